use axum::Json;
use idem_tower::idempotent;
use serde_json::Value;

#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order(_raw: String, Json(_order): Json<Value>) {}

fn main() {}
