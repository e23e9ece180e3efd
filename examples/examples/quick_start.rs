//! Quick start: one axum route made idempotent with `#[idempotent]`, on the
//! in-process `MemoryStore`, and what a client sees when it retries.
//!
//! ```text
//! cargo run -p idem-examples --example quick_start
//! ```
//!
//! Needs no server. It serves the route on a free loopback port, sends it a
//! first request, a retry, a different request under the same key and one
//! without a key, prints each answer, and exits. README.md, "The HTTP
//! contract", lists every answer the layer gives.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::sync::atomic::{AtomicU64, Ordering};

use axum::{Json, Router, http::StatusCode, routing::post};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::{Value, json};

/// How many charges were made: the effect that must happen once per key.
static CHARGES: AtomicU64 = AtomicU64::new(0);

/// Charges a card once per `Idempotency-Key`, however often the client
/// sends the request. Duplicates are answered from the stored response for
/// 24 hours, without running this function.
#[idempotent(key = "charge:{header:idempotency-key}", ttl = "24h")]
async fn create_charge(Json(request): Json<Value>) -> (StatusCode, Json<Value>) {
    let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
    let charged =
        json!({ "charge_id": format!("ch_{n}"), "amount_cents": request["amount_cents"] });
    (StatusCode::CREATED, Json(charged))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The handle lives in the router state (or comes from it through
    // `FromRef`). A real app also binds each record to its caller with
    // `Idempotency::builder(store).tenant(...).user(...)`: docs/keys.md.
    let app = Router::new()
        .route("/charges", post(create_charge))
        .with_state(Idempotency::new(MemoryStore::new()));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/charges", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::new();
    for (what, key, amount_cents) in [
        ("first request", Some("k-1"), 500),
        ("retry, same key", Some("k-1"), 500),
        ("same key, other body", Some("k-1"), 700),
        ("no key", None, 500),
    ] {
        let mut request = client
            .post(&url)
            .json(&json!({ "amount_cents": amount_cents }));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let body = response.text().await?;
        println!(
            "{what:<21} -> {status}, replayed: {replayed}\n{:<24} {body}",
            ""
        );
    }
    println!("charges made: {}", CHARGES.load(Ordering::SeqCst));
    Ok(())
}
