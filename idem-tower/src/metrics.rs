//! What the layer reports through the [`metrics`] facade: one counter of
//! requests by outcome and route, the claim latency, and the renewals of
//! plain claims' leases. Labels stay bounded: the outcome or result, and the
//! route *pattern* (`/orders/{id}`, as axum matched it or
//! [`IdempotencyLayer::route`](crate::IdempotencyLayer::route) named it;
//! `unknown` otherwise), never a path or a key. Which keys collide is kept
//! apart, in [`Idempotency::top_duplicated_keys`](crate::Idempotency::top_duplicated_keys).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `idem_requests_total` | counter | `outcome`: `first`, `replayed`, `in_flight`, `mismatch`, `not_replayable`, `missing_key`, `invalid_key`, `body_too_large`, `unkeyed`, `safe_method`, `not_run`, `released`, `misconfigured`, `store_error`; `route` |
//! | `idem_claim_seconds` | histogram | `route` |
//! | `idem_lease_renewals_total` | counter | `result`: `ok`, `failed` (a store error or a renewal that timed out; tried again), `lost` (the claim is no longer ours; renewals stop); `route` |
//! | `idem_completions_total` | counter | plain claims' completions, `result`: `ok`, `retried` (stored after store errors), `lost` (another attempt took the key first), `failed` (store errors for a whole lease: the effect stands without its record, and a retry after the lease runs the handler again); `route` |
//!
//! With no recorder installed these cost next to nothing.

use std::sync::Arc;
use std::time::Duration;

/// How one request through the layer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Ran, and its outcome was stored (or committed).
    First,
    /// A duplicate answered with the stored response.
    Replayed,
    /// A duplicate while the first was running.
    InFlight,
    /// The key reused with another request.
    Mismatch,
    /// A duplicate of a request whose response was not kept (too large to
    /// store, or its handler ended the claim's transaction).
    NotReplayable,
    /// A key part was absent.
    MissingKey,
    /// A key part was malformed, oversize or repeated; or the body unreadable.
    InvalidKey,
    /// The body was over the cap.
    BodyTooLarge,
    /// An optional key was absent: passed through.
    Unkeyed,
    /// A safe method (GET, HEAD, OPTIONS, TRACE): passed through.
    SafeMethod,
    /// Refused before the handler ran (a resolver's or an extractor's
    /// rejection): answered as it was, nothing kept. Also a request whose
    /// client went away while its claim was on its way: the claim let go,
    /// the handler not called.
    NotRun,
    /// Ran, and its claim was released (not final, error, panic) or rolled
    /// back.
    Released,
    /// The route is wired so that no request can succeed: answered 500.
    Misconfigured,
    /// The store could not be reached, or its commit failed.
    StoreError,
    /// The handler ended the claim's transaction itself: answered 500, the
    /// key kept from running again.
    TransactionEnded,
}

impl Handled {
    fn label(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::NotReplayable => "not_replayable",
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
            Self::BodyTooLarge => "body_too_large",
            Self::Unkeyed => "unkeyed",
            Self::SafeMethod => "safe_method",
            Self::NotRun => "not_run",
            Self::Misconfigured => "misconfigured",
            Self::Released => "released",
            Self::StoreError => "store_error",
            Self::TransactionEnded => "transaction_ended",
        }
    }
}

/// The `route` label of one request, shared by every metric it reports: a
/// label is a reference count, not a copy of the route.
pub(crate) type RouteLabel = Arc<str>;

/// The `route` label when nothing names the route.
pub(crate) fn unknown_route() -> RouteLabel {
    Arc::from("unknown")
}

pub(crate) fn request(outcome: Handled, route: &RouteLabel) {
    metrics::counter!(
        "idem_requests_total",
        "outcome" => outcome.label(),
        "route" => Arc::clone(route)
    )
    .increment(1);
}

pub(crate) fn claim_latency(elapsed: Duration, route: &RouteLabel) {
    metrics::histogram!("idem_claim_seconds", "route" => Arc::clone(route))
        .record(elapsed.as_secs_f64());
}

/// How one renewal of a plain claim's lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease runs a full lease from now.
    Ok,
    /// The store failed or did not answer in time: tried again.
    Failed,
    /// The claim is no longer ours: renewals stop.
    Lost,
}

pub(crate) fn renewal(result: Renewal, route: &RouteLabel) {
    let result = match result {
        Renewal::Ok => "ok",
        Renewal::Failed => "failed",
        Renewal::Lost => "lost",
    };
    metrics::counter!(
        "idem_lease_renewals_total",
        "result" => result,
        "route" => Arc::clone(route)
    )
    .increment(1);
}

/// How a plain claim's completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// Stored at the first try.
    Ok,
    /// Stored after store errors.
    Retried,
    /// Another attempt took the key first: not stored.
    Lost,
    /// Store errors for a whole lease: not stored.
    Failed,
}

pub(crate) fn completion(result: Completion, route: &RouteLabel) {
    let result = match result {
        Completion::Ok => "ok",
        Completion::Retried => "retried",
        Completion::Lost => "lost",
        Completion::Failed => "failed",
    };
    metrics::counter!(
        "idem_completions_total",
        "result" => result,
        "route" => Arc::clone(route)
    )
    .increment(1);
}
