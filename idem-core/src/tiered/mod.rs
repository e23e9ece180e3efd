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
//! # #[cfg(feature = "postgres")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_core::redis::RedisStore;
//! use idem_core::sql::{PgStore, sqlx::PgPool};
//! use idem_core::tiered::TieredStore;
//!
//! let truth = PgStore::new(PgPool::connect("postgres://localhost/app").await?);
//! truth.migrate().await?;
//! let redis = redis::Client::open("redis://127.0.0.1:6379")?;
//! let gate = RedisStore::new(redis.get_connection_manager().await?);
//! let store = TieredStore::new(gate, truth).gate_timeout(Duration::from_millis(50));
//! # let _ = store; Ok(()) }
//! ```

mod breaker;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionLike;

pub use breaker::BreakerState;
use breaker::{Breaker, Transition};

use crate::redis::RedisStore;
use crate::transaction::{BoxFuture, ClaimTransaction, TransactionalClaim, TransactionalStore};
use crate::{Claim, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};

/// How long a request waits on the gate before going to SQL alone.
pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_millis(100);
/// Consecutive gate failures that open the breaker.
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 3;
/// How long the breaker stays open before a probe.
pub const DEFAULT_BREAKER_PAUSE: Duration = Duration::from_secs(1);
/// How long a record copied back into Redis from SQL stays there.
pub const DEFAULT_REWARM_TTL: Duration = Duration::from_secs(60 * 60);

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

/// The tiered store's counters, shared and cheap to read. Each is also
/// reported through the `metrics` facade as `idem_tier_<name>_total`.
#[derive(Debug, Default)]
pub struct TierCounters {
    answered_by_gate: AtomicU64,
    cache_hits: AtomicU64,
    degraded: AtomicU64,
    fallback_caught: AtomicU64,
    breaker_opened: AtomicU64,
    breaker_recovered: AtomicU64,
    orphans_freed: AtomicU64,
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
    /// Duplicates that Redis let through and SQL's unique index caught.
    pub fallback_caught: u64,
    /// Times the breaker opened.
    pub breaker_opened: u64,
    /// Times a probe found Redis back and closed the breaker.
    pub breaker_recovered: u64,
    /// Transactional claims Redis called "in flight" whose owner's
    /// transaction had ended without committing (a crashed process): SQL
    /// found the key free, and the claim went ahead.
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
    fn bump(counter: &AtomicU64, name: &'static str) {
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(name).increment(1);
    }
}

/// What the gate made of a claim.
enum GateStep {
    /// The gate (or the cache) answered: SQL is not asked.
    Answered(Claim),
    /// The gate claimed the key for us: SQL decides.
    Held,
    /// The gate was not usable: SQL alone decides.
    Skipped,
}

impl<C, T> TieredStore<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    /// `gate` in front of `truth`, with the default timeout and breaker and
    /// no in-process cache.
    pub fn new(gate: RedisStore<C>, truth: T) -> Self {
        Self {
            inner: Arc::new(Inner {
                gate,
                truth,
                breaker: Breaker::new(DEFAULT_BREAKER_THRESHOLD, DEFAULT_BREAKER_PAUSE),
                gate_timeout: DEFAULT_GATE_TIMEOUT,
                rewarm_ttl: DEFAULT_REWARM_TTL,
                cache: None,
                counters: Arc::default(),
            }),
        }
    }

    fn configure(self, change: impl FnOnce(&mut Inner<C, T>)) -> Self {
        let mut inner =
            Arc::into_inner(self.inner).expect("configure a TieredStore before cloning it");
        change(&mut inner);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The longest a request waits on Redis ([`DEFAULT_GATE_TIMEOUT`]).
    ///
    /// # Panics
    ///
    /// If the store was already cloned: configure it first.
    pub fn gate_timeout(self, timeout: Duration) -> Self {
        self.configure(|i| i.gate_timeout = timeout)
    }

    /// Open the breaker after `threshold` consecutive gate failures, and probe
    /// again after `pause` ([`DEFAULT_BREAKER_THRESHOLD`],
    /// [`DEFAULT_BREAKER_PAUSE`]).
    ///
    /// # Panics
    ///
    /// If the store was already cloned: configure it first.
    pub fn breaker(self, threshold: u32, pause: Duration) -> Self {
        self.configure(|i| i.breaker = Breaker::new(threshold, pause))
    }

    /// How long a record copied from SQL back into Redis stays there
    /// ([`DEFAULT_REWARM_TTL`]).
    ///
    /// # Panics
    ///
    /// If the store was already cloned: configure it first.
    pub fn rewarm_ttl(self, ttl: Duration) -> Self {
        self.configure(|i| i.rewarm_ttl = ttl)
    }

    /// Keeps up to `entries` completed records in this process for `ttl`,
    /// answering their duplicates without a network trip. Keep `ttl` well
    /// under your retention: a cached record is replayed until it expires
    /// here, whatever the stores hold.
    ///
    /// # Panics
    ///
    /// If the store was already cloned: configure it first.
    pub fn cache(self, entries: u64, ttl: Duration) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(entries)
            .time_to_live(ttl)
            .build();
        self.configure(|i| i.cache = Some(cache))
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
    async fn on_gate<R>(
        &self,
        op: impl Future<Output = Result<R, Error>>,
    ) -> Option<Result<R, Error>> {
        let inner = &self.inner;
        if !inner.breaker.allow(Instant::now()) {
            return None;
        }
        match tokio::time::timeout(inner.gate_timeout, op).await {
            Ok(Err(err)) if err.kind() == crate::ErrorKind::Unavailable => {
                self.gate_failed(&err);
                None
            }
            Ok(result) => {
                if inner.breaker.success() == Transition::Recovered {
                    TierCounters::bump(
                        &inner.counters.breaker_recovered,
                        "idem_tier_breaker_recovered_total",
                    );
                    tracing::info!("Redis gate answering again; breaker closed");
                }
                Some(result)
            }
            Err(_) => {
                self.gate_failed(&"timed out");
                None
            }
        }
    }

    fn gate_failed(&self, why: &dyn fmt::Display) {
        let inner = &self.inner;
        if inner.breaker.failure(Instant::now()) == Transition::Opened {
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
                Claim::Replay(hit.1.clone())
            } else {
                Claim::Mismatch
            });
        }
        match self
            .on_gate(inner.gate.claim(key, fingerprint, lease, owner))
            .await
        {
            Some(Ok(Claim::Acquired(_))) => GateStep::Held,
            Some(Ok(claim)) => {
                TierCounters::bump(
                    &counters.answered_by_gate,
                    "idem_tier_answered_by_gate_total",
                );
                if let (Some(cache), Claim::Replay(outcome)) = (&inner.cache, &claim) {
                    cache.insert(
                        key.as_str().to_owned(),
                        Arc::new((*fingerprint, outcome.clone())),
                    );
                }
                GateStep::Answered(claim)
            }
            // A record Redis holds but cannot decode: let SQL decide.
            Some(Err(_)) | None => {
                TierCounters::bump(&counters.degraded, "idem_tier_degraded_total");
                GateStep::Skipped
            }
        }
    }

    /// After SQL answered a claim the gate had let through: count the catch
    /// and bring the gate in line with the truth.
    async fn reconcile(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        owner: &OwnerToken,
        truth: &Claim,
    ) {
        let inner = &self.inner;
        match truth {
            Claim::Acquired(_) => {}
            Claim::Replay(outcome) => {
                TierCounters::bump(
                    &inner.counters.fallback_caught,
                    "idem_tier_fallback_caught_total",
                );
                tracing::warn!(key = %key.redacted(), "SQL caught a duplicate Redis let through; re-warming the gate");
                let rewarm = inner
                    .gate
                    .put_completed(key, fingerprint, outcome, inner.rewarm_ttl);
                let _ = self.on_gate(rewarm).await;
            }
            Claim::InFlight { .. } | Claim::Mismatch => {
                TierCounters::bump(
                    &inner.counters.fallback_caught,
                    "idem_tier_fallback_caught_total",
                );
                let _ = self.on_gate(inner.gate.release(key, owner)).await;
            }
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
        let held = match self.through_gate(key, fingerprint, lease, owner).await {
            GateStep::Answered(claim) => return Ok(claim),
            GateStep::Held => true,
            GateStep::Skipped => false,
        };
        let truth = self.inner.truth.claim(key, fingerprint, lease, owner).await;
        match &truth {
            Ok(claim) if held => self.reconcile(key, fingerprint, &owner, claim).await,
            Err(_) if held => {
                let _ = self.on_gate(self.inner.gate.release(key, &owner)).await;
            }
            _ => {}
        }
        truth
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        retention: Duration,
    ) -> Result<(), Error> {
        self.inner
            .truth
            .complete(key, owner, outcome, retention)
            .await?;
        // A gate without our claim (it was skipped) fills itself on the next
        // duplicate, from SQL.
        let _ = self
            .on_gate(self.inner.gate.complete(key, owner, outcome, retention))
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

impl<C, T> TransactionalStore for TieredStore<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    fn claim_in_transaction<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<TransactionalClaim, Error>> {
        Box::pin(async move {
            let Some(truth) = self.inner.truth.transactional() else {
                return Err(Error::new(
                    crate::ErrorKind::Config,
                    "the tiered store's source of truth has no transactions",
                ));
            };
            let held = match self.through_gate(key, fingerprint, lease, owner).await {
                // A transactional claim lives exactly as long as its
                // transaction, and Redis cannot tell whether that still runs:
                // the truth can, without waiting.
                GateStep::Answered(Claim::InFlight { .. }) => {
                    return self
                        .past_gate_in_flight(truth, key, fingerprint, lease, owner)
                        .await;
                }
                GateStep::Answered(claim) => return Ok(TransactionalClaim::Answered(claim)),
                GateStep::Held => true,
                GateStep::Skipped => false,
            };
            match truth
                .claim_in_transaction(key, fingerprint, lease, owner)
                .await
            {
                Ok(TransactionalClaim::Acquired(tx)) => {
                    Ok(TransactionalClaim::Acquired(Box::new(TieredTransaction {
                        tx: Some(tx),
                        store: self.clone(),
                        key: key.clone(),
                        owner,
                    })))
                }
                Ok(TransactionalClaim::Answered(claim)) => {
                    if held {
                        self.reconcile(key, fingerprint, &owner, &claim).await;
                    }
                    Ok(TransactionalClaim::Answered(claim))
                }
                Err(err) => {
                    if held {
                        let _ = self.on_gate(self.inner.gate.release(key, &owner)).await;
                    }
                    Err(err)
                }
            }
        })
    }
}

impl<C, T> TieredStore<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    /// Redis holds the key in flight for a transactional claim: asks the
    /// truth whether a transaction still holds it. A live one answers "in
    /// flight" (the truth learns it without waiting); none means the owner
    /// died with its transaction rolled back, so the claim goes ahead and
    /// the gate's orphaned record is replaced by ours.
    async fn past_gate_in_flight(
        &self,
        truth: &dyn TransactionalStore,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<TransactionalClaim, Error> {
        let inner = &self.inner;
        match truth
            .claim_in_transaction(key, fingerprint, lease, owner)
            .await?
        {
            TransactionalClaim::Acquired(tx) => {
                TierCounters::bump(
                    &inner.counters.orphans_freed,
                    "idem_tier_orphans_freed_total",
                );
                tracing::warn!(key = %key.redacted(), "the gate held a claim whose transaction had ended; taking the key over");
                let _ = self.on_gate(inner.gate.forget(key)).await;
                let _ = self
                    .on_gate(inner.gate.claim(key, fingerprint, lease, owner))
                    .await;
                Ok(TransactionalClaim::Acquired(Box::new(TieredTransaction {
                    tx: Some(tx),
                    store: self.clone(),
                    key: key.clone(),
                    owner,
                })))
            }
            TransactionalClaim::Answered(Claim::Replay(outcome)) => {
                let rewarm = inner
                    .gate
                    .put_completed(key, fingerprint, &outcome, inner.rewarm_ttl);
                let _ = self.on_gate(rewarm).await;
                Ok(TransactionalClaim::Answered(Claim::Replay(outcome)))
            }
            answered => Ok(answered),
        }
    }
}

/// The truth's transaction, with the gate brought along after it.
struct TieredTransaction<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    tx: Option<Box<dyn ClaimTransaction>>,
    store: TieredStore<C, T>,
    key: IdempotencyKey,
    owner: OwnerToken,
}

impl<C, T> ClaimTransaction for TieredTransaction<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    fn attach(&self, extensions: &mut http::Extensions) {
        if let Some(tx) = &self.tx {
            tx.attach(extensions);
        }
    }

    fn commit<'a>(
        mut self: Box<Self>,
        outcome: &'a Outcome,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let tx = self.tx.take().expect("a transaction until it ends");
            tx.commit(outcome, retention).await?;
            let gate = &self.store.inner.gate;
            let _ = self
                .store
                .on_gate(gate.complete(&self.key, &self.owner, outcome, retention))
                .await;
            Ok(())
        })
    }

    fn rollback(mut self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            let tx = self.tx.take().expect("a transaction until it ends");
            let result = tx.rollback().await;
            let gate = &self.store.inner.gate;
            let _ = self
                .store
                .on_gate(gate.release(&self.key, &self.owner))
                .await;
            result
        })
    }
}

impl<C, T> Drop for TieredTransaction<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    fn drop(&mut self) {
        // Dropped unfinished (a panic, a cancelled request): the truth rolls
        // back with its transaction; free the gate too, on a task, so a retry
        // is not told "in flight" until the lease ends.
        if self.tx.is_none() {
            return;
        }
        let (store, key, owner) = (self.store.clone(), self.key.clone(), self.owner);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = store.on_gate(store.inner.gate.release(&key, &owner)).await;
            });
        }
    }
}
