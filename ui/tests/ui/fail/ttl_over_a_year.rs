use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", ttl = "400days")]
async fn create_order() {}

fn main() {}
