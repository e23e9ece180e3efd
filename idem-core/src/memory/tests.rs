//! The memory store's unit tests: it stays within its capacity, evicts
//! completed records nearest their expiry and never in-flight claims, keeps
//! one winner per key under eviction pressure, and sweeps expired records.

use super::*;
use crate::StoredResponse;
use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, StatusCode};

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    future.now_or_never().expect("the memory store never waits")
}

fn response(bytes: usize) -> Outcome {
    Outcome::Response(StoredResponse::new(
        StatusCode::CREATED,
        HeaderMap::new(),
        Bytes::from(vec![b'x'; bytes]),
    ))
}

fn key(i: usize) -> IdempotencyKey {
    IdempotencyKey::new("idem:", &format!("k{i}"))
}

/// Claims and completes `key` with a `bytes`-long response.
fn store_one(store: &MemoryStore, key: &IdempotencyKey, bytes: usize, ttl: Duration) {
    let fp = Fingerprint::from_bytes([7; 32]);
    let owner = OwnerToken::generate();
    let claim = block_on(store.claim(key, &fp, Duration::from_secs(30), owner)).unwrap();
    assert_eq!(claim, Claim::Acquired(owner));
    block_on(store.complete(key, &owner, &response(bytes), ttl)).unwrap();
}

fn held(store: &MemoryStore) -> (usize, u64) {
    store.inner.shards.iter().fold((0, 0), |(n, b), shard| {
        let shard = shard.lock().unwrap();
        (n + shard.records.len(), b + shard.bytes)
    })
}

#[test]
fn stays_within_its_capacity_dropping_the_records_nearest_expiry() {
    let store = MemoryStore::with_max_bytes(256 * 1024);
    for i in 0..2_000 {
        // Later keys are kept longer.
        store_one(&store, &key(i), 1024, Duration::from_secs(3600 + i as u64));
    }
    let (_, bytes) = held(&store);
    assert!(bytes <= 256 * 1024, "{bytes} bytes held");
    let fp = Fingerprint::from_bytes([7; 32]);
    let replayed = |i| {
        let claim = block_on(store.claim(
            &key(i),
            &fp,
            Duration::from_secs(30),
            OwnerToken::generate(),
        ));
        matches!(claim, Ok(Claim::Replay(_)))
    };
    assert!(replayed(1_999), "the newest record was evicted");
    let early = (0..100).filter(|&i| replayed(i)).count();
    assert_eq!(early, 0, "records nearest expiry should go first");
}

#[test]
fn in_flight_claims_are_never_evicted() {
    let store = MemoryStore::with_max_bytes(4 * 1024);
    let fp = Fingerprint::from_bytes([1; 32]);
    let owners: Vec<_> = (0..200)
        .map(|i| {
            let owner = OwnerToken::generate();
            let claim =
                block_on(store.claim(&key(i), &fp, Duration::from_secs(30), owner)).unwrap();
            assert_eq!(claim, Claim::Acquired(owner));
            owner
        })
        .collect();
    // Completions of big responses squeeze the store; no claim is lost.
    for i in 200..260 {
        store_one(&store, &key(i), 2048, Duration::from_secs(60));
    }
    for (i, owner) in owners.iter().enumerate() {
        block_on(store.release(&key(i), owner)).unwrap();
    }
}

/// Threads race to claim the same keys while others fill the store with
/// large responses: every key has exactly one winner, because eviction
/// never touches a claim in flight.
#[test]
fn one_winner_per_key_under_eviction_pressure() {
    let store = MemoryStore::with_max_bytes(64 * 1024);
    let fp = Fingerprint::from_bytes([3; 32]);
    let wins: Vec<std::sync::atomic::AtomicUsize> = (0..500).map(|_| Default::default()).collect();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for (i, won) in wins.iter().enumerate() {
                    let claim = block_on(store.claim(
                        &key(i),
                        &fp,
                        Duration::from_secs(30),
                        OwnerToken::generate(),
                    ))
                    .unwrap();
                    if matches!(claim, Claim::Acquired(_)) {
                        won.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        for t in 0..2 {
            let store = &store;
            scope.spawn(move || {
                for i in 0..400 {
                    let filler = key(10_000 + t * 1_000 + i);
                    store_one(store, &filler, 2048, Duration::from_secs(60));
                }
            });
        }
    });
    for (i, won) in wins.iter().enumerate() {
        assert_eq!(won.load(std::sync::atomic::Ordering::Relaxed), 1, "key {i}");
    }
    let (_, bytes) = held(&store);
    // Over the budget only by the claims, which are never evicted.
    assert!(bytes <= 64 * 1024 + 500 * (ENTRY_OVERHEAD + 16), "{bytes}");
}

#[test]
fn expired_records_are_swept_as_the_store_grows() {
    let store = MemoryStore::new();
    for i in 0..1_000 {
        store_one(&store, &key(i), 16, Duration::ZERO);
    }
    for i in 1_000..5_000 {
        store_one(&store, &key(i), 16, Duration::from_secs(60));
    }
    let (records, bytes) = held(&store);
    assert!(
        records < 5_000,
        "expired records were never swept: {records}"
    );
    assert!(records >= 4_000, "live records went missing: {records}");
    let live_bytes = 4_000 * (16 + 6 + ENTRY_OVERHEAD);
    assert!(bytes >= live_bytes, "{bytes} < {live_bytes}");
}
