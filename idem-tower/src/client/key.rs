//! The key of one logical request: the caller's own, or one made here
//! once and kept across every retry of that request.
//!
//! A key per attempt would make every retry a new operation on the server;
//! a key per business operation, reused for every call that performs it,
//! is what makes at-least-once delivery safe. The caller that already has
//! one (an order id, a payment intent) sets the `Idempotency-Key` header
//! itself, or builds it with [`OperationKey`].

use http::{HeaderMap, HeaderValue, Method};

pub use crate::operation::{KeyForm, OperationKey};

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

/// Keys made here: [`OperationKey`]'s generated forms (feature `client`).
impl OperationKey {
    /// A random key (UUID v4).
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
}

/// Whose key a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// The caller gave it: set `Idempotency-Key` itself, or put an
    /// [`OperationKey`] in the request's extensions (such as one a handler
    /// derived with [`Operation::key_for`](crate::Operation::key_for)).
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
/// the caller wrote it), else the [`OperationKey`] the caller put in the
/// request's extensions (`given`), written in `form`, else a new one of
/// `kind`, written in `form`. Every retry then re-sends these same headers.
///
/// A header written by hand wins over an extension: it is the more
/// explicit of the two, and a request carries one key.
pub(crate) fn ensure(
    method: &Method,
    headers: &mut HeaderMap,
    given: Option<&OperationKey>,
    style: KeyStyle,
) -> KeyOrigin {
    if method.is_safe() {
        return KeyOrigin::NotSent;
    }
    if headers.contains_key(KEY_HEADER) {
        return KeyOrigin::Caller;
    }
    if let Some(key) = given {
        headers.insert(KEY_HEADER, key.header_value_in(style.form));
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
                None,
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
                    None,
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
                    None,
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
                    None,
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
            None,
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
    fn a_key_in_the_extensions_is_sent_and_a_header_wins_over_it() {
        let given = OperationKey::from_caller("psp-7f3a").unwrap();
        let style = KeyStyle {
            kind: KeyKind::V4,
            form: KeyForm::Quoted,
        };
        let mut headers = HeaderMap::new();
        let origin = ensure(&Method::POST, &mut headers, Some(&given), style);
        assert_eq!(origin, KeyOrigin::Caller);
        assert_eq!(headers[KEY_HEADER], "\"psp-7f3a\"");
        let mut written = HeaderMap::new();
        written.insert(KEY_HEADER, HeaderValue::from_static("by-hand"));
        ensure(&Method::POST, &mut written, Some(&given), style);
        assert_eq!(written[KEY_HEADER], "by-hand");
        let mut safe = HeaderMap::new();
        assert_eq!(
            ensure(&Method::GET, &mut safe, Some(&given), style),
            KeyOrigin::NotSent
        );
        assert!(safe.is_empty());
    }

    #[test]
    fn generated_keys_differ() {
        assert_ne!(OperationKey::new_v4(), OperationKey::new_v4());
        assert_ne!(OperationKey::new_v7(), OperationKey::new_v7());
    }
}
