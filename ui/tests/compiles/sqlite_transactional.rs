//! A transactional handler writing through `Tx`, on a SQL store.
#![deny(warnings)]

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::sql::sqlx::{self, Sqlite};
use idem_tower::{Idempotency, SqliteStore, Tx, idempotent};
use serde_json::Value;

#[idempotent(
    key = "order:{header:idempotency-key}",
    transactional,
    in_flight = "reject"
)]
async fn create_order(
    mut tx: Tx<Sqlite>,
    Json(order): Json<Value>,
) -> Result<StatusCode, StatusCode> {
    sqlx::query("INSERT INTO orders (body) VALUES (?)")
        .bind(order.to_string())
        .execute(&mut *tx)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok(StatusCode::CREATED)
}

#[idempotent(key = "ledger:{header:idempotency-key}", transactional = true)]
async fn ledger(_tx: idem_tower::Tx<Sqlite>) -> StatusCode {
    StatusCode::NO_CONTENT
}

fn app(pool: sqlx::SqlitePool) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/ledger", post(ledger))
        .with_state(Idempotency::new(SqliteStore::new(pool)))
}

#[test]
fn builds_its_router() {
    let _ = app;
}
