//! What the caller learns about a request that went through the client
//! layer: the response extension, and the error when no answer came.

use std::fmt;

use http::{HeaderMap, HeaderValue};
use idem_core::BoxError;

use super::key::KeyOrigin;
use super::policy::Cause;

/// How a call through the client layer went: attempts, the key, whose
/// key.
///
/// Reachable whatever the call ends with:
///
/// - an answer, success or error status (HTTP 4xx/5xx included): in the
///   response's extensions, `response.extensions().get::<RetryReport>()`;
/// - no answer (connection errors, timeouts, attempts used up):
///   [`ClientError::report`], the error the tower layer returns
///   (reqwest-middleware's own timeouts and oversize bodies are an
///   `Error::Middleware` holding one; a reqwest error it gives up on is
///   returned as reqwest made it);
/// - on a tonic channel, a call that ends in a `tonic::Status` (which
///   carries no response extensions): [`RetryReport::of_status`] (feature
///   `grpc`), from the status's metadata (the layer adds
///   `idem-client-attempts`, `idem-client-key` and
///   `idem-client-key-origin` to an error reply's head) or its source
///   (a [`ClientError`]).
///
/// ```
/// # #[cfg(feature = "grpc")] {
/// use idem_tower::client::RetryReport;
///
/// fn log_failure(status: &tonic::Status) {
///     if let Some(report) = RetryReport::of_status(status) {
///         eprintln!("{:?} after {} attempt(s), key {:?}", status.code(), report.attempts, report.key);
///     }
/// }
/// # let _ = log_failure; }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryReport {
    /// Attempts made, this answer's included (1 if it came at once).
    pub attempts: u32,
    /// The server replayed a stored answer (`Idempotent-Replayed: true`):
    /// the operation ran on an earlier attempt, or an earlier call with
    /// the same key.
    pub replayed: bool,
    /// The key sent with every attempt; `None` for a safe method.
    pub key: Option<HeaderValue>,
    /// Whose key it is.
    pub origin: KeyOrigin,
}

/// Where an error reply's head carries the report, for `tonic::Status`.
pub(crate) const ATTEMPTS_FIELD: &str = "idem-client-attempts";
pub(crate) const KEY_FIELD: &str = "idem-client-key";
pub(crate) const ORIGIN_FIELD: &str = "idem-client-key-origin";

impl RetryReport {
    /// The report of a gRPC call that ended in `status`, if it went
    /// through the client layer: from the fields the layer adds to an
    /// error reply's head (which tonic puts in the status's metadata), or
    /// from the [`ClientError`] in its source when no reply came.
    #[cfg(feature = "grpc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
    pub fn of_status(status: &tonic::Status) -> Option<Self> {
        let mut source = std::error::Error::source(status);
        while let Some(error) = source {
            if let Some(report) = error
                .downcast_ref::<ClientError>()
                .and_then(ClientError::report)
            {
                return Some(report.clone());
            }
            source = error.source();
        }
        let metadata = status.metadata();
        let attempts = metadata.get(ATTEMPTS_FIELD)?.to_str().ok()?.parse().ok()?;
        let origin = match metadata.get(ORIGIN_FIELD)?.to_str().ok()? {
            "caller" => KeyOrigin::Caller,
            "generated" => KeyOrigin::Generated,
            _ => KeyOrigin::NotSent,
        };
        let key = metadata
            .get(KEY_FIELD)
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok());
        Some(Self {
            attempts,
            replayed: metadata
                .get(crate::Idempotency::REPLAYED_HEADER.as_str())
                .is_some(),
            key,
            origin,
        })
    }

    /// The report's fields, added to the head of a gRPC error reply
    /// (trailers-only) so that `tonic::Status` carries them.
    pub(crate) fn mark(&self, headers: &mut HeaderMap) {
        headers.insert(ATTEMPTS_FIELD, HeaderValue::from(self.attempts));
        if let Some(key) = &self.key {
            headers.insert(KEY_FIELD, key.clone());
        }
        let origin = match self.origin {
            KeyOrigin::Caller => "caller",
            KeyOrigin::Generated => "generated",
            KeyOrigin::NotSent => "not-sent",
        };
        headers.insert(ORIGIN_FIELD, HeaderValue::from_static(origin));
    }

    pub(crate) fn new(
        attempts: u32,
        headers: &HeaderMap,
        key: Option<HeaderValue>,
        origin: KeyOrigin,
    ) -> Self {
        let replayed = headers
            .get(crate::Idempotency::REPLAYED_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        Self {
            attempts,
            replayed,
            key,
            origin,
        }
    }
}

/// Why a request through the client layer has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientErrorKind {
    /// The request body is larger than `RetryPolicy::max_body`; nothing was
    /// sent.
    BodyTooLarge,
    /// The request body failed while it was read; nothing was sent.
    Body,
    /// The last attempt failed in the inner service (its error is the
    /// source) or timed out, and no attempt was left.
    Exhausted(Cause),
}

/// A request that went through the client layer without an answer.
#[derive(Debug)]
pub struct ClientError {
    kind: ClientErrorKind,
    attempts: u32,
    source: Option<BoxError>,
    report: Option<RetryReport>,
}

impl ClientError {
    pub(crate) fn new(kind: ClientErrorKind, attempts: u32, source: Option<BoxError>) -> Self {
        Self {
            kind,
            attempts,
            source,
            report: None,
        }
    }

    /// The same error with the call's report.
    pub(crate) fn with_report(mut self, key: Option<HeaderValue>, origin: KeyOrigin) -> Self {
        self.report = Some(RetryReport {
            attempts: self.attempts,
            replayed: false,
            key,
            origin,
        });
        self
    }

    /// The call's [`RetryReport`]: attempts, the key sent with each, whose
    /// key. `None` only where the key was not yet made.
    ///
    /// ```no_run
    /// # async fn run(client: idem_tower::client::IdempotencyClient<
    /// #     hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, http_body_util::Full<bytes::Bytes>>>,
    /// #     request: http::Request<http_body_util::Full<bytes::Bytes>>) {
    /// use tower::ServiceExt;
    ///
    /// match client.oneshot(request).await {
    ///     Ok(response) => { /* response.extensions().get::<RetryReport>() */ }
    ///     Err(error) => {
    ///         let report = error.report().expect("the key was made");
    ///         eprintln!("no answer after {} attempt(s) with key {:?}", report.attempts, report.key);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn report(&self) -> Option<&RetryReport> {
        self.report.as_ref()
    }

    /// What went wrong.
    pub fn kind(&self) -> ClientErrorKind {
        self.kind
    }

    /// Attempts made (0 if the request was never sent).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ClientErrorKind::BodyTooLarge => {
                f.write_str("request body too large to buffer for retries")
            }
            ClientErrorKind::Body => f.write_str("request body failed"),
            ClientErrorKind::Exhausted(Cause::Timeout) => {
                write!(f, "request timed out after {} attempt(s)", self.attempts)
            }
            ClientErrorKind::Exhausted(_) => {
                write!(f, "request failed after {} attempt(s)", self.attempts)
            }
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
