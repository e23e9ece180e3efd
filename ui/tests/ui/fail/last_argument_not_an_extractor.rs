use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use idem_tower::{Idempotency, MemoryStore, idempotent};

struct Order;

#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order(Path(_id): Path<String>, _order: Order) {}

fn main() {
    let _app: Router = Router::new()
        .route("/orders/{id}", post(create_order))
        .with_state(Idempotency::new(MemoryStore::new()));
}
