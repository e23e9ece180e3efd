//! Every form `ttl` is written in: a humane string, whole seconds, and
//! `retention`, its former name, which is still accepted.
#![deny(warnings)]

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem_tower::{Idempotency, MemoryStore, idempotent};

#[idempotent(key = "charge:{header:idempotency-key}", ttl = "24h")]
async fn charge() -> StatusCode {
    StatusCode::CREATED
}

#[idempotent(key = "grant:{header:idempotency-key}", ttl = "10m")]
async fn grant() -> StatusCode {
    StatusCode::CREATED
}

#[idempotent(key = "ship:{header:idempotency-key}", ttl = "1h 30m", lease = 30)]
async fn ship() -> StatusCode {
    StatusCode::CREATED
}

#[idempotent(key = "refund:{header:idempotency-key}", ttl = 86400)]
async fn refund() -> StatusCode {
    StatusCode::CREATED
}

#[idempotent(key = "credit:{header:idempotency-key}", ttl = "365days")]
async fn credit() -> StatusCode {
    StatusCode::CREATED
}

#[idempotent(key = "debit:{header:idempotency-key}", retention = "72h")]
async fn debit() -> StatusCode {
    StatusCode::CREATED
}

#[test]
fn builds_its_router() {
    let _app: Router = Router::new()
        .route("/charges", post(charge))
        .route("/grants", post(grant))
        .route("/shipments", post(ship))
        .route("/refunds", post(refund))
        .route("/credits", post(credit))
        .route("/debits", post(debit))
        .with_state(Idempotency::new(MemoryStore::new()));
}
