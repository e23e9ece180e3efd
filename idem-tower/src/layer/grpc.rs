//! A gRPC call's outcome: every gRPC response is HTTP 200, and what it
//! says is its `grpc-status`, in its trailers or, for a trailers-only
//! response, in its headers. OK and the deterministic client errors are
//! final; every other code lets the key go, so the call can be retried.
//! The layer's own answers to a gRPC call are gRPC statuses too.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body::Body;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::layer::ResponseBody;

/// What `grpc-message` percent-encodes: controls, `%`, and (as any
/// percent-encoding does) every byte outside ASCII.
const GRPC_MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// The gRPC status codes that are the call's own, final answer: `OK`,
/// `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
/// `FAILED_PRECONDITION` and `OUT_OF_RANGE`. The same call sent again gets
/// the same answer, so it is kept and replayed. Every other code
/// (`UNAVAILABLE`, `INTERNAL`, `UNKNOWN`, `DEADLINE_EXCEEDED`,
/// `RESOURCE_EXHAUSTED`, `ABORTED`, `CANCELLED`, `DATA_LOSS`,
/// `UNAUTHENTICATED`, `PERMISSION_DENIED`, `UNIMPLEMENTED`) is transient or
/// not the handler's outcome: the key is released.
const FINAL_CODES: [u32; 6] = [0, 3, 5, 6, 9, 11];

/// The header of a gRPC status that says when to retry, in milliseconds:
/// the layer writes it on its in-flight and unavailable answers, the client
/// waits for it.
pub(crate) const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// `UNAVAILABLE`: transient, retry.
pub(crate) const UNAVAILABLE: u32 = 14;
/// `ABORTED`: idem's answer while the first call with the key runs.
pub(crate) const ABORTED: u32 = 10;
/// `RESOURCE_EXHAUSTED`: a throttle, or a message over the layer's cap.
pub(crate) const RESOURCE_EXHAUSTED: u32 = 8;

/// Whether a message is gRPC: its content type is `application/grpc`,
/// with or without a `+proto`-style suffix or parameters.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// The `grpc-status` in `fields`, if there is one that parses.
pub(crate) fn status(fields: &HeaderMap) -> Option<u32> {
    fields
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `code` is a final answer.
pub(crate) fn is_final(code: u32) -> bool {
    FINAL_CODES.contains(&code)
}

/// A trailers-only gRPC reply (HTTP 200, no message) with this status:
/// how the layer answers a gRPC call itself. `message` becomes a
/// percent-encoded `grpc-message`; `retry_after`, `grpc-retry-pushback-ms`.
pub(super) fn trailers_only<B: Body>(
    code: u32,
    message: &str,
    retry_after: Option<Duration>,
) -> Response<ResponseBody<B>> {
    let mut status = Response::new(ResponseBody::full(Bytes::new()));
    let headers = status.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(code));
    let message = utf8_percent_encode(message, GRPC_MESSAGE).to_string();
    if let Ok(message) = HeaderValue::from_str(&message) {
        headers.insert("grpc-message", message);
    }
    if let Some(retry_after) = retry_after {
        let millis = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        headers.insert(PUSHBACK, HeaderValue::from(millis));
    }
    status
}

/// A resolver's rejection (such as a 401) as a gRPC status, by gRPC's own
/// HTTP-to-gRPC mapping.
pub(super) fn refusal<B: Body>(status: StatusCode) -> Response<ResponseBody<B>> {
    let message = format!("refused before the call ran: HTTP {status}");
    trailers_only(code_of_http(status), &message, None)
}

/// The gRPC code of an HTTP status, as gRPC's own HTTP-to-gRPC mapping
/// gives it.
fn code_of_http(status: StatusCode) -> u32 {
    match status.as_u16() {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502..=504 => 14,
        _ => 2,
    }
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
    fn a_trailers_only_status_says_its_code_cause_and_pushback() {
        let status: Response<ResponseBody<http_body_util::Empty<Bytes>>> = trailers_only(
            10,
            "in progress",
            Some(std::time::Duration::from_millis(1500)),
        );
        assert_eq!(status.status(), StatusCode::OK);
        let h = status.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "10");
        assert_eq!(h["grpc-message"], "in progress");
        assert_eq!(h["grpc-retry-pushback-ms"], "1500");
        assert!(http_body::Body::is_end_stream(status.body()));
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        let encoded = utf8_percent_encode("50% off: café\n", GRPC_MESSAGE).to_string();
        assert_eq!(encoded, "50%25 off: caf%C3%A9%0A");
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
        use crate::{FinishedResponse, final_by_default};
        let grpc = fields(&[("content-type", "application/grpc")]);
        let ok = fields(&[("grpc-status", "0")]);
        let unavailable = fields(&[("grpc-status", "14")]);
        let mut trailers_only_ok = grpc.clone();
        trailers_only_ok.extend(ok.clone());
        let reply = |headers, trailers| {
            final_by_default(&FinishedResponse::new(StatusCode::OK, headers, trailers))
        };
        assert!(reply(&grpc, Some(&ok)));
        assert!(!reply(&trailers_only_ok, Some(&unavailable)));
        assert!(reply(&trailers_only_ok, None), "trailers-only");
        assert!(!reply(&grpc, None));
        let mut garbled = grpc.clone();
        garbled.insert("grpc-status", HeaderValue::from_static("zero"));
        assert!(!reply(&garbled, None));
    }
}
