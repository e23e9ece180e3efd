//! An in-process store: sharded hash maps with lazy expiry and a capacity
//! bound in bytes.
//!
//! Each key lives in one of a fixed number of shards, each a hash table
//! behind its own mutex, so every transition is one short critical section
//! and claims of different keys rarely meet. A key is hashed once per
//! operation: the one hash picks the shard and finds the key in it, and each
//! record keeps its hash, so a table that grows never hashes its keys again. Records carry their expiry instant
//! and count as absent once it has passed; a shard sweeps its expired
//! records whenever it has doubled in size since its last sweep, so the work
//! is a constant per write on average and no thread or timer is needed.
//! Completed records are also kept in a heap by expiry, so a full shard
//! evicts the one nearest to its expiry in logarithmic time, one record at
//! a time, instead of sorting the shard.
//!
//! Why not a cache crate: docs/stores.md, "The memory store".

#[cfg(idem_loom)]
use ::loom::sync::{Mutex, MutexGuard};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
#[cfg(not(idem_loom))]
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use crate::time::expiry_after;
use crate::{
    Claim, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken, Record,
};

/// The default capacity: 64 MiB of keys and stored responses.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// What a record costs besides its key and response: the entry, the record,
/// the map's own slot and its place in the expiry heap, roughly.
const ENTRY_OVERHEAD: u64 = 128;
/// A shard sweeps its expired records when it holds twice as many as after
/// its last sweep, and never below this many.
const MIN_SWEEP_LEN: usize = 64;

/// Records in this process's memory, with per-record expiry and a capacity
/// bound in bytes.
///
/// Right for tests, development and a single-instance service that accepts
/// losing its records on restart. It is not shared between processes. When
/// full, it first drops expired records, then the completed records nearest
/// to their expiry (in-flight claims are never dropped), which forgets those
/// keys early: give it room for a ttl's worth of responses, or
/// use a SQL store. Evicting takes time in proportion to the logarithm of
/// the shard per record evicted; sweeping expired records runs on the write
/// that finds a shard doubled since its last sweep, under that shard's lock,
/// and takes time in proportion to the shard (a 64th of the store on a
/// machine with 16 CPUs or more). Clones share the records.
///
/// ```
/// use idem_core::MemoryStore;
///
/// let store = MemoryStore::with_max_bytes(16 * 1024 * 1024);
/// # let _ = store;
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// What one shard may hold, in bytes.
    shard_budget: u64,
    /// The bug this store is built with, for its loom check to catch.
    #[cfg(all(test, idem_loom))]
    bug: Option<interleavings::Bug>,
}

#[derive(Default)]
struct Shard {
    records: HashTable<Slot>,
    /// Completed records by expiry, nearest first: what eviction takes.
    /// An item whose record has since changed (taken over after expiring)
    /// is stale, and skipped when it comes up; sweeps drop the expired ones.
    by_expiry: BinaryHeap<Reverse<(Instant, Hashed)>>,
    /// The weight of every record held, expired ones included.
    bytes: u64,
    /// Sweep when the shard holds more records than this.
    sweep_above: usize,
}

/// A key with its hash, computed once by [`MemoryStore::shard`].
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Hashed {
    hash: u64,
    key: Arc<str>,
}

/// One record of a shard's table, under its key.
struct Slot {
    key: Hashed,
    entry: Entry,
}

struct Entry {
    record: Arc<Record>,
    expires_at: Instant,
    weight: u64,
}

impl Entry {
    fn new(key: &str, record: Record, expires_at: Instant) -> Self {
        let response = match &record {
            Record::Completed {
                outcome: Outcome::Response(r),
                ..
            } => r.size() as u64,
            _ => 0,
        };
        Self {
            record: Arc::new(record),
            expires_at,
            weight: key.len() as u64 + response + ENTRY_OVERHEAD,
        }
    }

    fn live(&self, now: Instant) -> bool {
        self.expires_at > now
    }

    fn completed(&self) -> bool {
        matches!(*self.record, Record::Completed { .. })
    }

    /// The owner, if this is a live in-flight record.
    fn holder(&self, now: Instant) -> Option<&OwnerToken> {
        match &*self.record {
            Record::InFlight { owner, .. } if self.live(now) => Some(owner),
            _ => None,
        }
    }
}

/// Overwrites `slot`, a record of the shard whose byte count is `bytes`,
/// with `entry`. (The slot borrows the shard's map, so the count comes apart.)
fn replace(bytes: &mut u64, slot: &mut Entry, entry: Entry) {
    *bytes = *bytes - slot.weight + entry.weight;
    *slot = entry;
}

/// The record of `key`, whose hash is `hash`, in a shard's `records`.
/// (The records alone: the shard's byte count stays free to change.)
fn record_mut<'a>(records: &'a mut HashTable<Slot>, hash: u64, key: &str) -> Option<&'a mut Entry> {
    records
        .find_mut(hash, |slot| *slot.key.key == *key)
        .map(|slot| &mut slot.entry)
}

impl Shard {
    /// Adds `entry` under `key`, which the shard does not hold.
    fn insert(&mut self, hash: u64, key: &str, entry: Entry) {
        self.bytes += entry.weight;
        let key = Hashed {
            hash,
            key: Arc::from(key),
        };
        self.records
            .insert_unique(hash, Slot { key, entry }, |slot| slot.key.hash);
        if self.records.len() > self.sweep_above {
            self.sweep(Instant::now());
        }
    }

    fn remove(&mut self, hash: u64, key: &str) {
        if let Ok(found) = self.records.find_entry(hash, |slot| *slot.key.key == *key) {
            let (slot, _) = found.remove();
            self.bytes -= slot.entry.weight;
        }
    }

    /// Drops every expired record.
    fn sweep(&mut self, now: Instant) {
        let mut freed = 0;
        self.records.retain(|slot| {
            let keep = slot.entry.live(now);
            if !keep {
                freed += slot.entry.weight;
            }
            keep
        });
        self.bytes -= freed;
        self.sweep_above = (self.records.len() * 2).max(MIN_SWEEP_LEN);
        while self
            .by_expiry
            .peek()
            .is_some_and(|Reverse((expires_at, _))| *expires_at <= now)
        {
            self.by_expiry.pop();
        }
    }

    /// Lists the completed record of `key`, which expires at `expires_at`,
    /// for eviction.
    fn list_for_eviction(&mut self, hash: u64, key: &str, expires_at: Instant) {
        if let Some(slot) = self.records.find(hash, |slot| *slot.key.key == *key) {
            self.by_expiry.push(Reverse((expires_at, slot.key.clone())));
        }
    }

    /// Brings the shard under `budget`: expired records first, then the
    /// completed ones nearest to their expiry, one at a time. `keep` (the
    /// record just written) and in-flight claims stay.
    fn fit(&mut self, budget: u64, keep: &str, now: Instant) {
        if self.bytes <= budget {
            return;
        }
        if self
            .by_expiry
            .peek()
            .is_some_and(|Reverse((expires_at, _))| *expires_at <= now)
        {
            self.sweep(now);
        }
        let mut kept = None;
        while self.bytes > budget {
            let Some(Reverse((expires_at, key))) = self.by_expiry.pop() else {
                break;
            };
            if *key.key == *keep {
                kept = Some(Reverse((expires_at, key)));
                continue;
            }
            // Stale unless the record is still the completed one listed.
            if let Ok(found) = self.records.find_entry(key.hash, |slot| slot.key == key)
                && found.get().entry.completed()
                && found.get().entry.expires_at == expires_at
            {
                let (slot, _) = found.remove();
                self.bytes -= slot.entry.weight;
            }
        }
        if let Some(kept) = kept {
            self.by_expiry.push(kept);
        }
    }
}

impl MemoryStore {
    /// A store holding up to [`DEFAULT_MAX_BYTES`].
    pub fn new() -> Self {
        Self::with_max_bytes(DEFAULT_MAX_BYTES)
    }

    /// A store holding up to about `max_bytes` of keys and responses.
    pub fn with_max_bytes(max_bytes: u64) -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        let count = (cpus * 4).next_power_of_two().clamp(4, 64);
        let shards = (0..count)
            .map(|_| {
                Mutex::new(Shard {
                    sweep_above: MIN_SWEEP_LEN,
                    ..Shard::default()
                })
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                shards,
                hasher: RandomState::new(),
                shard_budget: max_bytes / count as u64,
                #[cfg(all(test, idem_loom))]
                bug: None,
            }),
        }
    }

    /// The shard of `key`, locked, and the key's hash, which also finds it
    /// in the shard's table.
    fn shard(&self, key: &str) -> (MutexGuard<'_, Shard>, u64) {
        let shards = &self.inner.shards;
        let hash = self.inner.hasher.hash_one(key);
        // The shard from the hash's middle bits: the table's buckets are
        // picked by its low bits and its control bytes by its top ones, and
        // within a shard the bits that picked it are all alike.
        let index = (hash >> 32) as usize & (shards.len() - 1);
        // A panic never leaves a shard half-changed: every change is one
        // table operation and its byte count, neither of which can panic.
        let shard = shards[index].lock().unwrap_or_else(|p| p.into_inner());
        (shard, hash)
    }

    /// Replaces the live in-flight record of `key` held by `owner` with
    /// `next`, or removes it when `next` is `None`.
    fn transition(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        next: impl FnOnce(&Fingerprint, Instant) -> Option<Entry>,
    ) -> Result<(), Error> {
        let key = key.as_str();
        let (mut guard, hash) = self.shard(key);
        let shard = &mut *guard;
        let now = Instant::now();
        let entry = held(&mut shard.records, hash, key, owner, now)?;
        match next(entry.record.fingerprint(), now) {
            Some(next) => {
                let expires_at = next.expires_at;
                replace(&mut shard.bytes, entry, next);
                shard.list_for_eviction(hash, key, expires_at);
                shard.fit(self.inner.shard_budget, key, now);
            }
            None => shard.remove(hash, key),
        }
        Ok(())
    }
}

/// The live in-flight record of `key` if `owner` holds it: what every
/// owner-fenced transition starts from.
fn held<'a>(
    records: &'a mut HashTable<Slot>,
    hash: u64,
    key: &str,
    owner: &OwnerToken,
    now: Instant,
) -> Result<&'a mut Entry, Error> {
    record_mut(records, hash, key)
        .filter(|entry| entry.holder(now) == Some(owner))
        .ok_or_else(Error::lease_lost)
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyStore for MemoryStore {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, Error> {
        let key = key.as_str();
        let found = {
            let (mut guard, hash) = self.shard(key);
            let shard = &mut *guard;
            let now = Instant::now();
            let claimed = || {
                let record = Record::InFlight {
                    owner,
                    fingerprint: *fingerprint,
                };
                Entry::new(key, record, expiry_after(now, lease))
            };
            // One lookup: a live record answers, an expired one is taken
            // over in place, an absent key is added.
            match record_mut(&mut shard.records, hash, key) {
                Some(entry) if entry.live(now) => (
                    entry.record.clone(),
                    entry.expires_at.saturating_duration_since(now),
                ),
                Some(expired) => {
                    replace(&mut shard.bytes, expired, claimed());
                    return Ok(Claim::Acquired(owner));
                }
                None => {
                    #[cfg(all(test, idem_loom))]
                    if self.inner.bug == Some(interleavings::Bug::ClaimsAfterLooking) {
                        drop(guard);
                        let (mut again, hash) = self.shard(key);
                        again.insert(hash, key, claimed());
                        return Ok(Claim::Acquired(owner));
                    }
                    shard.insert(hash, key, claimed());
                    return Ok(Claim::Acquired(owner));
                }
            }
        };
        // Cloning a stored response happens outside the shard's lock.
        let (record, left) = found;
        Ok(record.claim_answer(fingerprint, left))
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error> {
        self.transition(key, owner, |fingerprint, now| {
            let record = Record::Completed {
                fingerprint: *fingerprint,
                outcome: outcome.clone(),
            };
            Some(Entry::new(key.as_str(), record, expiry_after(now, ttl)))
        })
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        self.transition(key, owner, |_, _| None)
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        let key = key.as_str();
        let (mut shard, hash) = self.shard(key);
        let now = Instant::now();
        let entry = held(&mut shard.records, hash, key, owner, now)?;
        // Same record, same weight: only the expiry moves.
        entry.expires_at = expiry_after(now, lease);
        Ok(())
    }
}

#[cfg(all(test, not(idem_loom)))]
mod tests;

#[cfg(all(test, idem_loom))]
mod interleavings;

#[cfg(all(test, feature = "test-util", not(idem_loom)))]
mod conformance {
    crate::store_conformance_tests!(async { Some(super::MemoryStore::new()) });
}
