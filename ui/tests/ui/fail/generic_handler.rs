use axum::extract::State;
use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order<T: Clone + Send + Sync + 'static>(State(_state): State<T>) {}

fn main() {}
