//! Idempotency keys: templates, the request they are evaluated against, and
//! the composite key they produce.

mod template;

use std::borrow::Cow;
use std::cell::OnceCell;
use std::fmt;

use http::{HeaderMap, Method};

use template::Segment;
pub use template::{KeyTemplate, Placeholder, TemplateError, TemplateErrorKind};

/// The longest value, in bytes, that one placeholder may contribute.
pub const MAX_PART_LEN: usize = 255;

/// The namespace stored keys get unless configured otherwise.
pub const DEFAULT_NAMESPACE: &str = "idem:";

/// What a key template (and a fingerprint) is evaluated against: the parts of
/// one request that matter, borrowed from it.
///
/// ```
/// use http::{HeaderMap, Method};
/// use idem_core::{KeyTemplate, RequestView};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("idempotency-key", "8e03978e".parse().unwrap());
/// let request = RequestView::new(&Method::POST, "/orders", &headers)
///     .tenant(Some("acme"))
///     .user(Some("u-7"));
///
/// let template: KeyTemplate = "order-create:{tenant}:{user}:{header:idempotency-key}".parse()?;
/// let key = template.evaluate(&request, "idem:")?;
/// assert_eq!(key.as_str(), "idem:{order-create:acme:u-7:8e03978e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RequestView<'a> {
    pub(crate) method: &'a Method,
    pub(crate) route: &'a str,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) path_params: &'a [(String, String)],
    pub(crate) query: Option<&'a str>,
    pub(crate) body: &'a [u8],
    tenant: Option<&'a str>,
    user: Option<&'a str>,
    json: OnceCell<Option<serde_json::Value>>,
}

impl<'a> RequestView<'a> {
    /// A request with no path parameters, query, body, tenant or user.
    pub fn new(method: &'a Method, route: &'a str, headers: &'a HeaderMap) -> Self {
        Self {
            method,
            route,
            headers,
            path_params: &[],
            query: None,
            body: &[],
            tenant: None,
            user: None,
            json: OnceCell::new(),
        }
    }

    /// The matched route's path parameters, as name and decoded value.
    pub fn path_params(mut self, params: &'a [(String, String)]) -> Self {
        self.path_params = params;
        self
    }

    /// The raw query string, without the `?`.
    pub fn query(mut self, query: Option<&'a str>) -> Self {
        self.query = query;
        self
    }

    /// The buffered request body.
    pub fn body(mut self, body: &'a [u8]) -> Self {
        self.body = body;
        self.json = OnceCell::new();
        self
    }

    /// The tenant, as the tenant resolver found it.
    pub fn tenant(mut self, tenant: Option<&'a str>) -> Self {
        self.tenant = tenant;
        self
    }

    /// The user, as the user resolver found it.
    pub fn user(mut self, user: Option<&'a str>) -> Self {
        self.user = user;
        self
    }

    /// The body parsed as JSON, once, or `None` if it is not JSON.
    pub(crate) fn json(&self) -> Option<&serde_json::Value> {
        self.json
            .get_or_init(|| serde_json::from_slice(self.body).ok())
            .as_ref()
    }

    /// Whether `placeholder` has a value in this request (valid or not).
    /// A route with an optional key passes a request through only when none
    /// of its client-supplied parts is present.
    pub fn is_present(&self, placeholder: &Placeholder) -> bool {
        !matches!(
            self.resolve(placeholder),
            Err(KeyError::Missing(_) | KeyError::BodyNotJson)
        )
    }

    fn resolve(&self, placeholder: &Placeholder) -> Result<Cow<'a, str>, KeyError> {
        let missing = || KeyError::Missing(placeholder.clone());
        let value = match placeholder {
            Placeholder::Tenant => Cow::Borrowed(self.tenant.ok_or_else(missing)?),
            Placeholder::User => Cow::Borrowed(self.user.ok_or_else(missing)?),
            Placeholder::Method => Cow::Borrowed(self.method.as_str()),
            Placeholder::Route => Cow::Borrowed(self.route),
            Placeholder::Header(name) => {
                let mut values = self.headers.get_all(name).iter();
                let value = values.next().ok_or_else(missing)?;
                if values.next().is_some() {
                    return Err(KeyError::Repeated(placeholder.clone()));
                }
                Cow::Borrowed(
                    value
                        .to_str()
                        .map_err(|_| KeyError::NotVisibleAscii(placeholder.clone()))?,
                )
            }
            Placeholder::Path(name) => self
                .path_params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| Cow::Borrowed(v.as_str()))
                .ok_or_else(missing)?,
            Placeholder::Query(name) => {
                let mut found = form_urlencoded::parse(self.query.unwrap_or("").as_bytes())
                    .filter(|(k, _)| k == name.as_str());
                let value = found.next().ok_or_else(missing)?.1;
                if found.next().is_some() {
                    return Err(KeyError::Repeated(placeholder.clone()));
                }
                value
            }
            Placeholder::Body(pointer) => {
                let json = self.json().ok_or(KeyError::BodyNotJson)?;
                Cow::Owned(match json.pointer(pointer) {
                    None | Some(serde_json::Value::Null) => return Err(missing()),
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                        v.to_string()
                    }
                    Some(_) => return Err(KeyError::NotScalar(placeholder.clone())),
                })
            }
        };
        if value.is_empty() {
            return Err(missing());
        }
        if value.len() > MAX_PART_LEN {
            return Err(KeyError::TooLong {
                placeholder: placeholder.clone(),
                len: value.len(),
            });
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError::NotVisibleAscii(placeholder.clone()));
        }
        Ok(value)
    }
}

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
    /// percent-encoded), and the composite is wrapped in a Redis Cluster hash
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
    while let Some(at) = rest.find(['%', ':', '{', '}']) {
        out.push_str(&rest[..at]);
        out.push_str(match rest.as_bytes()[at] {
            b'%' => "%25",
            b':' => "%3A",
            b'{' => "%7B",
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

/// Why a key could not be built for a request. Each is a client error (400).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The placeholder resolved to nothing (absent or empty).
    Missing(Placeholder),
    /// A header or query parameter the key reads was given more than once.
    Repeated(Placeholder),
    /// The value is longer than [`MAX_PART_LEN`] bytes.
    TooLong {
        /// Which part.
        placeholder: Placeholder,
        /// Its length in bytes.
        len: usize,
    },
    /// The value holds something other than visible ASCII.
    NotVisibleAscii(Placeholder),
    /// A `{body:...}` placeholder points at an object or array.
    NotScalar(Placeholder),
    /// The key or fingerprint reads the body as JSON, and it is not JSON.
    BodyNotJson,
}

impl KeyError {
    /// The placeholder at fault, if one is.
    pub fn placeholder(&self) -> Option<&Placeholder> {
        match self {
            Self::Missing(p)
            | Self::Repeated(p)
            | Self::NotVisibleAscii(p)
            | Self::NotScalar(p)
            | Self::TooLong { placeholder: p, .. } => Some(p),
            Self::BodyNotJson => None,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(p) => write!(
                f,
                "the idempotency key needs {{{p}}}, and the request has none"
            ),
            Self::Repeated(p) => write!(f, "{{{p}}} was given more than once"),
            Self::TooLong { placeholder, len } => write!(
                f,
                "{{{placeholder}}} is {len} bytes long; at most {MAX_PART_LEN} are allowed"
            ),
            Self::NotVisibleAscii(p) => write!(f, "{{{p}}} must be visible ASCII"),
            Self::NotScalar(p) => {
                write!(
                    f,
                    "{{{p}}} must be a string, number or boolean in the JSON body"
                )
            }
            Self::BodyNotJson => f.write_str("the request body must be JSON"),
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn the_caller_scopes_every_key_unless_shared() {
        let h = headers(&[("idempotency-key", "k-1")]);
        let m = Method::POST;
        let t = KeyTemplate::parse("refund:{header:idempotency-key}").unwrap();
        let key = |tenant: Option<&str>, user: Option<&str>, scope| {
            let v = RequestView::new(&m, "/r", &h).tenant(tenant).user(user);
            t.evaluate_scoped(&v, "idem:", scope)
                .map(|k| k.as_str().to_owned())
        };
        use KeyScope::{Caller, Shared};
        assert_eq!(
            key(Some("acme"), Some("alice"), Caller).unwrap(),
            "idem:{refund:k-1:@tenant=acme:@user=alice}"
        );
        assert_eq!(
            key(None, Some("alice"), Caller).unwrap(),
            "idem:{refund:k-1:@user=alice}"
        );
        assert_eq!(key(None, None, Caller).unwrap(), "idem:{refund:k-1}");
        assert_eq!(
            key(Some("acme"), Some("alice"), Shared).unwrap(),
            "idem:{refund:k-1}"
        );
        // A tenant named "alice" is not the user alice; escaped values
        // cannot forge a suffix.
        assert_ne!(
            key(Some("alice"), None, Caller),
            key(None, Some("alice"), Caller)
        );
        assert_eq!(
            key(Some("a:@user=b"), None, Caller).unwrap(),
            "idem:{refund:k-1:@tenant=a%3A@user=b}"
        );
        assert_ne!(
            key(Some("a:@user=b"), None, Caller),
            key(Some("a"), Some("b"), Caller)
        );
        // A malformed identity is an error, never a fall back to no scope.
        assert!(matches!(
            key(Some("acme corp"), None, Caller),
            Err(KeyError::NotVisibleAscii(Placeholder::Tenant))
        ));
    }

    #[test]
    fn a_template_naming_the_caller_is_not_scoped_twice() {
        let h = headers(&[("idempotency-key", "k-1")]);
        let v = RequestView::new(&Method::POST, "/r", &h)
            .tenant(Some("acme"))
            .user(Some("alice"));
        assert_eq!(
            eval("o:{tenant}:{header:idempotency-key}", &v).unwrap(),
            "o:acme:k-1:@user=alice"
        );
        assert_eq!(
            eval("o:{tenant}:{user}:{header:idempotency-key}", &v).unwrap(),
            "o:acme:alice:k-1"
        );
    }

    fn eval(template: &str, request: &RequestView<'_>) -> Result<String, KeyError> {
        let t = KeyTemplate::parse(template).unwrap();
        t.evaluate(request, "idem:")
            .map(|k| k.composite().to_owned())
    }

    #[test]
    fn resolves_every_placeholder_kind() {
        let h = headers(&[("idempotency-key", "k1")]);
        let params = vec![("payment_no".to_owned(), "P9".to_owned())];
        let body = br#"{"order":{"no":"O-1"},"n":3,"paid":true}"#;
        let request = RequestView::new(&Method::POST, "/p/{payment_no}", &h)
            .path_params(&params)
            .query(Some("a=1&b=x%2Fy"))
            .body(body)
            .tenant(Some("t"))
            .user(Some("u"));
        let key = eval(
            "s:{tenant}:{user}:{method}:{route}:{header:idempotency-key}:{path:payment_no}:{query:b}:{body:/order/no}:{body:/n}:{body:/paid}",
            &request,
        );
        assert_eq!(
            key.unwrap(),
            "s:t:u:POST:/p/%7Bpayment_no%7D:k1:P9:x/y:O-1:3:true"
        );
    }

    #[test]
    fn missing_parts_are_named_never_dropped() {
        let h = HeaderMap::new();
        let request = RequestView::new(&Method::POST, "/", &h).tenant(Some("t"));
        assert_eq!(
            eval("x:{tenant}:{user}:{header:idempotency-key}", &request),
            Err(KeyError::Missing(Placeholder::User))
        );
        let request = request.user(Some("u"));
        assert_eq!(
            eval("x:{tenant}:{user}:{header:idempotency-key}", &request),
            Err(KeyError::Missing(Placeholder::Header(
                "idempotency-key".parse().unwrap()
            )))
        );
    }

    #[test]
    fn presence_is_told_apart_from_validity() {
        let h = headers(&[("k", "has space")]);
        let request = RequestView::new(&Method::POST, "/", &h);
        assert!(request.is_present(&Placeholder::Header("k".parse().unwrap())));
        assert!(!request.is_present(&Placeholder::Header("other".parse().unwrap())));
        assert!(!request.is_present(&Placeholder::Body("/a".into())));
    }

    #[test]
    fn empty_and_null_values_count_as_missing() {
        let h = headers(&[("k", "")]);
        let request = RequestView::new(&Method::POST, "/", &h).body(br#"{"a":null}"#);
        assert!(matches!(
            eval("{header:k}", &request),
            Err(KeyError::Missing(_))
        ));
        assert!(matches!(
            eval("{body:/a}", &request),
            Err(KeyError::Missing(_))
        ));
    }

    #[test]
    fn client_parts_are_capped_at_255_visible_ascii_bytes() {
        let ok = "a".repeat(255);
        let long = "a".repeat(256);
        let h = headers(&[("ok", &ok), ("long", &long), ("space", "a b")]);
        let request = RequestView::new(&Method::POST, "/", &h);
        assert!(eval("{header:ok}", &request).is_ok());
        assert_eq!(
            eval("{header:long}", &request),
            Err(KeyError::TooLong {
                placeholder: Placeholder::Header("long".parse().unwrap()),
                len: 256
            })
        );
        assert!(matches!(
            eval("{header:space}", &request),
            Err(KeyError::NotVisibleAscii(_))
        ));
        let mut h = HeaderMap::new();
        h.insert("bin", http::HeaderValue::from_bytes(b"\xff").unwrap());
        let request = RequestView::new(&Method::POST, "/", &h);
        assert!(matches!(
            eval("{header:bin}", &request),
            Err(KeyError::NotVisibleAscii(_))
        ));
    }

    #[test]
    fn repeated_headers_and_query_parameters_are_rejected() {
        let h = headers(&[("k", "1"), ("k", "2")]);
        let request = RequestView::new(&Method::POST, "/", &h).query(Some("q=1&q=2"));
        assert!(matches!(
            eval("{header:k}", &request),
            Err(KeyError::Repeated(_))
        ));
        assert!(matches!(
            eval("{query:q}", &request),
            Err(KeyError::Repeated(_))
        ));
    }

    #[test]
    fn separators_in_values_cannot_forge_another_key() {
        let a = headers(&[("a", "1:2"), ("b", "3")]);
        let b = headers(&[("a", "1"), ("b", "2:3")]);
        let ka = eval(
            "{header:a}:{header:b}",
            &RequestView::new(&Method::POST, "/", &a),
        );
        let kb = eval(
            "{header:a}:{header:b}",
            &RequestView::new(&Method::POST, "/", &b),
        );
        assert_ne!(ka.unwrap(), kb.unwrap());
    }

    #[test]
    fn body_placeholders_need_json_scalars() {
        let h = HeaderMap::new();
        let request = RequestView::new(&Method::POST, "/", &h).body(b"not json");
        assert_eq!(eval("{body:/a}", &request), Err(KeyError::BodyNotJson));
        let request = RequestView::new(&Method::POST, "/", &h).body(br#"{"a":[1]}"#);
        assert!(matches!(
            eval("{body:/a}", &request),
            Err(KeyError::NotScalar(_))
        ));
    }

    #[test]
    fn stored_key_is_namespaced_and_hash_tagged() {
        let h = headers(&[("k", "x}y")]);
        let key = KeyTemplate::parse("op:{header:k}")
            .unwrap()
            .evaluate(&RequestView::new(&Method::POST, "/", &h), "app1:")
            .unwrap();
        assert_eq!(key.as_str(), "app1:{op:x%7Dy}");
        assert_eq!(key.redacted().len(), 16);
        assert!(!format!("{key:?}").contains("op:"));
    }
}
