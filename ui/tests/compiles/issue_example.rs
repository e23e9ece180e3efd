//! The shape from the issue: State, a custom auth extractor and Json in, a
//! Result out, and a route line that does not change.
#![deny(warnings)]

use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, Resolver, idempotent};
use serde_json::{Value, json};

#[derive(Clone)]
struct Db;

#[derive(Clone)]
struct AppState {
    db: Db,
    idem: Idempotency,
}

impl FromRef<AppState> for Db {
    fn from_ref(state: &AppState) -> Self {
        state.db.clone()
    }
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idem.clone()
    }
}

struct AuthUser(String);

impl<S: Send + Sync> FromRequestParts<S> for AuthUser {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let user = parts
            .headers
            .get("authorization")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        Ok(AuthUser(
            user.to_str()
                .map_err(|_| StatusCode::UNAUTHORIZED)?
                .to_owned(),
        ))
    }
}

struct AppError;

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// Creates an order.
#[idempotent(
    key = "order-create:{tenant}:{user}:{header:idempotency-key}",
    ttl = "24h"
)]
async fn create_order(
    State(_db): State<Db>,
    user: AuthUser,
    Json(req): Json<Value>,
) -> Result<(StatusCode, Json<Value>), AppError> {
    Ok((
        StatusCode::CREATED,
        Json(json!({ "user": user.0, "order": req })),
    ))
}

#[test]
fn builds_its_router() {
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .user(Resolver::header("authorization"))
        .build();
    let app_state = AppState { db: Db, idem };
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .with_state(app_state);
}
