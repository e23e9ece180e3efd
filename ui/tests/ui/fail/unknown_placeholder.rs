use idem_tower::idempotent;

#[idempotent(key = "order:{tenant}:{headers:idempotency-key}")]
async fn create_order() {}

fn main() {}
