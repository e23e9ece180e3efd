//! Handlers in submodules, public and private, several in one module, used
//! from routers generic over their state.
#![deny(warnings)]
// The modules are `pub`, as in a user's crate; a test's are unreachable.
#![allow(unreachable_pub)]

use axum::Router;
use axum::extract::FromRef;
use idem_tower::{Idempotency, MemoryStore};

pub mod api {
    pub mod orders {
        use axum::extract::{FromRef, State};
        use axum::routing::post;
        use axum::{Json, Router};
        use idem_tower::{Idempotency, idempotent};
        use serde_json::Value;

        /// The counter the handlers share.
        #[derive(Clone, Default)]
        pub struct Counter;

        /// Public, documented.
        #[idempotent(key = "order:{header:idempotency-key}")]
        pub async fn create(
            State(_counter): State<Counter>,
            Json(body): Json<Value>,
        ) -> Json<Value> {
            Json(body)
        }

        #[idempotent(key = "cancel:{header:idempotency-key}")]
        pub(crate) async fn cancel(State(_counter): State<Counter>) -> &'static str {
            "cancelled"
        }

        #[idempotent(key = "archive:{header:idempotency-key}")]
        async fn archive() -> &'static str {
            "archived"
        }

        /// Routes for any state that gives the handle and the counter.
        pub fn routes<S>() -> Router<S>
        where
            S: Clone + Send + Sync + 'static,
            Idempotency: FromRef<S>,
            Counter: FromRef<S>,
        {
            Router::new()
                .route("/orders", post(create))
                .route("/orders/cancel", post(cancel))
                .route("/orders/archive", post(archive))
        }
    }
}

#[derive(Clone)]
struct AppState {
    idem: Idempotency,
    counter: api::orders::Counter,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idem.clone()
    }
}

impl FromRef<AppState> for api::orders::Counter {
    fn from_ref(state: &AppState) -> Self {
        state.counter.clone()
    }
}

#[test]
fn builds_its_router() {
    let state = AppState {
        idem: Idempotency::new(MemoryStore::new()),
        counter: api::orders::Counter,
    };
    let _app: Router = api::orders::routes().with_state(state);
    // The handler is a Copy value, usable in several routers.
    let handler = api::orders::create;
    let _again: Router<AppState> = Router::new().route("/v2/orders", axum::routing::post(handler));
}
