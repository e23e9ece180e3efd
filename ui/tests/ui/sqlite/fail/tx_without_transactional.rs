use axum::Json;
use idem_tower::Tx;
use idem_tower::sql::sqlx::Sqlite;
use idem_tower::idempotent;
use serde_json::Value;

// `Tx` is only there on a transactional route.
#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order(_tx: Tx<Sqlite>, Json(_order): Json<Value>) {}

fn main() {}
