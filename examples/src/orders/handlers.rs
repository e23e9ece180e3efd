//! The orders app's handlers: plain axum, unaware of idempotency.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

use super::db::TransitionError;
use super::{App, NewOrder as OrderRow, UserId, Writer};

/// The body of `POST /orders`.
#[derive(Debug, Deserialize)]
pub(crate) struct NewOrder {
    sku: String,
    qty: i64,
    amount_cents: i64,
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

fn chaos_header(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

fn internal(err: impl std::fmt::Display) -> Response {
    tracing::error!(%err, "database error");
    error(StatusCode::INTERNAL_SERVER_ERROR, "database error")
}

pub(crate) async fn create_order(
    State(app): State<App>,
    Extension(UserId(user)): Extension<UserId>,
    headers: HeaderMap,
    mut writer: Writer,
    Json(order): Json<NewOrder>,
) -> Response {
    app.calls.orders.fetch_add(1, Ordering::SeqCst);
    let Some(tenant) = headers.get("x-tenant-id").and_then(|v| v.to_str().ok()) else {
        return error(StatusCode::BAD_REQUEST, "X-Tenant-Id is required");
    };
    if order.qty <= 0 || order.amount_cents < 0 {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "qty must be positive and amount_cents not negative",
        );
    }
    if app.chaos && chaos_header(&headers, "x-chaos-fail") == Some(503) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "chaos: failing before any write",
        );
    }
    let row = OrderRow {
        tenant,
        user: &user,
        sku: &order.sku,
        qty: order.qty,
        amount_cents: order.amount_cents,
    };
    let placed = match writer.place_order(&row).await {
        Ok(placed) => placed,
        // A 500 is not final: the layer rolls the transaction back.
        Err(err) => return internal(err),
    };
    if app.chaos
        && let Some(ms) = chaos_header(&headers, "x-chaos-delay-ms")
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
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

pub(crate) async fn payment_callback(
    State(app): State<App>,
    Path(payment_no): Path<String>,
    Json(callback): Json<Callback>,
) -> Response {
    app.calls.callbacks.fetch_add(1, Ordering::SeqCst);
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
        Ok(Ok(payment)) => Json(payment).into_response(),
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
            let state = idem_tower::core::guards::LifecycleState::as_str(&current);
            error(
                StatusCode::CONFLICT,
                &format!("the payment is {state}: this step does not apply"),
            )
        }
    }
}

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

pub(crate) async fn metrics(State(app): State<App>) -> Response {
    // idem's own metrics (requests by outcome, claim latency, the tiered
    // store's counters), when a recorder is installed.
    let mut body = app
        .prometheus
        .as_ref()
        .map(PrometheusHandle::render)
        .unwrap_or_default();
    body.push_str(&format!(
        "# TYPE orders_handler_calls_total counter\norders_handler_calls_total {}\n\
         # TYPE payment_callback_handler_calls_total counter\npayment_callback_handler_calls_total {}\n",
        app.calls.orders(),
        app.calls.callbacks(),
    ));
    // The keys duplicates hit most, from idem's bounded table: at most ten
    // series, each a key's first 64 characters and its duplicates so far.
    body.push_str(
        "# HELP idem_key_duplicates Duplicates seen per key since start (an upper bound), top ten keys.\n\
         # TYPE idem_key_duplicates gauge\n",
    );
    for top in app.idem.top_duplicated_keys(10) {
        let key = top.key.replace('\\', "\\\\").replace('"', "\\\"");
        body.push_str(&format!(
            "idem_key_duplicates{{key=\"{key}\"}} {}\n",
            top.count
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}
