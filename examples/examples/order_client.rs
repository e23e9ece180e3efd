//! The caller's half: orders placed through `IdempotencyClientLayer` on
//! hyper-util's client, against a small orders service (an
//! `#[idempotent]` axum route) served in process on loopback. Each attempt
//! and each final `RetryReport` is printed.
//!
//! ```text
//! cargo run -p idem-examples --example order_client
//! ```
//!
//! Needs nothing: the service keeps its orders in memory. The second order
//! carries `X-Chaos-Fail: 503` on its first two attempts (a small
//! `service_fn` in front of the HTTP client adds it), which the service
//! answers with a 503 before it writes anything, so the layer retries it
//! with the same key; the third reuses the caller's own key and is
//! replayed.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_tower::client::{IdempotencyClientLayer, RetryPolicy, RetryReport};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// The orders placed, in order.
type Orders = Arc<Mutex<Vec<Value>>>;

/// The service's state: the idempotency handle and the orders.
#[derive(Clone)]
struct Shop {
    idem: Idempotency,
    orders: Orders,
}

impl axum::extract::FromRef<Shop> for Idempotency {
    fn from_ref(shop: &Shop) -> Self {
        shop.idem.clone()
    }
}

/// Places an order, once per key: a 503 (before any write) when asked by
/// `X-Chaos-Fail: 503`, which releases the key for the retry.
#[idempotent(key = "order:{header:idempotency-key}", ttl = "24h")]
async fn place_order(
    State(shop): State<Shop>,
    headers: HeaderMap,
    Json(order): Json<Value>,
) -> (StatusCode, Json<Value>) {
    if headers.get("x-chaos-fail").is_some_and(|v| v == "503") {
        let busy = json!({"error": "try again"});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(busy));
    }
    let mut orders = shop.orders.lock().expect("not poisoned");
    let placed = json!({"order_id": orders.len() + 1, "order": order});
    orders.push(placed.clone());
    (StatusCode::CREATED, Json(placed))
}

/// The orders so far: a read, which needs no key.
async fn list_orders(State(shop): State<Shop>) -> Json<Vec<Value>> {
    Json(shop.orders.lock().expect("not poisoned").clone())
}

/// Serves the orders service on 127.0.0.1, an ephemeral port; its URL.
async fn serve() -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let shop = Shop {
        idem: Idempotency::new(MemoryStore::new()),
        orders: Orders::default(),
    };
    let router = Router::new()
        .route("/orders", post(place_order).get(list_orders))
        .with_state(shop);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(base)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let base = serve().await?;

    // Prints each attempt; on the attempts listed in `fail` (numbered from
    // 1 per order) adds `X-Chaos-Fail: 503`, which the service answers
    // with a 503 before any write.
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let attempt = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicU32::new(0));
    let inner = {
        let (attempt, fail) = (attempt.clone(), fail.clone());
        service_fn(move |mut request: Request<Full<Bytes>>| {
            let n = attempt.fetch_add(1, Ordering::SeqCst) + 1;
            if n <= fail.load(Ordering::SeqCst) {
                let chaos = HeaderValue::from_static("503");
                request.headers_mut().insert("x-chaos-fail", chaos);
            }
            let key = request.headers().get("idempotency-key").cloned();
            let http = http.clone();
            async move {
                let response = http.request(request).await?;
                println!(
                    "  attempt {n}: key {:?} -> {}",
                    key.unwrap_or(HeaderValue::from_static("-")),
                    response.status()
                );
                Ok::<_, hyper_util::client::legacy::Error>(response)
            }
        })
    };
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(
            RetryPolicy::default()
                .attempt_timeout(Duration::from_secs(5))
                .backoff(Duration::from_millis(50), Duration::from_millis(500)),
        ))
        .service(inner);

    for (what, amount_cents, failures, key) in [
        ("an order", 1999, 0, None),
        ("an order, 503 twice first", 2500, 2, None),
        ("the caller's own key", 1200, 0, Some("op-42")),
        ("the same key again", 1200, 0, Some("op-42")),
    ] {
        println!("{what}:");
        attempt.store(0, Ordering::SeqCst);
        fail.store(failures, Ordering::SeqCst);
        let mut request =
            Request::post(format!("{base}/orders")).header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let body = format!(r#"{{"sku":"book","qty":1,"amount_cents":{amount_cents}}}"#);
        let request = request.body(Full::new(Bytes::from(body)))?;
        let response = client.clone().oneshot(request).await?;
        let status = response.status();
        let delivery = response
            .extensions()
            .get::<RetryReport>()
            .cloned()
            .expect("the layer sets it");
        let body = response.into_body().collect().await?.to_bytes();
        println!(
            "  => {status} after {} attempt(s), replayed: {}, key origin: {:?}\n     {}",
            delivery.attempts,
            delivery.replayed,
            delivery.origin,
            String::from_utf8_lossy(&body)
        );
    }

    println!("GET /orders (safe: no key):");
    attempt.store(0, Ordering::SeqCst);
    let list = Request::get(format!("{base}/orders")).body(Full::<Bytes>::default())?;
    let response = client.oneshot(list).await?;
    let body = response.into_body().collect().await?.to_bytes();
    println!("  => {}", String::from_utf8_lossy(&body));
    Ok(())
}
