//! The key of one logical request: the caller's own, or one made here
//! once and kept across every retry of that request.
//!
//! A key per attempt would make every retry a new operation on the server;
//! a key per business operation, reused for every call that performs it,
//! is what makes at-least-once delivery safe. The caller that already has
//! one (an order id, a payment intent) sets the `Idempotency-Key` header
//! itself, or builds it with [`OperationKey`].

use http::{HeaderMap, HeaderValue, Method};

/// The header the key travels in.
pub const KEY_HEADER: &str = "idempotency-key";

/// Which UUID version a generated key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyKind {
    /// Random (version 4).
    #[default]
    V4,
    /// Time-ordered (version 7): keys sort by creation time, which suits
    /// B-tree indexes on the server.
    V7,
}

/// How a key is written in the `Idempotency-Key` header.
///
/// Bare by default (`Idempotency-Key: 8e03978e-...`): that is what Stripe
/// and most servers built before the IETF draft read, taking the header's
/// value as written, so a quoted key would reach them as another key, quotes
/// included (or be refused). The draft
/// (draft-ietf-httpapi-idempotency-key-header) writes the key as a
/// Structured Field String, quoted; a server that follows it reads a
/// generated key (a UUID, nothing in it to escape) the same in either form,
/// and idem's own layer takes both as one key. Choose
/// [`Quoted`](Self::Quoted) for a server that insists on the draft's form.
///
/// ```
/// use idem_tower::client::{IdempotencyClientLayer, KeyForm, RetryPolicy};
///
/// let layer = IdempotencyClientLayer::new(RetryPolicy::default()).key_form(KeyForm::Quoted);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyForm {
    /// `Idempotency-Key: 8e03978e-...`, as most servers read it.
    #[default]
    Bare,
    /// `Idempotency-Key: "8e03978e-..."`, the IETF draft's Structured
    /// Field String.
    Quoted,
}

/// An `Idempotency-Key` for one business operation: make it once, when the
/// operation starts, and send it with every call that performs it.
///
/// ```
/// use idem_tower::client::OperationKey;
///
/// let key = OperationKey::new_v7();
/// let request = http::Request::post("http://orders.local/orders")
///     .header(key.header_name(), key.header_value())
///     .body(String::from(r#"{"sku":"A-1"}"#))
///     .unwrap();
/// # let _ = request;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationKey(HeaderValue);

impl OperationKey {
    /// A random key (UUID v4).
    pub fn new_v4() -> Self {
        Self::generate(KeyKind::V4)
    }

    /// A time-ordered key (UUID v7).
    pub fn new_v7() -> Self {
        Self::generate(KeyKind::V7)
    }

    /// A key of this kind.
    pub fn generate(kind: KeyKind) -> Self {
        let uuid = match kind {
            KeyKind::V4 => uuid::Uuid::new_v4(),
            KeyKind::V7 => uuid::Uuid::now_v7(),
        };
        let mut buf = uuid::Uuid::encode_buffer();
        Self(HeaderValue::from_str(uuid.hyphenated().encode_lower(&mut buf)).expect("ASCII"))
    }

    /// The caller's own key, such as an operation id it already stores.
    /// `None` if it cannot be a header value.
    pub fn from_caller(key: &str) -> Option<Self> {
        HeaderValue::from_str(key).ok().map(Self)
    }

    /// `Idempotency-Key`.
    pub fn header_name(&self) -> &'static str {
        KEY_HEADER
    }

    /// The key as a header value, bare (see [`KeyForm`]).
    pub fn header_value(&self) -> HeaderValue {
        self.0.clone()
    }

    /// The key as a header value in `form`: bare, or quoted as the IETF
    /// draft writes it, `"` and `\` escaped.
    ///
    /// ```
    /// use idem_tower::client::{KeyForm, OperationKey};
    ///
    /// let key = OperationKey::from_caller("order-42").unwrap();
    /// assert_eq!(key.header_value_in(KeyForm::Quoted), "\"order-42\"");
    /// assert_eq!(key.header_value_in(KeyForm::Bare), "order-42");
    /// ```
    pub fn header_value_in(&self, form: KeyForm) -> HeaderValue {
        match form {
            KeyForm::Bare => self.header_value(),
            KeyForm::Quoted => {
                let mut quoted = Vec::with_capacity(self.0.len() + 2);
                quoted.push(b'"');
                for &b in self.0.as_bytes() {
                    if b == b'"' || b == b'\\' {
                        quoted.push(b'\\');
                    }
                    quoted.push(b);
                }
                quoted.push(b'"');
                HeaderValue::from_bytes(&quoted).expect("a header value, quoted, is one")
            }
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

/// Whose key a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// The caller set `Idempotency-Key` itself.
    Caller,
    /// The layer made it for this logical request.
    Generated,
    /// A safe method (GET, HEAD, OPTIONS, TRACE): no key is sent.
    NotSent,
}

/// How the layer makes and writes the keys it generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyStyle {
    pub(crate) kind: KeyKind,
    pub(crate) form: KeyForm,
}

/// Makes sure a request of this method carries a key, once, before its
/// first attempt: the caller's if `Idempotency-Key` is already there (as
/// the caller wrote it), else a new one of `kind`, written in `form`.
/// Every retry then re-sends these same headers.
pub(crate) fn ensure(method: &Method, headers: &mut HeaderMap, style: KeyStyle) -> KeyOrigin {
    if method.is_safe() {
        return KeyOrigin::NotSent;
    }
    if headers.contains_key(KEY_HEADER) {
        return KeyOrigin::Caller;
    }
    headers.insert(
        KEY_HEADER,
        OperationKey::generate(style.kind).header_value_in(style.form),
    );
    KeyOrigin::Generated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_key_is_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(KEY_HEADER, HeaderValue::from_static("order-42"));
        assert_eq!(
            ensure(
                &Method::POST,
                &mut headers,
                KeyStyle {
                    kind: KeyKind::V4,
                    form: KeyForm::Bare
                }
            ),
            KeyOrigin::Caller
        );
        assert_eq!(headers[KEY_HEADER], "order-42");
        assert_eq!(headers.get_all(KEY_HEADER).iter().count(), 1);
    }

    #[test]
    fn a_missing_key_is_generated_once() {
        for kind in [KeyKind::V4, KeyKind::V7] {
            let mut headers = HeaderMap::new();
            assert_eq!(
                ensure(
                    &Method::POST,
                    &mut headers,
                    KeyStyle {
                        kind,
                        form: KeyForm::Bare
                    }
                ),
                KeyOrigin::Generated
            );
            let key = headers[KEY_HEADER].clone();
            let uuid = uuid::Uuid::parse_str(key.to_str().unwrap()).expect("a UUID");
            let version = match kind {
                KeyKind::V4 => 4,
                KeyKind::V7 => 7,
            };
            assert_eq!(uuid.get_version_num(), version);
            // A second pass (a retry) finds it and keeps it.
            assert_eq!(
                ensure(
                    &Method::POST,
                    &mut headers,
                    KeyStyle {
                        kind,
                        form: KeyForm::Bare
                    }
                ),
                KeyOrigin::Caller
            );
            assert_eq!(headers[KEY_HEADER], key);
        }
    }

    #[test]
    fn safe_methods_get_no_key() {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            let mut headers = HeaderMap::new();
            assert_eq!(
                ensure(
                    &method,
                    &mut headers,
                    KeyStyle {
                        kind: KeyKind::V4,
                        form: KeyForm::Bare
                    }
                ),
                KeyOrigin::NotSent
            );
            assert!(headers.is_empty());
        }
    }

    #[test]
    fn a_generated_key_is_quoted_when_asked() {
        let mut headers = HeaderMap::new();
        ensure(
            &Method::POST,
            &mut headers,
            KeyStyle {
                kind: KeyKind::V4,
                form: KeyForm::Quoted,
            },
        );
        let key = headers[KEY_HEADER].to_str().unwrap();
        let inner = key.strip_prefix('"').and_then(|k| k.strip_suffix('"'));
        uuid::Uuid::parse_str(inner.expect("quoted")).expect("a UUID");
        let odd = OperationKey::from_caller(r#"a"b\c"#).unwrap();
        assert_eq!(odd.header_value_in(KeyForm::Quoted), r#""a\"b\\c""#);
    }

    #[test]
    fn generated_keys_differ() {
        assert_ne!(OperationKey::new_v4(), OperationKey::new_v4());
        assert_ne!(OperationKey::new_v7(), OperationKey::new_v7());
    }
}
