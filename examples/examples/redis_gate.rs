//! The Redis gate: a `TieredStore` with `RedisStore` in front of `PgStore`.
//! Redis answers duplicates in one round trip; PostgreSQL's unique index
//! stays the source of truth, and takes over alone if Redis fails
//! (docs/redis-gate.md).
//!
//! ```text
//! cargo run -p idem-examples --example redis_gate
//! ```
//!
//! Needs Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`) and
//! PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), where `store.migrate()`
//! creates idem's table. It sends one request and five duplicates, then
//! prints who answered them from the tiered store's counters.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::sync::atomic::{AtomicU64, Ordering};

use axum::{Json, Router, http::StatusCode, routing::post};
use idem_tower::redis::redis::{self, IntoConnectionInfo, io::tcp::TcpSettings};
use idem_tower::sql::sqlx::PgPool;
use idem_tower::{Idempotency, PgStore, RedisStore, TieredStore, idempotent};
use serde_json::{Value, json};

static SHIPMENTS: AtomicU64 = AtomicU64::new(0);

#[idempotent(key = "ship:{header:idempotency-key}")]
async fn ship(Json(parcel): Json<Value>) -> (StatusCode, Json<Value>) {
    let n = SHIPMENTS.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        Json(json!({ "shipment": n, "parcel": parcel })),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());

    // TCP_NODELAY on, which redis-rs leaves off (docs/redis-gate.md).
    let redis = redis_url
        .into_connection_info()?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    let redis = redis::Client::open(redis)?.get_connection_manager().await?;
    let sql = PgStore::new(PgPool::connect(&database_url).await?);
    sql.migrate().await?;
    let store = TieredStore::new(RedisStore::new(redis), sql);
    let counters = store.counters();
    let app = Router::new()
        .route("/shipments", post(ship))
        .with_state(Idempotency::new(store));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/shipments", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // A key of this run's own, so that every run starts fresh.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let key = format!("k-{run}");
    let client = reqwest::Client::new();
    for attempt in 1..=6 {
        let response = client
            .post(&url)
            .header("Idempotency-Key", &key)
            .json(&json!({ "to": "Ada" }))
            .send()
            .await?;
        let replayed = response.headers().contains_key("idempotent-replayed");
        println!(
            "request {attempt} -> {}, replayed: {replayed}",
            response.status()
        );
    }
    let stats = counters.snapshot();
    println!("shipments made: {}", SHIPMENTS.load(Ordering::SeqCst));
    println!(
        "claims answered by Redis alone: {}; decided by SQL alone, Redis failing: {}",
        stats.answered_by_gate, stats.degraded
    );
    Ok(())
}
