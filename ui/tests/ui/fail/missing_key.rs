use idem_tower::idempotent;

#[idempotent(ttl = "24h")]
async fn create_order() {}

fn main() {}
