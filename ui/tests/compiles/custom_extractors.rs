//! Custom extractors of every kind, none of them a false error: generic
//! over the state, bound to one state, reading a part of the state through
//! `FromRef` beside a `State` of another part, and reading the body.
#![deny(warnings)]

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, idempotent};
use serde_json::Value;

#[derive(Clone)]
struct Db;

#[derive(Clone)]
struct Sessions;

#[derive(Clone)]
struct AppState {
    idem: Idempotency,
    db: Db,
    sessions: Sessions,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idem.clone()
    }
}

impl FromRef<AppState> for Db {
    fn from_ref(state: &AppState) -> Self {
        state.db.clone()
    }
}

impl FromRef<AppState> for Sessions {
    fn from_ref(state: &AppState) -> Self {
        state.sessions.clone()
    }
}

/// Generic over the state.
struct RequestId(String);

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
        let id = parts
            .headers
            .get("x-request-id")
            .ok_or(StatusCode::BAD_REQUEST)?;
        Ok(Self(
            id.to_str().map_err(|_| StatusCode::BAD_REQUEST)?.to_owned(),
        ))
    }
}

/// Bound to one state: `AppState` only.
struct Session(String);

impl FromRequestParts<AppState> for Session {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, StatusCode> {
        let cookie = parts
            .headers
            .get("cookie")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        Ok(Self(
            cookie
                .to_str()
                .map_err(|_| StatusCode::UNAUTHORIZED)?
                .to_owned(),
        ))
    }
}

/// Any state that gives the session store.
struct Visitor;

impl<S> FromRequestParts<S> for Visitor
where
    S: Send + Sync,
    Sessions: FromRef<S>,
{
    type Rejection = StatusCode;

    async fn from_request_parts(_: &mut Parts, state: &S) -> Result<Self, StatusCode> {
        let _sessions = Sessions::from_ref(state);
        Ok(Self)
    }
}

/// Reads the body, on any state.
struct Signed(Bytes);

impl<S: Send + Sync> FromRequest<S> for Signed {
    type Rejection = StatusCode;

    async fn from_request(request: Request, state: &S) -> Result<Self, StatusCode> {
        let body = Bytes::from_request(request, state)
            .await
            .map_err(|_| StatusCode::BAD_REQUEST)?;
        Ok(Self(body))
    }
}

/// Reads the body, on `AppState` only.
struct Audited(Value);

impl FromRequest<AppState> for Audited {
    type Rejection = StatusCode;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, StatusCode> {
        let Json(value) = Json::<Value>::from_request(request, state)
            .await
            .map_err(|_| StatusCode::UNPROCESSABLE_ENTITY)?;
        Ok(Self(value))
    }
}

// A state-bound extractor beside a `State` of a part of the state: the
// router state is not `Db`, and nothing assumes it is.
#[idempotent(key = "order:{header:idempotency-key}")]
async fn create_order(
    State(_db): State<Db>,
    session: Session,
    RequestId(id): RequestId,
    _visitor: Visitor,
    Json(order): Json<Value>,
) -> Json<Value> {
    Json(serde_json::json!({ "session": session.0, "id": id, "order": order }))
}

#[idempotent(key = "upload:{header:idempotency-key}")]
async fn upload(_visitor: Visitor, Signed(body): Signed) -> String {
    body.len().to_string()
}

#[idempotent(key = "audit:{header:idempotency-key}")]
async fn audit(State(_sessions): State<Sessions>, Audited(value): Audited) -> Json<Value> {
    Json(value)
}

// A part extractor as the last argument, and one bound to the state alone.
#[idempotent(key = "touch:{header:idempotency-key}")]
async fn touch(RequestId(_id): RequestId, _session: Session) -> StatusCode {
    StatusCode::NO_CONTENT
}

#[test]
fn builds_its_router() {
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .route("/uploads", post(upload))
        .route("/audits", post(audit))
        .route("/touch", post(touch))
        .with_state(AppState {
            idem: Idempotency::new(MemoryStore::new()),
            db: Db,
            sessions: Sessions,
        });
}
