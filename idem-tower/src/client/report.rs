//! What the caller learns about a request that went through the client
//! layer: the response extension, and the error when no answer came.

use std::fmt;

use http::{HeaderMap, HeaderValue};
use idem_core::BoxError;

use super::key::KeyOrigin;
use super::policy::Cause;

/// How a response was obtained, in its extensions:
/// `response.extensions().get::<RetryReport>()`.
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

impl RetryReport {
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
}

impl ClientError {
    pub(crate) fn new(kind: ClientErrorKind, attempts: u32, source: Option<BoxError>) -> Self {
        Self {
            kind,
            attempts,
            source,
        }
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
