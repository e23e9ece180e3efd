use axum::Json;
use idem_tower::idempotent;

#[idempotent(key = "charge:{header:idempotency-key}")]
async fn charge(Json(charge): Json<serde_json::Value>) -> String {
    charge.to_string()
}

fn main() {}
