use axum::Router;
use axum::routing::post;
use idem_tower::{Idempotency, MemoryStore, idempotent};

struct NotAnExtractor;

#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order(_: NotAnExtractor, _: String) {}

fn main() {
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .with_state(Idempotency::new(MemoryStore::new()));
}
