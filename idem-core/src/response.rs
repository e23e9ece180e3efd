//! The response kept for replay.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

/// A response as it is stored and replayed: status, the allow-listed headers
/// (repeated and non-UTF-8 values kept as they were), the body and, if the
/// response ended with trailers (gRPC's `grpc-status`, say), the kept
/// trailers. A clone shares the headers, the trailers and the body; it
/// copies none of them.
///
/// ```
/// use idem_core::StoredResponse;
/// use http::{HeaderMap, StatusCode, header};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(header::LOCATION, "/orders/7".parse().unwrap());
/// let stored = StoredResponse::new(StatusCode::CREATED, headers, r#"{"order_id":7}"#);
/// assert_eq!(stored.status(), StatusCode::CREATED);
///
/// let mut trailers = HeaderMap::new();
/// trailers.insert("grpc-status", "0".parse().unwrap());
/// let stored = stored.with_trailers(trailers);
/// assert_eq!(stored.trailers().unwrap()["grpc-status"], "0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: Arc<HeaderMap>,
    body: Bytes,
    trailers: Option<Arc<HeaderMap>>,
}

impl StoredResponse {
    /// A stored response. `headers` should already be filtered to the ones
    /// worth replaying.
    pub fn new(status: StatusCode, headers: HeaderMap, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: Arc::new(headers),
            body: body.into(),
            trailers: None,
        }
    }

    /// The same response, ending with `trailers` (already filtered to the
    /// ones worth replaying). An empty map is no trailers.
    #[must_use]
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = (!trailers.is_empty()).then(|| Arc::new(trailers));
        self
    }

    /// The stored trailers, if the response had any worth replaying.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_deref()
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stored headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Status, headers and body, by value (the headers copied if a clone
    /// still shares them).
    pub fn into_parts(self) -> (StatusCode, HeaderMap, Bytes) {
        (self.status, Arc::unwrap_or_clone(self.headers), self.body)
    }

    /// Approximate size in bytes, for capacity accounting.
    pub fn size(&self) -> usize {
        let fields = |map: &HeaderMap| {
            map.iter()
                .map(|(k, v)| k.as_str().len() + v.len())
                .sum::<usize>()
        };
        self.body.len() + fields(&self.headers) + self.trailers().map_or(0, fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_the_headers_and_into_parts_copies_them_only_while_shared() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::LOCATION, "/orders/7".parse().unwrap());
        let stored = StoredResponse::new(StatusCode::CREATED, headers.clone(), "{}");
        let clone = stored.clone();
        assert!(std::ptr::eq(stored.headers(), clone.headers()));

        let (_, from_shared, _) = clone.into_parts();
        assert_eq!(from_shared, headers);
        let (status, last, body) = stored.into_parts();
        assert_eq!(
            (status, last, &body[..]),
            (StatusCode::CREATED, headers, &b"{}"[..])
        );
    }
}
