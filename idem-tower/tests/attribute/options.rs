//! What the attribute's arguments do: `key` (from a header, a path
//! parameter, the body or the query), `ttl`, `in_flight`, `fingerprint`
//! and `required`, on handlers public or private.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};

use crate::app::{app, keyed, order, state};
use crate::support::{Calls, Reply, post, send};

#[tokio::test]
async fn the_same_request_ten_times_runs_the_handler_once() {
    let state = state();
    let app = app(state.clone());
    let body = json!({ "sku": "A-1", "qty": 2 });

    let first = send(&app, order("k-1", body.clone())).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.json()["user"], "u-7");
    for _ in 0..9 {
        let again = send(&app, order("k-1", body.clone())).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers[header::LOCATION], "/orders/1");
    }
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422() {
    let state = state();
    let app = app(state.clone());

    send(&app, order("k-1", json!({ "sku": "A-1", "qty": 2 }))).await;
    let other = send(&app, order("k-1", json!({ "sku": "A-1", "qty": 3 }))).await;
    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "fingerprint-mismatch");
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_request_without_its_key_is_400_and_runs_nothing() {
    let state = state();
    let app = app(state.clone());
    let mut no_key = order("k-1", json!({}));
    no_key.headers_mut().remove("idempotency-key");

    let reply = send(&app, no_key).await;
    reply.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert!(
        reply.json()["detail"]
            .to_string()
            .contains("idempotency-key")
    );
    assert_eq!(state.calls.get(), 0);
}

#[tokio::test]
async fn the_ttl_is_honoured_and_an_expired_key_runs_again() {
    let state = state();
    let app = app(state.clone());

    assert_eq!(send(&app, keyed("/short", "s-1")).await.text(), "run 1");
    let replayed = send(&app, keyed("/short", "s-1")).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.text(), "run 1");

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = send(&app, keyed("/short", "s-1")).await;
    assert!(!after.replayed());
    assert_eq!(after.text(), "run 2");
    assert_eq!(state.calls.get(), 2);
}

/// Sends one request, waits until its handler is running, then sends
/// `duplicates` copies at once; returns the first's reply and theirs.
async fn duplicates_in_flight(
    app: &Router,
    calls: &Calls,
    uri: &str,
    duplicates: usize,
) -> (Reply, Vec<Reply>) {
    let spawn = |request: Request<Body>| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, request).await })
    };
    let first = spawn(keyed(uri, "same"));
    calls.wait_for(1).await;
    let copies: Vec<_> = (0..duplicates).map(|_| spawn(keyed(uri, "same"))).collect();
    let mut replies = Vec::new();
    for copy in copies {
        replies.push(copy.await.expect("no request task panics"));
    }
    (first.await.expect("no request task panics"), replies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_wait_makes_concurrent_duplicates_replay() {
    let state = state();
    let app = app(state.clone());

    let (first, duplicates) = duplicates_in_flight(&app, &state.calls, "/slow", 5).await;
    assert_eq!(first.text(), "run 1");
    assert!(!first.replayed());
    for reply in &duplicates {
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.replayed());
        assert_eq!(reply.text(), "run 1");
    }
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_concurrent_duplicates_get_409() {
    let state = state();
    let app = app(state.clone());

    let (first, duplicates) = duplicates_in_flight(&app, &state.calls, "/slow-rejected", 5).await;
    assert_eq!(first.text(), "run 1");
    for reply in &duplicates {
        reply.assert_problem(StatusCode::CONFLICT, "in-flight");
        assert!(reply.retry_after() >= 1, "{reply:?}");
    }
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_path_keyed_callback_credits_once_per_payment() {
    let state = state();
    let app = app(state.clone());
    let callback = |payment: &str, body: Value| {
        post(
            &format!("/payments/{payment}/callback"),
            None,
            &body.to_string(),
        )
    };

    let first = send(&app, callback("P-1", json!({ "status": "PAID" }))).await;
    assert_eq!(first.json(), json!({ "payment_no": "P-1", "credit": 1 }));
    // fingerprint = "method_and_route": a re-push with another body is the same callback.
    let again = send(&app, callback("P-1", json!({ "status": "PAID", "ts": 2 }))).await;
    assert!(again.replayed());
    assert_eq!(again.json(), first.json());
    let other = send(&app, callback("P-2", json!({ "status": "PAID" }))).await;
    assert_eq!(other.json(), json!({ "payment_no": "P-2", "credit": 2 }));
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test]
async fn a_body_keyed_refund_runs_once_per_refund_number() {
    let state = state();
    let app = app(state.clone());
    let refund = |refund_no: &str| {
        let body = json!({ "refund_no": refund_no, "amount": 5 });
        post("/payments/P-1/refunds", None, &body.to_string())
    };

    assert_eq!(send(&app, refund("R-1")).await.status, StatusCode::CREATED);
    assert!(send(&app, refund("R-1")).await.replayed());
    assert!(!send(&app, refund("R-2")).await.replayed());
    assert_eq!(state.calls.get(), 2);

    let missing = send(&app, post("/payments/P-1/refunds", None, "{}")).await;
    missing.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test]
async fn a_private_handler_without_extractors_is_idempotent_too() {
    let state = state();
    let app = app(state.clone());

    let first = send(&app, keyed("/payments/void", "v-1")).await;
    assert_eq!(first.status, StatusCode::NO_CONTENT);
    assert!(send(&app, keyed("/payments/void", "v-1")).await.replayed());
    send(&app, post("/payments/void", None, ""))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "key-missing");
}

#[tokio::test]
async fn a_query_keyed_optional_route_passes_keyless_requests_through() {
    let state = state();
    let app = app(state.clone());
    let post_search = |uri: &str| post(uri, None, "");

    let first = send(&app, post_search("/search?ref=r-1")).await;
    assert_eq!(first.json(), json!({ "ref": "r-1" }));
    assert!(send(&app, post_search("/search?ref=r-1")).await.replayed());
    assert_eq!(state.calls.get(), 1);

    // required = false: no key, no deduplication.
    for _ in 0..2 {
        let keyless = send(&app, post_search("/search")).await;
        assert_eq!(keyless.status, StatusCode::OK);
        assert!(!keyless.replayed());
    }
    assert_eq!(state.calls.get(), 3);
}

#[tokio::test]
async fn a_json_fields_fingerprint_ignores_the_other_fields() {
    let state = state();
    let app = app(state.clone());
    let post_transfer = |body: Value| post("/transfers", Some("t-1"), &body.to_string());

    let first = send(
        &app,
        post_transfer(json!({ "amount": 5, "currency": "EUR", "ts": 1 })),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = send(
        &app,
        post_transfer(json!({ "amount": 5, "currency": "EUR", "ts": 2 })),
    )
    .await;
    assert!(retry.replayed());
    let changed = send(
        &app,
        post_transfer(json!({ "amount": 6, "currency": "EUR", "ts": 3 })),
    )
    .await;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(state.calls.get(), 1);
}
