use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", transactional = "yes")]
async fn create_order() {}

fn main() {}
