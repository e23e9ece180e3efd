//! RFC 9457 problem responses, one `type` per situation.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::layer::grpc;

/// Every response the layer writes itself, rather than the handler.
///
/// Each is `application/problem+json` with its own `type`, so clients can
/// tell "fix the request" (400, 413, 422) from "try again later" (409, 503).
///
/// On a gRPC call (`content-type: application/grpc*`) each is instead a
/// trailers-only gRPC status (HTTP 200, no message) with a percent-encoded
/// `grpc-message` naming the cause:
///
/// | problem | gRPC status |
/// |---|---|
/// | key missing or invalid, body unreadable or not in its encoding | `INVALID_ARGUMENT` (3) |
/// | message over the cap | `RESOURCE_EXHAUSTED` (8) |
/// | key reused for another request | `FAILED_PRECONDITION` (9): not retried, use a new key |
/// | in flight | `ABORTED` (10), with `grpc-retry-pushback-ms`: retry the call with the same key |
/// | completed, not replayable | `ALREADY_EXISTS` (6): it ran, and will not run again |
/// | store unavailable | `UNAVAILABLE` (14), with `grpc-retry-pushback-ms` |
/// | misconfigured, transaction missing, transaction ended by the handler | `INTERNAL` (13) |
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// 400: a part of the key the route requires is absent.
    KeyMissing(String),
    /// 400: a key part is malformed, oversize or given twice.
    KeyInvalid(String),
    /// 400: the request body could not be read.
    BodyUnreadable,
    /// 400: the request body is not what its encoding says
    /// (`Content-Encoding`, or a gRPC message flagged compressed with
    /// `grpc-encoding`): it could not be decoded for its fingerprint.
    BodyUndecodable(String),
    /// 413: the body is over the configured cap; nothing was claimed.
    BodyTooLarge {
        /// The cap, in bytes.
        limit: usize,
    },
    /// 422: the key was used with a different request.
    FingerprintMismatch,
    /// 409: the first request with this key is still running.
    InFlight {
        /// When to retry.
        retry_after: Duration,
    },
    /// 409: the first request with this key ran, and its response was not
    /// kept: too large to store, or its handler ended the claim's
    /// transaction ([`Problem::TransactionEnded`]). It will not run again.
    NotReplayable,
    /// 500: a handler takes the claim's transaction (`Tx`) on a route that
    /// is not transactional (a wiring mistake: see
    /// `IdempotencyLayer::transactional`).
    TransactionMissing,
    /// 500: the handler ended the claim's transaction itself (a raw
    /// `COMMIT` or `ROLLBACK` on the connection `Tx` lends), so its writes
    /// may have committed without the record. The key is kept from running
    /// again: its duplicates get [`Problem::NotReplayable`].
    TransactionEnded,
    /// 500: the route is wired so that no request can succeed (a key part
    /// only the server can supply is missing, a resolver lacks the state it
    /// extracts on, settings that contradict each other). The server's
    /// error, never the client's; the detail names the fix.
    Misconfigured(String),
    /// 503: the store could not be reached; the handler was not called.
    StoreUnavailable {
        /// When to retry.
        retry_after: Duration,
    },
}

impl Problem {
    /// The problem's `type` URI.
    pub fn type_uri(&self) -> &'static str {
        match self {
            Self::KeyMissing(_) => "urn:idem:problem:key-missing",
            Self::KeyInvalid(_) => "urn:idem:problem:key-invalid",
            Self::BodyUnreadable => "urn:idem:problem:body-unreadable",
            Self::BodyUndecodable(_) => "urn:idem:problem:body-undecodable",
            Self::BodyTooLarge { .. } => "urn:idem:problem:body-too-large",
            Self::FingerprintMismatch => "urn:idem:problem:fingerprint-mismatch",
            Self::InFlight { .. } => "urn:idem:problem:in-flight",
            Self::NotReplayable => "urn:idem:problem:not-replayable",
            Self::StoreUnavailable { .. } => "urn:idem:problem:store-unavailable",
            Self::TransactionMissing => "urn:idem:problem:transaction-missing",
            Self::TransactionEnded => "urn:idem:problem:transaction-ended",
            Self::Misconfigured(_) => "urn:idem:problem:misconfigured",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::KeyMissing(_)
            | Self::KeyInvalid(_)
            | Self::BodyUnreadable
            | Self::BodyUndecodable(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::FingerprintMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::InFlight { .. } | Self::NotReplayable => StatusCode::CONFLICT,
            Self::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::TransactionMissing | Self::TransactionEnded | Self::Misconfigured(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The gRPC status code of this problem on a gRPC call (see the table
    /// above).
    pub fn grpc_code(&self) -> u32 {
        match self {
            Self::KeyMissing(_)
            | Self::KeyInvalid(_)
            | Self::BodyUnreadable
            | Self::BodyUndecodable(_) => 3,
            Self::BodyTooLarge { .. } => grpc::RESOURCE_EXHAUSTED,
            Self::FingerprintMismatch => 9,
            Self::InFlight { .. } => grpc::ABORTED,
            Self::NotReplayable => 6,
            Self::StoreUnavailable { .. } => grpc::UNAVAILABLE,
            Self::TransactionMissing | Self::TransactionEnded | Self::Misconfigured(_) => 13,
        }
    }

    /// `title: detail`, the `grpc-message` of this problem on a gRPC call,
    /// in gRPC's words (`grpc-retry-pushback-ms`, not `Retry-After`).
    pub(crate) fn message(&self) -> String {
        format!("{}: {}", self.title(), self.detail_on(true))
    }

    /// When to retry, for the problems that say.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after } | Self::StoreUnavailable { retry_after } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::KeyMissing(_) => "Idempotency key missing",
            Self::KeyInvalid(_) => "Idempotency key invalid",
            Self::BodyUnreadable => "Request body unreadable",
            Self::BodyUndecodable(_) => "Request body not in its encoding",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::FingerprintMismatch => "Idempotency key reused with a different request",
            Self::InFlight { .. } => "A request with this idempotency key is in progress",
            Self::NotReplayable => "The original response cannot be replayed",
            Self::StoreUnavailable { .. } => "Idempotency store unavailable",
            Self::TransactionMissing => "No idempotency transaction on this route",
            Self::TransactionEnded => "The handler ended the idempotency transaction",
            Self::Misconfigured(_) => "Idempotency misconfigured on this route",
        }
    }

    /// The detail of a problem+json answer.
    fn detail(&self) -> String {
        self.detail_on(false)
    }

    /// The detail, in the words of the wire it is written for.
    fn detail_on(&self, grpc: bool) -> String {
        match self {
            Self::KeyMissing(detail) | Self::KeyInvalid(detail) | Self::Misconfigured(detail) => {
                detail.clone()
            }
            Self::BodyUnreadable => "the request body ended early or could not be read".into(),
            Self::BodyUndecodable(why) => {
                format!("the request body could not be decoded as its encoding says: {why}")
            }
            Self::BodyTooLarge { limit } => {
                format!("the request body is larger than {limit} bytes")
            }
            Self::FingerprintMismatch => {
                "this key was first used with another method, route, query or body; \
                 use a new key for a new request"
                    .into()
            }
            Self::InFlight { .. } if grpc => {
                "the first call with this key has not finished; retry it with the same \
                 key after the time given in grpc-retry-pushback-ms"
                    .into()
            }
            Self::InFlight { .. } => {
                "the first request with this key has not finished; retry after the \
                 time given in Retry-After"
                    .into()
            }
            Self::NotReplayable => {
                "the request with this key ran, but its response was not kept (too \
                 large to store, or its outcome unknown after its handler ended its \
                 database transaction); it will not run again"
                    .into()
            }
            Self::StoreUnavailable { .. } => {
                "duplicate detection is unavailable, so the request was not processed; \
                 retry with the same key"
                    .into()
            }
            Self::TransactionEnded => {
                "the handler sent COMMIT or ROLLBACK on the transaction it was lent, so \
                 its writes may have been kept without their record; the key will not \
                 run again (use begin() for a nested transaction: it is a savepoint)"
                    .into()
            }
            Self::TransactionMissing => {
                "the handler takes the claim's database transaction (Tx), and its route \
                 is not transactional: add IdempotencyLayer::transactional, or \
                 #[idempotent(transactional)]"
                    .into()
            }
        }
    }

    /// The problem as a response with an `application/problem+json` body.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        let body = serde_json::json!({
            "type": self.type_uri(),
            "title": self.title(),
            "status": self.status().as_u16(),
            "detail": self.detail(),
        });
        let mut response = Response::new(B::from(Bytes::from(body.to_string())));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let retry_after = match self {
            // Whole seconds, rounded down: never past the first request's
            // remaining lease, after which a retry may take the key over.
            Self::InFlight { retry_after } => Some(retry_after.as_secs()),
            Self::StoreUnavailable { retry_after } => {
                Some((retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1))
            }
            _ => None,
        };
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_retry_after_rounds_down_and_unavailable_up() {
        let r: Response<Bytes> = Problem::InFlight {
            retry_after: Duration::from_millis(1200),
        }
        .to_response();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r: Response<Bytes> = Problem::InFlight {
            retry_after: Duration::from_millis(300),
        }
        .to_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "0");
        let r: Response<Bytes> = Problem::StoreUnavailable {
            retry_after: Duration::from_millis(1200),
        }
        .to_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        let r: Response<Bytes> = Problem::StoreUnavailable {
            retry_after: Duration::ZERO,
        }
        .to_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    /// The table in `Problem`'s docs, code by code.
    #[test]
    fn grpc_codes_are_the_documented_ones() {
        let zero = Duration::ZERO;
        for (problem, code) in [
            (Problem::KeyMissing(String::new()), 3),
            (Problem::KeyInvalid(String::new()), 3),
            (Problem::BodyUnreadable, 3),
            (Problem::BodyUndecodable(String::new()), 3),
            (Problem::BodyTooLarge { limit: 1 }, 8),
            (Problem::FingerprintMismatch, 9),
            (Problem::InFlight { retry_after: zero }, 10),
            (Problem::NotReplayable, 6),
            (Problem::StoreUnavailable { retry_after: zero }, 14),
            (Problem::TransactionMissing, 13),
            (Problem::TransactionEnded, 13),
            (Problem::Misconfigured(String::new()), 13),
        ] {
            assert_eq!(problem.grpc_code(), code, "{problem:?}");
            let pushback = matches!(
                problem,
                Problem::InFlight { .. } | Problem::StoreUnavailable { .. }
            );
            assert_eq!(problem.retry_after().is_some(), pushback, "{problem:?}");
        }
    }

    #[test]
    fn grpc_messages_name_grpc_pushback_and_no_http_header() {
        let zero = Duration::ZERO;
        for problem in [
            Problem::InFlight { retry_after: zero },
            Problem::StoreUnavailable { retry_after: zero },
            Problem::BodyTooLarge { limit: 1 },
            Problem::FingerprintMismatch,
            Problem::NotReplayable,
            Problem::TransactionMissing,
        ] {
            let message = problem.message();
            assert!(!message.contains("Retry-After"), "{message}");
        }
        let in_flight = Problem::InFlight { retry_after: zero };
        assert!(in_flight.message().contains("grpc-retry-pushback-ms"));
        assert!(in_flight.detail().contains("Retry-After"));
    }

    #[test]
    fn every_problem_has_its_own_type() {
        let all = [
            Problem::KeyMissing(String::new()),
            Problem::KeyInvalid(String::new()),
            Problem::BodyUnreadable,
            Problem::BodyUndecodable(String::new()),
            Problem::BodyTooLarge { limit: 1 },
            Problem::FingerprintMismatch,
            Problem::InFlight {
                retry_after: Duration::ZERO,
            },
            Problem::NotReplayable,
            Problem::StoreUnavailable {
                retry_after: Duration::ZERO,
            },
            Problem::TransactionMissing,
            Problem::TransactionEnded,
            Problem::Misconfigured(String::new()),
        ];
        let types: std::collections::HashSet<_> = all.iter().map(Problem::type_uri).collect();
        assert_eq!(types.len(), all.len());
    }
}
