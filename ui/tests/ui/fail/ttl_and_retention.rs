use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", ttl = "24h", retention = "1h")]
async fn create_order() {}

fn main() {}
