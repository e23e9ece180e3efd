//! Request fingerprints: the same key sent with a different request is a 422.

mod canonical;

use std::fmt;
use std::sync::LazyLock;

use crate::{KeyError, RequestView};

/// What a [`Fingerprint`] covers besides the method, the route pattern and
/// the path parameters (which always count: one key sent to `/orders/1/pay`
/// and then to `/orders/2/pay` is two different requests, never a replay).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FingerprintSpec {
    /// The canonical query and the whole body (the default). A JSON body is
    /// hashed in canonical form, so re-serialising it on retry (other key
    /// order, other whitespace) is still the same request.
    #[default]
    Request,
    /// The canonical query and only these JSON pointers into the body, for
    /// bodies that carry volatile fields such as a client timestamp.
    JsonFields(Vec<String>),
    /// Method, route and path parameters only: any query and body are
    /// accepted under the same key.
    MethodAndRoute,
}

/// A blake3 hash identifying what a request asked for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Computes the fingerprint of `request` under `spec`.
    ///
    /// ```
    /// use http::{HeaderMap, Method};
    /// use idem_core::{Fingerprint, FingerprintSpec, RequestView};
    ///
    /// let headers = HeaderMap::new();
    /// let a = RequestView::new(&Method::POST, "/orders", &headers).body(br#"{"sku":"A","qty":1}"#);
    /// let b = RequestView::new(&Method::POST, "/orders", &headers).body(br#"{ "qty": 1, "sku": "A" }"#);
    /// let c = RequestView::new(&Method::POST, "/orders", &headers).body(br#"{"sku":"A","qty":2}"#);
    /// let fp = |r| Fingerprint::of(r, &FingerprintSpec::Request).unwrap();
    /// assert_eq!(fp(&a), fp(&b));
    /// assert_ne!(fp(&a), fp(&c));
    /// ```
    pub fn of(request: &RequestView<'_>, spec: &FingerprintSpec) -> Result<Self, KeyError> {
        let mut h = Hasher(Vec::with_capacity(256 + request.body.len()));
        h.bytes(request.method.as_str().as_bytes());
        h.bytes(request.route.as_bytes());
        let mut params: Vec<_> = request.path_params.iter().collect();
        params.sort_unstable();
        h.len(params.len());
        for (name, value) in params {
            h.bytes(name.as_bytes());
            h.bytes(value.as_bytes());
        }
        if matches!(spec, FingerprintSpec::MethodAndRoute) {
            return Ok(h.finish());
        }
        let mut query: Vec<_> =
            form_urlencoded::parse(request.query.unwrap_or("").as_bytes()).collect();
        query.sort_unstable();
        h.len(query.len());
        for (k, v) in &query {
            h.bytes(k.as_bytes());
            h.bytes(v.as_bytes());
        }
        match spec {
            FingerprintSpec::Request => {
                h.tag(b'j');
                if !canonical::write(&mut h, request.body) {
                    // Not JSON: the bytes as they are.
                    h.0.pop();
                    h.tag(b'b');
                    h.bytes(request.body);
                }
            }
            FingerprintSpec::JsonFields(pointers) => {
                let json = request.json().ok_or(KeyError::BodyNotJson)?;
                for pointer in pointers {
                    h.bytes(pointer.as_bytes());
                    match json.pointer(pointer) {
                        Some(value) => {
                            h.tag(b'v');
                            h.json(value);
                        }
                        None => h.tag(b'-'),
                    }
                }
            }
            FingerprintSpec::MethodAndRoute => unreachable!("returned above"),
        }
        Ok(h.finish())
    }

    /// The fingerprint from its 32 stored bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 bytes to store.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = blake3::Hash::from_bytes(self.0).to_hex();
        write!(f, "Fingerprint({})", &hex[..16])
    }
}

/// The hasher every fingerprint starts from, its key derived once.
static KEYED: LazyLock<blake3::Hasher> =
    LazyLock::new(|| blake3::Hasher::new_derive_key("idem 2026-11-30 request fingerprint v1"));

/// Length-prefixed, tagged writes, so no two inputs hash alike by accident.
/// They go to a buffer hashed in one call at the end: a JSON body makes
/// dozens of writes of a few bytes each, and hashing each as it comes costs
/// more than the hash of the whole.
struct Hasher(Vec<u8>);

impl Hasher {
    fn tag(&mut self, tag: u8) {
        self.0.push(tag);
    }

    fn len(&mut self, len: usize) {
        self.0.extend_from_slice(&(len as u64).to_le_bytes());
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.len(bytes.len());
        self.0.extend_from_slice(bytes);
    }

    /// Writes `value` formatted, length-prefixed like [`Hasher::bytes`],
    /// without a string of its own.
    fn display(&mut self, value: &impl fmt::Display) {
        use std::io::Write;
        let at = self.0.len();
        self.len(0);
        write!(self.0, "{value}").expect("writing to a Vec cannot fail");
        self.patch_len(at, self.0.len() - at - 8);
    }

    /// Overwrites the length written at `at` (as a placeholder) with `len`.
    fn patch_len(&mut self, at: usize, len: usize) {
        self.0[at..at + 8].copy_from_slice(&(len as u64).to_le_bytes());
    }

    /// Canonical JSON of a parsed value (a field picked by a JSON pointer):
    /// the same bytes as [`canonical::write`] writes from the text.
    fn json(&mut self, value: &serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::Null => self.tag(b'n'),
            Value::Bool(b) => self.tag(if *b { b't' } else { b'f' }),
            Value::Number(n) => {
                self.tag(b'#');
                self.display(n);
            }
            Value::String(s) => {
                self.tag(b's');
                self.bytes(s.as_bytes());
            }
            Value::Array(items) => {
                self.tag(b'[');
                self.len(items.len());
                items.iter().for_each(|v| self.json(v));
            }
            Value::Object(map) => {
                self.tag(b'{');
                self.len(map.len());
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (k, v) in entries {
                    self.bytes(k.as_bytes());
                    self.json(v);
                }
            }
        }
    }

    fn finish(self) -> Fingerprint {
        let mut hasher = KEYED.clone();
        hasher.update(&self.0);
        Fingerprint(*hasher.finalize().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method};

    use super::*;

    fn fp(
        method: Method,
        route: &str,
        query: Option<&str>,
        body: &[u8],
        spec: &FingerprintSpec,
    ) -> Fingerprint {
        let h = HeaderMap::new();
        let request = RequestView::new(&method, route, &h).query(query).body(body);
        Fingerprint::of(&request, spec).unwrap()
    }

    #[test]
    fn covers_method_route_query_and_body() {
        let spec = FingerprintSpec::Request;
        let base = fp(Method::POST, "/a", Some("x=1"), b"{}", &spec);
        assert_eq!(base, fp(Method::POST, "/a", Some("x=1"), b"{ }", &spec));
        assert_ne!(base, fp(Method::PUT, "/a", Some("x=1"), b"{}", &spec));
        assert_ne!(base, fp(Method::POST, "/b", Some("x=1"), b"{}", &spec));
        assert_ne!(base, fp(Method::POST, "/a", Some("x=2"), b"{}", &spec));
        assert_ne!(base, fp(Method::POST, "/a", Some("x=1"), b"[]", &spec));
    }

    #[test]
    fn path_parameters_always_count() {
        let h = HeaderMap::new();
        let one = [("order_id".to_owned(), "1".to_owned())];
        let two = [("order_id".to_owned(), "2".to_owned())];
        for spec in [
            FingerprintSpec::Request,
            FingerprintSpec::JsonFields(vec!["/a".into()]),
            FingerprintSpec::MethodAndRoute,
        ] {
            let fp = |params| {
                let r = RequestView::new(&Method::POST, "/orders/{order_id}/pay", &h)
                    .path_params(params)
                    .body(b"{}");
                Fingerprint::of(&r, &spec).unwrap()
            };
            assert_ne!(fp(&one), fp(&two), "{spec:?}");
        }
    }

    #[test]
    fn query_order_does_not_matter() {
        let spec = FingerprintSpec::Request;
        assert_eq!(
            fp(Method::GET, "/", Some("a=1&b=2"), b"", &spec),
            fp(Method::GET, "/", Some("b=2&a=1"), b"", &spec)
        );
    }

    #[test]
    fn non_json_bodies_are_hashed_raw() {
        let spec = FingerprintSpec::Request;
        assert_ne!(
            fp(Method::POST, "/", None, b"a b", &spec),
            fp(Method::POST, "/", None, b"a  b", &spec)
        );
    }

    #[test]
    fn json_fields_ignore_the_rest_of_the_body() {
        let spec = FingerprintSpec::JsonFields(vec!["/amount".into()]);
        let a = fp(Method::POST, "/", None, br#"{"amount":5,"ts":1}"#, &spec);
        let b = fp(Method::POST, "/", None, br#"{"amount":5,"ts":2}"#, &spec);
        let c = fp(Method::POST, "/", None, br#"{"amount":6,"ts":1}"#, &spec);
        let d = fp(Method::POST, "/", None, br#"{"ts":1}"#, &spec);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn method_and_route_ignores_body_and_query() {
        let spec = FingerprintSpec::MethodAndRoute;
        assert_eq!(
            fp(Method::POST, "/", Some("a=1"), b"x", &spec),
            fp(Method::POST, "/", None, b"y", &spec)
        );
    }

    /// Fingerprints are stored: a change of their encoding would turn every
    /// duplicate of a record written before an upgrade into a 422.
    #[test]
    fn the_encoding_is_stable() {
        let h = HeaderMap::new();
        let params = [("id".to_owned(), "7".to_owned())];
        let request = RequestView::new(&Method::POST, "/orders/{id}", &h)
            .path_params(&params)
            .query(Some("b=2&a=1"))
            .body(br#"{"qty":2,"sku":"A","amount":12.5,"tags":[null,true,"x"]}"#);
        let fp = Fingerprint::of(&request, &FingerprintSpec::Request).unwrap();
        assert_eq!(
            blake3::Hash::from_bytes(*fp.as_bytes()).to_hex().as_str(),
            "bf8b178396fd43f0ed2db504ecb58a5853dfdc73204b002425eea5ba3b78cde1"
        );
    }
}
