use idem_tower::idempotent;

#[idempotent(
    key = "order:{header:idempotency-key}",
    transactional,
    in_flight = "wait(5s)"
)]
async fn create_order() {}

fn main() {}
