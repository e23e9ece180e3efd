use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", ttl = "0s")]
async fn create_order() {}

fn main() {}
