//! The requests the tests send, built once and sent over either transport.

use bytes::Bytes;
use http::Method;
use serde_json::Value;

/// A request to send.
#[derive(Debug, Clone)]
pub struct Call {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Bytes,
}

impl Call {
    /// A POST of `body` as JSON.
    pub fn post(path: &str, body: &Value) -> Self {
        Self {
            method: Method::POST,
            path: path.to_owned(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from(body.to_string()),
        }
    }

    /// A GET.
    pub fn get(path: &str) -> Self {
        Self {
            method: Method::GET,
            path: path.to_owned(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Adds a header (repeatable).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Replaces the raw body.
    pub fn raw_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }
}

/// `POST /orders` as user `user` of tenant `tenant` with client key `key`.
pub fn order(tenant: &str, user: &str, key: &str, amount_cents: i64) -> Call {
    Call::post(
        "/orders",
        &serde_json::json!({ "sku": "book", "qty": 1, "amount_cents": amount_cents }),
    )
    .header("idempotency-key", key)
    .header("x-tenant-id", tenant)
    .header("authorization", &format!("Bearer {user}"))
}
