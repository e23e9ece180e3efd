//! Several annotated handlers in one module, public, crate-visible and
//! private, routed from outside it (`app::app`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::idempotent;
use serde_json::{Value, json};

use crate::AppState;
use crate::support::Calls;

/// A payment platform's callback: the payment number is the key, and
/// retries with other bodies are still the same callback.
#[idempotent(
    key = "pay-callback:{path:payment_no}",
    fingerprint = "method_and_route"
)]
pub async fn callback(
    State(state): State<AppState>,
    Path(payment_no): Path<String>,
    Json(_body): Json<Value>,
) -> Json<Value> {
    let run = state.calls.run();
    Json(json!({ "payment_no": payment_no, "credit": run }))
}

#[idempotent(
    key = "refund:{path:payment_no}:{body:/refund_no}",
    fingerprint = "request"
)]
pub(crate) async fn refund(
    State(calls): State<Calls>,
    Path(payment_no): Path<String>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    calls.run();
    (
        StatusCode::CREATED,
        Json(json!({ "payment_no": payment_no, "refund_no": body["refund_no"] })),
    )
}

#[idempotent(key = "void:{header:idempotency-key}")]
async fn void() -> StatusCode {
    StatusCode::NO_CONTENT
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/payments/{payment_no}/callback", post(callback))
        .route("/payments/{payment_no}/refunds", post(refund))
        .route("/payments/void", post(void))
}
