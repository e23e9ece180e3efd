//! The store conformance suite: the cases every [`IdempotencyStore`] must
//! pass, run against a real backend by [`store_conformance_tests!`].
//!
//! Each case uses fresh random keys, so a suite may run against a store that
//! other suites (or earlier runs) share.
//!
//! [`store_conformance_tests!`]: crate::store_conformance_tests

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};

use crate::{
    Claim, ErrorKind, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken,
    StoredResponse,
};

/// Runs one case on a fresh multi-thread runtime, so concurrent claims
/// really run in parallel.
#[doc(hidden)]
pub fn run<F: std::future::Future<Output = ()>>(case: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime for the conformance suite")
        .block_on(case);
}

/// A generous lease for cases that must not expire.
const LONG: Duration = Duration::from_secs(60);
/// A lease short enough to wait out in a test.
const SHORT: Duration = Duration::from_millis(400);
/// Long enough after [`SHORT`] for any store's clock to agree it expired.
const PAST_SHORT: Duration = Duration::from_millis(1100);

fn fresh_key(case: &str) -> IdempotencyKey {
    let nonce: u64 = rand::random();
    IdempotencyKey::new("idem-test:", &format!("{case}:{nonce:016x}"))
}

fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

fn response(body: &'static str) -> Outcome {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.append("link", HeaderValue::from_static("</a>; rel=a"));
    headers.append("link", HeaderValue::from_static("</b>; rel=b"));
    headers.insert("x-raw", HeaderValue::from_bytes(b"\xfe\xffok").unwrap());
    Outcome::Response(StoredResponse::new(StatusCode::CREATED, headers, body))
}

async fn acquire<S: IdempotencyStore>(
    store: &S,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    lease: Duration,
) -> OwnerToken {
    match store
        .claim(key, fingerprint, lease, OwnerToken::generate())
        .await
        .unwrap()
    {
        Claim::Acquired(owner) => owner,
        other => panic!("expected to acquire a free key, got {other:?}"),
    }
}

/// A completed key replays its outcome, headers and body byte for byte.
pub async fn claim_complete_replay<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("replay");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    let outcome = response(r#"{"id":1}"#);
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            store
                .claim(&key, &fp(1), LONG, OwnerToken::generate())
                .await
                .unwrap(),
            Claim::Replay(outcome.clone())
        );
    }
}

/// A completed-but-too-large outcome replays as such.
pub async fn not_replayable_outcome_is_kept<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("tombstone");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    store
        .complete(&key, &owner, &Outcome::NotReplayable, LONG)
        .await
        .unwrap();
    assert_eq!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(Outcome::NotReplayable)
    );
}

/// 64 concurrent claims of one key: exactly one acquires, the rest see it in
/// flight.
pub async fn concurrent_claims_have_one_winner<S: IdempotencyStore>(store: Arc<S>) {
    let key = Arc::new(fresh_key("race"));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, key, barrier) = (store.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .claim(&key, &fp(1), LONG, OwnerToken::generate())
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut acquired = 0;
    for task in tasks {
        match task.await.unwrap() {
            Claim::Acquired(_) => acquired += 1,
            Claim::InFlight { .. } => {}
            other => panic!("unexpected claim result {other:?}"),
        }
    }
    assert_eq!(acquired, 1, "exactly one concurrent claim may win");
}

/// A released key can be claimed again, under a new owner.
pub async fn release_then_reclaim<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("release");
    let first = acquire(&*store, &key, &fp(1), LONG).await;
    store.release(&key, &first).await.unwrap();
    let second = acquire(&*store, &key, &fp(1), LONG).await;
    assert_ne!(first, second);
}

/// While the lease runs, duplicates are told it is in flight and for how long.
pub async fn in_flight_reports_lease_left<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("inflight");
    let _owner = acquire(&*store, &key, &fp(1), LONG).await;
    match store
        .claim(&key, &fp(1), LONG, OwnerToken::generate())
        .await
        .unwrap()
    {
        Claim::InFlight { retry_after } => {
            assert!(retry_after <= LONG, "{retry_after:?}");
            assert!(
                retry_after > LONG - Duration::from_secs(10),
                "{retry_after:?}"
            );
        }
        other => panic!("expected in flight, got {other:?}"),
    }
}

/// An expired lease is taken over by the next claim.
pub async fn expired_lease_is_taken_over<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("takeover");
    let first = acquire(&*store, &key, &fp(1), SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    let second = acquire(&*store, &key, &fp(1), LONG).await;
    assert_ne!(first, second);
}

/// After a takeover the old owner can neither complete nor release, and its
/// attempts leave the new owner's claim intact.
pub async fn stale_owner_cannot_complete_or_release<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("stale");
    let stale = acquire(&*store, &key, &fp(1), SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    let current = acquire(&*store, &key, &fp(1), LONG).await;

    let err = store
        .complete(&key, &stale, &response("stale"), LONG)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
    let err = store.release(&key, &stale).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
    assert!(matches!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::InFlight { .. }
    ));

    let outcome = response("current");
    store
        .complete(&key, &current, &outcome, LONG)
        .await
        .unwrap();
    assert_eq!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome)
    );
}

/// A token that never owned the key changes nothing; a completed key cannot be
/// completed or released again.
pub async fn only_the_owner_moves_the_record<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("owner");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    let stranger = OwnerToken::generate();
    assert_eq!(
        store.release(&key, &stranger).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        store
            .complete(&key, &stranger, &response("x"), LONG)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::LeaseLost
    );
    let outcome = response("done");
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    assert_eq!(
        store
            .complete(&key, &owner, &response("again"), LONG)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        store.release(&key, &owner).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome)
    );
    let absent = fresh_key("absent");
    assert_eq!(
        store.release(&absent, &owner).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
}

/// Another fingerprint under the same key is a mismatch, in flight or
/// completed, and takes nothing over.
pub async fn fingerprint_mismatch<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("mismatch");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    assert_eq!(
        store
            .claim(&key, &fp(2), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Mismatch
    );
    store
        .complete(&key, &owner, &response("one"), LONG)
        .await
        .unwrap();
    assert_eq!(
        store
            .claim(&key, &fp(2), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Mismatch
    );
    assert!(matches!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(_)
    ));
}

/// Once retention runs out, the key is free again.
pub async fn retention_expiry_frees_the_key<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("retention");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    store
        .complete(&key, &owner, &response("old"), SHORT)
        .await
        .unwrap();
    assert!(matches!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(_)
    ));
    tokio::time::sleep(PAST_SHORT).await;
    acquire(&*store, &key, &fp(2), LONG).await;
}

/// How often [`renew_keeps_a_claim_past_its_lease`] renews a [`SHORT`]
/// lease: a third of it, as the idempotency layer does.
const RENEW_EVERY: Duration = Duration::from_millis(130);

/// An owner that renews its claim keeps it for as long as it renews, many
/// times its lease: a duplicate is told it is in flight, never handed the
/// key. Once the renewals stop, the claim frees within about one lease.
pub async fn renew_keeps_a_claim_past_its_lease<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("renew");
    let owner = acquire(&*store, &key, &fp(1), SHORT).await;
    // Three leases and more, renewed every third of one.
    let until = tokio::time::Instant::now() + PAST_SHORT + SHORT * 2;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(RENEW_EVERY).await;
        store.renew(&key, &owner, SHORT).await.unwrap();
    }
    match store
        .claim(&key, &fp(1), LONG, OwnerToken::generate())
        .await
        .unwrap()
    {
        Claim::InFlight { retry_after } => {
            assert!(retry_after <= SHORT, "{retry_after:?}");
        }
        other => panic!("a renewed claim must stay in flight, got {other:?}"),
    }
    // The owner still moves its record, and a duplicate replays it.
    store.renew(&key, &owner, SHORT).await.unwrap();
    let outcome = response("renewed");
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    assert_eq!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome)
    );

    // Renewals that stop: the claim frees within about one lease.
    let key = fresh_key("renew-stop");
    let owner = acquire(&*store, &key, &fp(1), SHORT).await;
    tokio::time::sleep(RENEW_EVERY).await;
    store.renew(&key, &owner, SHORT).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let next = acquire(&*store, &key, &fp(1), LONG).await;
    assert_ne!(next, owner);
}

/// A renewal by an owner whose lease ran out is refused, whether or not
/// the key was taken over meanwhile, and changes nothing: not the new
/// owner's lease, and not the free key.
pub async fn stale_owner_cannot_renew<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("renew-stale");
    let stale = acquire(&*store, &key, &fp(1), SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    // Expired, not yet taken over: a lease that ran out is not revived.
    let err = store.renew(&key, &stale, LONG).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
    let current = acquire(&*store, &key, &fp(1), LONG).await;

    // Taken over: the stale owner's renewal must not touch the new claim
    // (a 1 ms lease would expire it at once).
    let err = store
        .renew(&key, &stale, Duration::from_millis(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
    tokio::time::sleep(Duration::from_millis(50)).await;
    match store
        .claim(&key, &fp(1), LONG, OwnerToken::generate())
        .await
        .unwrap()
    {
        Claim::InFlight { retry_after } => assert!(
            retry_after > LONG - Duration::from_secs(10),
            "the new owner's lease was changed: {retry_after:?}"
        ),
        other => panic!("the new owner's claim must stay in flight, got {other:?}"),
    }
    store.renew(&key, &current, LONG).await.unwrap();
    store
        .complete(&key, &current, &response("current"), LONG)
        .await
        .unwrap();
}

/// Renewing a completed, released or absent key, or another owner's claim,
/// is refused and changes nothing.
pub async fn renew_of_a_finished_or_foreign_claim_is_lease_lost<S: IdempotencyStore>(
    store: Arc<S>,
) {
    let lost = |result: Result<(), crate::Error>| {
        assert_eq!(result.unwrap_err().kind(), ErrorKind::LeaseLost);
    };

    // Completed: still replayed, with its retention.
    let key = fresh_key("renew-completed");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    let outcome = response("done");
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    lost(store.renew(&key, &owner, Duration::from_millis(1)).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome)
    );

    // Released: the key stays free.
    let key = fresh_key("renew-released");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    store.release(&key, &owner).await.unwrap();
    lost(store.renew(&key, &owner, LONG).await);
    acquire(&*store, &key, &fp(1), LONG).await;

    // Absent.
    lost(store.renew(&fresh_key("renew-absent"), &owner, LONG).await);

    // Another owner's live claim: its lease is untouched.
    let key = fresh_key("renew-stranger");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    lost(
        store
            .renew(&key, &OwnerToken::generate(), Duration::from_millis(1))
            .await,
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(
        store
            .claim(&key, &fp(1), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::InFlight { .. }
    ));
    store.release(&key, &owner).await.unwrap();
}

/// Keys do not see each other's records.
pub async fn keys_are_independent<S: IdempotencyStore>(store: Arc<S>) {
    let a = fresh_key("indep");
    let b = fresh_key("indep");
    let owner = acquire(&*store, &a, &fp(1), LONG).await;
    store
        .complete(&a, &owner, &response("a"), LONG)
        .await
        .unwrap();
    acquire(&*store, &b, &fp(1), LONG).await;
}

/// Generates one `#[tokio::test]` per conformance case for a store.
///
/// `$make` is an expression evaluating to a future of `Option<S>`: `None`
/// skips the case (the factory says why, for a server that is not there).
///
/// ```ignore
/// idem_core::store_conformance_tests!(async { Some(MyStore::connect().await) });
/// ```
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store_conformance_tests!(@cases $make;
            claim_complete_replay,
            not_replayable_outcome_is_kept,
            concurrent_claims_have_one_winner,
            release_then_reclaim,
            in_flight_reports_lease_left,
            expired_lease_is_taken_over,
            stale_owner_cannot_complete_or_release,
            only_the_owner_moves_the_record,
            fingerprint_mismatch,
            retention_expiry_frees_the_key,
            keys_are_independent,
            renew_keeps_a_claim_past_its_lease,
            stale_owner_cannot_renew,
            renew_of_a_finished_or_foreign_claim_is_lease_lost,
        );
    };
    (@cases $make:expr; $($case:ident,)*) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run(async {
                    if let Some(store) = $make.await {
                        $crate::conformance::$case(::std::sync::Arc::new(store)).await;
                    }
                });
            }
        )*
    };
}

/// What a test does about a server it cannot reach: under `CI=true` that is
/// a failure (the run must not pass by testing nothing); elsewhere the test
/// says why it is skipped and passes.
///
/// # Panics
///
/// Under `CI=true`, always.
pub fn server_missing<T>(what: &str, url: &str, err: impl std::fmt::Display) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} at {url} is required when CI=true, and it failed: {err}");
    }
    eprintln!("skipped: {what} is not reachable at {url} ({err}); set the URL or start it");
    None
}

/// A server URL from `var`, or `default`.
pub fn server_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// The PostgreSQL server of the tests: `IDEM_TEST_POSTGRES_URL`, or
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn postgres_url() -> String {
    server_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// The MySQL/MariaDB server of the tests: `IDEM_TEST_MYSQL_URL`, or
/// `mysql://root@127.0.0.1:3306/test`.
pub fn mysql_url() -> String {
    server_url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// The Redis server of the tests: `IDEM_TEST_REDIS_URL`, or
/// `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    server_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

#[cfg(feature = "sql")]
pub mod sql;

#[cfg(feature = "redis")]
mod redis_server;
#[cfg(feature = "redis")]
pub use redis_server::{RedisServer, free_port, redis_cli_says, wait_until};
