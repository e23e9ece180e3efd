//! [`OperationKey`]: the `Idempotency-Key` one call sends, made once per
//! operation (by the caller, by the client layer, or derived from the
//! operation a handler runs for).

use http::HeaderValue;

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
/// # #[cfg(feature = "client")] {
/// use idem_tower::client::{IdempotencyClientLayer, KeyForm, RetryPolicy};
///
/// let layer = IdempotencyClientLayer::new(RetryPolicy::default()).key_form(KeyForm::Quoted);
/// # let _ = layer;
/// # }
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
/// Put it in the header yourself, or in the request's extensions, where
/// the client half (`idem_tower::client`, feature `client`) finds it and
/// sends it with every attempt. A handler's calls out take theirs from the
/// operation it runs for: [`Operation::key_for`](crate::Operation::key_for)
/// (docs/outbound.md).
///
/// ```
/// use idem_tower::OperationKey;
///
/// let key = OperationKey::from_caller("order-42").unwrap();
/// let request = http::Request::post("http://orders.local/orders")
///     .header(key.header_name(), key.header_value())
///     .body(String::from(r#"{"sku":"A-1"}"#))
///     .unwrap();
/// # let _ = request;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationKey(pub(crate) HeaderValue);

impl OperationKey {
    /// The caller's own key, such as an operation id it already stores.
    /// `None` if it cannot be a header value.
    pub fn from_caller(key: &str) -> Option<Self> {
        HeaderValue::from_str(key).ok().map(Self)
    }

    /// `Idempotency-Key`.
    pub fn header_name(&self) -> &'static str {
        "idempotency-key"
    }

    /// The key as a header value, bare (see [`KeyForm`]).
    pub fn header_value(&self) -> HeaderValue {
        self.0.clone()
    }

    /// The key as a header value in `form`: bare, or quoted as the IETF
    /// draft writes it, `"` and `\` escaped.
    ///
    /// ```
    /// use idem_tower::{KeyForm, OperationKey};
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
