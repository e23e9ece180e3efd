//! What the tiered store counts: answers by the gate, degraded claims,
//! duplicates SQL caught, the breaker, orphaned claims freed.

use std::sync::atomic::{AtomicU64, Ordering};

/// The tiered store's counters, shared and cheap to read. Each is also
/// reported through the `metrics` facade as `idem_tier_<name>_total`.
#[derive(Debug, Default)]
pub struct TierCounters {
    pub(super) answered_by_gate: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) degraded: AtomicU64,
    pub(super) fallback_caught: AtomicU64,
    pub(super) breaker_opened: AtomicU64,
    pub(super) breaker_recovered: AtomicU64,
    pub(super) orphans_freed: AtomicU64,
}

/// A reading of [`TierCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStats {
    /// Claims answered by Redis alone (replay, in flight, mismatch).
    pub answered_by_gate: u64,
    /// Claims answered by the in-process cache.
    pub cache_hits: u64,
    /// Claims that went to SQL without the gate: Redis failed, timed out or
    /// its breaker was open.
    pub degraded: u64,
    /// Duplicates of an answered request that Redis let through, because
    /// it had lost the key (eviction, failover, restart), and SQL's unique
    /// index caught (replayed, or refused as a mismatch). Not counted: a
    /// concurrent first attempt that overtook this one on its way to SQL
    /// (Redis lost nothing), and a duplicate SQL found still in flight
    /// (which cannot be told from that race).
    pub fallback_caught: u64,
    /// Times the breaker opened, a probe that failed (which opens it
    /// again) included: it can exceed `breaker_recovered` by more than one
    /// while the breaker is closed.
    pub breaker_opened: u64,
    /// Times a probe found Redis back and closed the breaker.
    pub breaker_recovered: u64,
    /// Transactional claims Redis called "in flight" while no transaction
    /// held the key in SQL, so the claim went ahead: the owner's
    /// transaction had ended without committing (a crashed process), or
    /// the owner had claimed the gate but not yet reached the database (a
    /// concurrent copy of the request; SQL then answers it as the
    /// duplicate).
    pub orphans_freed: u64,
}

impl TierCounters {
    /// The counters now.
    pub fn snapshot(&self) -> TierStats {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TierStats {
            answered_by_gate: read(&self.answered_by_gate),
            cache_hits: read(&self.cache_hits),
            degraded: read(&self.degraded),
            fallback_caught: read(&self.fallback_caught),
            breaker_opened: read(&self.breaker_opened),
            breaker_recovered: read(&self.breaker_recovered),
            orphans_freed: read(&self.orphans_freed),
        }
    }

    /// Counts one here and, as `name`, through the `metrics` facade.
    pub(super) fn bump(counter: &AtomicU64, name: &'static str) {
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(name).increment(1);
    }
}
