//! The same policy through reqwest-middleware: `IdempotencyMiddleware` on a
//! `reqwest::Client`, against the same loopback server.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::StatusCode;
use idem_tower::client::{IdempotencyMiddleware, KEY_HEADER, KeyOrigin, RetryPolicy, RetryReport};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use super::{Server, quick};

fn client(policy: RetryPolicy) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(IdempotencyMiddleware::new(policy))
        .build()
}

fn delivery(response: &reqwest::Response) -> RetryReport {
    response
        .extensions()
        .get::<RetryReport>()
        .cloned()
        .expect("every response carries its delivery")
}

#[tokio::test]
async fn a_503_then_success_is_one_effect_in_two_attempts() {
    let server = Server::default();
    server.fail_first.store(1, Ordering::SeqCst);
    let addr = server.start().await;

    let response = client(quick())
        .post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .body(r#"{"sku":"A-1"}"#)
        .send()
        .await
        .expect("an answer");

    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = delivery(&response);
    assert_eq!(delivery.attempts, 2);
    assert!(!delivery.replayed);
    assert_eq!(delivery.origin, KeyOrigin::Generated);
    let keys = server.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn an_operation_key_given_as_an_extension_is_sent_with_every_retry() {
    let server = Server::default();
    server.fail_first.store(2, Ordering::SeqCst);
    let addr = server.start().await;
    // What a handler passes on: `operation.key_for("psp-charge")`.
    let derived = idem_tower::OperationKey::from_caller("7f3a9c-derived").unwrap();

    let response = client(quick())
        .post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .body(r#"{"sku":"A-1"}"#)
        .with_extension(derived.clone())
        .send()
        .await
        .expect("an answer");

    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = delivery(&response);
    assert_eq!(delivery.attempts, 3);
    assert_eq!(delivery.origin, KeyOrigin::Caller);
    let keys = server.keys.lock().unwrap().clone();
    assert_eq!(keys, vec![Some(derived.as_str().to_owned()); 3]);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_422_is_returned_at_once_with_one_attempt() {
    let server = Server::default();
    let addr = server.start().await;
    let client = client(quick());
    let send = |body: &'static str| {
        client
            .post(format!("http://{addr}/orders"))
            .header(KEY_HEADER, "op-1")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let first = send(r#"{"sku":"A-1"}"#).await.expect("an answer");
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(delivery(&first).origin, KeyOrigin::Caller);

    let reused = send(r#"{"sku":"B-2"}"#).await.expect("an answer");
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(delivery(&reused).attempts, 1);
    assert_eq!(server.arrivals.load(Ordering::SeqCst), 2);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_lost_answer_is_replayed_on_the_retry() {
    let server = Server::default();
    *server.first_answer_late.lock().unwrap() = Duration::from_millis(300);
    let addr = server.start().await;

    let response = client(quick().attempt_timeout(Duration::from_millis(100)))
        .post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .body(r#"{"sku":"A-1"}"#)
        .send()
        .await
        .expect("an answer");

    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = delivery(&response);
    assert!(delivery.replayed);
    assert_eq!(delivery.attempts, 2);
    let body = response.text().await.unwrap();
    assert!(body.contains(r#""order":1"#), "{body}");
    assert_eq!(server.runs(), 1);
}
