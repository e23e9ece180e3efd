//! `#[idempotent]` handlers serving real requests through an axum router:
//! each test counts how often the handler body actually ran.
#![cfg(feature = "macros")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use idem_tower::{Idempotency, MemoryStore, Resolver, idempotent};
use serde_json::{Value, json};
use tower::ServiceExt;

/// How many times handler bodies ran.
#[derive(Clone, Default)]
pub struct Calls(Arc<AtomicUsize>);

impl Calls {
    /// Counts one run and returns its number, from 1.
    fn run(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Makes the next run of a fallible handler fail.
#[derive(Clone, Default)]
pub struct FailNext(Arc<AtomicBool>);

/// The members an API key stands for: what the `Member` extractor looks
/// keys up in.
#[derive(Clone, Default)]
pub struct Directory(Arc<HashMap<String, String>>);

/// The router state: the handle, and what the handlers count with.
#[derive(Clone)]
pub struct AppState {
    idem: Idempotency,
    calls: Calls,
    fail_next: FailNext,
    directory: Directory,
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

fn state() -> AppState {
    state_with(
        Idempotency::builder(MemoryStore::new())
            .tenant(Resolver::header("x-tenant-id"))
            .build(),
    )
}

fn state_with(idem: Idempotency) -> AppState {
    AppState {
        idem,
        calls: Calls::default(),
        fail_next: FailNext::default(),
        directory: Directory::default(),
    }
}

/// A custom auth extractor: `Authorization: Bearer <user>`.
struct AuthUser(String);

impl<S: Send + Sync> FromRequestParts<S> for AuthUser {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|user| AuthUser(user.to_owned()))
            .ok_or(StatusCode::UNAUTHORIZED)
    }
}

/// An extractor that needs the app state: the member an `X-Api-Key`
/// stands for, looked up in the state's directory.
struct Member(String);

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

/// An application error that renders as a 500.
struct AppError(&'static str);

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0).into_response()
    }
}

#[idempotent(
    key = "order-create:{tenant}:{header:idempotency-key}",
    retention = "24h"
)]
async fn create_order(
    State(calls): State<Calls>,
    AuthUser(user): AuthUser,
    Json(order): Json<Value>,
) -> (StatusCode, HeaderMap, Json<Value>) {
    let run = calls.run();
    let mut headers = HeaderMap::new();
    headers.insert(header::LOCATION, format!("/orders/{run}").parse().unwrap());
    let body = json!({ "order_id": run, "user": user, "order": order });
    (StatusCode::CREATED, headers, Json(body))
}

#[idempotent(key = "charge:{header:idempotency-key}")]
async fn charge(
    State(calls): State<Calls>,
    State(fail_next): State<FailNext>,
) -> Result<(StatusCode, String), AppError> {
    let run = calls.run();
    if fail_next.0.swap(false, Ordering::SeqCst) {
        return Err(AppError("the bank is down"));
    }
    Ok((StatusCode::CREATED, format!("charge {run}")))
}

#[idempotent(key = "short:{header:idempotency-key}", retention = "1s")]
async fn short_lived(State(calls): State<Calls>) -> String {
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
async fn search(
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
    AuthUser(user): AuthUser,
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
    AuthUser(user): AuthUser,
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
    AuthUser(user): AuthUser,
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

/// Several annotated handlers in one module, public and private, routed
/// from outside it.
pub mod payments {
    use super::*;

    /// A payment platform's callback: the payment number is the key, and
    /// retries with other bodies are still the same callback.
    #[idempotent(
        key = "pay-callback:{path:payment_no}",
        fingerprint = "method_and_route"
    )]
    pub async fn callback(
        State(calls): State<Calls>,
        Path(payment_no): Path<String>,
        Json(_body): Json<Value>,
    ) -> Json<Value> {
        let run = calls.run();
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
}

fn app(state: AppState) -> Router {
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
        .route("/profile", post(update_profile))
        .merge(payments::routes())
        .with_state(state)
}

/// A request to send.
fn request(uri: &str) -> axum::http::request::Builder {
    Request::post(uri)
}

fn order(key: &str, body: Value) -> Request<Body> {
    request("/orders")
        .header("idempotency-key", key)
        .header("x-tenant-id", "acme")
        .header(header::AUTHORIZATION, "Bearer u-7")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn keyed(uri: &str, key: &str) -> Request<Body> {
    request(uri)
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap()
}

fn json_post(uri: &str) -> axum::http::request::Builder {
    request(uri).header(header::CONTENT_TYPE, "application/json")
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes().to_vec(),
    }
}

#[tokio::test]
async fn the_same_request_ten_times_runs_the_handler_once() {
    let state = state();
    let app = app(state.clone());
    let body = json!({ "sku": "A-1", "qty": 2 });

    let first = send(&app, order("k-1", body.clone())).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.json()["user"], "u-7");
    for _ in 0..9 {
        let again = send(&app, order("k-1", body.clone())).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers[header::LOCATION], "/orders/1");
    }
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422() {
    let state = state();
    let app = app(state.clone());

    send(&app, order("k-1", json!({ "sku": "A-1", "qty": 2 }))).await;
    let other = send(&app, order("k-1", json!({ "sku": "A-1", "qty": 3 }))).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_request_without_its_key_is_400_and_runs_nothing() {
    let state = state();
    let app = app(state.clone());
    let mut no_key = order("k-1", json!({}));
    no_key.headers_mut().remove("idempotency-key");

    let reply = send(&app, no_key).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.headers[header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(
        reply.json()["detail"]
            .to_string()
            .contains("idempotency-key")
    );
    assert_eq!(state.calls.get(), 0);
}

#[tokio::test]
async fn a_failed_custom_extractor_releases_the_key() {
    let state = state();
    let app = app(state.clone());
    let mut anonymous = order("k-1", json!({}));
    anonymous.headers_mut().remove(header::AUTHORIZATION);

    assert_eq!(send(&app, anonymous).await.status, StatusCode::UNAUTHORIZED);
    let signed_in = send(&app, order("k-1", json!({}))).await;
    assert_eq!(signed_in.status, StatusCode::CREATED);
    assert!(!signed_in.replayed());
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_500_from_a_result_handler_releases_the_key_for_a_retry() {
    let state = state();
    state.fail_next.0.store(true, Ordering::SeqCst);
    let app = app(state.clone());

    let failed = send(&app, keyed("/charges", "c-1")).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.text(), "the bank is down");

    let retried = send(&app, keyed("/charges", "c-1")).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(retried.text(), "charge 2");

    let replayed = send(&app, keyed("/charges", "c-1")).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.text(), "charge 2");
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test]
async fn the_ttl_is_honoured_and_an_expired_key_runs_again() {
    let state = state();
    let app = app(state.clone());

    assert_eq!(send(&app, keyed("/short", "s-1")).await.text(), "run 1");
    let replayed = send(&app, keyed("/short", "s-1")).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.text(), "run 1");

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = send(&app, keyed("/short", "s-1")).await;
    assert!(!after.replayed());
    assert_eq!(after.text(), "run 2");
    assert_eq!(state.calls.get(), 2);
}

/// Sends one request, waits until its handler is running, then sends
/// `duplicates` copies at once; returns the first's reply and theirs.
async fn duplicates_in_flight(
    app: &Router,
    calls: &Calls,
    uri: &str,
    duplicates: usize,
) -> (Reply, Vec<Reply>) {
    let spawn = |request: Request<Body>| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, request).await })
    };
    let first = spawn(keyed(uri, "same"));
    while calls.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let copies: Vec<_> = (0..duplicates).map(|_| spawn(keyed(uri, "same"))).collect();
    let mut replies = Vec::new();
    for copy in copies {
        replies.push(copy.await.unwrap());
    }
    (first.await.unwrap(), replies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_wait_makes_concurrent_duplicates_replay() {
    let state = state();
    let app = app(state.clone());

    let (first, duplicates) = duplicates_in_flight(&app, &state.calls, "/slow", 5).await;
    assert_eq!(first.text(), "run 1");
    assert!(!first.replayed());
    for reply in &duplicates {
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.replayed());
        assert_eq!(reply.text(), "run 1");
    }
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_concurrent_duplicates_get_409() {
    let state = state();
    let app = app(state.clone());

    let (first, duplicates) = duplicates_in_flight(&app, &state.calls, "/slow-rejected", 5).await;
    assert_eq!(first.text(), "run 1");
    for reply in &duplicates {
        assert_eq!(reply.status, StatusCode::CONFLICT);
        assert!(reply.headers.contains_key(header::RETRY_AFTER));
    }
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_path_keyed_callback_credits_once_per_payment() {
    let state = state();
    let app = app(state.clone());
    let callback = |payment: &str, body: Value| {
        json_post(&format!("/payments/{payment}/callback"))
            .body(Body::from(body.to_string()))
            .unwrap()
    };

    let first = send(&app, callback("P-1", json!({ "status": "PAID" }))).await;
    assert_eq!(first.json(), json!({ "payment_no": "P-1", "credit": 1 }));
    // fingerprint = "method_and_route": a re-push with another body is the same callback.
    let again = send(&app, callback("P-1", json!({ "status": "PAID", "ts": 2 }))).await;
    assert!(again.replayed());
    assert_eq!(again.json(), first.json());
    let other = send(&app, callback("P-2", json!({ "status": "PAID" }))).await;
    assert_eq!(other.json(), json!({ "payment_no": "P-2", "credit": 2 }));
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test]
async fn a_body_keyed_refund_runs_once_per_refund_number() {
    let state = state();
    let app = app(state.clone());
    let refund = |refund_no: &str| {
        let body = json!({ "refund_no": refund_no, "amount": 5 });
        json_post("/payments/P-1/refunds")
            .body(Body::from(body.to_string()))
            .unwrap()
    };

    assert_eq!(send(&app, refund("R-1")).await.status, StatusCode::CREATED);
    assert!(send(&app, refund("R-1")).await.replayed());
    assert!(!send(&app, refund("R-2")).await.replayed());
    assert_eq!(state.calls.get(), 2);

    let missing = json_post("/payments/P-1/refunds")
        .body(Body::from("{}"))
        .unwrap();
    assert_eq!(send(&app, missing).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test]
async fn a_private_handler_without_extractors_is_idempotent_too() {
    let state = state();
    let app = app(state.clone());

    let first = send(&app, keyed("/payments/void", "v-1")).await;
    assert_eq!(first.status, StatusCode::NO_CONTENT);
    assert!(send(&app, keyed("/payments/void", "v-1")).await.replayed());
    assert_eq!(
        send(&app, request("/payments/void").body(Body::empty()).unwrap())
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn a_query_keyed_optional_route_passes_keyless_requests_through() {
    let state = state();
    let app = app(state.clone());
    let post_search = |uri: &str| request(uri).body(Body::empty()).unwrap();

    let first = send(&app, post_search("/search?ref=r-1")).await;
    assert_eq!(first.json(), json!({ "ref": "r-1" }));
    assert!(send(&app, post_search("/search?ref=r-1")).await.replayed());
    assert_eq!(state.calls.get(), 1);

    // required = false: no key, no deduplication.
    for _ in 0..2 {
        let keyless = send(&app, post_search("/search")).await;
        assert_eq!(keyless.status, StatusCode::OK);
        assert!(!keyless.replayed());
    }
    assert_eq!(state.calls.get(), 3);
}

#[tokio::test]
async fn a_json_fields_fingerprint_ignores_the_other_fields() {
    let state = state();
    let app = app(state.clone());
    let post_transfer = |body: Value| {
        json_post("/transfers")
            .header("idempotency-key", "t-1")
            .body(Body::from(body.to_string()))
            .unwrap()
    };

    let first = send(
        &app,
        post_transfer(json!({ "amount": 5, "currency": "EUR", "ts": 1 })),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = send(
        &app,
        post_transfer(json!({ "amount": 5, "currency": "EUR", "ts": 2 })),
    )
    .await;
    assert!(retry.replayed());
    let changed = send(
        &app,
        post_transfer(json!({ "amount": 6, "currency": "EUR", "ts": 3 })),
    )
    .await;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn handlers_without_the_attribute_are_untouched() {
    let state = state();
    let app = app(state.clone());
    let get_orders = || {
        Request::get("/orders")
            .header("idempotency-key", "k-1")
            .body(Body::empty())
            .unwrap()
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
async fn transactional_handler_on_a_store_without_transactions_refuses_to_run() {
    let state = state();
    let app = app(state.clone());
    for _ in 0..2 {
        let reply = send(&app, keyed("/ledger", "l-1")).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(reply.json()["type"], "urn:idem:problem:misconfigured");
        assert!(reply.text().contains("PgStore"), "names the fix");
    }
    assert_eq!(state.calls.get(), 0, "never run without its transaction");
}

/// `/place` with this key, body and content type.
fn place(key: &str, content_type: &str, body: &str) -> Request<Body> {
    request("/place")
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_content_type_is_415_and_the_corrected_request_runs_with_the_same_key() {
    let state = state();
    let app = app(state.clone());
    let body = r#"{"sku":"A-1"}"#;

    let refused = send(&app, place("k-1", "text/plain", body)).await;
    assert_eq!(refused.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(!refused.replayed());
    // Not kept: the same mistake again is refused again, not replayed.
    let again = send(&app, place("k-1", "text/plain", body)).await;
    assert_eq!(again.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(!again.replayed());
    assert_eq!(state.calls.get(), 0);

    let corrected = send(&app, place("k-1", "application/json", body)).await;
    assert_eq!(corrected.status, StatusCode::CREATED);
    assert!(!corrected.replayed());
    assert_eq!(
        corrected.json(),
        json!({ "order": { "sku": "A-1" }, "run": 1 })
    );
    let duplicate = send(&app, place("k-1", "application/json", body)).await;
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, corrected.body);
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_json_body_is_refused_and_the_fixed_one_runs_with_the_same_key() {
    let state = state();
    let app = app(state.clone());

    let malformed = send(&app, place("k-1", "application/json", r#"{"sku":"#)).await;
    assert!(
        [StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY].contains(&malformed.status),
        "{}",
        malformed.status
    );
    assert!(!malformed.replayed());
    assert_eq!(state.calls.get(), 0);

    let fixed = send(&app, place("k-1", "application/json", r#"{"sku":"A-1"}"#)).await;
    assert_eq!(fixed.status, StatusCode::CREATED);
    assert!(!fixed.replayed());
    assert!(
        send(&app, place("k-1", "application/json", r#"{"sku":"A-1"}"#))
            .await
            .replayed()
    );
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_from_an_auth_extractor_is_not_kept_and_the_signed_in_retry_runs_once() {
    let state = state();
    let app = app(state.clone());
    let anonymous = || {
        let mut request = order("k-1", json!({ "sku": "A-1" }));
        request.headers_mut().remove(header::AUTHORIZATION);
        request
    };

    for _ in 0..2 {
        let refused = send(&app, anonymous()).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert!(!refused.replayed());
    }
    assert_eq!(state.calls.get(), 0);

    let signed_in = send(&app, order("k-1", json!({ "sku": "A-1" }))).await;
    assert_eq!(signed_in.status, StatusCode::CREATED);
    assert!(!signed_in.replayed());
    let duplicate = send(&app, order("k-1", json!({ "sku": "A-1" }))).await;
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, signed_in.body);
    assert_eq!(state.calls.get(), 1);
}

/// A handle whose tenant is a header and whose user is the bearer token,
/// through the same extractor the handlers authenticate with.
fn caller_scoped_state() -> AppState {
    state_with(
        Idempotency::builder(MemoryStore::new())
            .tenant(Resolver::header("x-tenant-id"))
            .user(Resolver::from_extractor(|AuthUser(user): AuthUser| user))
            .build(),
    )
}

/// A refund of charge `ch-1` with key `r-1`, by this tenant and user.
fn refund(uri: &str, tenant: &str, user: &str) -> Request<Body> {
    request(uri)
        .header("idempotency-key", "r-1")
        .header("x-tenant-id", tenant)
        .header(header::AUTHORIZATION, format!("Bearer {user}"))
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_with_the_same_key_each_get_their_own_response() {
    let state = caller_scoped_state();
    let app = app(state.clone());
    let uri = "/charges/ch-1/refunds";

    let alice = send(&app, refund(uri, "acme", "alice")).await;
    let bob = send(&app, refund(uri, "globex", "bob")).await;
    // The same tenant, another user: still another caller.
    let carol = send(&app, refund(uri, "acme", "carol")).await;
    for (reply, user) in [(&alice, "alice"), (&bob, "bob"), (&carol, "carol")] {
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.replayed(), "{user} got another caller's response");
        assert_eq!(reply.json()["refunded_by"], user);
    }
    assert_eq!(state.calls.get(), 3);

    // Each caller's duplicate replays their own.
    let alice_again = send(&app, refund(uri, "acme", "alice")).await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    let bob_again = send(&app, refund(uri, "globex", "bob")).await;
    assert!(bob_again.replayed());
    assert_eq!(bob_again.body, bob.body);
    assert_eq!(state.calls.get(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_callers_request_in_flight_does_not_hold_up_another_callers_same_key() {
    let state = caller_scoped_state();
    let app = app(state.clone());
    let uri = "/slow/charges/ch-1/refunds";
    let spawn = |request: Request<Body>| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, request).await })
    };

    let alice = spawn(refund(uri, "acme", "alice"));
    while state.calls.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Alice's request is running; Bob's, with the same key, is not hers.
    let bob = spawn(refund(uri, "globex", "bob"));
    let alice_duplicate = spawn(refund(uri, "acme", "alice"));
    let (alice, bob, alice_duplicate) = (
        alice.await.unwrap(),
        bob.await.unwrap(),
        alice_duplicate.await.unwrap(),
    );
    assert_eq!(alice.status, StatusCode::CREATED);
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed());
    assert_eq!(bob.json()["refunded_by"], "bob");
    assert_eq!(alice_duplicate.status, StatusCode::CONFLICT);
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_across_callers_replays_one_callers_response_to_another() {
    let state = caller_scoped_state();
    let app = app(state.clone());
    let uri = "/shared/charges/ch-1/refunds";

    let alice = send(&app, refund(uri, "acme", "alice")).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert!(!alice.replayed());
    let bob = send(&app, refund(uri, "globex", "bob")).await;
    assert!(bob.replayed());
    assert_eq!(bob.json()["refunded_by"], "alice");
    assert_eq!(state.calls.get(), 1);
}

/// A handle whose user is the member an API key stands for: a resolver
/// that extracts on the app state.
fn member_state() -> AppState {
    let mut state = state_with(
        Idempotency::builder(MemoryStore::new())
            .user(Resolver::from_extractor_with_state::<AppState, Member, _>(
                |Member(member)| member,
            ))
            .build(),
    );
    state.directory = Directory(Arc::new(HashMap::from([
        ("key-ann".to_owned(), "ann".to_owned()),
        ("key-ben".to_owned(), "ben".to_owned()),
    ])));
    state
}

fn grant_request(api_key: Option<&str>) -> Request<Body> {
    let mut request = request("/grants").header("idempotency-key", "g-1");
    if let Some(api_key) = api_key {
        request = request.header("x-api-key", api_key);
    }
    request.body(Body::empty()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_extracting_on_the_app_state_keys_each_member() {
    let state = member_state();
    let app = app(state.clone());

    let ann = send(&app, grant_request(Some("key-ann"))).await;
    assert_eq!(ann.status, StatusCode::CREATED);
    assert_eq!(ann.text(), "grant 1 to ann");
    let again = send(&app, grant_request(Some("key-ann"))).await;
    assert!(again.replayed());
    assert_eq!(again.text(), "grant 1 to ann");
    // `{user}` is the member: the same key is another record for ben.
    let ben = send(&app, grant_request(Some("key-ben"))).await;
    assert!(!ben.replayed());
    assert_eq!(ben.text(), "grant 2 to ben");
    assert_eq!(state.calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_rejection_is_answered_as_is_and_claims_nothing() {
    let state = member_state();
    let app = app(state.clone());

    let missing = send(&app, grant_request(None)).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(missing.text(), "no api key");
    let unknown = send(&app, grant_request(Some("key-eve"))).await;
    assert_eq!(unknown.status, StatusCode::FORBIDDEN);
    assert_eq!(unknown.text(), "unknown api key");
    assert!(!unknown.replayed());
    assert_eq!(state.calls.get(), 0);

    let granted = send(&app, grant_request(Some("key-ann"))).await;
    assert_eq!(granted.status, StatusCode::CREATED);
    assert!(!granted.replayed());
    assert_eq!(granted.text(), "grant 1 to ann");
    assert_eq!(state.calls.get(), 1);
}

#[tokio::test]
async fn a_user_placeholder_without_a_user_resolver_is_a_500_and_runs_nothing() {
    let state = state();
    let app = app(state.clone());

    for _ in 0..2 {
        let reply = send(&app, keyed("/profile", "p-1")).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            reply.headers[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(reply.json()["type"], "urn:idem:problem:misconfigured");
        assert!(reply.json()["detail"].to_string().contains("{user}"));
    }
    assert_eq!(state.calls.get(), 0, "never run without its key");
}

#[tokio::test]
async fn the_handler_is_still_callable_as_the_function() {
    let calls = Calls::default();

    // No router, no handle, no key: the function alone.
    let (status, headers, Json(body)) = create_order(
        State(calls.clone()),
        AuthUser("u-7".to_owned()),
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
        AuthUser("u-7".to_owned()),
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
