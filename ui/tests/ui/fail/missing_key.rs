use idem_tower::idempotent;

#[idempotent(retention = "24h")]
async fn create_order() {}

fn main() {}
