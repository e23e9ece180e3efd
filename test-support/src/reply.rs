//! A response as the client saw it, and the assertions the tests make on
//! it.

use axum::body::HttpBody;
use bytes::Bytes;
use http::header::{self, AsHeaderName};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

/// What came back: status, headers and the whole body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Bytes,
}

impl Reply {
    /// Reads `response` whole.
    pub async fn read<B>(response: Response<B>) -> Self
    where
        B: HttpBody,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("the response body").to_bytes();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Whether the layer marked this a replay (`Idempotent-Replayed: true`;
    /// any other value of the header fails the test).
    pub fn replayed(&self) -> bool {
        match self.headers.get("idempotent-replayed") {
            Some(value) => {
                assert_eq!(value, "true", "{self:?}");
                true
            }
            None => false,
        }
    }

    /// The body as text (panics if it is not UTF-8).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// The body as JSON (panics with the body if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// A header's value, if present (panics if it is not visible ASCII).
    pub fn header(&self, name: impl AsHeaderName) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("an ASCII header"))
    }

    /// The problem `type`, for layer-written errors (panics if this is not
    /// a problem response).
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header(header::CONTENT_TYPE),
            Some("application/problem+json"),
            "not a problem response: {self:?}"
        );
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }

    /// Asserts this is a problem response (README.md, "The HTTP contract")
    /// of `status` with type `urn:idem:problem:{kind}`, and never a replay.
    pub fn assert_problem(&self, status: StatusCode, kind: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.problem_type(),
            format!("urn:idem:problem:{kind}"),
            "{self:?}"
        );
        assert_eq!(self.json()["status"], status.as_u16(), "{self:?}");
        assert!(!self.replayed(), "a problem is never a replay: {self:?}");
    }

    /// The `Retry-After` header in whole seconds (panics if absent).
    pub fn retry_after(&self) -> u64 {
        self.header(header::RETRY_AFTER)
            .unwrap_or_else(|| panic!("no Retry-After: {self:?}"))
            .parse()
            .expect("Retry-After in seconds")
    }
}
