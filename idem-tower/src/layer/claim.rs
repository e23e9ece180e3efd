//! Claiming the key, in the store or in a database transaction, waiting out
//! a running first attempt if the route says so, and the claim then held as
//! one value whatever the mode: [`Claimed`].
//!
//! The store's answers are named here and nowhere else in the layer.

use std::future::Future;
use std::time::{Duration, Instant};

use idem_core::{Duplicate, Outcome, OwnerToken, expiry_after};
use idem_core::{DynStore, OpenTransaction, TransactionalStore, TxClaim};

use super::answer::Answer;
use super::future::MustFinish;
use super::guard::ClaimGuard;
use super::key::Target;
use super::layer::Settings;
use super::lease;
use crate::InFlightPolicy;
use crate::metrics::{self, RouteLabel};

/// A claim the request holds while its service runs: the layer's to keep
/// (finish) or let go (abort), the same way in either mode.
pub(super) enum Claimed {
    /// A claim in the store, held by its lease.
    Plain { guard: ClaimGuard, lease: Duration },
    /// An open database transaction holding the claim, which the handler
    /// writes in (ARCHITECTURE.md, "The three layers"). Dropped, it rolls
    /// back.
    Transaction(Box<dyn OpenTransaction>),
}

/// What one try at the key came to.
enum Tried {
    /// The key is ours in the store, under this owner token.
    Plain(OwnerToken),
    /// The key is ours in this open transaction.
    Transaction(Box<dyn OpenTransaction>),
    /// Another request has the key.
    Duplicate(Duplicate),
}

/// Claims the request's key: the claim, or the layer's answer (a duplicate,
/// an unavailable store, a transactional route whose store has no
/// transactions). Under [`InFlightPolicy::Wait`] a duplicate of a running first
/// attempt tries again until it can be answered otherwise, or the wait is
/// over, or its client (`attempt`) has gone.
pub(super) async fn claim(
    settings: &Settings,
    target: Target,
    route: &RouteLabel,
    attempt: &MustFinish,
) -> Result<Claimed, Answer> {
    let store = &settings.config().store;
    let transactions = match (settings.policy.transactional, store.transactional()) {
        (false, _) => None,
        (true, Some(transactions)) => Some(transactions),
        // Checked when the layer was built (IdempotencyLayer::transactional):
        // a 500 should it ever get here, never a panic.
        (true, None) => {
            return Err(Answer::Misconfigured(
                "the route is transactional and its store has no transactions: build the \
                 Idempotency handle on PgStore, MySqlStore, SqliteStore or a TieredStore in front of one"
                    .to_owned(),
            ));
        }
    };
    let started = Instant::now();
    let mut patience = Patience::new(settings.in_flight);
    let tried = loop {
        match try_once(&**store, transactions, &target, settings.lease).await {
            // No waiting for a client that has gone.
            Ok(Tried::Duplicate(Duplicate::InFlight { retry_after }))
                if !attempt.client_gone() && patience.wait(retry_after).await => {}
            tried => break tried,
        }
    };
    metrics::claim_latency(started.elapsed(), route);
    match tried? {
        Tried::Plain(owner) => {
            tracing::debug!("claimed; calling the service");
            let guard = ClaimGuard::new(store.clone(), target.key, owner);
            #[cfg(all(test, idem_loom))]
            let guard = guard.with_bug(settings.bug);
            Ok(Claimed::Plain {
                guard,
                lease: settings.lease,
            })
        }
        Tried::Transaction(transaction) => {
            tracing::debug!("claimed in a transaction; calling the service");
            Ok(Claimed::Transaction(transaction))
        }
        Tried::Duplicate(duplicate) => {
            settings.config().duplicated.record(target.key.composite());
            Err(Answer::Duplicate(duplicate))
        }
    }
}

/// One try at the key: in the store, or in a new transaction on a
/// transactional route.
async fn try_once(
    store: &dyn DynStore,
    transactions: Option<&dyn TransactionalStore>,
    target: &Target,
    lease: Duration,
) -> Result<Tried, Answer> {
    let (key, fingerprint, owner) = (&target.key, &target.fingerprint, OwnerToken::generate());
    match transactions {
        Some(transactions) => match transactions
            .claim_in_transaction(key, fingerprint, lease, owner)
            .await
        {
            Ok(TxClaim::Open(transaction)) => Ok(Tried::Transaction(transaction)),
            Ok(TxClaim::Duplicate(duplicate)) => Ok(Tried::Duplicate(duplicate)),
            Err(err) => Err(Answer::Unavailable(err)),
        },
        None => match store.claim(key, fingerprint, lease, owner).await {
            Ok(claim) => Ok(claim.acquired().map_or_else(Tried::Duplicate, Tried::Plain)),
            Err(err) => Err(Answer::Unavailable(err)),
        },
    }
}

impl Claimed {
    /// Lends the claim's transaction to the handler: its handle goes in the
    /// request's extensions, where the `Tx` extractor finds it. A plain
    /// claim has nothing to lend.
    pub(super) fn lend(&self, extensions: &mut http::Extensions) {
        if let Self::Transaction(transaction) = self {
            extensions.insert(transaction.handle());
        }
    }

    /// Runs the service's `call` while the claim is held: a plain claim's
    /// lease renewed meanwhile ([`lease::renewing`]); a transaction holds
    /// the key for as long as it stays open.
    /// (Mutably borrowed: the future stays `Send` with a transaction that is
    /// not `Sync`.)
    pub(super) async fn hold<F: Future>(&mut self, call: F, route: &RouteLabel) -> F::Output {
        match self {
            Self::Plain { guard, lease } => lease::renewing(guard, *lease, route, call).await,
            Self::Transaction(_) => call.await,
        }
    }

    /// Keeps `outcome` for `ttl`: completes a plain claim, commits a
    /// transaction with the handler's writes. A plain claim's failures are
    /// retried for up to a lease, logged and counted, and its response
    /// stands (the effect happened, and its key stays blocked meanwhile:
    /// [`lease::complete`]); a transaction that did not
    /// commit kept nothing, the handler's writes included: the error, and
    /// the client must not see its success.
    pub(super) async fn finish(
        self,
        outcome: &Outcome,
        ttl: Duration,
        route: &RouteLabel,
    ) -> Result<(), idem_core::Error> {
        match self {
            Self::Plain { guard, lease } => {
                lease::complete(guard, outcome, ttl, lease, route).await;
                Ok(())
            }
            Self::Transaction(transaction) => {
                transaction.commit(outcome, ttl).await?;
                tracing::debug!("committed the handler's writes with the outcome");
                Ok(())
            }
        }
    }

    /// Lets the key go, for `reason`, so the client may retry at once:
    /// releases a plain claim, rolls a transaction back with the handler's
    /// writes.
    pub(super) async fn abort(self, reason: &'static str) {
        match self {
            Self::Plain { guard, .. } => guard.release(reason).await,
            Self::Transaction(transaction) => match transaction.rollback().await {
                Ok(()) => tracing::info!(reason, "rolled back the handler's writes and the claim"),
                // Logged and counted by the store, which kept the key.
                Err(err) if err.kind() == idem_core::ErrorKind::TransactionEnded => {
                    tracing::debug!(reason, "the handler had ended the transaction");
                }
                // The transaction ends with its connection either way.
                Err(err) => tracing::warn!(reason, error = %err, "rollback failed"),
            },
        }
    }
}

/// How long a duplicate may still wait for the first attempt to finish,
/// under [`InFlightPolicy::Wait`]. Waiting holds nothing: no connection, no lock.
struct Patience {
    deadline: Option<Instant>,
    pause: Duration,
}

impl Patience {
    fn new(in_flight: InFlightPolicy) -> Self {
        let deadline = match in_flight {
            InFlightPolicy::Reject => None,
            InFlightPolicy::Wait(wait) => Some(expiry_after(Instant::now(), wait)),
        };
        Self {
            deadline,
            pause: Duration::from_millis(10),
        }
    }

    /// Sleeps before the next try (backing off, never past `retry_after`
    /// or the deadline); `false` if there is no time left to wait.
    async fn wait(&mut self, retry_after: Duration) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let nap = self
            .pause
            .min(left)
            .min(retry_after)
            .max(Duration::from_millis(1));
        tokio::time::sleep(nap).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(250));
        true
    }
}
