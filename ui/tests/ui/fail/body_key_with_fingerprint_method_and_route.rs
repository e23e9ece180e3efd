use axum::Json;
use idem_tower::idempotent;
use serde_json::Value;

#[idempotent(key = "refund:{body:/refund_no}", fingerprint = "method_and_route")]
async fn refund(Json(body): Json<Value>) -> Json<Value> {
    Json(body)
}

fn main() {}
