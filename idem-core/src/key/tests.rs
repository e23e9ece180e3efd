//! Building keys: every placeholder kind resolved and checked, the caller's
//! scope, escaping, namespacing.

use http::{HeaderMap, Method};

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

#[test]
fn a_quoted_key_header_and_its_bare_form_are_one_key() {
    let t = KeyTemplate::parse("o:{header:idempotency-key}:{header:x-other}").unwrap();
    let eval = |key: &str, other: &str| {
        let h = headers(&[("idempotency-key", key), ("x-other", other)]);
        t.evaluate(&RequestView::new(&Method::POST, "/", &h), "idem:")
            .map(|k| k.as_str().to_owned())
    };
    assert_eq!(eval("\"abc-1\"", "x").unwrap(), eval("abc-1", "x").unwrap());
    assert_eq!(eval("\"abc-1\"", "x").unwrap(), "idem:{o:abc-1:x}");
    // Only the key header is read as the draft writes it.
    assert_eq!(eval("k", "\"x\"").unwrap(), "idem:{o:k:\"x\"}");
    // A String's spaces and escapes are kept, and escaped in the stored key:
    // no quoted key is another's bare one.
    assert_eq!(
        eval(r#""order 7 of 9""#, "x").unwrap(),
        "idem:{o:order%207%20of%209:x}"
    );
    assert_eq!(eval(r#""a\"b:c""#, "x").unwrap(), "idem:{o:a\"b%3Ac:x}");
    assert_ne!(eval(r#""a b""#, "x").unwrap(), eval("a%20b", "x").unwrap());
    // `""` is no key, as an empty header is none.
    assert!(matches!(eval(r#""""#, "x"), Err(KeyError::Missing(_))));
    let err = eval(r#""abc-1";x=1"#, "x").unwrap_err();
    assert!(
        matches!(&err, KeyError::NotAString { placeholder: Placeholder::Header(n), .. } if n == "idempotency-key"),
        "{err:?}"
    );
    assert!(err.to_string().contains("no parameters"), "{err}");
    // The cap counts the key, not its quotes.
    let long = "k".repeat(MAX_PART_LEN);
    assert!(eval(&format!("\"{long}\""), "x").is_ok());
    assert!(matches!(
        eval(&format!("\"{long}k\""), "x"),
        Err(KeyError::TooLong { .. })
    ));
    // Spaces stay refused outside a quoted key.
    assert!(matches!(
        eval("k", "a b"),
        Err(KeyError::NotVisibleAscii(_))
    ));
}

#[test]
fn the_key_header_can_be_another_header() {
    let t = KeyTemplate::parse("o:{header:x-key}").unwrap();
    let h = headers(&[("x-key", "\"k 1\"")]);
    let name = http::HeaderName::from_static("x-key");
    let default = RequestView::new(&Method::POST, "/", &h);
    assert!(matches!(
        t.evaluate(&default, "idem:"),
        Err(KeyError::NotVisibleAscii(_))
    ));
    let configured = RequestView::new(&Method::POST, "/", &h).key_header(&name);
    assert_eq!(
        t.evaluate(&configured, "idem:").unwrap().composite(),
        "o:k%201"
    );
}
