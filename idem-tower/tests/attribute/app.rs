//! The app under test: its state, extractors, `#[idempotent]` handlers
//! (one per attribute option the tests exercise), its router, and the
//! requests most tests send it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::{Idempotency, MemoryStore, Resolver, idempotent};
use serde_json::{Value, json};

use crate::support::{Calls, CurrentUser, signed};

/// Makes the next run of a fallible handler fail.
#[derive(Clone, Default)]
pub(crate) struct FailNext(pub(crate) Arc<AtomicBool>);

/// The members an API key stands for: what the `Member` extractor looks
/// keys up in.
#[derive(Clone, Default)]
pub(crate) struct Directory(pub(crate) Arc<HashMap<String, String>>);

/// The router state: the handle, and what the handlers count with.
#[derive(Clone)]
pub struct AppState {
    pub(crate) idem: Idempotency,
    pub(crate) calls: Calls,
    pub(crate) fail_next: FailNext,
    pub(crate) directory: Directory,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idem.clone()
    }
}

impl FromRef<AppState> for Calls {
    fn from_ref(state: &AppState) -> Self {
        state.calls.clone()
    }
}

impl FromRef<AppState> for FailNext {
    fn from_ref(state: &AppState) -> Self {
        state.fail_next.clone()
    }
}

/// A state whose handle takes the tenant from `X-Tenant-Id`.
pub(crate) fn state() -> AppState {
    state_with(
        Idempotency::builder(MemoryStore::new())
            .tenant(Resolver::header("x-tenant-id"))
            .build(),
    )
}

/// A state with this handle, nothing counted yet.
pub(crate) fn state_with(idem: Idempotency) -> AppState {
    AppState {
        idem,
        calls: Calls::default(),
        fail_next: FailNext::default(),
        directory: Directory::default(),
    }
}

/// An extractor that needs the app state: the member an `X-Api-Key`
/// stands for, looked up in the state's directory.
pub(crate) struct Member(pub(crate) String);

impl FromRequestParts<AppState> for Member {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .ok_or((StatusCode::UNAUTHORIZED, "no api key"))?;
        let member = state.directory.0.get(key);
        member
            .map(|member| Member(member.clone()))
            .ok_or((StatusCode::FORBIDDEN, "unknown api key"))
    }
}

/// An extractor that sends a visitor without a session to the login page
/// (axum's OAuth example answers so): a refusal that is no error.
pub(crate) struct SignedIn;

impl<S: Send + Sync> FromRequestParts<S> for SignedIn {
    type Rejection = Redirect;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get(header::COOKIE) {
            Some(cookie) if cookie.as_bytes().starts_with(b"session=") => Ok(SignedIn),
            _ => Err(Redirect::temporary("/login")),
        }
    }
}

/// An application error that renders as a 500.
pub(crate) struct AppError(pub(crate) &'static str);

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0).into_response()
    }
}

#[idempotent(key = "order-create:{tenant}:{header:idempotency-key}", ttl = "24h")]
pub(crate) async fn create_order(
    State(calls): State<Calls>,
    CurrentUser(user): CurrentUser,
    Json(order): Json<Value>,
) -> (StatusCode, HeaderMap, Json<Value>) {
    let run = calls.run();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::LOCATION,
        format!("/orders/{run}").parse().expect("a header value"),
    );
    let body = json!({ "order_id": run, "user": user, "order": order });
    (StatusCode::CREATED, headers, Json(body))
}

#[idempotent(key = "charge:{header:idempotency-key}")]
pub(crate) async fn charge(
    State(calls): State<Calls>,
    State(fail_next): State<FailNext>,
) -> Result<(StatusCode, String), AppError> {
    let run = calls.run();
    if fail_next.0.swap(false, Ordering::SeqCst) {
        return Err(AppError("the bank is down"));
    }
    Ok((StatusCode::CREATED, format!("charge {run}")))
}

#[idempotent(key = "short:{header:idempotency-key}", ttl = "1s")]
pub(crate) async fn short_lived(State(calls): State<Calls>) -> String {
    format!("run {}", calls.run())
}

#[idempotent(key = "slow:{header:idempotency-key}", in_flight = "wait(2s)")]
async fn slow_waited(State(calls): State<Calls>) -> String {
    let run = calls.run();
    tokio::time::sleep(Duration::from_millis(500)).await;
    format!("run {run}")
}

#[idempotent(key = "slow-rejected:{header:idempotency-key}", lease = "10s")]
async fn slow_rejected(State(calls): State<Calls>) -> String {
    let run = calls.run();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    format!("run {run}")
}

#[idempotent(key = "search:{query:ref}", required = false)]
pub(crate) async fn search(
    State(calls): State<Calls>,
    Query(params): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    calls.run();
    Json(json!({ "ref": params.get("ref") }))
}

#[idempotent(key = "transfer:{header:idempotency-key}", fingerprint = ["/amount", "/currency"])]
async fn transfer(State(calls): State<Calls>, Json(body): Json<Value>) -> Json<Value> {
    calls.run();
    Json(json!({ "amount": body["amount"] }))
}

/// Transactional on a handle whose store has no transactions: must refuse.
#[idempotent(key = "ledger:{header:idempotency-key}", transactional)]
async fn ledger_entry(State(calls): State<Calls>) -> StatusCode {
    calls.run();
    StatusCode::CREATED
}

#[idempotent(key = "place:{header:idempotency-key}")]
async fn place_order(
    State(calls): State<Calls>,
    Json(order): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let run = calls.run();
    (
        StatusCode::CREATED,
        Json(json!({ "order": order, "run": run })),
    )
}

/// Keyed without `{tenant}` or `{user}`: the caller scope still binds each
/// record to the tenant and user that created it.
#[idempotent(key = "refund:{path:charge_id}:{header:idempotency-key}")]
async fn refund_charge(
    State(calls): State<Calls>,
    Path(charge_id): Path<String>,
    CurrentUser(user): CurrentUser,
) -> (StatusCode, Json<Value>) {
    let run = calls.run();
    let body = json!({ "charge": charge_id, "refunded_by": user, "run": run });
    (StatusCode::CREATED, Json(body))
}

/// The same, shared across callers.
#[idempotent(
    key = "refund:{path:charge_id}:{header:idempotency-key}",
    shared_across_callers
)]
async fn refund_charge_shared(
    State(calls): State<Calls>,
    Path(charge_id): Path<String>,
    CurrentUser(user): CurrentUser,
) -> (StatusCode, Json<Value>) {
    let run = calls.run();
    let body = json!({ "charge": charge_id, "refunded_by": user, "run": run });
    (StatusCode::CREATED, Json(body))
}

/// A slow refund, keyed without `{tenant}` or `{user}`.
#[idempotent(key = "slow-refund:{path:charge_id}:{header:idempotency-key}")]
async fn slow_refund(
    State(calls): State<Calls>,
    Path(charge_id): Path<String>,
    CurrentUser(user): CurrentUser,
) -> (StatusCode, Json<Value>) {
    let run = calls.run();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = json!({ "charge": charge_id, "refunded_by": user, "run": run });
    (StatusCode::CREATED, Json(body))
}

/// Keyed by the member an API key stands for, resolved on the app state.
#[idempotent(key = "grant:{user}:{header:idempotency-key}")]
async fn grant(State(calls): State<Calls>, Member(member): Member) -> (StatusCode, String) {
    let run = calls.run();
    (StatusCode::CREATED, format!("grant {run} to {member}"))
}

/// Behind a sign-in that redirects.
#[idempotent(key = "checkout:{header:idempotency-key}")]
async fn checkout(State(calls): State<Calls>, _: SignedIn) -> (StatusCode, String) {
    let run = calls.run();
    (StatusCode::CREATED, format!("checkout {run}"))
}

/// `{user}` in the key: the handle must have a user resolver.
#[idempotent(key = "profile:{user}:{header:idempotency-key}")]
async fn update_profile(State(calls): State<Calls>) -> StatusCode {
    calls.run();
    StatusCode::NO_CONTENT
}

/// Not idempotent: a plain handler next to the annotated ones.
async fn count(State(calls): State<Calls>) -> String {
    format!("run {}", calls.run())
}

/// Every route, on `state`.
pub(crate) fn app(state: AppState) -> Router {
    Router::new()
        .route("/orders", post(create_order).get(count))
        .route("/charges", post(charge))
        .route("/short", post(short_lived))
        .route("/slow", post(slow_waited))
        .route("/slow-rejected", post(slow_rejected))
        .route("/search", post(search))
        .route("/transfers", post(transfer))
        .route("/ledger", post(ledger_entry))
        .route("/place", post(place_order))
        .route("/charges/{charge_id}/refunds", post(refund_charge))
        .route(
            "/shared/charges/{charge_id}/refunds",
            post(refund_charge_shared),
        )
        .route("/slow/charges/{charge_id}/refunds", post(slow_refund))
        .route("/grants", post(grant))
        .route("/checkout", post(checkout))
        .route("/profile", post(update_profile))
        .merge(crate::payments::routes())
        .with_state(state)
}

/// `POST /orders` of `body` with `key`, by user `u-7` of tenant `acme`.
pub(crate) fn order(key: &str, body: Value) -> Request<Body> {
    let mut request = signed(
        crate::support::post("/orders", Some(key), &body.to_string()),
        "u-7",
    );
    request
        .headers_mut()
        .insert("x-tenant-id", HeaderValue::from_static("acme"));
    request
}

/// A POST to `uri` with `key` and an empty body.
pub(crate) fn keyed(uri: &str, key: &str) -> Request<Body> {
    crate::support::post(uri, Some(key), "")
}
