//! The key: a missing, repeated or malformed `Idempotency-Key` is a 400
//! that runs nothing; optional keys; path parameters read with the
//! configured route; templates naming parts only the server supplies are
//! refused when the layer is built (ARCHITECTURE.md, "Keys and callers").

use axum::body::Body;
use http::{Request, StatusCode};
use idem_tower::{ErrorKind, Idempotency, MemoryStore};
use tower::Layer;

use crate::fixtures::{ORDER, counting, created, json, post_with_key_values};
use crate::support::{Calls, post, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_key_is_400_and_the_handler_is_not_called() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let absent = send(&service, post("/orders", None, ORDER)).await;
    let empty = send(&service, post_with_key_values(&[b""], ORDER)).await;

    absent.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    empty.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert_eq!(calls.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_of_256_chars_is_400_and_255_chars_is_accepted() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let too_long = "k".repeat(256);
    let longest = "k".repeat(255);

    let rejected = send(&service, post("/orders", Some(&too_long), ORDER)).await;
    rejected.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(calls.get(), 0);

    let accepted = send(&service, post("/orders", Some(&longest), ORDER)).await;
    let replay = send(&service, post("/orders", Some(&longest), ORDER)).await;
    assert_eq!(accepted.status, StatusCode::CREATED);
    assert!(!accepted.replayed());
    assert!(replay.replayed());
    assert_eq!(calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeated_key_header_is_400() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let same_twice = send(&service, post_with_key_values(&[b"k-1", b"k-1"], ORDER)).await;
    let two_keys = send(&service, post_with_key_values(&[b"k-1", b"k-2"], ORDER)).await;

    same_twice.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    two_keys.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(calls.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_outside_visible_ascii_is_400() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let values: [&[u8]; 4] = [b"has space", b"tab\there", "café".as_bytes(), b"\xff\xfe"];
    for value in values {
        let reply = send(&service, post_with_key_values(&[value], ORDER)).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    }
    assert_eq!(calls.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn optional_key_passes_keyless_requests_through_and_deduplicates_keyed_ones() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .required(false)
        .layer(inner);

    let a = send(&service, post("/orders", None, ORDER)).await;
    let b = send(&service, post("/orders", None, ORDER)).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!a.replayed() && !b.replayed());
    assert_eq!(calls.get(), 2, "no key, no deduplication");

    let keyed = send(&service, post("/orders", Some("k-opt"), ORDER)).await;
    let keyed_again = send(&service, post("/orders", Some("k-opt"), ORDER)).await;
    assert!(!keyed.replayed());
    assert!(keyed_again.replayed());
    assert_eq!(keyed_again.body, keyed.body);
    assert_eq!(calls.get(), 3);

    let malformed = send(&service, post("/orders", Some(&"k".repeat(256)), ORDER)).await;
    malformed.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(calls.get(), 3);
}

/// `IdempotencyLayer::required` documents: "a request whose client-supplied
/// key parts are ALL absent passes straight to the service [...]; a partly
/// present [...] key is still a 400".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn optional_key_partly_present_is_400() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::new(MemoryStore::new());
    let service = idem
        .layer_with_key("refund:{body:/order_no}:{header:idempotency-key}")
        .expect("a valid template")
        .required(false)
        .layer(inner);
    let refund = r#"{"order_no":"O-1","amount_cents":500}"#;

    // The body names the order but the key header is absent.
    let header_absent = send(&service, post("/refunds", None, refund)).await;
    // The key header is there but the body lacks the order number.
    let body_part_absent = send(
        &service,
        post("/refunds", Some("k-refund"), r#"{"amount_cents":500}"#),
    )
    .await;

    assert_eq!(
        calls.get(),
        0,
        "a partly present key passed through undeduplicated: {header_absent:?} / {body_part_absent:?}"
    );
    header_absent.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    body_part_absent.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
}

/// An optional key is absent when the client sent none of its parts,
/// whatever else the template reads: a path parameter is the route's,
/// always there, and a body that is not JSON has no part a pointer reads.
/// Such a request passes through (the handler runs each time); the same
/// with the key header is deduplicated. A template with no part the client
/// supplies (only the path here) is never absent: always deduplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_optional_key_is_absent_whatever_the_route_and_body_supply() {
    let paid = r#"{"status":"PAID"}"#;
    for (template, body) in [
        ("pay:{path:payment_no}:{header:idempotency-key}", paid),
        ("pay:{body:/order_no}:{header:idempotency-key}", ""),
        ("pay:{body:/order_no}:{header:idempotency-key}", "paid=1"),
        ("pay:{header:idempotency-key}:{body:/order_no}", "paid=1"),
    ] {
        let calls = Calls::default();
        let inner = counting(&calls, |n, _| async move { created(n) });
        let service = Idempotency::new(MemoryStore::new())
            .layer_with_key(template)
            .expect("a valid template")
            .route("/payments/{payment_no}/callback")
            .required(false)
            .layer(inner);
        let path = "/payments/P-1/callback";
        for _ in 0..2 {
            let unkeyed = send(&service, post(path, None, body)).await;
            assert_eq!(
                unkeyed.status,
                StatusCode::CREATED,
                "{template} {body:?}: {unkeyed:?}"
            );
            assert!(!unkeyed.replayed());
        }
        assert_eq!(
            calls.get(),
            2,
            "{template} {body:?}: passed through, each ran"
        );
    }

    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new())
        .layer_with_key("pay:{path:payment_no}")
        .expect("a valid template")
        .route("/payments/{payment_no}/callback")
        .required(false)
        .layer(inner);
    let first = send(&service, post("/payments/P-1/callback", None, paid)).await;
    let again = send(&service, post("/payments/P-1/callback", None, paid)).await;
    assert!(!first.replayed() && again.replayed(), "{again:?}");
    assert_eq!(
        calls.get(),
        1,
        "a key only the route supplies is never absent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn path_placeholder_is_read_with_the_configured_route_on_a_plain_service() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, request: Request<Body>| async move {
        json(
            StatusCode::OK,
            format!(r#"{{"credited":"{}","call":{n}}}"#, request.uri().path()),
        )
    });
    let service = Idempotency::new(MemoryStore::new())
        .layer_with_key("pay-callback:{path:payment_no}")
        .expect("a valid template")
        .route("/payments/{payment_no}/callback")
        .layer(inner);
    let paid = r#"{"status":"PAID","amount_cents":500}"#;

    let first = send(&service, post("/payments/P-1/callback", None, paid)).await;
    let again = send(&service, post("/payments/P-1/callback", None, paid)).await;
    let encoded = send(&service, post("/payments/P%2D1/callback", None, paid)).await;
    let other = send(&service, post("/payments/P-2/callback", None, paid)).await;

    assert_eq!(first.status, StatusCode::OK);
    assert!(!first.replayed());
    assert!(again.replayed() && encoded.replayed(), "{encoded:?}");
    assert_eq!(encoded.body, first.body, "P%2D1 is P-1");
    assert!(!other.replayed());
    assert_eq!(
        other.text(),
        r#"{"credited":"/payments/P-2/callback","call":2}"#
    );
    assert_eq!(calls.get(), 2);

    // A path parameter comes from the route, never the client: a request
    // the configured route does not match is the server's wiring, a 500.
    let unmatched = send(&service, post("/refunds/R-1", None, paid)).await;
    unmatched.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
    assert!(
        unmatched.text().contains("{path:payment_no}")
            && unmatched
                .text()
                .contains("`/refunds/R-1` does not match the layer's route"),
        "the message names the mismatch, not a missing parameter: {unmatched:?}"
    );
    assert_eq!(calls.get(), 2);
}

/// The default key is `{method}:{route}:{header:idempotency-key}`, and the
/// fingerprint covers the route *pattern*: with a parametrised route the same
/// client key sent for two different resources must not replay one
/// resource's response for the other (it should be a 422 or a second run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_on_two_resources_of_one_route_never_replays_across_them() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, request: Request<Body>| async move {
        json(
            StatusCode::OK,
            format!(r#"{{"paid":"{}","call":{n}}}"#, request.uri().path()),
        )
    });
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .route("/orders/{order_id}/pay")
        .layer(inner);

    let first = send(&service, post("/orders/1/pay", Some("k-pay"), "")).await;
    let second = send(&service, post("/orders/2/pay", Some("k-pay"), "")).await;

    assert_eq!(first.text(), r#"{"paid":"/orders/1/pay","call":1}"#);
    assert!(
        !second.replayed(),
        "order 2 got order 1's payment replayed and was never paid: {second:?} (calls: {})",
        calls.get()
    );
    assert!(
        second.status == StatusCode::UNPROCESSABLE_ENTITY || calls.get() == 2,
        "{second:?}"
    );
}

#[tokio::test]
async fn key_parts_only_the_server_supplies_are_refused_when_the_layer_is_built() {
    let idem = Idempotency::new(MemoryStore::new());
    for template in [
        "order:{user}:{header:idempotency-key}",
        "order:{tenant}:{query:id}",
    ] {
        let err = idem.layer_with_key(template).expect_err(template);
        assert_eq!(err.kind(), ErrorKind::Config, "{template}");
        let text = err.to_string();
        assert!(
            text.contains("resolver") && text.contains("Idempotency::builder"),
            "{text}"
        );
    }
    let err = idem
        .layer_with_key("order:{header:idempotency-key")
        .expect_err("unclosed");
    assert_eq!(err.kind(), ErrorKind::Config);
    let err = idem
        .layer_with_key("order:{header:idempotency-key}")
        .expect("valid")
        .transactional()
        .expect_err("the memory store has no transactions");
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.to_string().contains("PgStore"), "{err}");
}
