//! The handlers of the scenarios without the orders endpoint, and the
//! peer's login.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use idem_tower::redis::redis;
use ruts::Session;
use ruts::store::Ttl;
use ruts::store::moka::MokaStore;
use serde::{Deserialize, Serialize};

use super::{AppState, PROBE_KEY};

/// The body of every scenario's request but the orders endpoint's.
#[derive(Deserialize)]
pub(super) struct Order {
    sku: String,
    qty: u32,
    amount_cents: i64,
}

/// The answer to an [`Order`].
#[derive(Serialize)]
struct Created {
    order_id: usize,
    sku: String,
    qty: u32,
    amount_cents: i64,
}

/// The handler of every scenario: parses the order, counts the call and
/// answers a small JSON `201` with a `Location` (after the simulated work,
/// if the server has any).
pub(super) async fn create_order(
    State(state): State<AppState>,
    Json(order): Json<Order>,
) -> impl IntoResponse {
    let order_id = state.calls.fetch_add(1, Ordering::Relaxed) + 1;
    if !state.delay.is_zero() {
        tokio::time::sleep(state.delay).await;
    }
    created(order_id, order)
}

/// The same handler, plus one Redis `GET`.
pub(super) async fn create_order_after_get(
    State(state): State<AppState>,
    Json(order): Json<Order>,
) -> axum::response::Response {
    let mut conn = state.redis.clone().expect("a Redis connection");
    let probe: Result<Option<Vec<u8>>, _> = redis::cmd("GET")
        .arg(PROBE_KEY)
        .query_async(&mut conn)
        .await;
    if probe.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let order_id = state.calls.fetch_add(1, Ordering::Relaxed) + 1;
    created(order_id, order).into_response()
}

/// A `201` with the created order and its `Location`.
fn created(order_id: usize, order: Order) -> impl IntoResponse {
    let location = HeaderValue::try_from(format!("/orders/{order_id}")).expect("a valid header");
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(Created {
            order_id,
            sku: order.sku,
            qty: order.qty,
            amount_cents: order.amount_cents,
        }),
    )
}

/// axum-idempotent only caches for a request that already has a session;
/// this route starts one, the way its own tests do.
pub(super) async fn login(session: Session<MokaStore>) -> StatusCode {
    let hour = Ttl::new(3600).expect("a valid TTL");
    match session.set("user", &"bench", hour, None).await {
        Ok(()) => StatusCode::OK,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
