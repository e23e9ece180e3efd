use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}", in_flight = "wait")]
async fn create_order() {}

fn main() {}
