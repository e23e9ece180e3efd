use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}")]
struct CreateOrder;

fn main() {}
