//! `#[axum::debug_handler]` above or below `#[idempotent]`: both compile,
//! and the handler can still be called as the function.
#![deny(warnings)]

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::Value;

#[derive(Clone)]
struct AppState {
    idem: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idem.clone()
    }
}

#[axum::debug_handler]
#[idempotent(key = "above:{header:idempotency-key}")]
async fn above(
    State(_state): State<AppState>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    (StatusCode::CREATED, Json(body))
}

#[idempotent(key = "below:{header:idempotency-key}")]
#[axum::debug_handler]
async fn below(
    State(_state): State<AppState>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    (StatusCode::CREATED, Json(body))
}

#[axum::debug_handler(state = AppState)]
#[idempotent(key = "no-arguments:{header:idempotency-key}")]
async fn no_arguments() -> &'static str {
    "done"
}

#[test]
fn builds_its_router() {
    let state = AppState {
        idem: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/above", post(above))
        .route("/below", post(below))
        .route("/none", post(no_arguments))
        .with_state(state.clone());
    let _called = (
        above(State(state.clone()), Json(Value::Null)),
        below(State(state), Json(Value::Null)),
        no_arguments(),
    );
}
