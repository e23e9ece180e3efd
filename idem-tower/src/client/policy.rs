//! The retry policy as a value: which outcomes of an attempt are worth
//! another attempt with the same key, and how long to wait before it.
//!
//! Only outcomes after which the server either did nothing or kept the
//! result under the key are retried: a retry then either runs the operation
//! for the first time or gets its stored answer replayed. An answer that
//! says the request itself is wrong (422: the key was reused for a
//! different request, 400, 413, ...) goes straight back to the caller.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode, header};
use rand::Rng;

use crate::layer::grpc;

/// Why an attempt is retried; the `cause` label of
/// `idem_client_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The inner service failed without an answer: a refused or reset
    /// connection, a response lost on the way.
    Connection,
    /// The attempt took longer than [`RetryPolicy::attempt_timeout`].
    Timeout,
    /// A 5xx other than 501 and 505 (and 503, below).
    ServerError,
    /// 503: the server (or its store) is unavailable for now.
    Unavailable,
    /// 409 with `Retry-After`: the first attempt with this key still runs.
    InFlight,
    /// 429 with `Retry-After`.
    TooManyRequests,
}

impl Cause {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::ServerError => "server_error",
            Self::Unavailable => "unavailable",
            Self::InFlight => "in_flight",
            Self::TooManyRequests => "too_many_requests",
        }
    }
}

/// What to do with an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Give it to the caller.
    Final,
    /// Send the same request again, with the same key.
    Retry {
        /// Why.
        cause: Cause,
        /// The server's `Retry-After`, if it sent one that parses.
        retry_after: Option<Duration>,
    },
}

/// When and how often a request is retried with the same key.
///
/// ```
/// use std::time::Duration;
/// use idem_tower::client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(5)
///     .deadline(Duration::from_secs(30))
///     .attempt_timeout(Duration::from_secs(5));
/// # let _ = policy;
/// ```
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) base_delay: Duration,
    pub(crate) max_delay: Duration,
    pub(crate) max_retry_after: Duration,
    pub(crate) max_body: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            deadline: Some(Self::DEFAULT_DEADLINE),
            attempt_timeout: None,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(30),
            max_body: Self::DEFAULT_MAX_BODY,
        }
    }
}

impl RetryPolicy {
    /// Attempts per logical request, the first included: 5.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
    /// The time from the first attempt after which no new attempt starts:
    /// 60 s.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);
    /// The largest request body buffered for re-sending: 1 MiB.
    pub const DEFAULT_MAX_BODY: usize = 1 << 20;

    /// Attempts per logical request, the first included (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// No attempt starts, and no wait is begun, past this time from the
    /// first attempt; the last answer (or error) is returned instead.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// No total deadline: only [`max_attempts`](Self::max_attempts) bounds
    /// the retries.
    pub fn no_deadline(mut self) -> Self {
        self.deadline = None;
        self
    }

    /// Each attempt is abandoned after this long and retried
    /// ([`Cause::Timeout`]); none by default. The server goes on with the
    /// abandoned attempt (idem's layer does not cancel a handler whose
    /// client left), so the retry, with the same key, usually meets it in
    /// flight (409 with `Retry-After`, [`Cause::InFlight`]) and the one
    /// after gets its answer replayed: a timeout typically costs two more
    /// attempts and the server's `Retry-After` (capped by
    /// [`RetryPolicy::max_retry_after`]).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The backoff: before retry `n` (from 1) a wait drawn uniformly from
    /// zero to `min(max, base * 2^(n-1))` ("full jitter"). 100 ms and 10 s
    /// by default.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_delay = base;
        self.max_delay = max.max(base);
        self
    }

    /// The longest `Retry-After` honoured as it is; a longer one is waited
    /// for this long. 30 s by default.
    pub fn max_retry_after(mut self, cap: Duration) -> Self {
        self.max_retry_after = cap;
        self
    }

    /// The largest request body buffered so the request can be re-sent; a
    /// larger one fails the request before it is sent. 1 MiB by default.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// What an answer with this status and these headers calls for.
    ///
    /// A gRPC answer (`content-type: application/grpc`) is read by its
    /// `grpc-status` instead, when its head carries one (a trailers-only
    /// reply, which is how servers send an error without a message):
    /// `UNAVAILABLE` is retried ([`Cause::Unavailable`]), and so are
    /// `ABORTED` and `RESOURCE_EXHAUSTED` when they carry
    /// `grpc-retry-pushback-ms` (idem's in-flight answer,
    /// [`Cause::InFlight`], and a throttle, [`Cause::TooManyRequests`]);
    /// every other code is final. A gRPC answer whose status is in its
    /// trailers comes with a message: final.
    pub fn classify(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
        if status == StatusCode::OK && grpc::is_grpc(headers) {
            return classify_grpc(headers);
        }
        let retry_after = || retry_after(headers, SystemTime::now());
        let cause = match status.as_u16() {
            503 => Cause::Unavailable,
            501 | 505 => return Verdict::Final,
            500..=599 => Cause::ServerError,
            // Only the layer's own in-flight answer carries `Retry-After`
            // on a 409; a handler's business conflict or a "not
            // replayable" 409 does not, and is final.
            409 if headers.contains_key(header::RETRY_AFTER) => Cause::InFlight,
            429 if headers.contains_key(header::RETRY_AFTER) => Cause::TooManyRequests,
            _ => return Verdict::Final,
        };
        Verdict::Retry {
            cause,
            retry_after: retry_after(),
        }
    }

    /// The wait before retry `retry` (from 1): the server's `Retry-After`
    /// (capped) when it gave a non-zero one, else the jittered backoff.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(wait) if !wait.is_zero() => wait.min(self.max_retry_after),
            _ => {
                let ceiling = self.backoff_ceiling(retry);
                let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rand::rng().random_range(0..=nanos))
            }
        }
    }

    /// The largest backoff before retry `retry` (from 1).
    pub(crate) fn backoff_ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.base_delay
            .saturating_mul(1u32 << doublings)
            .min(self.max_delay)
    }
}

/// A gRPC answer's verdict, from the `grpc-status` of its head.
fn classify_grpc(headers: &HeaderMap) -> Verdict {
    let pushback = pushback(headers);
    let cause = match grpc::status(headers) {
        Some(grpc::UNAVAILABLE) => Cause::Unavailable,
        Some(grpc::ABORTED) if pushback.is_some() => Cause::InFlight,
        Some(grpc::RESOURCE_EXHAUSTED) if pushback.is_some() => Cause::TooManyRequests,
        _ => return Verdict::Final,
    };
    Verdict::Retry {
        cause,
        retry_after: pushback,
    }
}

/// `grpc-retry-pushback-ms` as a wait. `None` if absent or unreadable
/// (gRPC's negative pushback, "do not retry", included).
fn pushback(headers: &HeaderMap) -> Option<Duration> {
    let millis = headers.get(grpc::PUSHBACK)?.to_str().ok()?;
    millis.trim().parse().ok().map(Duration::from_millis)
}

/// `Retry-After` as a wait from `now`: delta-seconds or an HTTP-date (a
/// date already past is no wait). `None` if absent or unreadable.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(retry_after: Option<&'static str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static(value));
        }
        headers
    }

    fn verdict(status: u16, retry_after: Option<&'static str>) -> Verdict {
        RetryPolicy::default().classify(
            StatusCode::from_u16(status).expect("a status"),
            &headers(retry_after),
        )
    }

    fn cause(status: u16, retry_after: Option<&'static str>) -> Option<Cause> {
        match verdict(status, retry_after) {
            Verdict::Final => None,
            Verdict::Retry { cause, .. } => Some(cause),
        }
    }

    #[test]
    fn server_errors_are_retried_except_501_and_505() {
        for status in [500, 502, 504, 507, 599] {
            assert_eq!(cause(status, None), Some(Cause::ServerError), "{status}");
        }
        assert_eq!(cause(503, None), Some(Cause::Unavailable));
        assert_eq!(cause(501, None), None);
        assert_eq!(cause(505, None), None);
    }

    #[test]
    fn other_4xx_are_final() {
        for status in [400, 401, 403, 404, 408, 413, 415, 422, 423, 425] {
            assert_eq!(cause(status, None), None, "{status}");
            assert_eq!(cause(status, Some("1")), None, "{status} with Retry-After");
        }
    }

    #[test]
    fn conflict_and_throttle_are_retried_only_with_retry_after() {
        assert_eq!(cause(409, Some("1")), Some(Cause::InFlight));
        assert_eq!(cause(409, None), None);
        assert_eq!(cause(429, Some("2")), Some(Cause::TooManyRequests));
        assert_eq!(cause(429, None), None);
    }

    #[test]
    fn success_and_redirects_are_final() {
        for status in [200, 201, 204, 301, 304] {
            assert_eq!(verdict(status, None), Verdict::Final);
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(
            retry_after(&headers(Some("3")), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&headers(Some(" 0 ")), now),
            Some(Duration::ZERO)
        );
        // 2001-09-09T01:46:40Z is the epoch + 1e9 s.
        let mut later = HeaderMap::new();
        later.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Sun, 09 Sep 2001 01:46:50 GMT"),
        );
        assert_eq!(retry_after(&later, now), Some(Duration::from_secs(10)));
        let mut past = HeaderMap::new();
        past.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Sun, 09 Sep 2001 01:46:30 GMT"),
        );
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers(Some("soon")), now), None);
        assert_eq!(retry_after(&headers(Some("-1")), now), None);
        assert_eq!(retry_after(&headers(None), now), None);
    }

    #[test]
    fn retry_after_is_honoured_up_to_its_cap() {
        let policy = RetryPolicy::default().max_retry_after(Duration::from_secs(5));
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(600))),
            Duration::from_secs(5)
        );
        // A zero Retry-After falls back to the backoff.
        assert!(policy.delay(1, Some(Duration::ZERO)) <= policy.backoff_ceiling(1));
    }

    #[test]
    fn backoff_doubles_up_to_its_max_with_full_jitter() {
        let policy =
            RetryPolicy::default().backoff(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(policy.backoff_ceiling(1), Duration::from_millis(100));
        assert_eq!(policy.backoff_ceiling(2), Duration::from_millis(200));
        assert_eq!(policy.backoff_ceiling(4), Duration::from_millis(800));
        assert_eq!(policy.backoff_ceiling(5), Duration::from_secs(1));
        assert_eq!(policy.backoff_ceiling(u32::MAX), Duration::from_secs(1));
        for retry in 1..10 {
            let ceiling = policy.backoff_ceiling(retry);
            let delays: Vec<_> = (0..200).map(|_| policy.delay(retry, None)).collect();
            assert!(delays.iter().all(|d| *d <= ceiling), "retry {retry}");
            // Full jitter: spread over the whole range, not bunched at the top.
            assert!(delays.iter().any(|d| *d < ceiling / 2), "retry {retry}");
        }
    }

    fn grpc(code: &'static str, pushback: Option<&'static str>) -> Verdict {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from_static(code));
        if let Some(ms) = pushback {
            headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static(ms));
        }
        RetryPolicy::default().classify(StatusCode::OK, &headers)
    }

    #[test]
    fn grpc_answers_are_read_by_their_status() {
        assert_eq!(
            grpc("14", None),
            Verdict::Retry {
                cause: Cause::Unavailable,
                retry_after: None
            }
        );
        assert_eq!(
            grpc("10", Some("1500")),
            Verdict::Retry {
                cause: Cause::InFlight,
                retry_after: Some(Duration::from_millis(1500))
            }
        );
        assert_eq!(
            grpc("8", Some("20")),
            Verdict::Retry {
                cause: Cause::TooManyRequests,
                retry_after: Some(Duration::from_millis(20))
            }
        );
        // Without pushback, ABORTED and RESOURCE_EXHAUSTED are the call's
        // own answers; a negative pushback says "do not retry".
        assert_eq!(grpc("10", None), Verdict::Final);
        assert_eq!(grpc("10", Some("-1")), Verdict::Final);
        assert_eq!(grpc("8", None), Verdict::Final);
        // Final codes, and the codes idem's server releases the key on but
        // that a retry would not change without the caller's help.
        for code in ["0", "2", "3", "5", "6", "7", "9", "11", "12", "13", "16"] {
            assert_eq!(grpc(code, None), Verdict::Final, "{code}");
        }
    }

    #[test]
    fn a_grpc_answer_without_a_status_in_its_head_is_final() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        let policy = RetryPolicy::default();
        assert_eq!(policy.classify(StatusCode::OK, &headers), Verdict::Final);
        // An HTTP error in front of a gRPC server is read as HTTP.
        assert_eq!(
            policy.classify(StatusCode::SERVICE_UNAVAILABLE, &headers),
            Verdict::Retry {
                cause: Cause::Unavailable,
                retry_after: None
            }
        );
    }

    #[test]
    fn at_least_one_attempt() {
        assert_eq!(RetryPolicy::default().max_attempts(0).max_attempts, 1);
    }
}
