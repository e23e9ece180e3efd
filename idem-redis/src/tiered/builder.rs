//! Configuring a tiered store: the gate's timeout and breaker, re-warming
//! and the in-process cache, fixed when it is built.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionLike;

use super::breaker::Breaker;
use super::{Inner, TieredStore};
use crate::RedisStore;
use idem_core::IdempotencyStore;

/// Configures a [`TieredStore`]; made by [`TieredStore::builder`].
#[must_use]
pub struct TieredStoreBuilder<C, T> {
    gate: RedisStore<C>,
    truth: T,
    gate_timeout: Duration,
    breaker: (u32, Duration),
    rewarm_ttl: Duration,
    cache: Option<(u64, Duration)>,
}

impl<C, T> std::fmt::Debug for TieredStoreBuilder<C, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredStoreBuilder")
            .field("gate_timeout", &self.gate_timeout)
            .field("breaker", &self.breaker)
            .field("rewarm_ttl", &self.rewarm_ttl)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl<C, T> TieredStoreBuilder<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    /// How long a request waits on the gate before going to SQL alone.
    pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_millis(100);
    /// Consecutive gate failures that open the breaker.
    pub const DEFAULT_BREAKER_THRESHOLD: u32 = 3;
    /// How long the breaker stays open before a probe.
    pub const DEFAULT_BREAKER_PAUSE: Duration = Duration::from_secs(1);
    /// How long a record copied back into Redis from SQL stays there.
    pub const DEFAULT_REWARM_TTL: Duration = Duration::from_secs(60 * 60);

    pub(super) fn new(gate: RedisStore<C>, truth: T) -> Self {
        Self {
            gate,
            truth,
            gate_timeout: Self::DEFAULT_GATE_TIMEOUT,
            breaker: (Self::DEFAULT_BREAKER_THRESHOLD, Self::DEFAULT_BREAKER_PAUSE),
            rewarm_ttl: Self::DEFAULT_REWARM_TTL,
            cache: None,
        }
    }

    /// The longest a request waits on Redis
    /// ([`DEFAULT_GATE_TIMEOUT`](Self::DEFAULT_GATE_TIMEOUT), 100 ms).
    pub fn gate_timeout(mut self, timeout: Duration) -> Self {
        self.gate_timeout = timeout;
        self
    }

    /// Open the breaker after `threshold` consecutive gate failures, and
    /// probe again after `pause` (3 failures, 1 s).
    pub fn breaker(mut self, threshold: u32, pause: Duration) -> Self {
        self.breaker = (threshold, pause);
        self
    }

    /// How long a record copied from SQL back into Redis stays there
    /// ([`DEFAULT_REWARM_TTL`](Self::DEFAULT_REWARM_TTL), 1 hour). The
    /// copy is replayed from Redis for this long even when SQL's record
    /// expires sooner (SQL does not say how long its record has left): keep
    /// it at or under the shortest `ttl` of the routes behind the store, or
    /// a route with a 5-minute `ttl` replays a re-warmed response for up to
    /// this long.
    pub fn rewarm_ttl(mut self, ttl: Duration) -> Self {
        self.rewarm_ttl = ttl;
        self
    }

    /// Keeps up to `entries` completed records in this process for
    /// `time_to_live`, answering their duplicates without a network trip
    /// (none by default). Keep it well under the records' `ttl`: a cached
    /// record is replayed until it expires here, whatever the stores hold.
    pub fn cache(mut self, entries: u64, time_to_live: Duration) -> Self {
        self.cache = Some((entries, time_to_live));
        self
    }

    /// The store.
    pub fn build(self) -> TieredStore<C, T> {
        let cache = self.cache.map(|(entries, time_to_live)| {
            moka::sync::Cache::builder()
                .max_capacity(entries)
                .time_to_live(time_to_live)
                .build()
        });
        TieredStore {
            inner: Arc::new(Inner {
                gate: self.gate,
                truth: self.truth,
                breaker: Breaker::new(self.breaker.0, self.breaker.1),
                gate_timeout: self.gate_timeout,
                rewarm_ttl: self.rewarm_ttl,
                cache,
                counters: Arc::default(),
            }),
        }
    }
}
