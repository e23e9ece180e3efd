//! What is not kept, so the fixed request runs with the same key: a
//! refusal by an extractor (401, 415, a malformed body) and the handler's
//! own 500; and the misconfigurations that refuse to run the handler at
//! all (transactional without transactions, `{user}` without a resolver).

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use serde_json::json;

use crate::app::{app, keyed, order, state};
use crate::support::{post, send};

#[tokio::test]
async fn a_failed_custom_extractor_releases_the_key() {
    let state = state();
    let app = app(state.clone());
    let mut anonymous = order("k-1", json!({}));
    anonymous.headers_mut().remove(header::AUTHORIZATION);

    assert_eq!(send(&app, anonymous).await.status, StatusCode::UNAUTHORIZED);
    let signed_in = send(&app, order("k-1", json!({}))).await;
    assert_eq!(signed_in.status, StatusCode::CREATED);
    assert!(!signed_in.replayed());
    assert_eq!(state.calls.get(), 1);
}

/// An extractor's refusal need not be an error: a redirect to the login
/// page is one too. The attribute marks every response its function
/// returns, so the redirect, unmarked, is not kept; the visitor signs in
/// and retries with the same key, and the handler runs.
#[tokio::test]
async fn an_extractors_redirect_releases_the_key() {
    let state = state();
    let app = app(state.clone());

    let redirected = send(&app, keyed("/checkout", "k-login")).await;
    assert_eq!(redirected.status, StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(redirected.header(header::LOCATION), Some("/login"));
    assert_eq!(state.calls.get(), 0);

    let mut signed_in = keyed("/checkout", "k-login");
    signed_in
        .headers_mut()
        .insert(header::COOKIE, HeaderValue::from_static("session=s-1"));
    let checked_out = send(&app, signed_in).await;
    assert_eq!(checked_out.status, StatusCode::CREATED, "{checked_out:?}");
    assert!(!checked_out.replayed());
    assert_eq!(checked_out.text(), "checkout 1");
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_500_from_a_result_handler_releases_the_key_for_a_retry() {
    let state = state();
    state.fail_next.0.store(true, Ordering::SeqCst);
    let app = app(state.clone());

    let failed = send(&app, keyed("/charges", "c-1")).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.text(), "the bank is down");

    let retried = send(&app, keyed("/charges", "c-1")).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(retried.text(), "charge 2");

    let replayed = send(&app, keyed("/charges", "c-1")).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.text(), "charge 2");
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test]
async fn transactional_handler_on_a_store_without_transactions_refuses_to_run() {
    let state = state();
    let app = app(state.clone());
    for _ in 0..2 {
        let reply = send(&app, keyed("/ledger", "l-1")).await;
        reply.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
        assert!(reply.text().contains("PgStore"), "names the fix");
    }
    assert_eq!(state.calls.get(), 0, "never run without its transaction");
}

/// `/place` with this key, body and content type.
fn place(key: &str, content_type: &str, body: &str) -> Request<Body> {
    let mut request = post("/place", Some(key), body);
    request.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).expect("a header value"),
    );
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_content_type_is_415_and_the_corrected_request_runs_with_the_same_key() {
    let state = state();
    let app = app(state.clone());
    let body = r#"{"sku":"A-1"}"#;

    let refused = send(&app, place("k-1", "text/plain", body)).await;
    assert_eq!(refused.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(!refused.replayed());
    // Not kept: the same mistake again is refused again, not replayed.
    let again = send(&app, place("k-1", "text/plain", body)).await;
    assert_eq!(again.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(!again.replayed());
    assert_eq!(state.calls.get(), 0);

    let corrected = send(&app, place("k-1", "application/json", body)).await;
    assert_eq!(corrected.status, StatusCode::CREATED);
    assert!(!corrected.replayed());
    assert_eq!(
        corrected.json(),
        json!({ "order": { "sku": "A-1" }, "run": 1 })
    );
    let duplicate = send(&app, place("k-1", "application/json", body)).await;
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, corrected.body);
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_json_body_is_refused_and_the_fixed_one_runs_with_the_same_key() {
    let state = state();
    let app = app(state.clone());

    let malformed = send(&app, place("k-1", "application/json", r#"{"sku":"#)).await;
    assert!(
        [StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY].contains(&malformed.status),
        "{}",
        malformed.status
    );
    assert!(!malformed.replayed());
    assert_eq!(state.calls.get(), 0);

    let fixed = send(&app, place("k-1", "application/json", r#"{"sku":"A-1"}"#)).await;
    assert_eq!(fixed.status, StatusCode::CREATED);
    assert!(!fixed.replayed());
    assert!(
        send(&app, place("k-1", "application/json", r#"{"sku":"A-1"}"#))
            .await
            .replayed()
    );
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_from_an_auth_extractor_is_not_kept_and_the_signed_in_retry_runs_once() {
    let state = state();
    let app = app(state.clone());
    let anonymous = || {
        let mut request = order("k-1", json!({ "sku": "A-1" }));
        request.headers_mut().remove(header::AUTHORIZATION);
        request
    };

    for _ in 0..2 {
        let refused = send(&app, anonymous()).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert!(!refused.replayed());
    }
    assert_eq!(state.calls.get(), 0);

    let signed_in = send(&app, order("k-1", json!({ "sku": "A-1" }))).await;
    assert_eq!(signed_in.status, StatusCode::CREATED);
    assert!(!signed_in.replayed());
    let duplicate = send(&app, order("k-1", json!({ "sku": "A-1" }))).await;
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, signed_in.body);
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_user_placeholder_without_a_user_resolver_is_a_500_and_runs_nothing() {
    let state = state();
    let app = app(state.clone());

    for _ in 0..2 {
        let reply = send(&app, keyed("/profile", "p-1")).await;
        reply.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
        assert!(reply.json()["detail"].to_string().contains("{user}"));
    }
    assert_eq!(state.calls.get(), 0, "never run without its key");
}
