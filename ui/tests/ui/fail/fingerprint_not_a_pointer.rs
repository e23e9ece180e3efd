use idem_tower::idempotent;

#[idempotent(key = "transfer:{header:idempotency-key}", fingerprint = ["/amount", "currency"])]
async fn transfer() {}

fn main() {}
