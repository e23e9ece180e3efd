//! Test fixture, not part of the reference: what the contract tests count
//! and provoke. Nothing here is needed to make a route idempotent.
//!
//! - [`Calls`]: how many times each idempotent handler ran, the effect count
//!   the tests check ([`App::calls`](super::App::calls) in process, and
//!   `orders_handler_calls_total` and `payment_callback_handler_calls_total`
//!   in `GET /metrics`).
//! - [`Chaos`]: with `--chaos` only, `POST /orders` honours
//!   `X-Chaos-Fail: 503` (answer 503 before any write),
//!   `X-Chaos-Fail-After-Write: 500` (answer 500 after the writes and the
//!   outbox event, so the transaction rolls them back) and
//!   `X-Chaos-Delay-Ms: N` (sleep after the writes, before the commit);
//!   the payment callback honours `X-Chaos-Delay-Ms: N` too (sleep after
//!   its effect committed, before its answer: a plain handler still
//!   running when its store goes away).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::App;
use super::handlers::error;

/// How many times each handler ran.
#[derive(Debug, Default)]
pub struct Calls {
    orders: AtomicU64,
    callbacks: AtomicU64,
}

impl Calls {
    /// `POST /orders` invocations so far.
    pub fn orders(&self) -> u64 {
        self.orders.load(Ordering::SeqCst)
    }

    /// `POST /payments/{payment_no}/callback` invocations so far.
    pub fn callbacks(&self) -> u64 {
        self.callbacks.load(Ordering::SeqCst)
    }

    pub(crate) fn order_ran(&self) {
        self.orders.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn callback_ran(&self) {
        self.callbacks.fetch_add(1, Ordering::SeqCst);
    }

    /// The counts in Prometheus' text format, for `GET /metrics`.
    pub(crate) fn prometheus_text(&self) -> String {
        format!(
            "# TYPE orders_handler_calls_total counter\norders_handler_calls_total {}\n\
             # TYPE payment_callback_handler_calls_total counter\npayment_callback_handler_calls_total {}\n",
            self.orders(),
            self.callbacks(),
        )
    }
}

/// What a request's `X-Chaos-*` headers ask for; nothing unless the app
/// runs with `--chaos`.
#[derive(Debug, Default)]
pub(crate) struct Chaos {
    fail: bool,
    fail_after_write: bool,
    delay: Option<Duration>,
}

impl Chaos {
    pub(crate) fn asked(app: &App, headers: &HeaderMap) -> Self {
        if !app.chaos {
            return Self::default();
        }
        let number = |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.parse().ok() };
        Self {
            fail: number("x-chaos-fail") == Some(503),
            fail_after_write: number("x-chaos-fail-after-write") == Some(500),
            delay: number("x-chaos-delay-ms").map(Duration::from_millis),
        }
    }

    /// The 503 to answer before any write, if asked for.
    pub(crate) fn failure(&self) -> Option<Response> {
        self.fail.then(|| {
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "chaos: failing before any write",
            )
        })
    }

    /// The 500 to answer after the writes, if asked for: the idempotency
    /// layer rolls the transaction back (order, debit, event and claim).
    pub(crate) fn failure_after_write(&self) -> Option<Response> {
        self.fail_after_write.then(|| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "chaos: failing after the writes",
            )
        })
    }

    /// Sleeps as long as asked, between the writes and the commit.
    pub(crate) async fn delay(&self) {
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
    }
}
