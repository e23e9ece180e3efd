//! Idempotency keys: templates (`template.rs`), the request they are
//! evaluated against (`request.rs`), and here the composite key they
//! produce, scoped to its caller and escaped; `error.rs` says why a template
//! or a key was refused.

mod error;
mod header;
mod request;
mod template;

use std::fmt;

pub use error::{KeyError, TemplateError, TemplateErrorKind};
pub use request::RequestView;
use template::Segment;
pub use template::{KeyTemplate, Placeholder};

/// The longest value, in bytes, that one placeholder may contribute.
pub const MAX_PART_LEN: usize = 255;

/// The namespace stored keys get unless configured otherwise.
pub const DEFAULT_NAMESPACE: &str = "idem:";

/// Who may be answered with a record's response.
///
/// A record is bound to the caller who created it: with [`KeyScope::Caller`]
/// (the default) the request's tenant and user are part of the stored key
/// whether or not the template names them, so a caller can never be replayed
/// another caller's response, even under a template such as
/// `refund:{path:charge_id}:{header:idempotency-key}`.
///
/// Binding by key rather than by fingerprint is deliberate: under a
/// fingerprint, a second caller reusing a key would learn that the key
/// exists (a 422) and could block it for its owner; under the key, the two
/// callers simply have independent records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyScope {
    /// The resolved tenant and user always scope the key (the default).
    #[default]
    Caller,
    /// The key is exactly what the template says, whoever sends it: every
    /// caller with the same key shares one record. For keys that name a
    /// resource any caller may act on, such as a payment platform's
    /// callback keyed by payment number.
    Shared,
}

impl KeyTemplate {
    /// Builds the key for `request`, stored under `namespace`, scoped to
    /// its caller ([`KeyScope::Caller`]).
    ///
    /// Every placeholder must resolve: a missing part is an error naming it,
    /// never a shorter key. Values are escaped so that no choice of values can
    /// produce another request's key (`:`, `%`, `{` and `}` are
    /// percent-encoded, and the spaces a quoted key header may hold), and the composite is wrapped in a Redis Cluster hash
    /// tag so all of one request's keys share a slot.
    ///
    /// A tenant or user the request has and the template does not name is
    /// appended as `:@tenant=...` or `:@user=...`:
    ///
    /// ```
    /// use http::{HeaderMap, Method};
    /// use idem_core::{KeyScope, KeyTemplate, RequestView};
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert("idempotency-key", "k-1".parse().unwrap());
    /// let request = RequestView::new(&Method::POST, "/refunds", &headers).tenant(Some("acme"));
    /// let template: KeyTemplate = "refund:{header:idempotency-key}".parse()?;
    ///
    /// let key = template.evaluate(&request, "idem:")?;
    /// assert_eq!(key.as_str(), "idem:{refund:k-1:@tenant=acme}");
    /// let shared = template.evaluate_scoped(&request, "idem:", KeyScope::Shared)?;
    /// assert_eq!(shared.as_str(), "idem:{refund:k-1}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn evaluate(
        &self,
        request: &RequestView<'_>,
        namespace: &str,
    ) -> Result<IdempotencyKey, KeyError> {
        self.evaluate_scoped(request, namespace, KeyScope::Caller)
    }

    /// [`evaluate`](Self::evaluate) with an explicit [`KeyScope`].
    pub fn evaluate_scoped(
        &self,
        request: &RequestView<'_>,
        namespace: &str,
        scope: KeyScope,
    ) -> Result<IdempotencyKey, KeyError> {
        let mut full = String::with_capacity(namespace.len() + self.as_str().len() + 64);
        full.push_str(namespace);
        full.push('{');
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => full.push_str(text),
                Segment::Placeholder(p) => escape_into(&mut full, &request.resolve(p)?),
            }
        }
        if scope == KeyScope::Caller {
            // `:` never comes from a value (values are escaped), so the
            // suffix cannot be forged by one.
            for (placeholder, label) in
                [(Placeholder::Tenant, "tenant"), (Placeholder::User, "user")]
            {
                if self.placeholders().any(|p| *p == placeholder) {
                    continue;
                }
                // No tenant (or user) is a scope of its own; a malformed one
                // is an error, never a fall back to a wider scope.
                let value = match request.resolve(&placeholder) {
                    Ok(value) => value,
                    Err(KeyError::Missing(_)) => continue,
                    Err(err) => return Err(err),
                };
                full.push_str(":@");
                full.push_str(label);
                full.push('=');
                escape_into(&mut full, &value);
            }
        }
        full.push('}');
        Ok(IdempotencyKey {
            full,
            namespace_len: namespace.len(),
        })
    }
}

fn escape_into(out: &mut String, value: &str) {
    let mut rest = value;
    while let Some(at) = rest.find(['%', ':', '{', '}', ' ']) {
        out.push_str(&rest[..at]);
        out.push_str(match rest.as_bytes()[at] {
            b'%' => "%25",
            b':' => "%3A",
            b'{' => "%7B",
            b' ' => "%20",
            _ => "%7D",
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// A composite, namespaced idempotency key, as stores see it:
/// `idem:{order-create:acme:u-7:8e03978e}`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    full: String,
    namespace_len: usize,
}

impl IdempotencyKey {
    /// A key from an already composed string, for stores' own tests and
    /// tools; requests get theirs from [`KeyTemplate::evaluate`].
    ///
    /// ```
    /// let key = idem_core::IdempotencyKey::new("idem:", "pay:42");
    /// assert_eq!(key.as_str(), "idem:{pay:42}");
    /// assert_eq!(key.composite(), "pay:42");
    /// ```
    pub fn new(namespace: &str, composite: &str) -> Self {
        Self {
            full: format!("{namespace}{{{composite}}}"),
            namespace_len: namespace.len(),
        }
    }

    /// The key as stored: namespace, then the hash-tagged composite.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The composite alone, without namespace or hash tag.
    pub fn composite(&self) -> &str {
        &self.full[self.namespace_len + 1..self.full.len() - 1]
    }

    /// A short hash of the key, safe to log: keys may carry user ids.
    pub fn redacted(&self) -> String {
        blake3::hash(self.full.as_bytes()).to_hex()[..16].to_owned()
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey")
            .field(&self.redacted())
            .finish()
    }
}

#[cfg(test)]
mod tests;
