use idem_tower::idempotent;

#[idempotent(key = "order:{tenant}:{header:idempotency-key")]
async fn create_order() {}

fn main() {}
