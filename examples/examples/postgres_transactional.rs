//! Transactional mode on PostgreSQL: the idempotency claim, the handler's
//! writes through the `Tx` extractor and the stored response commit in one
//! transaction, or not at all (docs/transactional.md).
//!
//! ```text
//! cargo run -p idem-examples --example postgres_transactional
//! ```
//!
//! Needs PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); creates the table
//! `example_orders` and, with `store.migrate()`, idem's own. The first
//! attempt fails after its insert, which rolls back with the claim; the
//! client's retry under the same key runs; a duplicate replays. One row.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::sync::atomic::{AtomicBool, Ordering};

use axum::{Json, Router, http::StatusCode, routing::post};
use idem_tower::sql::sqlx::{self, PgPool, Postgres};
use idem_tower::{Idempotency, PgStore, Tx, idempotent};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct NewOrder {
    sku: String,
    qty: i32,
}

/// Makes the first attempt fail after its write, as a crash or a timeout
/// further down would.
static FAIL_ONCE: AtomicBool = AtomicBool::new(true);

#[idempotent(key = "order:{header:idempotency-key}", transactional)]
async fn create_order(
    mut tx: Tx<Postgres>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Value>), StatusCode> {
    // Through `&mut *tx`, never the pool: this insert commits with the
    // stored response, or rolls back with the claim.
    let order_id: i64 =
        sqlx::query_scalar("INSERT INTO example_orders (sku, qty) VALUES ($1, $2) RETURNING id")
            .bind(&order.sku)
            .bind(order.qty)
            .fetch_one(&mut *tx)
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    if FAIL_ONCE.swap(false, Ordering::SeqCst) {
        // Not final: the layer rolls the insert back and frees the key.
        return Err(StatusCode::SERVICE_UNAVAILABLE);
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({ "order_id": order_id, "sku": order.sku })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = PgPool::connect(&url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS example_orders \
         (id BIGSERIAL PRIMARY KEY, sku TEXT NOT NULL, qty INT NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let store = PgStore::new(pool.clone());
    store.migrate().await?;
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(Idempotency::new(store));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/orders", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // A key and a product of this run's own, so that every run starts fresh.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let (key, sku) = (format!("k-{run}"), format!("book-{run}"));
    let client = reqwest::Client::new();
    for what in ["first attempt", "retry, same key", "duplicate"] {
        let response = client
            .post(&url)
            .header("Idempotency-Key", &key)
            .json(&json!({ "sku": sku, "qty": 1 }))
            .send()
            .await?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        println!(
            "{what:<16} -> {status}, replayed: {replayed}, {}",
            response.text().await?
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM example_orders WHERE sku = $1")
        .bind(&sku)
        .fetch_one(&pool)
        .await?;
    println!("rows for {sku}: {rows}");
    Ok(())
}
