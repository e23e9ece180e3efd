//! A plain (non-transactional) claim's lease: renewed while the service
//! runs, then completed with the outcome (ARCHITECTURE.md, "Records" and
//! "The three layers").

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{Either, select};
use idem_core::{ErrorKind, Outcome};

use super::guard::ClaimGuard;
use crate::metrics::{self, Renewal, RouteLabel};

/// How often a completion that failed on a store error is tried in all.
const COMPLETE_ATTEMPTS: u32 = 3;

/// Runs `call` while renewing the claim's lease every third of it, so that
/// a handler may run for many leases and a claim whose process died still
/// frees within about one. The renewals are polled in the same future as
/// the handler, not spawned: they stop when it returns or is dropped, and a
/// handler that finishes in its first poll never starts a timer.
pub(super) async fn renewing<F: Future>(
    guard: &ClaimGuard,
    lease: Duration,
    route: &RouteLabel,
    call: F,
) -> F::Output {
    let call = pin!(call);
    let heartbeat = pin!(heartbeat(guard, lease, route));
    match select(call, heartbeat).await {
        Either::Left((output, _)) => output,
        // The lease was lost: nothing left to renew.
        Either::Right(((), call)) => call.await,
    }
}

/// Renews the lease every third of it, on one timer, until the lease is
/// lost. A renewal that fails is logged and counted, and the next one is
/// tried a third of a lease later; one that has not answered by then is
/// given up and counted as failed, so a stalled store cannot hold the
/// renewals back. Returns once the store says the claim is no longer ours.
async fn heartbeat(guard: &ClaimGuard, lease: Duration, route: &RouteLabel) {
    if tokio::runtime::Handle::try_current().is_err() {
        tracing::warn!(
            "no tokio runtime to time lease renewals; the claim lives by its first lease only"
        );
        return std::future::pending().await;
    }
    // Bounded, so that a lease meant as "forever" cannot overflow a deadline.
    let every = (lease / 3).clamp(Duration::from_millis(1), Duration::from_secs(86_400));
    let mut tick = pin!(tokio::time::sleep(every));
    loop {
        tick.as_mut().await;
        // The next tick is also this renewal's deadline.
        tick.as_mut().reset(tokio::time::Instant::now() + every);
        let renewal = guard.store().renew(guard.key(), guard.owner(), lease);
        match select(renewal, tick.as_mut()).await {
            Either::Left((Ok(()), _)) => metrics::renewal(Renewal::Ok, route),
            Either::Left((Err(err), _)) if err.kind() == ErrorKind::LeaseLost => {
                metrics::renewal(Renewal::Lost, route);
                tracing::error!(
                    ?lease,
                    "idempotency lease lost while the handler runs: another attempt may take \
                     the key over and run the effect again, and this attempt's outcome will not \
                     be stored"
                );
                return;
            }
            Either::Left((Err(err), _)) => {
                metrics::renewal(Renewal::Failed, route);
                tracing::warn!(error = %err, ?lease, "could not renew the idempotency lease; trying again");
            }
            Either::Right(((), _)) => {
                metrics::renewal(Renewal::Failed, route);
                tracing::warn!(
                    ?lease,
                    "renewing the idempotency lease timed out; trying again"
                );
                // Due already: the next renewal starts at once.
                tick.as_mut().reset(tokio::time::Instant::now());
            }
        }
    }
}

/// Stores the outcome, retrying a store error, and disarms the guard. On
/// failure the key stays claimed until its lease ends, which blocks
/// duplicates for that long; releasing instead would let a retry run the
/// effect a second time.
pub(super) async fn complete(guard: ClaimGuard, outcome: &Outcome, ttl: Duration) {
    for attempt in 1..=COMPLETE_ATTEMPTS {
        let err = match guard
            .store()
            .complete(guard.key(), guard.owner(), outcome, ttl)
            .await
        {
            Ok(()) => {
                tracing::debug!("completed");
                break;
            }
            Err(err) => err,
        };
        if err.kind() == ErrorKind::LeaseLost {
            tracing::error!(
                "the lease ran out before the handler finished (its renewals failed, or could not \
                 run: a handler that blocks its thread starves them) and another attempt took \
                 the key; this outcome is not stored"
            );
            break;
        }
        if attempt == COMPLETE_ATTEMPTS {
            tracing::error!(error = %err, "could not store the outcome; the key stays blocked until its lease ends");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
    }
    guard.defuse();
}
