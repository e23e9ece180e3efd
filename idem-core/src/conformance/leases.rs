//! Conformance cases for time: the lease a duplicate is told about, expiry
//! and takeover, the stale owner's fence, ttl, and renewal.

use std::sync::Arc;
use std::time::Duration;

use super::{
    LONG, PAST_SHORT, SHORT, acquire, duplicate, fp, fresh_key, in_flight_for, lease_lost, response,
};
use crate::{Claim, IdempotencyStore, OwnerToken};

/// While the lease runs, duplicates are told it is in flight and for how long.
pub async fn in_flight_reports_lease_left<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("inflight");
    let _owner = acquire(&*store, &key, &fp(1), LONG).await;
    let retry_after = in_flight_for(&*store, &key, "a claimed key").await;
    assert!(retry_after <= LONG, "{retry_after:?}");
    assert!(
        retry_after > LONG - Duration::from_secs(10),
        "{retry_after:?}"
    );
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

    lease_lost(store.complete(&key, &stale, &response("stale"), LONG).await);
    lease_lost(store.release(&key, &stale).await);
    assert!(matches!(
        duplicate(&*store, &key, &fp(1)).await,
        Claim::InFlight { .. }
    ));

    let outcome = response("current");
    store
        .complete(&key, &current, &outcome, LONG)
        .await
        .unwrap();
    assert_eq!(
        duplicate(&*store, &key, &fp(1)).await,
        Claim::Replay(outcome)
    );
}

/// Once ttl runs out, the key is free again.
pub async fn ttl_expiry_frees_the_key<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("ttl");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    store
        .complete(&key, &owner, &response("old"), SHORT)
        .await
        .unwrap();
    assert!(matches!(
        duplicate(&*store, &key, &fp(1)).await,
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
    let retry_after = in_flight_for(&*store, &key, "a renewed claim").await;
    assert!(retry_after <= SHORT, "{retry_after:?}");
    // The owner still moves its record, and a duplicate replays it.
    store.renew(&key, &owner, SHORT).await.unwrap();
    let outcome = response("renewed");
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    assert_eq!(
        duplicate(&*store, &key, &fp(1)).await,
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
    lease_lost(store.renew(&key, &stale, LONG).await);
    let current = acquire(&*store, &key, &fp(1), LONG).await;

    // Taken over: the stale owner's renewal must not touch the new claim
    // (a 1 ms lease would expire it at once).
    lease_lost(store.renew(&key, &stale, Duration::from_millis(1)).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let retry_after = in_flight_for(&*store, &key, "the new owner's claim").await;
    assert!(
        retry_after > LONG - Duration::from_secs(10),
        "the new owner's lease was changed: {retry_after:?}"
    );
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
    // Completed: still replayed, with its ttl.
    let key = fresh_key("renew-completed");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    let outcome = response("done");
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    lease_lost(store.renew(&key, &owner, Duration::from_millis(1)).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        duplicate(&*store, &key, &fp(1)).await,
        Claim::Replay(outcome)
    );

    // Released: the key stays free.
    let key = fresh_key("renew-released");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    store.release(&key, &owner).await.unwrap();
    lease_lost(store.renew(&key, &owner, LONG).await);
    acquire(&*store, &key, &fp(1), LONG).await;

    // Absent.
    lease_lost(store.renew(&fresh_key("renew-absent"), &owner, LONG).await);

    // Another owner's live claim: its lease is untouched.
    let key = fresh_key("renew-stranger");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    lease_lost(
        store
            .renew(&key, &OwnerToken::generate(), Duration::from_millis(1))
            .await,
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(
        duplicate(&*store, &key, &fp(1)).await,
        Claim::InFlight { .. }
    ));
    store.release(&key, &owner).await.unwrap();
}
