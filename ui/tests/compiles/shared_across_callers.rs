//! `shared_across_callers`, bare or with a value.
#![deny(warnings)]

use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use idem_tower::{Idempotency, MemoryStore, idempotent};

#[idempotent(
    key = "pay-callback:{path:payment_no}",
    fingerprint = "method_and_route",
    shared_across_callers
)]
async fn callback(Path(payment_no): Path<String>) -> String {
    payment_no
}

#[idempotent(key = "refund:{path:payment_no}", shared_across_callers = false)]
async fn refund(Path(payment_no): Path<String>) -> String {
    payment_no
}

#[test]
fn builds_its_router() {
    let _app: Router = Router::new()
        .route("/payments/{payment_no}/callback", post(callback))
        .route("/payments/{payment_no}/refund", post(refund))
        .with_state(Idempotency::new(MemoryStore::new()));
}
