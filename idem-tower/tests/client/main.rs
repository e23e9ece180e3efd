//! The client layer (`idem_tower::client`) against a real server over
//! loopback HTTP: an axum app with an `IdempotencyLayer` on its write
//! route, bound to 127.0.0.1:0, driven through hyper-util's client.
//!
//! Every test counts the handler's runs: the point of the two halves
//! together is one effect per logical request, however many attempts it
//! took.
#![cfg(all(feature = "client", feature = "axum", feature = "memory"))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request as AxumRequest, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response as AxumResponse};
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use idem_tower::client::{
    Cause, ClientErrorKind, IdempotencyClient, IdempotencyClientLayer, KEY_HEADER, KeyForm,
    KeyOrigin, RetryPolicy, RetryReport,
};
use idem_tower::{Idempotency, MemoryStore};
use tower::{Layer, ServiceExt};

mod faults;
#[cfg(feature = "reqwest")]
mod with_reqwest;

type Http = Client<HttpConnector, Full<Bytes>>;

/// What the test server saw and how it behaves.
#[derive(Clone, Default)]
struct Server {
    /// Handler runs: the effects.
    runs: Arc<AtomicUsize>,
    /// Requests that reached the server, before the idem layer.
    arrivals: Arc<AtomicUsize>,
    /// The first this many arrivals are answered 503 before the idem layer,
    /// as a proxy or load balancer would.
    fail_first: Arc<AtomicUsize>,
    /// How long the handler's first run takes.
    first_run_takes: Arc<Mutex<Duration>>,
    /// How long the first answer is held back after the idem layer has
    /// settled it: the server commits, the answer is late (or lost).
    first_answer_late: Arc<Mutex<Duration>>,
    /// The `Idempotency-Key` of every arrival.
    keys: Arc<Mutex<Vec<Option<String>>>>,
}

impl Server {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Waits until the handler has been entered `n` times (5 s at most).
    async fn wait_for_runs(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.runs() < n {
            assert!(Instant::now() < deadline, "the handler was not called");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Serves the app on a free loopback port.
    async fn start(&self) -> SocketAddr {
        let idem = Idempotency::builder(MemoryStore::new()).build();
        let layer = idem
            .layer_with_key("orders:{header:idempotency-key}")
            .expect("a valid template");
        let app = Router::new()
            .route("/orders", post(create_order).layer(layer))
            .layer(middleware::from_fn_with_state(self.clone(), front))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("an address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }
}

/// In front of the idem layer: records the key, fails the first arrivals.
async fn front(State(server): State<Server>, request: AxumRequest, next: Next) -> AxumResponse {
    let key = request
        .headers()
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    server.keys.lock().unwrap().push(key);
    let arrival = server.arrivals.fetch_add(1, Ordering::SeqCst);
    if arrival < server.fail_first.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let response = next.run(request).await;
    let late = std::mem::take(&mut *server.first_answer_late.lock().unwrap());
    tokio::time::sleep(late).await;
    response
}

/// The effect: one order per run.
async fn create_order(State(server): State<Server>, body: Bytes) -> impl IntoResponse {
    let run = server.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if run == 1 {
        let takes = *server.first_run_takes.lock().unwrap();
        tokio::time::sleep(takes).await;
    }
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        format!(
            r#"{{"order":{run},"request":{}}}"#,
            String::from_utf8_lossy(&body)
        ),
    )
}

fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A policy quick enough for tests.
fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(5)
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .deadline(Duration::from_secs(10))
}

fn client(policy: RetryPolicy) -> IdempotencyClient<Http> {
    IdempotencyClientLayer::new(policy).layer(http())
}

fn order(addr: SocketAddr, key: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut builder = Request::post(format!("http://{addr}/orders"))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header(KEY_HEADER, key);
    }
    builder
        .body(Full::from(body.to_owned()))
        .expect("a request")
}

/// Status, delivery and body of a response.
async fn read<B>(response: Response<B>) -> (StatusCode, RetryReport, String)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let status = response.status();
    let delivery = response
        .extensions()
        .get::<RetryReport>()
        .cloned()
        .expect("every response carries its delivery");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (
        status,
        delivery,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// Also with a deadline meant as forever (`Duration::MAX`): no deadline to
/// speak of, never an overflow.
#[tokio::test]
async fn a_503_then_success_is_one_effect_in_two_attempts() {
    for policy in [quick(), quick().deadline(Duration::MAX)] {
        let server = Server::default();
        server.fail_first.store(1, Ordering::SeqCst);
        let addr = server.start().await;

        let response = client(policy)
            .oneshot(order(addr, None, r#"{"sku":"A-1"}"#))
            .await
            .expect("an answer");
        let (status, delivery, _) = read(response).await;

        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(delivery.attempts, 2);
        assert!(!delivery.replayed);
        assert_eq!(delivery.origin, KeyOrigin::Generated);
        assert_eq!(server.runs(), 1);
    }
}

#[tokio::test]
async fn an_operation_key_in_the_extensions_is_sent_with_every_retry() {
    let server = Server::default();
    server.fail_first.store(2, Ordering::SeqCst);
    let addr = server.start().await;
    // What a handler passes on: `operation.key_for("psp-charge")`.
    let derived = idem_tower::OperationKey::from_caller("7f3a9c-derived").unwrap();
    let mut request = order(addr, None, r#"{"sku":"A-1"}"#);
    request.extensions_mut().insert(derived.clone());

    let response = client(quick()).oneshot(request).await.expect("an answer");
    let (status, delivery, _) = read(response).await;

    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(delivery.attempts, 3);
    assert_eq!(delivery.origin, KeyOrigin::Caller);
    let keys = server.keys.lock().unwrap().clone();
    assert_eq!(keys, vec![Some(derived.as_str().to_owned()); 3]);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_generated_key_is_made_once_and_kept_across_retries() {
    let server = Server::default();
    server.fail_first.store(3, Ordering::SeqCst);
    let addr = server.start().await;

    let response = client(quick())
        .oneshot(order(addr, None, r#"{"sku":"A-1"}"#))
        .await
        .expect("an answer");
    let (status, delivery, _) = read(response).await;

    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(delivery.attempts, 4);
    let keys = server.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 4);
    let sent = delivery.key.expect("a key").to_str().unwrap().to_owned();
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(sent.as_str())),
        "{keys:?}"
    );
    uuid::Uuid::parse_str(&sent).expect("a UUID");
    assert_eq!(server.runs(), 1);

    // The next logical request gets a key of its own.
    let response = client(quick())
        .oneshot(order(addr, None, r#"{"sku":"A-1"}"#))
        .await
        .expect("an answer");
    let (status, delivery, _) = read(response).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(delivery.key.unwrap().to_str().unwrap(), sent);
    assert_eq!(server.runs(), 2);
}

/// `KeyForm::Quoted` sends the IETF draft's form, `"<uuid>"`, on every
/// attempt; the server reads it as the same key as its bare form, so a later
/// call with the bare key gets the replay.
#[tokio::test]
async fn a_quoted_key_is_sent_on_every_attempt_and_is_its_bare_form() {
    let server = Server::default();
    server.fail_first.store(1, Ordering::SeqCst);
    let addr = server.start().await;
    let quoted = IdempotencyClientLayer::new(quick())
        .key_form(KeyForm::Quoted)
        .layer(http());

    let response = quoted
        .oneshot(order(addr, None, r#"{"sku":"A-1"}"#))
        .await
        .expect("an answer");
    let (status, delivery, first) = read(response).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(delivery.attempts, 2);
    let sent = delivery.key.expect("a key").to_str().unwrap().to_owned();
    let bare = sent.strip_prefix('"').and_then(|k| k.strip_suffix('"'));
    uuid::Uuid::parse_str(bare.expect("quoted")).expect("a UUID");
    let keys = server.keys.lock().unwrap().clone();
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(sent.as_str())),
        "{keys:?}"
    );

    let response = client(quick())
        .oneshot(order(addr, bare, r#"{"sku":"A-1"}"#))
        .await
        .expect("an answer");
    let (status, delivery, again) = read(response).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(delivery.replayed, "the bare form is the same key");
    assert_eq!(again, first);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn retries_stop_at_max_attempts_with_the_last_answer() {
    let server = Server::default();
    server.fail_first.store(100, Ordering::SeqCst);
    let addr = server.start().await;

    let response = client(quick().max_attempts(3))
        .oneshot(order(addr, None, "{}"))
        .await
        .expect("an answer");
    let (status, delivery, _) = read(response).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(delivery.attempts, 3);
    assert_eq!(server.arrivals.load(Ordering::SeqCst), 3);
    assert_eq!(server.runs(), 0);
}

#[tokio::test]
async fn a_422_is_returned_at_once_with_one_attempt() {
    let server = Server::default();
    let addr = server.start().await;
    let client = client(quick());

    let response = client
        .clone()
        .oneshot(order(addr, Some("op-1"), r#"{"sku":"A-1"}"#))
        .await
        .expect("an answer");
    let (status, delivery, _) = read(response).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(delivery.origin, KeyOrigin::Caller);
    assert_eq!(delivery.key, Some(HeaderValue::from_static("op-1")));

    // The same key for a different request.
    let response = client
        .oneshot(order(addr, Some("op-1"), r#"{"sku":"B-2"}"#))
        .await
        .expect("an answer");
    let (status, delivery, _) = read(response).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(delivery.attempts, 1);
    assert!(!delivery.replayed);
    assert_eq!(server.arrivals.load(Ordering::SeqCst), 2);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn the_callers_key_gets_the_replay_on_a_later_call() {
    let server = Server::default();
    let addr = server.start().await;
    let client = client(quick());

    let first = read(
        client
            .clone()
            .oneshot(order(addr, Some("op-7"), r#"{"sku":"A-1"}"#))
            .await
            .expect("an answer"),
    )
    .await;
    let second = read(
        client
            .oneshot(order(addr, Some("op-7"), r#"{"sku":"A-1"}"#))
            .await
            .expect("an answer"),
    )
    .await;

    assert_eq!(first.0, StatusCode::CREATED);
    assert!(!first.1.replayed);
    assert_eq!(second.0, StatusCode::CREATED);
    assert!(second.1.replayed);
    assert_eq!(second.1.attempts, 1);
    assert_eq!(first.2, second.2);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn an_in_flight_409_then_the_replay() {
    let server = Server::default();
    *server.first_run_takes.lock().unwrap() = Duration::from_millis(400);
    let addr = server.start().await;

    // Someone else's call with the same key is running.
    let other = tokio::spawn(http().request(order(addr, Some("op-9"), r#"{"sku":"A-1"}"#)));
    server.wait_for_runs(1).await;

    let response = client(quick())
        .oneshot(order(addr, Some("op-9"), r#"{"sku":"A-1"}"#))
        .await
        .expect("an answer");
    let (status, delivery, body) = read(response).await;

    let other = other.await.unwrap().expect("the first answer");
    assert_eq!(other.status(), StatusCode::CREATED);
    let first_body = other.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, StatusCode::CREATED);
    assert!(delivery.replayed);
    assert_eq!(
        delivery.attempts, 2,
        "a 409 (Retry-After: 1), then the replay"
    );
    assert_eq!(body.as_bytes(), &first_body[..]);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_lost_answer_is_replayed_on_the_retry() {
    let server = Server::default();
    *server.first_answer_late.lock().unwrap() = Duration::from_millis(300);
    let addr = server.start().await;

    // The server commits, but its answer comes after the client has given
    // up on the attempt.
    let response = client(quick().attempt_timeout(Duration::from_millis(100)))
        .oneshot(order(addr, None, r#"{"sku":"A-1"}"#))
        .await
        .expect("an answer");
    let (status, delivery, body) = read(response).await;

    assert_eq!(status, StatusCode::CREATED);
    assert!(delivery.replayed, "{body}");
    assert_eq!(delivery.attempts, 2, "{delivery:?}");
    assert!(body.contains(r#""order":1"#), "{body}");
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn connection_errors_are_retried_then_returned() {
    // A port nobody listens on.
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };

    let error = client(quick().max_attempts(3))
        .oneshot(order(addr, None, "{}"))
        .await
        .expect_err("nobody answers");

    assert_eq!(error.kind(), ClientErrorKind::Exhausted(Cause::Connection));
    assert_eq!(error.attempts(), 3);
    assert!(std::error::Error::source(&error).is_some());
    // The caller's report, without a response to carry it.
    let report = error.report().expect("a report");
    assert_eq!(report.attempts, 3);
    assert_eq!(report.origin, KeyOrigin::Generated);
    assert!(!report.replayed);
    uuid::Uuid::parse_str(report.key.as_ref().unwrap().to_str().unwrap()).expect("its key");
}

#[tokio::test]
async fn the_deadline_stops_retries() {
    let server = Server::default();
    server.fail_first.store(100, Ordering::SeqCst);
    let addr = server.start().await;

    let started = Instant::now();
    let result = client(
        quick()
            .max_attempts(1000)
            .backoff(Duration::from_millis(20), Duration::from_millis(20))
            .deadline(Duration::from_millis(300)),
    )
    .oneshot(order(addr, None, "{}"))
    .await;

    // The last answer, or, if the deadline fell during an attempt, that
    // attempt abandoned.
    let attempts = match result {
        Ok(response) => {
            let (status, delivery, _) = read(response).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            delivery.attempts
        }
        Err(error) => {
            assert_eq!(error.kind(), ClientErrorKind::Exhausted(Cause::Timeout));
            error.attempts()
        }
    };
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(attempts > 1 && attempts < 1000, "{attempts}");
    assert_eq!(server.runs(), 0);
}

#[tokio::test]
async fn an_oversize_body_is_refused_before_sending() {
    let server = Server::default();
    let addr = server.start().await;

    let error = client(quick().max_body(8))
        .oneshot(order(addr, None, r#"{"sku":"much too long"}"#))
        .await
        .expect_err("too large");

    assert_eq!(error.kind(), ClientErrorKind::BodyTooLarge);
    assert_eq!(error.attempts(), 0);
    assert_eq!(server.arrivals.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn safe_methods_are_sent_without_a_key() {
    let server = Server::default();
    server.fail_first.store(1, Ordering::SeqCst);
    let addr = server.start().await;

    let request = Request::get(format!("http://{addr}/orders"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client(quick()).oneshot(request).await.expect("an answer");
    let (status, delivery, _) = read(response).await;

    // 503 from the front, then the router's 405 (final).
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(delivery.attempts, 2);
    assert_eq!(delivery.origin, KeyOrigin::NotSent);
    assert_eq!(delivery.key, None);
    assert!(server.keys.lock().unwrap().iter().all(Option::is_none));
}
