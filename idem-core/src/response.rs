//! The response kept for replay.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

/// A response as it is stored and replayed: status, the allow-listed headers
/// (repeated and non-UTF-8 values kept as they were) and the body. A clone
/// shares the headers and the body; it copies neither.
///
/// ```
/// use idem_core::StoredResponse;
/// use http::{HeaderMap, StatusCode, header};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(header::LOCATION, "/orders/7".parse().unwrap());
/// let stored = StoredResponse::new(StatusCode::CREATED, headers, r#"{"order_id":7}"#);
/// assert_eq!(stored.status(), StatusCode::CREATED);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: Arc<HeaderMap>,
    body: Bytes,
}

impl StoredResponse {
    /// A stored response. `headers` should already be filtered to the ones
    /// worth replaying.
    pub fn new(status: StatusCode, headers: HeaderMap, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: Arc::new(headers),
            body: body.into(),
        }
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
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len())
                .sum::<usize>()
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
