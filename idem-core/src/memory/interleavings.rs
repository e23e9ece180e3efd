//! The memory store's shards under loom (`.ci/loom`, `--cfg idem_loom`):
//! every interleaving of a few threads on one key, on the store's own code
//! with loom's mutex in place of the standard one. Properties: a key is held
//! by at most one owner at a time; a completed key is replayed, never run
//! again; a released key is taken by exactly one of the claims after it.
//! A seeded bug shows the first can fail.

use ::loom::sync::atomic::{AtomicUsize, Ordering};
use ::loom::thread;
use futures_util::FutureExt;

use super::*;

/// Stacks deep enough for the store's unoptimised futures (loom's own are
/// a few kilobytes).
const STACK: usize = 4 << 20;

/// Runs `f` in every interleaving loom finds, on a thread with a deep
/// stack.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let f = Arc::new(f);
    ::loom::model(move || {
        let f = Arc::clone(&f);
        spawn(move || f()).join().unwrap();
    });
}

/// A loom thread with a deep stack.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("a loom thread")
}

/// The memory store never awaits: its futures are ready at once.
fn now<T>(future: impl std::future::Future<Output = Result<T, Error>>) -> T {
    future
        .now_or_never()
        .expect("the memory store never waits")
        .expect("the memory store does not fail")
}

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(600);

fn key() -> IdempotencyKey {
    IdempotencyKey::new("idem:", "order:42")
}

fn fp() -> Fingerprint {
    Fingerprint::from_bytes([1; 32])
}

/// A known bug seeded into the store under loom, that these checks must
/// catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bug {
    /// A claim finds the key absent under its shard's lock, lets the lock
    /// go, and adds its record under a second one: two claims that both
    /// looked before either added each acquire the key.
    ClaimsAfterLooking,
}

/// A small store: few shards would do, but the count follows the machine.
fn store() -> MemoryStore {
    MemoryStore::with_max_bytes(1 << 20)
}

/// A small store built with `bug`.
fn store_with(bug: Option<Bug>) -> MemoryStore {
    let mut store = store();
    Arc::get_mut(&mut store.inner).expect("not shared yet").bug = bug;
    store
}

/// Three claims of one fresh key, on a store built with `bug`.
fn three_claim_one_key(bug: Option<Bug>) {
    model(move || {
        let store = store_with(bug);
        let acquired = Arc::new(AtomicUsize::new(0));
        let claimants: Vec<_> = (0..2)
            .map(|_| {
                let (store, acquired) = (store.clone(), Arc::clone(&acquired));
                spawn(move || {
                    let claim = now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate()));
                    match claim {
                        Claim::Acquired(_) => {
                            acquired.fetch_add(1, Ordering::SeqCst);
                        }
                        Claim::InFlight { .. } => {}
                        other => panic!("a fresh key is acquired or in flight: {other:?}"),
                    }
                })
            })
            .collect();
        let mine = now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate()));
        if matches!(mine, Claim::Acquired(_)) {
            acquired.fetch_add(1, Ordering::SeqCst);
        }
        for claimant in claimants {
            claimant.join().unwrap();
        }
        assert_eq!(acquired.load(Ordering::SeqCst), 1, "one owner of three");
    });
}

#[test]
fn concurrent_claims_of_one_key_have_one_owner() {
    three_claim_one_key(None);
}

#[test]
fn seeded_bug_a_claim_that_adds_after_looking_is_caught() {
    let caught = std::panic::catch_unwind(|| three_claim_one_key(Some(Bug::ClaimsAfterLooking)));
    let panic = caught.expect_err("loom missed two owners of one key");
    let message = panic.downcast_ref::<String>().map_or("", String::as_str);
    assert!(message.contains("one owner of three"), "{message}");
}

#[test]
fn a_completion_racing_duplicates_is_replayed_never_run_again() {
    model(|| {
        let store = store();
        let Claim::Acquired(owner) = now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate()))
        else {
            panic!("a fresh key is free");
        };
        let duplicate = {
            let store = store.clone();
            spawn(move || now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate())))
        };
        now(store.complete(&key(), &owner, &Outcome::NotReplayable, TTL));
        match duplicate.join().unwrap() {
            Claim::InFlight { .. } | Claim::Replay(Outcome::NotReplayable) => {}
            other => panic!("a duplicate of a running or completed claim: {other:?}"),
        }
        let after = now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate()));
        assert_eq!(after, Claim::Replay(Outcome::NotReplayable));
    });
}

#[test]
fn a_released_key_goes_to_one_of_the_claims_after_it() {
    model(|| {
        let store = store();
        let Claim::Acquired(owner) = now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate()))
        else {
            panic!("a fresh key is free");
        };
        let acquired = Arc::new(AtomicUsize::new(0));
        let retries: Vec<_> = (0..2)
            .map(|_| {
                let (store, acquired) = (store.clone(), Arc::clone(&acquired));
                spawn(move || {
                    if let Claim::Acquired(_) =
                        now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate()))
                    {
                        acquired.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        now(store.release(&key(), &owner));
        for retry in retries {
            retry.join().unwrap();
        }
        // Each retry met the first's claim (in flight) or the free key; at
        // most one of them took it.
        assert!(acquired.load(Ordering::SeqCst) <= 1);
        // The key is held by the retry that took it, or free.
        let last = now(store.claim(&key(), &fp(), LEASE, OwnerToken::generate()));
        let held = acquired.load(Ordering::SeqCst) == 1;
        assert_eq!(matches!(last, Claim::InFlight { .. }), held, "{last:?}");
    });
}
