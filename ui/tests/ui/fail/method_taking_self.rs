use idem_tower::idempotent;

struct Orders;

impl Orders {
    #[idempotent(key = "order:{header:idempotency-key}")]
    async fn create(&self) -> &'static str {
        "created"
    }
}

fn main() {}
