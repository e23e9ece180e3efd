//! When the store fails: one that is down fails closed with 503 and the
//! handler does not run; one that cannot complete blocks duplicates, a
//! completion that fails for a while is retried until it lands, and one
//! that fails for a whole lease lets a retry run again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use idem_core::{Claim, Fingerprint, IdempotencyKey, Outcome, OwnerToken};
use idem_tower::core::IdempotencyStore;
use idem_tower::{Idempotency, MemoryStore};
use tower::Layer;

use crate::fixtures::{ORDER, counting, created};
use crate::support::{Calls, Reply, post, send};

/// A store whose backend is down: every call fails as unavailable.
struct UnavailableStore;

fn connection_refused() -> idem_core::Error {
    idem_core::Error::unavailable(std::io::Error::other("connection refused"))
}

impl IdempotencyStore for UnavailableStore {
    async fn claim(
        &self,
        _: &IdempotencyKey,
        _: &Fingerprint,
        _: Duration,
        _: OwnerToken,
    ) -> Result<Claim, idem_core::Error> {
        Err(connection_refused())
    }

    async fn complete(
        &self,
        _: &IdempotencyKey,
        _: &OwnerToken,
        _: &Outcome,
        _: Duration,
    ) -> Result<(), idem_core::Error> {
        Err(connection_refused())
    }

    async fn release(&self, _: &IdempotencyKey, _: &OwnerToken) -> Result<(), idem_core::Error> {
        Err(connection_refused())
    }

    async fn renew(
        &self,
        _: &IdempotencyKey,
        _: &OwnerToken,
        _: Duration,
    ) -> Result<(), idem_core::Error> {
        Err(connection_refused())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unavailable_store_fails_closed_with_503_and_the_handler_is_not_called() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::builder(UnavailableStore)
        .unavailable_retry_after(Duration::from_secs(7))
        .build();
    let service = idem.layer().layer(inner);

    for _ in 0..3 {
        let reply = send(&service, post("/orders", Some("k-down"), ORDER)).await;
        reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable");
        assert_eq!(reply.retry_after(), 7);
    }
    assert_eq!(calls.get(), 0, "no handler call without dedup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_completion_blocks_duplicates_instead_of_running_them() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(CompleteFails::always())
        .layer()
        .layer(inner);

    let first = send(&service, post("/orders", Some("k-unstored"), ORDER)).await;
    let duplicate = send(&service, post("/orders", Some("k-unstored"), ORDER)).await;

    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "the handler's answer still reaches its client"
    );
    duplicate.assert_problem(StatusCode::CONFLICT, "in-flight");
    assert_eq!(calls.get(), 1);
}

/// A memory store whose first `failures` completions fail, as a store
/// does through an outage: the handler's outcome cannot be recorded.
struct CompleteFails {
    store: MemoryStore,
    failures: AtomicUsize,
}

impl CompleteFails {
    /// Every completion fails.
    fn always() -> Self {
        Self::first(usize::MAX)
    }

    /// The first `failures` completions fail.
    fn first(failures: usize) -> Self {
        Self {
            store: MemoryStore::new(),
            failures: AtomicUsize::new(failures),
        }
    }
}

impl IdempotencyStore for CompleteFails {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, idem_core::Error> {
        self.store.claim(key, fingerprint, lease, owner).await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), idem_core::Error> {
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(connection_refused());
        }
        self.store.complete(key, owner, outcome, ttl).await
    }

    async fn release(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
    ) -> Result<(), idem_core::Error> {
        self.store.release(key, owner).await
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), idem_core::Error> {
        self.store.renew(key, owner, lease).await
    }
}

/// Sends `request()` until it is answered other than "in flight", for up
/// to `patience`.
async fn until_settled<S, B>(
    service: &S,
    request: impl Fn() -> Request<Body>,
    patience: Duration,
) -> Reply
where
    S: tower::Service<Request<Body>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let deadline = Instant::now() + patience;
    loop {
        let reply = send(service, request()).await;
        if reply.status != StatusCode::CONFLICT || Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_that_fails_for_a_while_is_retried_until_it_lands() {
    // Five failures: more than the tries before the answer goes out, so
    // the rest happen in the background while duplicates wait.
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(CompleteFails::first(5))
        .layer()
        .layer(inner);
    let request = || post("/orders", Some("k-late"), ORDER);

    let first = send(&service, request()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = until_settled(&service, request, Duration::from_secs(10)).await;
    assert!(replay.replayed(), "the outcome landed: {replay:?}");
    assert_eq!(replay.text(), first.text());
    assert_eq!(calls.get(), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_that_fails_for_a_whole_lease_lets_a_retry_run_again() {
    // The one path on which plain mode runs a handler twice
    // (docs/leases-and-crashes.md): the effect made, its record never
    // stored, the lease over.
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::builder(CompleteFails::always())
        .lease(Duration::from_millis(400))
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/orders", Some("k-never-stored"), ORDER);

    assert_eq!(send(&service, request()).await.status, StatusCode::CREATED);
    send(&service, request())
        .await
        .assert_problem(StatusCode::CONFLICT, "in-flight");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = send(&service, request()).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed());
    assert_eq!(calls.get(), 2, "the handler ran again after the lease");
}
