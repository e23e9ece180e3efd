use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", ttl = 0)]
async fn create_order() {}

fn main() {}
