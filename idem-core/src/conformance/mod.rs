//! The store conformance suite: the cases every [`IdempotencyStore`] must
//! pass, run against a real backend by [`store_conformance_tests!`].
//!
//! Each case uses fresh random keys, so a suite may run against a store that
//! other suites (or earlier runs) share. The cases are grouped by topic:
//! `records.rs` moves records through their transitions, `leases.rs` lets
//! leases and ttl run out and renews them, and [`model`] checks random
//! sequences of claims against a reference model of the record state
//! machine (a property test). What only a SQL store can show is idem-sql's
//! `conformance`, which runs these cases too.
//!
//! [`store_conformance_tests!`]: crate::store_conformance_tests

mod leases;
pub mod model;
mod records;

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};

pub use leases::{
    expired_lease_is_taken_over, in_flight_reports_lease_left, renew_keeps_a_claim_past_its_lease,
    renew_of_a_finished_or_foreign_claim_is_lease_lost, stale_owner_cannot_complete_or_release,
    stale_owner_cannot_renew, ttl_expiry_frees_the_key,
};
pub use records::{
    a_lease_and_ttl_meant_as_forever_hold, claim_complete_replay,
    concurrent_claims_have_one_winner, fingerprint_mismatch, keys_are_independent,
    not_replayable_outcome_is_kept, only_the_owner_moves_the_record, release_then_reclaim,
};

use crate::{
    Claim, Error, ErrorKind, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken,
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
pub const LONG: Duration = Duration::from_secs(60);
/// A lease short enough to wait out in a test.
const SHORT: Duration = Duration::from_millis(400);
/// Long enough after [`SHORT`] for any store's clock to agree it expired.
const PAST_SHORT: Duration = Duration::from_millis(1100);

// What follows is public for the cases backends add of their own (idem-sql's
// table and transaction cases): the same keys, fingerprints and claims.

/// A key no other case or run uses, and the random part of it.
pub fn fresh_key_and_nonce(case: &str) -> (IdempotencyKey, String) {
    let nonce = format!("{:016x}", rand::random::<u64>());
    (
        IdempotencyKey::new("idem-test:", &format!("{case}:{nonce}")),
        nonce,
    )
}

/// A key no other case or run uses.
pub fn fresh_key(case: &str) -> IdempotencyKey {
    fresh_key_and_nonce(case).0
}

/// The fingerprint numbered `n`: equal numbers are the same request.
pub fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

fn response(body: &'static str) -> Outcome {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.append("link", HeaderValue::from_static("</a>; rel=a"));
    headers.append("link", HeaderValue::from_static("</b>; rel=b"));
    headers.insert("x-raw", HeaderValue::from_bytes(b"\xfe\xffok").unwrap());
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    // Binary metadata travels base64-encoded: this is `08 00`.
    trailers.insert("grpc-status-details-bin", HeaderValue::from_static("CAA"));
    Outcome::Response(
        StoredResponse::new(StatusCode::CREATED, headers, body).with_trailers(trailers),
    )
}

/// Claims `key`, which must be free, and returns its owner.
pub async fn acquire<S: IdempotencyStore>(
    store: &S,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    lease: Duration,
) -> OwnerToken {
    match claim(store, key, fingerprint, lease).await {
        Claim::Acquired(owner) => owner,
        other => panic!("expected to acquire a free key, got {other:?}"),
    }
}

/// A claim of `key` by a new owner, as a request would make it.
pub async fn claim<S: IdempotencyStore>(
    store: &S,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    lease: Duration,
) -> Claim {
    store
        .claim(key, fingerprint, lease, OwnerToken::generate())
        .await
        .unwrap()
}

/// What a duplicate of `key` is told: a claim by a new owner, with a
/// [`LONG`] lease.
pub async fn duplicate<S: IdempotencyStore>(
    store: &S,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Claim {
    claim(store, key, fingerprint, LONG).await
}

/// How long a duplicate of `key` is told to wait: `what` (the claim on it)
/// must be in flight.
async fn in_flight_for<S: IdempotencyStore>(
    store: &S,
    key: &IdempotencyKey,
    what: &str,
) -> Duration {
    match duplicate(store, key, &fp(1)).await {
        Claim::InFlight { retry_after } => retry_after,
        other => panic!("{what} must be in flight, got {other:?}"),
    }
}

/// Asserts that a transition was refused because the owner does not hold
/// the key (any more).
fn lease_lost(result: Result<(), Error>) {
    assert_eq!(result.unwrap_err().kind(), ErrorKind::LeaseLost);
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
        $crate::store_conformance_tests!(@cases [$crate::conformance] $make;
            claim_complete_replay,
            a_lease_and_ttl_meant_as_forever_hold,
            not_replayable_outcome_is_kept,
            concurrent_claims_have_one_winner,
            release_then_reclaim,
            in_flight_reports_lease_left,
            expired_lease_is_taken_over,
            stale_owner_cannot_complete_or_release,
            only_the_owner_moves_the_record,
            fingerprint_mismatch,
            ttl_expiry_frees_the_key,
            keys_are_independent,
            renew_keeps_a_claim_past_its_lease,
            stale_owner_cannot_renew,
            renew_of_a_finished_or_foreign_claim_is_lease_lost,
        );
    };
    // One test per case, named for it, which runs the function of that name
    // in the module `$suite` (the transactional suite's macro comes here
    // too), one case at a time.
    (@cases [$($suite:tt)*] $make:expr; $case:ident, $($rest:ident,)*) => {
        #[test]
        fn $case() {
            $crate::conformance::run(async {
                if let Some(store) = $make.await {
                    $($suite)*::$case(::std::sync::Arc::new(store)).await;
                }
            });
        }
        $crate::store_conformance_tests!(@cases [$($suite)*] $make; $($rest,)*);
    };
    (@cases [$($suite:tt)*] $make:expr;) => {};
}
