//! A plain (non-transactional) claim's lease: renewed while the service
//! runs, then completed with the outcome (ARCHITECTURE.md, "Records" and
//! "The three layers").

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{Either, select};
use idem_core::{ErrorKind, Outcome, expiry_after};

use super::guard::ClaimGuard;
use super::task;
use crate::metrics::{self, Completion, Renewal, RouteLabel};

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

/// Stores the outcome, retrying a store error, and disarms the guard.
///
/// A completion that fails leaves the handler's effect without its record:
/// the key stays claimed until its lease ends (releasing it would let a
/// retry run the effect again), and once it has ended a retry runs the
/// handler a second time. So a store error is retried with the same owner
/// token for as long as a lease from now: a few times quickly, before the
/// response goes out, then on a task of its own, so that the client is
/// answered meanwhile (its duplicates are told "in flight" until the record
/// lands, then replayed). A completion after the lease ended still lands if
/// no other attempt took the key. What still fails is counted
/// (`idem_completions_total`, `result="failed"`): docs/leases-and-crashes.md
/// says when plain mode runs a handler twice.
pub(super) async fn complete(
    guard: ClaimGuard,
    outcome: &Outcome,
    ttl: Duration,
    lease: Duration,
    route: &RouteLabel,
) {
    let deadline = expiry_after(tokio::time::Instant::now(), lease);
    let mut failures = 0;
    let last = loop {
        match try_complete(&guard, outcome, ttl, failures, route).await {
            Some(err) if failures + 1 < QUICK_ATTEMPTS => {
                failures += 1;
                tracing::warn!(error = %err, "could not store the outcome; trying again");
                tokio::time::sleep(backoff(failures)).await;
            }
            Some(err) => break err,
            None => return guard.defuse(),
        }
    };
    failures += 1;
    let outcome = outcome.clone();
    let label = route.clone();
    let later = async move {
        let mut last = last;
        loop {
            let pause = backoff(failures);
            if tokio::time::Instant::now() + pause >= deadline {
                metrics::completion(Completion::Failed, &label);
                tracing::error!(
                    error = %last,
                    attempts = failures,
                    "could not store the outcome within a lease; the key stays blocked until \
                     its lease ends, and a retry after that runs the handler again"
                );
                return guard.defuse();
            }
            tracing::warn!(error = %last, "could not store the outcome; trying again in the background");
            tokio::time::sleep(pause).await;
            match try_complete(&guard, &outcome, ttl, failures, &label).await {
                Some(err) => (last, failures) = (err, failures + 1),
                None => return guard.defuse(),
            }
        }
    };
    if !task::spawn_tokio(later) {
        metrics::completion(Completion::Failed, route);
        tracing::error!(
            "could not store the outcome, and no runtime to keep trying on; the key stays blocked until its lease ends"
        );
    }
}

/// How often a completion is tried before the response goes out.
const QUICK_ATTEMPTS: u32 = 3;

/// The pause before the next completion after `failures` failed ones:
/// 40 ms, doubling, at most 2 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(20 << failures.min(6)).min(Duration::from_secs(2))
}

/// One completion; the store error to retry, if any. A completion that
/// landed, or that found the claim no longer ours, is counted and done.
async fn try_complete(
    guard: &ClaimGuard,
    outcome: &Outcome,
    ttl: Duration,
    failures: u32,
    route: &RouteLabel,
) -> Option<idem_core::Error> {
    match guard
        .store()
        .complete(guard.key(), guard.owner(), outcome, ttl)
        .await
    {
        Ok(()) => {
            tracing::debug!(retries = failures, "completed");
            let result = if failures == 0 {
                Completion::Ok
            } else {
                Completion::Retried
            };
            metrics::completion(result, route);
            None
        }
        Err(err) if err.kind() == ErrorKind::LeaseLost => {
            metrics::completion(Completion::Lost, route);
            tracing::error!(
                "the lease ran out before the outcome was stored (renewals failed, or could not \
                 run: a handler that blocks its thread starves them) and another attempt took \
                 the key; this outcome is not stored"
            );
            None
        }
        Err(err) => Some(err),
    }
}
