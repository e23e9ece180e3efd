//! Handlers named like the locals of the expansion (`request`, `state`,
//! `idem`, ...) in one module: none shadows another's code.
#![deny(warnings)]

use axum::extract::Path;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::Value;

#[idempotent(key = "a:{header:idempotency-key}")]
async fn request(Path(_id): Path<String>, Json(order): Json<Value>) -> Json<Value> {
    Json(order)
}

#[idempotent(key = "b:{header:idempotency-key}")]
async fn state(Json(order): Json<Value>) -> Json<Value> {
    Json(order)
}

#[idempotent(key = "c:{header:idempotency-key}")]
async fn body() -> &'static str {
    "body"
}

#[idempotent(key = "d:{header:idempotency-key}")]
async fn call(Path(id): Path<String>) -> String {
    id
}

#[idempotent(key = "e:{header:idempotency-key}")]
async fn response(Path(id): Path<String>) -> impl IntoResponse {
    id
}

#[idempotent(key = "f:{header:idempotency-key}")]
async fn idem(_idem: Idempotency) -> &'static str {
    "idem"
}

#[test]
fn builds_its_router() {
    let _app: Router = Router::new()
        .route("/a/{id}", post(request))
        .route("/b", post(state))
        .route("/c", post(body))
        .route("/d/{id}", post(call))
        .route("/e/{id}", post(response))
        .route("/f", post(idem))
        .with_state(Idempotency::new(MemoryStore::new()));
}
