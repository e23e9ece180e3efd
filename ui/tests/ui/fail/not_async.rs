use idem_tower::idempotent;

#[idempotent(key = "order:{header:idempotency-key}")]
fn create_order() -> &'static str {
    "created"
}

fn main() {}
