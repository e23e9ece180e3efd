//! An in-process store on a moka cache.

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::future::Cache;
use moka::ops::compute::Op;

use crate::{
    Claim, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken, Record,
};

/// The default capacity: 64 MiB of keys and stored responses.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Records in this process's memory, on a [moka] cache with per-entry expiry
/// and a capacity bound in bytes.
///
/// Right for tests, development and a single-instance service that accepts
/// losing its records on restart. It is not shared between processes, and
/// when full it evicts (least valuable first), which forgets keys early: give
/// it room for a retention period's worth of traffic, or use a SQL store.
///
/// ```
/// use idem_core::MemoryStore;
///
/// let store = MemoryStore::with_max_bytes(16 * 1024 * 1024);
/// # let _ = store;
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    records: Cache<Arc<str>, Entry>,
}

#[derive(Clone)]
struct Entry {
    record: Arc<Record>,
    expires_at: Instant,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.expires_at > now
    }
}

struct ExpiresAt;

impl Expiry<Arc<str>, Entry> for ExpiresAt {
    fn expire_after_create(&self, _: &Arc<str>, entry: &Entry, now: Instant) -> Option<Duration> {
        Some(entry.expires_at.saturating_duration_since(now))
    }

    fn expire_after_update(
        &self,
        _: &Arc<str>,
        entry: &Entry,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.expires_at.saturating_duration_since(now))
    }
}

impl MemoryStore {
    /// A store holding up to [`DEFAULT_MAX_BYTES`].
    pub fn new() -> Self {
        Self::with_max_bytes(DEFAULT_MAX_BYTES)
    }

    /// A store holding up to about `max_bytes` of keys and responses.
    pub fn with_max_bytes(max_bytes: u64) -> Self {
        let records = Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|key: &Arc<str>, entry: &Entry| {
                let response = match &*entry.record {
                    Record::Completed {
                        outcome: Outcome::Response(r),
                        ..
                    } => r.size(),
                    _ => 0,
                };
                u32::try_from(key.len() + response + 96).unwrap_or(u32::MAX)
            })
            .expire_after(ExpiresAt)
            .build();
        Self { records }
    }

    /// Runs `decide` on the live entry of `key` (expired ones count as
    /// absent) as one atomic step, and returns what it returned beside the op.
    async fn compute<T>(
        &self,
        key: &IdempotencyKey,
        decide: impl FnOnce(Option<&Entry>, Instant) -> (Op<Entry>, T),
    ) -> T {
        let mut answer = None;
        self.records
            .entry(Arc::from(key.as_str()))
            .and_compute_with(|current| {
                let now = Instant::now();
                let live = current.as_ref().map(|e| e.value()).filter(|e| e.live(now));
                let (op, value) = decide(live, now);
                answer = Some(value);
                std::future::ready(op)
            })
            .await;
        answer.expect("and_compute_with always runs its closure")
    }

    /// Applies `next` to the record if `owner` holds it in flight.
    async fn transition(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        next: impl FnOnce(&Fingerprint, Instant) -> Op<Entry>,
    ) -> Result<(), Error> {
        self.compute(key, |live, now| match live.map(|e| &*e.record) {
            Some(Record::InFlight {
                owner: holder,
                fingerprint,
            }) if holder == owner => (next(fingerprint, now), Ok(())),
            _ => (Op::Nop, Err(Error::lease_lost())),
        })
        .await
    }
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
        // A completed record only ever changes by expiring, so a live one can
        // answer its duplicates from a plain read, without the atomic
        // compute that claiming a free key needs.
        if let Some(entry) = self.records.get(key.as_str()).await {
            let now = Instant::now();
            if entry.live(now) && matches!(*entry.record, Record::Completed { .. }) {
                return Ok(entry.record.claim_answer(fingerprint, Duration::ZERO));
            }
        }
        Ok(self
            .compute(key, |live, now| match live {
                Some(entry) => (
                    Op::Nop,
                    entry
                        .record
                        .claim_answer(fingerprint, entry.expires_at.saturating_duration_since(now)),
                ),
                None => {
                    let entry = Entry {
                        record: Arc::new(Record::InFlight {
                            owner,
                            fingerprint: *fingerprint,
                        }),
                        expires_at: now + lease,
                    };
                    (Op::Put(entry), Claim::Acquired(owner))
                }
            })
            .await)
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        retention: Duration,
    ) -> Result<(), Error> {
        self.transition(key, owner, |fingerprint, now| {
            Op::Put(Entry {
                record: Arc::new(Record::Completed {
                    fingerprint: *fingerprint,
                    outcome: outcome.clone(),
                }),
                expires_at: now + retention,
            })
        })
        .await
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        self.transition(key, owner, |_, _| Op::Remove).await
    }
}

#[cfg(all(test, feature = "test-util"))]
mod conformance {
    crate::store_conformance_tests!(async { Some(super::MemoryStore::new()) });
}
