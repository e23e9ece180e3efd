//! A gRPC call's outcome: every gRPC response is HTTP 200, and what it
//! says is its `grpc-status`, in its trailers or, for a trailers-only
//! response, in its headers. OK and the deterministic client errors are
//! final; every other code lets the key go, so the call can be retried.

use http::{HeaderMap, header};

/// The gRPC status codes that are the call's own, final answer: `OK`,
/// `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
/// `FAILED_PRECONDITION` and `OUT_OF_RANGE`. The same call sent again gets
/// the same answer, so it is kept and replayed. Every other code
/// (`UNAVAILABLE`, `INTERNAL`, `UNKNOWN`, `DEADLINE_EXCEEDED`,
/// `RESOURCE_EXHAUSTED`, `ABORTED`, `CANCELLED`, `DATA_LOSS`,
/// `UNAUTHENTICATED`, `PERMISSION_DENIED`, `UNIMPLEMENTED`) is transient or
/// not the handler's outcome: the key is released.
const FINAL_CODES: [u32; 6] = [0, 3, 5, 6, 9, 11];

/// Whether a message is gRPC: its content type is `application/grpc`,
/// with or without a `+proto`-style suffix or parameters.
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// The `grpc-status` in `fields`, if there is one that parses.
pub(super) fn status(fields: &HeaderMap) -> Option<u32> {
    fields
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `code` is a final answer.
pub(super) fn is_final(code: u32) -> bool {
    FINAL_CODES.contains(&code)
}

/// Whether a gRPC response that has been read whole ended with a final
/// status, in its trailers or its headers. A response with no status at
/// all is a broken call, not an answer: not final.
pub(super) fn ended_final(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> bool {
    trailers
        .and_then(status)
        .or_else(|| status(headers))
        .is_some_and(is_final)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn fields(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn knows_grpc_content_types() {
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc;charset=utf-8",
        ] {
            assert!(is_grpc(&fields(&[("content-type", ct)])), "{ct}");
        }
        for ct in [
            "application/json",
            "application/grpc-web",
            "application/grpcx",
        ] {
            assert!(!is_grpc(&fields(&[("content-type", ct)])), "{ct}");
        }
    }

    #[test]
    fn final_codes_are_ok_and_deterministic_client_errors() {
        let finals: Vec<u32> = (0..=16).filter(|&c| is_final(c)).collect();
        assert_eq!(finals, [0, 3, 5, 6, 9, 11]);
    }

    #[test]
    fn the_trailers_status_wins_and_none_is_not_final() {
        let ok = fields(&[("grpc-status", "0")]);
        let unavailable = fields(&[("grpc-status", "14")]);
        assert!(ended_final(&HeaderMap::new(), Some(&ok)));
        assert!(!ended_final(&ok, Some(&unavailable)));
        assert!(ended_final(&ok, None), "trailers-only");
        assert!(!ended_final(&HeaderMap::new(), None));
        assert!(!ended_final(&fields(&[("grpc-status", "zero")]), None));
    }
}
