//! Conformance cases for the record transitions: complete and replay,
//! release, the owner fence, fingerprint mismatches, and claims racing for
//! one key.

use std::sync::Arc;
use std::time::Duration;

use super::{LONG, acquire, duplicate, fp, fresh_key, lease_lost, response};
use crate::{Claim, IdempotencyStore, Outcome, OwnerToken};

/// A completed key replays its outcome, headers and body byte for byte.
pub async fn claim_complete_replay<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("replay");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    let outcome = response(r#"{"id":1}"#);
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            duplicate(&*store, &key, &fp(1)).await,
            Claim::Replay(outcome.clone())
        );
    }
}

/// A lease and a ttl meant as "forever" (`Duration::MAX`) are taken as the
/// longest every backend takes (`LONGEST_EXPIRY`), never refused, and never
/// a panic: a claim, its renewal and its completion all hold.
pub async fn a_lease_and_ttl_meant_as_forever_hold<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("forever");
    let owner = acquire(&*store, &key, &fp(1), Duration::MAX).await;
    store.renew(&key, &owner, Duration::MAX).await.unwrap();
    let outcome = response(r#"{"id":1}"#);
    store
        .complete(&key, &owner, &outcome, Duration::MAX)
        .await
        .unwrap();
    assert_eq!(
        duplicate(&*store, &key, &fp(1)).await,
        Claim::Replay(outcome)
    );
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
        duplicate(&*store, &key, &fp(1)).await,
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
                duplicate(&*store, &key, &fp(1)).await
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

/// A token that never owned the key changes nothing; a completed key cannot be
/// completed or released again.
pub async fn only_the_owner_moves_the_record<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("owner");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    let stranger = OwnerToken::generate();
    lease_lost(store.release(&key, &stranger).await);
    lease_lost(store.complete(&key, &stranger, &response("x"), LONG).await);
    let outcome = response("done");
    store.complete(&key, &owner, &outcome, LONG).await.unwrap();
    lease_lost(store.complete(&key, &owner, &response("again"), LONG).await);
    lease_lost(store.release(&key, &owner).await);
    assert_eq!(
        duplicate(&*store, &key, &fp(1)).await,
        Claim::Replay(outcome)
    );
    lease_lost(store.release(&fresh_key("absent"), &owner).await);
}

/// Another fingerprint under the same key is a mismatch, in flight or
/// completed, and takes nothing over.
pub async fn fingerprint_mismatch<S: IdempotencyStore>(store: Arc<S>) {
    let key = fresh_key("mismatch");
    let owner = acquire(&*store, &key, &fp(1), LONG).await;
    assert_eq!(duplicate(&*store, &key, &fp(2)).await, Claim::Mismatch);
    store
        .complete(&key, &owner, &response("one"), LONG)
        .await
        .unwrap();
    assert_eq!(duplicate(&*store, &key, &fp(2)).await, Claim::Mismatch);
    assert!(matches!(
        duplicate(&*store, &key, &fp(1)).await,
        Claim::Replay(_)
    ));
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
