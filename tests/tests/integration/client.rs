//! The client half against the orders app over loopback HTTP: hyper-util's
//! legacy client behind `IdempotencyClientLayer`, answers lost on the way
//! back, a client timeout shorter than the handler, and attempts failed by
//! `X-Chaos-Fail: 503`, one order per operation; the retries' metric and
//! the attempts' spans.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use idem_app::orders::{App, STARTING_BALANCE_CENTS};
use idem_test_support::prometheus;
use idem_tests::Harness;
use idem_tower::client::{IdempotencyClientLayer, RetryPolicy, RetryReport};
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::{Value, json};
use tower::util::ServiceFn;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::{LookupSpan, Registry};

const PRICE: i64 = 1999;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Http = Client<HttpConnector, Full<Bytes>>;

/// The orders app with chaos on, served on loopback; its base URL.
async fn start() -> (Harness, String) {
    let h = Harness::serve(App::in_memory(true)).await;
    let base = h
        .base()
        .expect("Harness::serve serves over HTTP")
        .to_owned();
    (h, base)
}

fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A fast policy for tests: short backoff, short `Retry-After` cap.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(10)
        .deadline(Duration::from_secs(20))
        .backoff(Duration::from_millis(10), Duration::from_millis(100))
        .max_retry_after(Duration::from_millis(300))
}

/// `POST /orders` for `user` under the harness's `acme`, no key unless the
/// caller adds one: the layer makes it.
fn order(h: &Harness, base: &str, user: &str) -> http::request::Builder {
    Request::post(format!("{base}/orders"))
        .header("content-type", "application/json")
        .header("x-tenant-id", h.unique("acme"))
        .header("authorization", format!("Bearer {user}"))
}

fn body(amount_cents: i64) -> Full<Bytes> {
    Full::new(Bytes::from(
        json!({ "sku": "book", "qty": 1, "amount_cents": amount_cents }).to_string(),
    ))
}

/// The HTTP client, adding `X-Chaos-Fail: 503` (the app answers 503 before
/// any write) to the first `failing` attempts; `sent` counts the attempts.
fn failing_first(
    failing: u32,
    sent: Arc<AtomicU32>,
) -> ServiceFn<impl FnMut(Request<Full<Bytes>>) -> ResponseFuture + Clone> {
    let http = http();
    service_fn(move |mut request: Request<Full<Bytes>>| {
        if sent.fetch_add(1, Ordering::SeqCst) < failing {
            request
                .headers_mut()
                .insert("x-chaos-fail", http::HeaderValue::from_static("503"));
        }
        http.request(request)
    })
}

fn json_of(bytes: &Bytes) -> Value {
    serde_json::from_slice(bytes).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answer_is_replayed_on_retry_with_one_order() {
    let (h, base) = start().await;
    // The server commits and answers; the first answer is lost on the way
    // back (read, then dropped, and the attempt fails as a broken
    // connection would). The retry, same key, gets it replayed.
    let sent = Arc::new(AtomicU32::new(0));
    let inner = {
        let (http, sent) = (http(), sent.clone());
        service_fn(move |request: Request<Full<Bytes>>| {
            let (http, first) = (http.clone(), sent.fetch_add(1, Ordering::SeqCst) == 0);
            async move {
                let response = http.request(request).await?;
                if first {
                    let lost = response.into_body().collect().await?;
                    drop(lost);
                    return Err::<_, BoxError>("connection reset: the answer was lost".into());
                }
                Ok(response)
            }
        })
    };
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(policy()))
        .service(inner);
    let request = order(&h, &base, "alice").body(body(PRICE)).unwrap();
    let response = client.oneshot(request).await.expect("an answer");
    let delivery = response.extensions().get::<RetryReport>().cloned().unwrap();
    assert_eq!(response.status(), StatusCode::CREATED, "{delivery:?}");
    assert!(delivery.attempts >= 2, "{delivery:?}");
    assert!(delivery.replayed, "{delivery:?}");
    assert!(delivery.key.is_some());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!json_of(&bytes)["order_id"].is_null());
    assert_eq!(
        h.account("acme", "alice").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
    assert_eq!(h.app.calls.orders(), 1, "the handler ran once");
}

/// The client gives up on an attempt before the server answers (its
/// timeout is shorter than `X-Chaos-Delay-Ms`, a sleep after the order's
/// writes): the server must not run the order a second time for the retry.
/// The abandoned attempt finishes on the server, the retries meet it in
/// flight (409), then get its replay: one order, one debit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_timeout_shorter_than_the_handler_gets_the_replay_with_one_order() {
    let (h, base) = start().await;
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(
            policy().attempt_timeout(Duration::from_millis(150)),
        ))
        .service(http());
    let request = order(&h, &base, "dave")
        .header("x-chaos-delay-ms", "600")
        .body(body(PRICE))
        .unwrap();
    let response = client.oneshot(request).await.expect("an answer");
    let delivery = response.extensions().get::<RetryReport>().cloned().unwrap();
    assert_eq!(response.status(), StatusCode::CREATED, "{delivery:?}");
    assert!(delivery.attempts >= 2, "{delivery:?}");
    assert!(delivery.replayed, "{delivery:?}");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!json_of(&bytes)["order_id"].is_null());
    assert_eq!(
        h.account("acme", "dave").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
    assert_eq!(h.app.calls.orders(), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_503_on_first_attempts_then_success_makes_one_order() {
    let (h, base) = start().await;
    let sent = Arc::new(AtomicU32::new(0));
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(policy()))
        .service(failing_first(2, sent.clone()));
    let request = order(&h, &base, "bob").body(body(PRICE)).unwrap();
    let response = client.oneshot(request).await.expect("an answer");
    let delivery = response.extensions().get::<RetryReport>().cloned().unwrap();
    assert_eq!(response.status(), StatusCode::CREATED, "{delivery:?}");
    assert_eq!(delivery.attempts, 3, "{delivery:?}");
    assert!(!delivery.replayed, "the failures stored nothing to replay");
    assert_eq!(sent.load(Ordering::SeqCst), 3);
    assert_eq!(
        h.account("acme", "bob").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
    assert_eq!(h.app.calls.orders(), 3, "two failures, then one success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_a_different_body_is_422_at_once() {
    let (h, base) = start().await;
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(policy()))
        .service(http());
    // The caller's own key, one business operation, reused by mistake for
    // a different request.
    let first = order(&h, &base, "carol")
        .header("idempotency-key", "op-carol-1")
        .body(body(PRICE))
        .unwrap();
    let response = client.clone().oneshot(first).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = response.extensions().get::<RetryReport>().cloned().unwrap();
    assert_eq!(delivery.attempts, 1);
    assert_eq!(
        delivery
            .key
            .as_ref()
            .map(|k| k.to_str().unwrap().to_owned()),
        Some("op-carol-1".to_owned())
    );

    let other = order(&h, &base, "carol")
        .header("idempotency-key", "op-carol-1")
        .body(body(PRICE + 1))
        .unwrap();
    let response = client.oneshot(other).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let delivery = response.extensions().get::<RetryReport>().cloned().unwrap();
    assert_eq!(delivery.attempts, 1, "a 422 is never retried");
    assert!(!delivery.replayed);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let problem = json_of(&bytes);
    assert_eq!(problem["type"], "urn:idem:problem:fingerprint-mismatch");
    assert_eq!(
        h.account("acme", "carol").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}

/// Each retry is counted under its cause in `idem_client_retries_total`, and
/// each attempt runs in an `idem.client.attempt` span with its number and
/// the status it got. (A current-thread runtime: the recorder and the
/// subscriber are this thread's own, so other tests cannot add to them.)
#[tokio::test(flavor = "current_thread")]
async fn retries_are_counted_by_cause_and_each_attempt_has_its_span() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let spans = AttemptSpans::default();
    let _subscriber = tracing::subscriber::set_default(Registry::default().with(spans.clone()));

    let (h, base) = start().await;
    let sent = Arc::new(AtomicU32::new(0));
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(policy()))
        .service(failing_first(2, sent.clone()));
    let request = order(&h, &base, "erin").body(body(PRICE)).unwrap();
    let response = client.oneshot(request).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::CREATED);

    let text = scrape.render();
    assert_eq!(
        prometheus::metric(
            &text,
            "idem_client_retries_total",
            &[("cause", "unavailable")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        prometheus::metric(&text, "idem_client_retries_total", &[]),
        Some(2.0),
        "no retry under another cause: {text}"
    );
    assert_eq!(
        spans.seen(),
        [(1, Some(503)), (2, Some(503)), (3, Some(201))],
        "one span per attempt, with its number and status"
    );
}

/// One `idem.client.attempt` span: its attempt number and the status it got.
type AttemptSpan = (u64, Option<u64>);

/// The `idem.client.attempt` spans seen, in order.
#[derive(Clone, Default)]
struct AttemptSpans(Arc<Mutex<Vec<AttemptSpan>>>);

impl AttemptSpans {
    fn seen(&self) -> Vec<AttemptSpan> {
        self.0.lock().unwrap().clone()
    }
}

/// Where in [`AttemptSpans`] a span's fields go.
struct Slot(usize);

/// The two fields the test reads.
#[derive(Default)]
struct Fields {
    attempt: Option<u64>,
    status: Option<u64>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "attempt" => self.attempt = Some(value),
            "status" => self.status = Some(value),
            _ => {}
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for AttemptSpans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "idem.client.attempt" {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut seen = self.0.lock().unwrap();
        seen.push((fields.attempt.expect("an attempt number"), fields.status));
        let span = ctx.span(id).expect("the new span");
        span.extensions_mut().insert(Slot(seen.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a live span");
        let Some(Slot(slot)) = span.extensions().get::<Slot>().map(|s| Slot(s.0)) else {
            return;
        };
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(status) = fields.status {
            self.0.lock().unwrap()[slot].1 = Some(status);
        }
    }
}
