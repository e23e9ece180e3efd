//! What the fuzz targets share: the line format their inputs are written in,
//! and the oracles they check idem-core against.
//!
//! Inputs are plain bytes split on `\n`, so seeds are readable and libFuzzer's
//! mutations keep most of their structure. The key targets read one field per
//! line, named by its first byte (an optional space after it is dropped):
//!
//! ```text
//! M <method>        R <route>         N <namespace>
//! T <tenant>        U <user>          Q <query string>
//! H <name>:<value>  (repeatable; the value may be any bytes)
//! K <value>         (repeatable; an `idempotency-key` value, any bytes)
//! P <name>=<value>  (repeatable; a path parameter)
//! B <body>          (the rest of the input, newlines and all)
//! ```
//!
//! Lines with an unknown tag are ignored; fields that cannot exist in a real
//! request (a header value with control bytes) are dropped, as hyper would
//! never hand them over.

use http::{HeaderMap, HeaderName, HeaderValue, Method};

/// A request as a fuzz input describes it, owning its parts so a
/// [`idem_core::RequestView`] can borrow them.
#[derive(Debug, Default)]
pub struct FuzzRequest {
    /// `M`; `POST` when absent or invalid.
    pub method: Option<Method>,
    /// `R`; `/` when absent.
    pub route: String,
    /// `N`; [`idem_core::DEFAULT_NAMESPACE`] when absent.
    pub namespace: Option<String>,
    /// `T`.
    pub tenant: Option<String>,
    /// `U`.
    pub user: Option<String>,
    /// `Q`.
    pub query: Option<String>,
    /// `H` and `K` lines, in order.
    pub headers: HeaderMap,
    /// The raw bytes of each `K` line, valid header value or not.
    pub key_values: Vec<Vec<u8>>,
    /// `P`.
    pub path_params: Vec<(String, String)>,
    /// `B`.
    pub body: Vec<u8>,
}

/// The `idempotency-key` header name.
pub const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

impl FuzzRequest {
    /// Parses the fields of `data` (see the crate docs).
    pub fn parse(mut data: &[u8]) -> Self {
        let mut request = Self {
            route: "/".to_owned(),
            ..Self::default()
        };
        while !data.is_empty() {
            let (line, rest) = match data.iter().position(|&b| b == b'\n') {
                Some(i) => (&data[..i], &data[i + 1..]),
                None => (data, &data[data.len()..]),
            };
            let (tag, value) = match line.split_first() {
                Some((tag, value)) => (*tag, value.strip_prefix(b" ").unwrap_or(value)),
                None => (0, line),
            };
            let text = || String::from_utf8_lossy(value).into_owned();
            match tag {
                b'M' => request.method = Method::from_bytes(value).ok(),
                b'R' => request.route = text(),
                b'N' => request.namespace = Some(text()),
                b'T' => request.tenant = Some(text()),
                b'U' => request.user = Some(text()),
                b'Q' => request.query = Some(text()),
                b'H' => {
                    let (name, value) = match value.iter().position(|&b| b == b':') {
                        Some(i) => (&value[..i], &value[i + 1..]),
                        None => (value, &value[value.len()..]),
                    };
                    let value = value.strip_prefix(b" ").unwrap_or(value);
                    if let (Ok(name), Ok(value)) =
                        (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
                    {
                        request.headers.append(name, value);
                    }
                }
                b'K' => {
                    if let Ok(header) = HeaderValue::from_bytes(value) {
                        request.headers.append(KEY_HEADER, header);
                        request.key_values.push(value.to_vec());
                    }
                }
                b'P' => {
                    let text = text();
                    let (name, value) = text.split_once('=').unwrap_or((&text, ""));
                    request
                        .path_params
                        .push((name.to_owned(), value.to_owned()));
                }
                b'B' => {
                    // The body is everything after the tag, newlines included.
                    let start = line.len() - value.len();
                    request.body = data[start..].to_vec();
                    break;
                }
                _ => {}
            }
            data = rest;
        }
        request
    }

    /// The method, `POST` by default.
    pub fn method(&self) -> Method {
        self.method.clone().unwrap_or(Method::POST)
    }

    /// The namespace keys are stored under.
    pub fn namespace(&self) -> &str {
        self.namespace
            .as_deref()
            .unwrap_or(idem_core::DEFAULT_NAMESPACE)
    }

    /// A view of this request, as the layer would build it.
    pub fn view<'a>(&'a self, method: &'a Method) -> idem_core::RequestView<'a> {
        idem_core::RequestView::new(method, &self.route, &self.headers)
            .path_params(&self.path_params)
            .query(self.query.as_deref())
            .body(&self.body)
            .tenant(self.tenant.as_deref())
            .user(self.user.as_deref())
    }
}

/// Splits `data` at its first `\n`: the template line and the rest.
pub fn split_first_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    }
}

/// The escaping that key templates document: `%`, `:`, `{`, `}` and the
/// spaces a quoted key may hold are percent-encoded, everything else is
/// kept.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ' ' => out.push_str("%20"),
            c => out.push(c),
        }
    }
    out
}

/// What a client-supplied part may be, by ARCHITECTURE.md, "Keys and callers": present,
/// at most [`idem_core::MAX_PART_LEN`] bytes, visible ASCII. Returns the
/// reasons it is not (empty when it is acceptable).
pub fn part_faults(value: &[u8]) -> Vec<PartFault> {
    let mut faults = Vec::new();
    if value.is_empty() {
        faults.push(PartFault::Missing);
    }
    if value.len() > idem_core::MAX_PART_LEN {
        faults.push(PartFault::TooLong);
    }
    if !value.iter().all(u8::is_ascii_graphic) {
        faults.push(PartFault::NotVisibleAscii);
    }
    faults
}

/// The key an `idempotency-key` value carries, by the rule of
/// `idem-core/src/key/header.rs`, written here without a Structured Field
/// parser: a value that starts with `"` is a String (`\"` and `\\` the
/// only escapes, `%x20-7E` inside, nothing but spaces after the closing quote), its
/// content the key; any other value is the key as written. `Err` with the
/// fault of a value that is not a key (`None`: not a lone String).
pub fn key_header_value(value: &[u8]) -> Result<Vec<u8>, Option<PartFault>> {
    let Some(rest) = value.strip_prefix(b"\"") else {
        return Ok(value.to_vec());
    };
    let mut content = Vec::new();
    let mut bytes = rest.iter();
    loop {
        match bytes.next() {
            None => return Err(None),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(&b) if b == b'"' || b == b'\\' => content.push(b),
                _ => return Err(None),
            },
            Some(&b) if (0x20..=0x7e).contains(&b) => content.push(b),
            Some(_) => return Err(None),
        }
    }
    // Spaces after the String are the field's, not the key's (RFC 9651).
    if bytes.any(|&b| b != b' ') {
        return Err(None);
    }
    Ok(content)
}

/// What a key header's content may be: [`part_faults`], with the spaces a
/// quoted key may hold.
pub fn key_faults(content: &[u8], quoted: bool) -> Vec<PartFault> {
    let mut faults = part_faults(content);
    if quoted && content.iter().all(|&b| b == b' ' || b.is_ascii_graphic()) {
        faults.retain(|f| *f != PartFault::NotVisibleAscii);
    }
    faults
}

/// Why a part of a key is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartFault {
    /// Absent or empty.
    Missing,
    /// Over [`idem_core::MAX_PART_LEN`] bytes.
    TooLong,
    /// Holds a byte that is not visible ASCII.
    NotVisibleAscii,
}

#[cfg(test)]
mod seeds {
    //! The committed seed corpora, written by code so that the binary ones
    //! match the record format: `IDEM_WRITE_SEEDS=1 cargo test` in `fuzz/`
    //! rewrites them, a plain `cargo test` checks they are current.

    use std::path::PathBuf;

    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, StatusCode};
    use idem_core::{Fingerprint, Outcome, OwnerToken, Record, StoredResponse};

    fn text_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
        let mut long_key = b"T acme\nK ".to_vec();
        long_key.extend(std::iter::repeat_n(b'x', 300));
        vec![
            (
                "key_template",
                "seed-order-create",
                b"order-create:{tenant}:{user}:{header:idempotency-key}\n\
                  T acme\nU u-7\nH idempotency-key: 8e03978e\n"
                    .to_vec(),
            ),
            (
                "key_template",
                "seed-pay-callback",
                b"pay-callback:{path:payment_no}\nR /payments/{payment_no}/callback\n\
                  P payment_no=P-1\nB {\"status\":\"PAID\",\"amount_cents\":500}"
                    .to_vec(),
            ),
            (
                "key_template",
                "seed-refund",
                b"refund:{tenant}:{body:/order_no}:{body:/refund_no}\nT t1\n\
                  B {\"order_no\":\"O-1\",\"refund_no\":42,\"items\":[{\"sku\":\"a~/b\"}]}"
                    .to_vec(),
            ),
            (
                "key_template",
                "seed-method-route-query",
                b"{method}:{route}:{query:id}\nM PUT\nR /items/{id}\nQ id=7%3A8&x=%7B&id2=y\n"
                    .to_vec(),
            ),
            (
                "key_template",
                "seed-escaped-values",
                b"x:{header:k}:{path:p}\nN app1:\nH k: a:b%c{d}\nP p=}{\n".to_vec(),
            ),
            (
                "key_template",
                "seed-syntax-errors",
                b"a:{pa{th:x}:{header:bad name}}{\nH bad: x\n".to_vec(),
            ),
            (
                "key_header",
                "seed-valid",
                b"T acme\nK 8e03978e-1f4b-4e0e-9d56\nB {\"sku\":\"A\",\"qty\":1}".to_vec(),
            ),
            (
                "key_header",
                "seed-repeated",
                b"T acme\nK a\nK b\nB not json".to_vec(),
            ),
            (
                "key_header",
                "seed-non-utf8",
                b"T acme\nK caf\xe9\nB {\"a\":[1,2.5,-0,1e3,\"\\u00e9\"]}".to_vec(),
            ),
            (
                "key_header",
                "seed-escaped",
                b"T a:b{c}\nK %3A:{}\nQ b=2&a=1".to_vec(),
            ),
            (
                "key_header",
                "seed-quoted",
                b"T acme\nK \"order \\\"7\\\" of 9\"\nB {}".to_vec(),
            ),
            (
                "key_header",
                "seed-quoted-params",
                b"T acme\nK \"k-1\";x=1\nU u:1".to_vec(),
            ),
            ("key_header", "seed-too-long", long_key),
            ("key_header", "seed-no-tenant", b"K k1\nK \n".to_vec()),
        ]
    }

    fn record_seeds() -> Vec<(&'static str, Bytes)> {
        let fingerprint = Fingerprint::from_bytes([7; 32]);
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("location", HeaderValue::from_static("/orders/7"));
        headers.append("link", HeaderValue::from_static("</a>; rel=a"));
        headers.append("link", HeaderValue::from_static("</b>; rel=b"));
        headers.insert("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let response = Outcome::Response(StoredResponse::new(
            StatusCode::CREATED,
            headers,
            &b"{\"order_id\":7}\x00\xff"[..],
        ));
        let empty = Outcome::Response(StoredResponse::new(
            StatusCode::NO_CONTENT,
            HeaderMap::new(),
            Bytes::new(),
        ));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("3"));
        trailers.insert("grpc-message", HeaderValue::from_static("bad%20amount"));
        trailers.insert("grpc-status-details-bin", HeaderValue::from_static("CAM"));
        let with_trailers = Outcome::Response(
            StoredResponse::new(
                StatusCode::OK,
                HeaderMap::new(),
                &b"\x00\x00\x00\x00\x00"[..],
            )
            .with_trailers(trailers),
        );
        vec![
            (
                "seed-in-flight",
                Record::InFlight {
                    owner: OwnerToken::from_bytes(*b"0123456789abcdef"),
                    fingerprint,
                }
                .encode(),
            ),
            (
                "seed-completed-response",
                Record::Completed {
                    fingerprint,
                    outcome: response.clone(),
                }
                .encode(),
            ),
            (
                "seed-completed-empty",
                Record::Completed {
                    fingerprint,
                    outcome: empty,
                }
                .encode(),
            ),
            (
                "seed-completed-not-replayable",
                Record::Completed {
                    fingerprint,
                    outcome: Outcome::NotReplayable,
                }
                .encode(),
            ),
            (
                "seed-completed-trailers",
                Record::Completed {
                    fingerprint,
                    outcome: with_trailers.clone(),
                }
                .encode(),
            ),
            ("seed-outcome-response", response.encode()),
            ("seed-outcome-trailers", with_trailers.encode()),
            (
                "seed-outcome-not-replayable",
                Outcome::NotReplayable.encode(),
            ),
        ]
    }

    #[test]
    fn seed_corpora_are_current() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let write = std::env::var_os("IDEM_WRITE_SEEDS").is_some();
        let all = text_seeds().into_iter().chain(
            record_seeds()
                .into_iter()
                .map(|(name, bytes)| ("record_decode", name, bytes.to_vec())),
        );
        for (target, name, bytes) in all {
            let path = root.join(target).join(name);
            if write {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            } else {
                let on_disk = std::fs::read(&path).unwrap_or_default();
                assert!(
                    on_disk == bytes,
                    "{} is stale: run IDEM_WRITE_SEEDS=1 cargo test in fuzz/",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn record_seeds_decode() {
        for (name, bytes) in record_seeds() {
            let decoded = if name.starts_with("seed-outcome") {
                Outcome::decode(&bytes).map(|_| ())
            } else {
                Record::decode(&bytes).map(|_| ())
            };
            assert!(decoded.is_ok(), "{name}: {decoded:?}");
        }
    }
}
