//! Transactional mode behind the gate: the truth's transaction decides,
//! the gate follows it, and a gate record whose transaction died is taken
//! over.

use std::time::Duration;

use ::redis::aio::ConnectionLike;

use super::{GateStep, TierCounters, TieredStore};
use idem_core::{BoxFuture, OpenTransaction, TransactionalStore, TxClaim, TxHandle};
use idem_core::{
    Duplicate, Error, ErrorKind, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken,
};

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
    ) -> BoxFuture<'a, Result<TxClaim, Error>> {
        Box::pin(async move {
            let Some(truth) = self.inner.truth.transactional() else {
                return Err(Error::new(
                    ErrorKind::Config,
                    "the tiered store's source of truth has no transactions",
                ));
            };
            let gate = match self.through_gate(key, fingerprint, lease, owner).await {
                // A transactional claim lives exactly as long as its
                // transaction, and Redis cannot tell whether that still runs:
                // the truth can, without waiting.
                GateStep::Answered(Duplicate::InFlight { .. }) => {
                    return self
                        .past_gate_in_flight(truth, key, fingerprint, lease, owner)
                        .await;
                }
                GateStep::Answered(duplicate) => return Ok(TxClaim::Duplicate(duplicate)),
                gate => gate,
            };
            match truth
                .claim_in_transaction(key, fingerprint, lease, owner)
                .await
            {
                Ok(TxClaim::Open(tx)) => Ok(TxClaim::Open(Box::new(TieredTransaction {
                    tx: Some(tx),
                    store: self.clone(),
                    key: key.clone(),
                    owner,
                }))),
                Ok(TxClaim::Duplicate(duplicate)) => {
                    self.after_truth_refused(&gate, key, &owner, Some(&duplicate))
                        .await;
                    Ok(TxClaim::Duplicate(duplicate))
                }
                Err(err) => {
                    self.after_truth_refused(&gate, key, &owner, None).await;
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
    ) -> Result<TxClaim, Error> {
        let inner = &self.inner;
        match truth
            .claim_in_transaction(key, fingerprint, lease, owner)
            .await?
        {
            TxClaim::Open(tx) => {
                TierCounters::bump(
                    &inner.counters.orphans_freed,
                    "idem_tier_orphans_freed_total",
                );
                tracing::info!(key = %key.redacted(), "the gate held a claim no transaction holds (its owner died, or has not reached the database yet); taking the key over");
                let takeover = inner.gate.put_in_flight(key, fingerprint, owner, lease);
                let _ = self.on_gate(takeover).await;
                Ok(TxClaim::Open(Box::new(TieredTransaction {
                    tx: Some(tx),
                    store: self.clone(),
                    key: key.clone(),
                    owner,
                })))
            }
            TxClaim::Duplicate(Duplicate::Replay(outcome)) => {
                let rewarm = inner
                    .gate
                    .put_completed(key, fingerprint, &outcome, inner.rewarm_ttl);
                let _ = self.on_gate(rewarm).await;
                Ok(TxClaim::Duplicate(Duplicate::Replay(outcome)))
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
    tx: Option<Box<dyn OpenTransaction>>,
    store: TieredStore<C, T>,
    key: IdempotencyKey,
    owner: OwnerToken,
}

impl<C, T> OpenTransaction for TieredTransaction<C, T>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    T: IdempotencyStore,
{
    fn handle(&self) -> TxHandle {
        self.tx
            .as_ref()
            .expect("a transaction until it ends")
            .handle()
    }

    fn commit<'a>(
        mut self: Box<Self>,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let tx = self.tx.take().expect("a transaction until it ends");
            tx.commit(outcome, ttl).await?;
            // Committed: the truth holds the outcome, and the request is
            // answered without waiting for Redis. The gate is completed on a
            // task; until it is, a duplicate that meets the gate's in-flight
            // record asks the truth, which replays (and re-warms the gate),
            // as after a completion Redis failed or lost.
            let (store, key, owner) = (self.store.clone(), self.key.clone(), self.owner);
            let outcome = outcome.clone();
            let complete = async move {
                let gate = &store.inner.gate;
                let _ = store
                    .on_gate(gate.complete(&key, &owner, &outcome, ttl))
                    .await;
            };
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(complete)),
                Err(_) => complete.await,
            }
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
