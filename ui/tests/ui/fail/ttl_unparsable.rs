use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", ttl = "one day")]
async fn create_order() {}

fn main() {}
