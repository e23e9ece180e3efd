use axum::extract::{FromRef, State};
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::Value;

#[derive(Clone)]
struct Db;

#[derive(Clone)]
struct AppState {
    idem: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idem.clone()
    }
}

// `State<Db>` needs `impl FromRef<AppState> for Db`, which is missing.
#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order(State(_db): State<Db>, Json(_order): Json<Value>) {}

fn main() {
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .with_state(AppState {
            idem: Idempotency::new(MemoryStore::new()),
        });
}
