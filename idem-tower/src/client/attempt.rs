//! The schedule of one logical request's attempts, shared by the tower
//! service and the reqwest middleware: each attempt's span and time limit,
//! and after a transient failure, whether to retry and after how long.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, error::Elapsed};
use tracing::Span;

use super::policy::{Cause, RetryPolicy};

pub(super) struct Schedule {
    policy: Arc<RetryPolicy>,
    deadline: Option<Instant>,
    attempts: u32,
}

impl Schedule {
    /// Starts the clock of the total deadline.
    pub(super) fn start(policy: Arc<RetryPolicy>) -> Self {
        let deadline = policy
            .deadline
            .map(|d| idem_core::expiry_after(Instant::now(), d));
        Self {
            policy,
            deadline,
            attempts: 0,
        }
    }

    pub(super) fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Attempts begun so far.
    pub(super) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Begins the next attempt: its span.
    pub(super) fn begin(&mut self, method: &http::Method, path: &str) -> Span {
        self.attempts += 1;
        tracing::info_span!(
            "idem.client.attempt",
            attempt = self.attempts,
            method = %method,
            path,
            status = tracing::field::Empty,
        )
    }

    /// The time this attempt may take: the per-attempt timeout, and never
    /// past the deadline.
    pub(super) fn timeout(&self) -> Option<Duration> {
        let left = self
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        match (self.policy.attempt_timeout, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// After a transient failure of the current attempt: the wait before
    /// the next one (counted under its cause), or `None` when no attempt
    /// is left or the wait would end past the deadline.
    pub(super) fn retry(
        &self,
        span: &Span,
        cause: Cause,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        let wait = self.policy.delay(self.attempts, retry_after);
        let past_deadline = self.deadline.is_some_and(|d| Instant::now() + wait >= d);
        if self.attempts >= self.policy.max_attempts || past_deadline {
            tracing::debug!(parent: span, cause = cause.as_str(), attempts = self.attempts, "no retry left");
            return None;
        }
        tracing::debug!(
            parent: span,
            cause = cause.as_str(),
            wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            "retrying with the same key"
        );
        metrics::counter!("idem_client_retries_total", "cause" => cause.as_str()).increment(1);
        Some(wait)
    }
}

/// `future`, abandoned after `timeout` if there is one.
pub(super) async fn within<F: Future>(
    timeout: Option<Duration>,
    future: F,
) -> Result<F::Output, Elapsed> {
    match timeout {
        Some(timeout) => tokio::time::timeout(timeout, future).await,
        None => Ok(future.await),
    }
}
