//! When the store fails: one that is down fails closed with 503 and the
//! handler does not run; one that cannot complete blocks duplicates, a
//! completion that fails for a while is retried until it lands, and one
//! that fails for a whole lease lets a retry run again.

use std::time::Duration;

use http::StatusCode;
use idem_core::{Claim, Fingerprint, IdempotencyKey, Outcome, OwnerToken};
use idem_tower::Idempotency;
use idem_tower::core::IdempotencyStore;
use tower::Layer;

use crate::fixtures::{ORDER, WatchedStore, connection_refused, counting, created, past_in_flight};
use crate::support::{Calls, post, send};

/// A store whose backend is down: every call fails as unavailable.
struct UnavailableStore;

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
    let service = Idempotency::new(WatchedStore::completions_fail())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_that_fails_for_a_while_is_retried_until_it_lands() {
    // Five failures: more than the tries before the answer goes out, so
    // the rest happen in the background while duplicates wait.
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(WatchedStore::first_completions_fail(5))
        .layer()
        .layer(inner);
    let request = || post("/orders", Some("k-late"), ORDER);

    let first = send(&service, request()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = past_in_flight(&service, request, Duration::from_secs(10)).await;
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
    let idem = Idempotency::builder(WatchedStore::completions_fail())
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
