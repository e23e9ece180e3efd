//! The annotated function as Rust code: handlers without the attribute
//! are untouched, one handler serves routers of different states, the
//! handle itself can be the state, and the function is still callable
//! directly.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{FromRef, Query, State};
use axum::http::{Request, StatusCode, header};
use axum::routing::{get, post};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::json;

use crate::app::{AppError, app, charge, create_order, keyed, search, short_lived, state};
use crate::support::{Calls, CurrentUser, send};

#[tokio::test]
async fn handlers_without_the_attribute_are_untouched() {
    let state = state();
    let app = app(state.clone());
    let get_orders = || {
        Request::get("/orders")
            .header("idempotency-key", "k-1")
            .body(Body::empty())
            .expect("a valid request")
    };

    assert_eq!(send(&app, get_orders()).await.text(), "run 1");
    let second = send(&app, get_orders()).await;
    assert_eq!(second.text(), "run 2");
    assert!(!second.replayed());
}

/// Routes written once for any state that can give the handle and the
/// counter: the generated `Handler` impl is generic over the state.
fn generic_routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    Calls: FromRef<S>,
{
    Router::new().route("/short", post(short_lived))
}

#[derive(Clone)]
struct OtherState {
    idem: Idempotency,
    calls: Calls,
    #[allow(dead_code)]
    name: &'static str,
}

impl FromRef<OtherState> for Idempotency {
    fn from_ref(state: &OtherState) -> Self {
        state.idem.clone()
    }
}

impl FromRef<OtherState> for Calls {
    fn from_ref(state: &OtherState) -> Self {
        state.calls.clone()
    }
}

#[tokio::test]
async fn one_handler_serves_routers_of_different_states() {
    let first = state();
    let second = OtherState {
        idem: Idempotency::new(MemoryStore::new()),
        calls: Calls::default(),
        name: "other",
    };
    let a: Router = generic_routes().with_state(first.clone());
    let b: Router = generic_routes().with_state(second.clone());

    assert_eq!(send(&a, keyed("/short", "g-1")).await.text(), "run 1");
    assert!(send(&a, keyed("/short", "g-1")).await.replayed());
    // Another handle, another store: the same key is new there.
    let other = send(&b, keyed("/short", "g-1")).await;
    assert!(!other.replayed());
    assert_eq!(other.text(), "run 1");
    assert_eq!((first.calls.get(), second.calls.get()), (1, 1));
}

#[tokio::test]
async fn the_handle_itself_can_be_the_router_state() {
    #[idempotent(key = "ping:{header:idempotency-key}")]
    async fn ping(idem: Idempotency) -> String {
        idem.key_header().to_string()
    }

    let app: Router = Router::new()
        .route("/ping", post(ping))
        .route("/health", get(|| async { "ok" }))
        .with_state(Idempotency::new(MemoryStore::new()));

    let first = send(&app, keyed("/ping", "p-1")).await;
    assert_eq!(first.text(), "idempotency-key");
    assert!(send(&app, keyed("/ping", "p-1")).await.replayed());
}

#[tokio::test]
async fn the_handler_is_still_callable_as_the_function() {
    let calls = Calls::default();

    // No router, no handle, no key: the function alone.
    let (status, headers, Json(body)) = create_order(
        State(calls.clone()),
        CurrentUser("u-7".to_owned()),
        Json(json!({ "sku": "A-1" })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers[header::LOCATION], "/orders/1");
    assert_eq!(
        body,
        json!({ "order_id": 1, "user": "u-7", "order": { "sku": "A-1" } })
    );
    // Each call runs it: nothing is deduplicated outside the router.
    let (_, _, Json(second)) = create_order(
        State(calls.clone()),
        CurrentUser("u-7".to_owned()),
        Json(json!({ "sku": "A-1" })),
    )
    .await;
    assert_eq!(second["order_id"], 2);

    let state = state();
    let failed = {
        state.fail_next.0.store(true, Ordering::SeqCst);
        charge(State(state.calls.clone()), State(state.fail_next.clone())).await
    };
    assert!(matches!(failed, Err(AppError("the bank is down"))));
    assert_eq!(
        charge(State(state.calls.clone()), State(state.fail_next.clone()))
            .await
            .ok(),
        Some((StatusCode::CREATED, "charge 2".to_owned()))
    );

    // A function returning `impl IntoResponse` gives its response.
    let response = search(State(calls.clone()), Query(HashMap::new())).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.get(), 3);

    // One without arguments.
    #[idempotent(key = "noop:{header:idempotency-key}")]
    async fn noop() -> StatusCode {
        StatusCode::NO_CONTENT
    }
    assert_eq!(noop().await, StatusCode::NO_CONTENT);
}
