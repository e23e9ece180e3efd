use axum::extract::Path;
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::Value;

// `Json` reads the body, so it must come last.
#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order(Json(_order): Json<Value>, Path(_id): Path<String>) {}

fn main() {
    // The route adds no error of its own.
    let _app: Router = Router::new()
        .route("/orders/{id}", post(create_order))
        .with_state(Idempotency::new(MemoryStore::new()));
}
