use idem_tower::idempotent;

struct Order;

#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order() -> Order {
    Order
}

fn main() {}
