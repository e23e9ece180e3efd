//! Every argument, every fingerprint form, and handlers of every shape:
//! no extractor, `impl IntoResponse`, Path, Query, the handle itself.
#![deny(warnings)]

use std::collections::HashMap;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::Value;

#[idempotent(
    key = "pay:{path:payment_no}",
    ttl = "7days",
    lease = "1m 30s",
    required = true,
    in_flight = "wait(5s)",
    fingerprint = "method_and_route"
)]
async fn pay(Path(_payment_no): Path<String>) -> StatusCode {
    StatusCode::OK
}

#[idempotent(
    key = "refund:{body:/refund_no}",
    in_flight = "reject",
    fingerprint = "request"
)]
async fn refund(Json(body): Json<Value>) -> impl IntoResponse {
    Json(body)
}

#[idempotent(key = "transfer:{header:idempotency-key}", fingerprint = ["/amount", "/currency"])]
async fn transfer(Json(body): Json<Value>) -> Json<Value> {
    Json(body)
}

#[idempotent(key = "search:{query:ref}", required = false, ttl = "10m")]
async fn search(Query(params): Query<HashMap<String, String>>, idem: Idempotency) -> String {
    format!("{} {}", params.len(), idem.key_header())
}

#[idempotent(key = "ping:{header:idempotency-key}")]
async fn ping() {}

async fn untouched() -> &'static str {
    "not idempotent"
}

#[test]
fn builds_its_router() {
    let _app: Router = Router::new()
        .route("/payments/{payment_no}", put(pay))
        .route("/refunds", post(refund))
        .route("/transfers", post(transfer))
        .route("/search", post(search).get(untouched))
        .route("/ping", post(ping))
        .route("/health", get(untouched))
        .with_state(Idempotency::new(MemoryStore::new()));
}
