use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", lease = "30 secondz")]
async fn create_order() {}

fn main() {}
