//! The client half against the orders app over loopback HTTP: hyper-util's
//! legacy client behind `IdempotentClientLayer`, answers lost on the way
//! back and attempts failed by `X-Chaos-Fail: 503`, one order per
//! operation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_examples::orders::{App, STARTING_BALANCE_CENTS};
use idem_tests::{Harness, Transport};
use idem_tower::client::{Delivery, IdempotentClientLayer, RetryPolicy};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const PRICE: i64 = 1999;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Http = Client<HttpConnector, Full<Bytes>>;

/// The orders app with chaos on, served on loopback; its base URL.
async fn start() -> (Harness, String) {
    let h = Harness::serve(App::in_memory(true)).await;
    let Transport::Http { base, .. } = &h.transport else {
        unreachable!("Harness::serve serves over HTTP")
    };
    let base = base.clone();
    (h, base)
}

fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A fast policy for tests: short backoff, short `Retry-After` cap.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(10)
        .deadline(Duration::from_secs(20))
        .backoff(Duration::from_millis(10), Duration::from_millis(100))
        .max_retry_after(Duration::from_millis(300))
}

/// `POST /orders` for `user` under the harness's `acme`, no key unless the
/// caller adds one: the layer makes it.
fn order(h: &Harness, base: &str, user: &str) -> http::request::Builder {
    Request::post(format!("{base}/orders"))
        .header("content-type", "application/json")
        .header("x-tenant-id", h.unique("acme"))
        .header("authorization", format!("Bearer {user}"))
}

fn body(amount_cents: i64) -> Full<Bytes> {
    Full::new(Bytes::from(
        json!({ "sku": "book", "qty": 1, "amount_cents": amount_cents }).to_string(),
    ))
}

fn json_of(bytes: &Bytes) -> Value {
    serde_json::from_slice(bytes).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answer_is_replayed_on_retry_with_one_order() {
    let (h, base) = start().await;
    // The server commits and answers; the first answer is lost on the way
    // back (read, then dropped, and the attempt fails as a broken
    // connection would). The retry, same key, gets it replayed.
    let sent = Arc::new(AtomicU32::new(0));
    let inner = {
        let (http, sent) = (http(), sent.clone());
        service_fn(move |request: Request<Full<Bytes>>| {
            let (http, first) = (http.clone(), sent.fetch_add(1, Ordering::SeqCst) == 0);
            async move {
                let response = http.request(request).await?;
                if first {
                    let lost = response.into_body().collect().await?;
                    drop(lost);
                    return Err::<_, BoxError>("connection reset: the answer was lost".into());
                }
                Ok(response)
            }
        })
    };
    let client = ServiceBuilder::new()
        .layer(IdempotentClientLayer::new(policy()))
        .service(inner);
    let request = order(&h, &base, "alice").body(body(PRICE)).unwrap();
    let response = client.oneshot(request).await.expect("an answer");
    let delivery = response.extensions().get::<Delivery>().cloned().unwrap();
    assert_eq!(response.status(), StatusCode::CREATED, "{delivery:?}");
    assert!(delivery.attempts >= 2, "{delivery:?}");
    assert!(delivery.replayed, "{delivery:?}");
    assert!(delivery.key.is_some());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!json_of(&bytes)["order_id"].is_null());
    assert_eq!(
        h.account("acme", "alice").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
    assert_eq!(h.app.calls.orders(), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_503_on_first_attempts_then_success_makes_one_order() {
    let (h, base) = start().await;
    // `X-Chaos-Fail: 503` fails every request that carries it, before any
    // write: this wrapper adds it to the first two attempts only.
    let sent = Arc::new(AtomicU32::new(0));
    let inner = {
        let (http, sent) = (http(), sent.clone());
        service_fn(move |mut request: Request<Full<Bytes>>| {
            if sent.fetch_add(1, Ordering::SeqCst) < 2 {
                request
                    .headers_mut()
                    .insert("x-chaos-fail", http::HeaderValue::from_static("503"));
            }
            http.request(request)
        })
    };
    let client = ServiceBuilder::new()
        .layer(IdempotentClientLayer::new(policy()))
        .service(inner);
    let request = order(&h, &base, "bob").body(body(PRICE)).unwrap();
    let response = client.oneshot(request).await.expect("an answer");
    let delivery = response.extensions().get::<Delivery>().cloned().unwrap();
    assert_eq!(response.status(), StatusCode::CREATED, "{delivery:?}");
    assert_eq!(delivery.attempts, 3, "{delivery:?}");
    assert!(!delivery.replayed, "the failures stored nothing to replay");
    assert_eq!(sent.load(Ordering::SeqCst), 3);
    assert_eq!(
        h.account("acme", "bob").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
    assert_eq!(h.app.calls.orders(), 3, "two failures, then one success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_a_different_body_is_422_at_once() {
    let (h, base) = start().await;
    let client = ServiceBuilder::new()
        .layer(IdempotentClientLayer::new(policy()))
        .service(http());
    // The caller's own key, one business operation, reused by mistake for
    // a different request.
    let first = order(&h, &base, "carol")
        .header("idempotency-key", "op-carol-1")
        .body(body(PRICE))
        .unwrap();
    let response = client.clone().oneshot(first).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = response.extensions().get::<Delivery>().cloned().unwrap();
    assert_eq!(delivery.attempts, 1);
    assert_eq!(
        delivery
            .key
            .as_ref()
            .map(|k| k.to_str().unwrap().to_owned()),
        Some("op-carol-1".to_owned())
    );

    let other = order(&h, &base, "carol")
        .header("idempotency-key", "op-carol-1")
        .body(body(PRICE + 1))
        .unwrap();
    let response = client.oneshot(other).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let delivery = response.extensions().get::<Delivery>().cloned().unwrap();
    assert_eq!(delivery.attempts, 1, "a 422 is never retried");
    assert!(!delivery.replayed);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let problem = json_of(&bytes);
    assert_eq!(problem["type"], "urn:idem:problem:fingerprint-mismatch");
    assert_eq!(
        h.account("acme", "carol").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}
