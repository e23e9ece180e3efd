//! The idempotent routes as `#[idempotent]` handlers: the default wiring.
//! Each delegates to the plain handler in [`handlers`](super::handlers),
//! which [`Wiring::Layer`](super::Wiring::Layer) serves behind explicitly
//! built layers instead, so the contract tests hold both paths to the same
//! answers.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use idem_tower::idempotent;

use super::handlers::{self, Callback, NewOrder};
use super::{App, UserId, Writer};

/// `POST /orders` on SQL: the order, the debit and the stored response
/// commit in one transaction.
#[idempotent(
    key = "order-create:{tenant}:{user}:{header:idempotency-key}",
    transactional
)]
pub(crate) async fn create_order(
    app: State<App>,
    user: Extension<UserId>,
    headers: HeaderMap,
    writer: Writer,
    order: Json<NewOrder>,
) -> Response {
    handlers::create_order(app, user, headers, writer, order).await
}

/// `POST /orders` on the memory database, which has no transactions.
#[idempotent(key = "order-create:{tenant}:{user}:{header:idempotency-key}")]
pub(crate) async fn create_order_in_memory(
    app: State<App>,
    user: Extension<UserId>,
    headers: HeaderMap,
    writer: Writer,
    order: Json<NewOrder>,
) -> Response {
    handlers::create_order(app, user, headers, writer, order).await
}

/// `POST /payments/{payment_no}/callback`: the provider re-pushes it until
/// it gets a 2xx; the payment number is the key, one record for the payment
/// whoever (and from wherever) the provider sends it as.
#[idempotent(key = "pay-callback:{path:payment_no}", shared_across_callers)]
pub(crate) async fn payment_callback(
    app: State<App>,
    payment_no: Path<String>,
    callback: Json<Callback>,
) -> Response {
    handlers::payment_callback(app, payment_no, callback).await
}
