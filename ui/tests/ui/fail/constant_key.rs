use idem_tower::idempotent;

#[idempotent(key = "idempotent:pay")]
async fn pay() {}

fn main() {}
