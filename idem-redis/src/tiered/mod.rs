//! The three-layer defense as one store: the Redis gate in front, the SQL store as
//! the source of truth behind, and optionally a small in-process cache of
//! completed records.
//!
//! - A duplicate of a completed request is answered by Redis alone: one
//!   command, no SQL.
//! - A first request claims in Redis, then in SQL, and completes both; its
//!   lease is renewed in both, SQL's answer deciding.
//! - When SQL's unique index catches a duplicate that Redis let through (a
//!   key evicted, expired early or lost in a failover), that is counted as
//!   *fallback caught* and the gate is re-warmed with what SQL holds.
//! - Redis errors and timeouts degrade to SQL alone, still exactly-once, and
//!   are counted; after a few in a row a circuit breaker stops asking Redis,
//!   then lets one request probe it, and closes when it answers: Redis comes
//!   back without a restart, and no request waits on a dead Redis longer
//!   than the gate timeout.
//! - SQL errors are errors (the layer answers 503 and does not call the
//!   handler): the gate never decides that a request may run.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_redis::RedisStore;
//! use idem_sql::{PgStore, sqlx::PgPool};
//! use idem_redis::tiered::TieredStore;
//!
//! let truth = PgStore::new(PgPool::connect("postgres://localhost/app").await?);
//! truth.migrate().await?;
//! let redis = redis::Client::open("redis://127.0.0.1:6379")?;
//! let gate = RedisStore::new(redis.get_connection_manager().await?);
//! let store = TieredStore::builder(gate, truth)
//!     .gate_timeout(Duration::from_millis(50))
//!     .build();
//! # let _ = store; Ok(()) }
//! ```

mod breaker;
mod builder;
mod counters;
mod transactional;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionLike;

pub use breaker::BreakerState;
use breaker::{Breaker, Permit, Transition};
pub use builder::TieredStoreBuilder;
pub use counters::{TierCounters, TierStats};

use crate::RedisStore;
use idem_core::TransactionalStore;
use idem_core::{
    Claim, Duplicate, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken,
};

/// The Redis gate in front of a source of truth: see the [module docs](self).
pub struct TieredStore<C, T> {
    inner: Arc<Inner<C, T>>,
}

struct Inner<C, T> {
    gate: RedisStore<C>,
    truth: T,
    breaker: Breaker,
    gate_timeout: Duration,
    rewarm_ttl: Duration,
    cache: Option<moka::sync::Cache<String, Arc<(Fingerprint, Outcome)>>>,
    counters: Arc<TierCounters>,
}

impl<C, T> Clone for TieredStore<C, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C, T> fmt::Debug for TieredStore<C, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TieredStore")
            .field("breaker", &self.inner.breaker.current())
            .field("gate_timeout", &self.inner.gate_timeout)
            .field("counters", &self.inner.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// What the gate made of a claim.
enum GateStep {
    /// The gate (or the cache) answered: SQL is not asked.
    Answered(Duplicate),
    /// The gate claimed the key for us: SQL decides.
    Held,
    /// The gate's answer is not to be trusted (a mismatch), and it holds
    /// another claim's record, not ours: SQL alone decides.
    Skipped,
    /// The gate was skipped, failed or timed out: SQL alone decides, and
    /// our claim may have landed on the gate unseen (a `SET NX` applied
    /// whose reply was lost or came too late).
    Unknown,
}

impl<C, T> TieredStore<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    /// `gate` in front of `truth`, with the defaults of
    /// [`TieredStoreBuilder`]: its timeout and breaker, and no in-process
    /// cache.
    pub fn new(gate: RedisStore<C>, truth: T) -> Self {
        Self::builder(gate, truth).build()
    }

    /// A builder for `gate` in front of `truth`.
    pub fn builder(gate: RedisStore<C>, truth: T) -> TieredStoreBuilder<C, T> {
        TieredStoreBuilder::new(gate, truth)
    }

    /// The counters, to read or to export.
    pub fn counters(&self) -> Arc<TierCounters> {
        self.inner.counters.clone()
    }

    /// Where the breaker stands.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.current()
    }

    /// The gate.
    pub fn gate(&self) -> &RedisStore<C> {
        &self.inner.gate
    }

    /// The source of truth.
    pub fn truth(&self) -> &T {
        &self.inner.truth
    }

    /// Runs `op` on the gate if the breaker allows, within the timeout,
    /// accounting the outcome; `None` if the gate was skipped or failed.
    /// Dropped before `op` ends, it accounts nothing, and a probe it was
    /// running is handed to the next request (see [`Permit`]).
    async fn on_gate<R>(
        &self,
        op: impl Future<Output = Result<R, Error>>,
    ) -> Option<Result<R, Error>> {
        let inner = &self.inner;
        let permit = inner.breaker.allow(Instant::now())?;
        match tokio::time::timeout(inner.gate_timeout, op).await {
            Ok(Err(err)) if err.kind() == idem_core::ErrorKind::Unavailable => {
                self.gate_failed(permit, &err);
                None
            }
            Ok(result) => {
                if permit.success() == Transition::Recovered {
                    TierCounters::bump(
                        &inner.counters.breaker_recovered,
                        "idem_tier_breaker_recovered_total",
                    );
                    tracing::info!("Redis gate answering again; breaker closed");
                }
                Some(result)
            }
            Err(_) => {
                self.gate_failed(permit, &"timed out");
                None
            }
        }
    }

    fn gate_failed(&self, permit: Permit<'_>, why: &dyn fmt::Display) {
        let inner = &self.inner;
        if permit.failure(Instant::now()) == Transition::Opened {
            TierCounters::bump(
                &inner.counters.breaker_opened,
                "idem_tier_breaker_opened_total",
            );
            tracing::warn!(%why, "Redis gate failing; breaker open, SQL alone decides");
        } else {
            tracing::debug!(%why, "Redis gate failed; SQL alone decides");
        }
    }

    async fn through_gate(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> GateStep {
        let inner = &self.inner;
        let counters = &inner.counters;
        if let Some(hit) = inner.cache.as_ref().and_then(|c| c.get(key.as_str())) {
            TierCounters::bump(&counters.cache_hits, "idem_tier_cache_hits_total");
            return GateStep::Answered(if hit.0 == *fingerprint {
                Duplicate::Replay(hit.1.clone())
            } else {
                Duplicate::Mismatch
            });
        }
        match self
            .on_gate(inner.gate.claim(key, fingerprint, lease, owner))
            .await
        {
            Some(Ok(claim)) => {
                let Err(duplicate) = claim.acquired() else {
                    return GateStep::Held;
                };
                // The gate's record has another fingerprint. It may be an
                // attempt the truth refuses or rolled back (a key reused with
                // another body claims the gate when the first's gate record
                // is gone: expired, evicted, lost in a failover), so the
                // truth decides: a retry of a request it committed is
                // replayed, never refused. A reused key is rare; this costs
                // it one SQL round trip.
                if duplicate == Duplicate::Mismatch {
                    return GateStep::Skipped;
                }
                TierCounters::bump(
                    &counters.answered_by_gate,
                    "idem_tier_answered_by_gate_total",
                );
                if let (Some(cache), Duplicate::Replay(outcome)) = (&inner.cache, &duplicate) {
                    cache.insert(
                        key.as_str().to_owned(),
                        Arc::new((*fingerprint, outcome.clone())),
                    );
                }
                GateStep::Answered(duplicate)
            }
            // A record Redis holds but cannot decode: let SQL decide.
            Some(Err(_)) | None => {
                TierCounters::bump(&counters.degraded, "idem_tier_degraded_total");
                GateStep::Unknown
            }
        }
    }

    /// Releases our claim on the gate, if it is there, under our token (so
    /// never another's), when SQL did not give us the key. Left there, it
    /// would answer "in flight" to every duplicate for a lease, in place of
    /// SQL's replay, or of the run owed to a retry after SQL's error; and a
    /// claim whose gate command failed or timed out may have landed unseen.
    async fn take_back(&self, key: &IdempotencyKey, owner: &OwnerToken) {
        let _ = self.on_gate(self.inner.gate.release(key, owner)).await;
    }

    /// After SQL turned our claim away (`Some`, its answer) or failed
    /// (`None`): the gate brought in line with SQL ([`reconcile`](Self::reconcile))
    /// if it held our claim, or our claim taken back if it may hold it.
    async fn after_truth_refused(
        &self,
        gate: &GateStep,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        truth: Option<&Duplicate>,
    ) {
        match (gate, truth) {
            (GateStep::Held, Some(duplicate)) => self.reconcile(key, owner, duplicate).await,
            (GateStep::Held | GateStep::Unknown, _) => self.take_back(key, owner).await,
            (GateStep::Skipped | GateStep::Answered(_), _) => {}
        }
    }

    /// After SQL answered a claim the gate had let through: bring the gate
    /// in line with the truth, and count the catch if Redis had lost the
    /// key.
    ///
    /// Our claim on the gate being still ours is what tells a lost key
    /// from a race. Redis lost the key (eviction, failover, restart): our
    /// `SET NX` was the only claim there, it is still ours, and it is
    /// turned into the truth's answer under our owner token. A concurrent
    /// first attempt took the gate over while ours was on its way to SQL
    /// (it found no transaction holding the key and claimed it, see
    /// `transactional.rs`): the gate is no longer ours, nothing was lost,
    /// and the attempt that won completes the gate itself.
    ///
    /// SQL answering "in flight" is not counted: the attempt that holds the
    /// key there may have claimed it an instant ago and be about to take
    /// the gate over, so that answer cannot tell a lost key from that race.
    /// Our claim is released, under our token, either way.
    async fn reconcile(&self, key: &IdempotencyKey, owner: &OwnerToken, truth: &Duplicate) {
        let inner = &self.inner;
        let (aligned, answer) = match truth {
            Duplicate::Replay(outcome) => {
                let rewarm = inner.gate.complete(key, owner, outcome, inner.rewarm_ttl);
                (self.on_gate(rewarm).await, "replay")
            }
            Duplicate::Mismatch => (
                self.on_gate(inner.gate.release(key, owner)).await,
                "mismatch",
            ),
            Duplicate::InFlight { .. } => {
                let _ = self.on_gate(inner.gate.release(key, owner)).await;
                return;
            }
        };
        match aligned {
            Some(Ok(())) => {
                TierCounters::bump(
                    &inner.counters.fallback_caught,
                    "idem_tier_fallback_caught_total",
                );
                tracing::warn!(key = %key.redacted(), answer, "SQL caught a duplicate Redis let through (Redis had lost the key); the gate now follows SQL");
            }
            Some(Err(_)) => {
                tracing::debug!(key = %key.redacted(), "a concurrent attempt took the gate over; it completes the gate");
            }
            // Redis failed: the breaker counts it.
            None => {}
        }
    }
}

impl<C, T> IdempotencyStore for TieredStore<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, Error> {
        let gate = self.through_gate(key, fingerprint, lease, owner).await;
        if let GateStep::Answered(duplicate) = gate {
            return Ok(duplicate.into());
        }
        match self.inner.truth.claim(key, fingerprint, lease, owner).await {
            Ok(claim) => match claim.acquired() {
                Ok(owner) => Ok(Claim::Acquired(owner)),
                Err(duplicate) => {
                    self.after_truth_refused(&gate, key, &owner, Some(&duplicate))
                        .await;
                    Ok(duplicate.into())
                }
            },
            Err(err) => {
                self.after_truth_refused(&gate, key, &owner, None).await;
                Err(err)
            }
        }
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error> {
        if let Err(err) = self.inner.truth.complete(key, owner, outcome, ttl).await {
            // SQL may have completed all the same (its answer lost, and a
            // retry told the lease is lost, as the record is no longer in
            // flight): our gate record goes, so duplicates ask SQL rather
            // than being told "in flight" by it for the rest of the lease.
            self.take_back(key, owner).await;
            return Err(err);
        }
        // A gate without our claim (it was skipped) fills itself on the next
        // duplicate, from SQL.
        let _ = self
            .on_gate(self.inner.gate.complete(key, owner, outcome, ttl))
            .await;
        Ok(())
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        self.inner.truth.release(key, owner).await?;
        let _ = self.on_gate(self.inner.gate.release(key, owner)).await;
        Ok(())
    }

    /// Renews in the truth, whose answer is the answer, then in the gate. A
    /// gate that fails, or no longer holds the claim (it was skipped, or lost
    /// the record), degrades as elsewhere: SQL still knows the claim is in
    /// flight, and tells a duplicate the gate lets through.
    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        self.inner.truth.renew(key, owner, lease).await?;
        let _ = self.on_gate(self.inner.gate.renew(key, owner, lease)).await;
        Ok(())
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner.truth.transactional()?;
        Some(self)
    }
}
