//! The caller's half: orders placed through `IdempotencyClientLayer` on
//! hyper-util's client, against the orders app (chaos on) served in process
//! on loopback. Each attempt and each final `RetryReport` is printed.
//!
//! ```text
//! cargo run -p idem-examples --example order_client
//! ```
//!
//! Needs nothing: the app runs on the in-memory store. The second order
//! carries `X-Chaos-Fail: 503` on its first two attempts (a small
//! `service_fn` in front of the HTTP client adds it), so the layer retries
//! it with the same key; the third reuses the caller's own key and is
//! replayed.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_examples::orders::App;
use idem_tower::client::{IdempotencyClientLayer, RetryPolicy, RetryReport};
use tower::{ServiceBuilder, ServiceExt, service_fn};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The orders app with `--chaos`, on 127.0.0.1, an ephemeral port.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let router = App::in_memory(true).router();
    tokio::spawn(async move { axum::serve(listener, router).await });

    // Prints each attempt; on the attempts listed in `fail` (numbered from
    // 1 per order) adds `X-Chaos-Fail: 503`, which the app answers with a
    // 503 before any write.
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
        let mut request = Request::post(format!("{base}/orders"))
            .header("content-type", "application/json")
            .header("x-tenant-id", "acme")
            .header("authorization", "Bearer alice");
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
    let list = Request::get(format!("{base}/orders?tenant=acme&user=alice"))
        .body(Full::<Bytes>::default())?;
    let response = client.oneshot(list).await?;
    let body = response.into_body().collect().await?.to_bytes();
    println!("  => {}", String::from_utf8_lossy(&body));
    Ok(())
}
