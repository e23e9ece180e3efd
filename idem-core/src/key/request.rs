//! The request a key template (and a fingerprint) is evaluated against, and
//! how each placeholder finds its value in it.

use std::borrow::Cow;
use std::cell::OnceCell;

use http::{HeaderMap, HeaderName, Method};

use super::header::{self, Fault};
use super::{KeyError, MAX_PART_LEN, Placeholder};

/// The header the draft names, the key header unless a view says otherwise.
static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

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
    key_header: &'a HeaderName,
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
            key_header: &IDEMPOTENCY_KEY,
            path_params: &[],
            query: None,
            body: &[],
            tenant: None,
            user: None,
            json: OnceCell::new(),
        }
    }

    /// The header that carries the idempotency key, read as the IETF draft
    /// writes it (`idempotency-key` unless set): a `{header:...}` of this
    /// name takes a quoted Structured Field String (`"abc-1"`, which may
    /// hold spaces) or the bare form (`abc-1`), and the same characters in
    /// either form are one key. Every other header is taken as written.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderName, Method};
    /// use idem_core::{KeyTemplate, RequestView};
    ///
    /// let template: KeyTemplate = "op:{header:x-op-key}".parse()?;
    /// let name = HeaderName::from_static("x-op-key");
    /// let mut quoted = HeaderMap::new();
    /// quoted.insert(&name, "\"order 7 of 9\"".parse().unwrap());
    /// let request = RequestView::new(&Method::POST, "/orders", &quoted).key_header(&name);
    /// assert_eq!(template.evaluate(&request, "idem:")?.as_str(), "idem:{op:order%207%20of%209}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key_header(mut self, name: &'a HeaderName) -> Self {
        self.key_header = name;
        self
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

    /// The value of `placeholder` in this request, checked: present, at
    /// most [`MAX_PART_LEN`] bytes of visible ASCII (spaces too in a quoted
    /// key header, `header.rs`).
    pub(super) fn resolve(&self, placeholder: &Placeholder) -> Result<Cow<'a, str>, KeyError> {
        let missing = || KeyError::Missing(placeholder.clone());
        let mut spaces_allowed = false;
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
                if name == self.key_header {
                    spaces_allowed = true;
                    header::key_of(value).map_err(|fault| match fault {
                        Fault::NotVisibleAscii => KeyError::NotVisibleAscii(placeholder.clone()),
                        Fault::NotAString(why) => KeyError::NotAString {
                            placeholder: placeholder.clone(),
                            why,
                        },
                    })?
                } else {
                    Cow::Borrowed(
                        value
                            .to_str()
                            .map_err(|_| KeyError::NotVisibleAscii(placeholder.clone()))?,
                    )
                }
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
        if !value
            .bytes()
            .all(|b| b.is_ascii_graphic() || (spaces_allowed && b == b' '))
        {
            return Err(KeyError::NotVisibleAscii(placeholder.clone()));
        }
        Ok(value)
    }
}
