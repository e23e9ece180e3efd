use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", tll = "24h")]
async fn create_order() {}

fn main() {}
