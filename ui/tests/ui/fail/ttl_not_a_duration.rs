use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", ttl = true)]
async fn create_order() {}

fn main() {}
