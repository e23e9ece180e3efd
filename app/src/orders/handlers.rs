//! The orders app's handlers: plain axum, unaware of idempotency. The
//! routes (routes.rs) put the idempotency layer in front of the two that
//! need it, `create_order` and `payment_callback`.

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_tower::guards::LifecycleState;
use serde::Deserialize;
use serde_json::json;

use super::chaos::Chaos;
use super::model::{NewOrder, TransitionError};
use super::{App, UserId, Writer};

/// `{"error": message}` with `status`.
pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

fn internal(err: impl std::fmt::Display) -> Response {
    tracing::error!(%err, "database error");
    error(StatusCode::INTERNAL_SERVER_ERROR, "database error")
}

/// `POST /orders`: debits the user's balance, inserts the order and (on SQL)
/// enqueues its `order.created` event, through `writer`, which on SQL is
/// the idempotency claim's own transaction.
pub(crate) async fn create_order(
    State(app): State<App>,
    Extension(UserId(user)): Extension<UserId>,
    headers: HeaderMap,
    mut writer: Writer,
    Json(order): Json<NewOrder>,
) -> Response {
    app.calls.order_ran(); // test fixture, as is `Chaos` (chaos.rs)
    let Some(tenant) = headers.get("x-tenant-id").and_then(|v| v.to_str().ok()) else {
        return error(StatusCode::BAD_REQUEST, "X-Tenant-Id is required");
    };
    if order.qty <= 0 || order.amount_cents < 0 {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "qty must be positive and amount_cents not negative",
        );
    }
    let chaos = Chaos::asked(&app, &headers);
    if let Some(failure) = chaos.failure() {
        return failure;
    }
    let placed = match writer.place_order(tenant, &user, &order).await {
        Ok(placed) => placed,
        // A 500 is not final: the layer rolls the transaction back.
        Err(err) => return internal(err),
    };
    if let Some(failure) = chaos.failure_after_write() {
        return failure;
    }
    chaos.delay().await;
    let location = format!("/orders/{}", placed.order_id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(placed),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct Owner {
    tenant: String,
    user: String,
}

/// `GET /orders?tenant=T&user=U`: a user's orders and balance.
pub(crate) async fn list_orders(State(app): State<App>, Query(owner): Query<Owner>) -> Response {
    let (orders, balance) = match app.data.orders_of(&owner.tenant, &owner.user).await {
        Ok(found) => found,
        Err(err) => return internal(err),
    };
    Json(json!({ "count": orders.len(), "balance_cents": balance, "orders": orders }))
        .into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct NewPayment {
    payment_no: String,
    amount_cents: i64,
}

/// `POST /payments`: a payment waiting for its provider's callback.
pub(crate) async fn create_payment(State(app): State<App>, Json(p): Json<NewPayment>) -> Response {
    match app.data.create_payment(&p.payment_no, p.amount_cents).await {
        Ok(true) => {}
        Ok(false) => return error(StatusCode::CONFLICT, "payment_no already exists"),
        Err(err) => return internal(err),
    }
    match app.data.payment(&p.payment_no).await {
        Ok(payment) => (StatusCode::CREATED, Json(payment)).into_response(),
        Err(err) => internal(err),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct Callback {
    status: String,
    amount_cents: i64,
}

/// `POST /payments/{payment_no}/callback`: the provider says the payment
/// is paid, and re-pushes it until it gets a 2xx.
pub(crate) async fn payment_callback(
    State(app): State<App>,
    Path(payment_no): Path<String>,
    headers: HeaderMap,
    Json(callback): Json<Callback>,
) -> Response {
    app.calls.callback_ran(); // test fixture (chaos.rs)
    let chaos = Chaos::asked(&app, &headers);
    if callback.status != "PAID" {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "only PAID callbacks are supported",
        );
    }
    // A state-machine transition, WAIT_PAY -> PAID, crediting the ledger in
    // the same transaction: a callback whose idempotency record expired
    // finds the payment PAID and books nothing.
    match app.data.mark_paid(&payment_no, callback.amount_cents).await {
        Ok(Ok(payment)) => {
            // Test fixture: a handler still running after its effect.
            chaos.delay().await;
            Json(payment).into_response()
        }
        Ok(Err(refused)) => transition_refused(refused),
        Err(err) => internal(err),
    }
}

/// `POST /payments/{payment_no}/refund`: `PAID -> REFUNDED`, reversing the
/// credit once. Idempotent by the transition alone: a second refund finds
/// the payment refunded and answers 200, booking nothing.
pub(crate) async fn refund_payment(
    State(app): State<App>,
    Path(payment_no): Path<String>,
) -> Response {
    match app.data.refund(&payment_no).await {
        Ok(Ok(payment)) => Json(payment).into_response(),
        Ok(Err(refused)) => transition_refused(refused),
        Err(err) => internal(err),
    }
}

fn transition_refused(refused: TransitionError) -> Response {
    match refused {
        TransitionError::NotFound => error(StatusCode::NOT_FOUND, "no such payment"),
        TransitionError::AmountMismatch => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount does not match the payment",
        ),
        TransitionError::Illegal(current) => {
            let state = current.as_str();
            error(
                StatusCode::CONFLICT,
                &format!("the payment is {state}: this step does not apply"),
            )
        }
    }
}

/// `GET /payments/{payment_no}`: its state, credits and refunds.
pub(crate) async fn get_payment(
    State(app): State<App>,
    Path(payment_no): Path<String>,
) -> Response {
    match app.data.payment(&payment_no).await {
        Ok(Some(payment)) => Json(payment).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "no such payment"),
        Err(err) => internal(err),
    }
}
