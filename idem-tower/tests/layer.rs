//! Integration tests of `IdempotencyLayer` against the HTTP contract
//! (README.md) and the key and record invariants of ARCHITECTURE.md.
//!
//! Every inner service is a real `tower::service_fn` (or an axum router) that
//! counts its invocations in an `Arc<AtomicUsize>` owned by the test, and
//! every test asserts that count: the point of the layer is how many times
//! the handler runs, not only what status the client sees.
#![cfg(feature = "memory")]

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use idem_core::{Claim, Fingerprint, IdempotencyKey, Outcome, OwnerToken};
use idem_tower::store::IdempotencyStore;
use idem_tower::{Idempotency, InFlightPolicy, MemoryStore, Resolver};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

const KEY_HEADER: &str = "idempotency-key";
const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;
const OTHER_ORDER: &str = r#"{"sku":"A-1","qty":3}"#;

// ---------------------------------------------------------------------------
// helpers

/// A response as the client saw it, body read whole.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    async fn read<B>(response: Response<B>) -> Self
    where
        B: http_body::Body,
        B::Error: fmt::Debug,
    {
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("the response body").to_bytes();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Whether the layer marked this response as a replay.
    fn replayed(&self) -> bool {
        match self.headers.get("idempotent-replayed") {
            Some(value) => {
                assert_eq!(value, "true", "{self:?}");
                true
            }
            None => false,
        }
    }

    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("a UTF-8 body")
    }

    fn header(&self, name: impl http::header::AsHeaderName) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }

    /// Asserts this is a problem response of `status` with type
    /// `urn:idem:problem:{kind}`.
    fn assert_problem(&self, status: StatusCode, kind: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header(header::CONTENT_TYPE),
            Some("application/problem+json"),
            "{self:?}"
        );
        let problem: serde_json::Value =
            serde_json::from_slice(&self.body).expect("a problem+json body");
        assert_eq!(
            problem["type"],
            format!("urn:idem:problem:{kind}"),
            "{self:?}"
        );
        assert_eq!(problem["status"], status.as_u16(), "{self:?}");
        assert!(!self.replayed(), "a problem is never a replay: {self:?}");
    }

    /// The `Retry-After` header in whole seconds.
    fn retry_after(&self) -> u64 {
        self.header(header::RETRY_AFTER)
            .unwrap_or_else(|| panic!("no Retry-After: {self:?}"))
            .parse()
            .expect("Retry-After in seconds")
    }
}

/// Sends one request through a clone of `service`.
async fn send<S, B>(service: &S, request: Request<Body>) -> Reply
where
    S: Service<Request<Body>, Response = Response<B>> + Clone,
    S::Error: fmt::Debug,
    B: http_body::Body,
    B::Error: fmt::Debug,
{
    let response = service
        .clone()
        .oneshot(request)
        .await
        .expect("the service answers");
    Reply::read(response).await
}

/// Sends `n` copies of a request at once: each from its own task, released
/// together by a barrier.
async fn concurrently<S, B>(
    n: usize,
    service: &S,
    request: impl Fn() -> Request<Body>,
) -> Vec<Reply>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: fmt::Debug + Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: fmt::Debug + Send,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let service = service.clone();
            let barrier = Arc::clone(&barrier);
            let request = request();
            tokio::spawn(async move {
                barrier.wait().await;
                let response = service.oneshot(request).await.expect("the service answers");
                Reply::read(response).await
            })
        })
        .collect();
    let mut replies = Vec::with_capacity(n);
    for task in tasks {
        replies.push(task.await.expect("no request task panics"));
    }
    replies
}

/// A POST with a JSON body and, if given, an `Idempotency-Key`.
fn post(path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header(KEY_HEADER, key);
    }
    builder
        .body(Body::from(body.to_owned()))
        .expect("a valid request")
}

/// A POST carrying the key header once per value given, values taken as raw
/// bytes.
fn post_with_key_values(values: &[&[u8]], body: &str) -> Request<Body> {
    let mut request = post("/orders", None, body);
    for value in values {
        request.headers_mut().append(
            KEY_HEADER,
            HeaderValue::from_bytes(value).expect("a header value"),
        );
    }
    request
}

/// A body delivered in chunks with no `Content-Length` and no exact size
/// hint, as a client streaming with chunked transfer encoding would send it.
fn streamed(chunks: Vec<Bytes>) -> Body {
    let stream = futures_util::stream::iter(chunks).then(|chunk| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok::<_, Infallible>(chunk)
    });
    Body::from_stream(stream)
}

fn calls() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

fn count(calls: &AtomicUsize) -> usize {
    calls.load(Ordering::SeqCst)
}

/// Waits until the handler has been entered `n` times.
async fn wait_for_calls(calls: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while count(calls) < n {
        assert!(Instant::now() < deadline, "the handler was not called");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The handler: a `service_fn` that counts its invocations in `calls` and
/// answers with `f(invocation number, request)`.
fn counting<F, Fut, B>(
    calls: &Arc<AtomicUsize>,
    f: F,
) -> impl Service<Request<Body>, Response = Response<B>, Error = Infallible, Future: Send + 'static>
+ Clone
+ Send
+ 'static
where
    F: Fn(usize, Request<Body>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
{
    let calls = Arc::clone(calls);
    service_fn(move |request: Request<Body>| {
        let calls = Arc::clone(&calls);
        let f = f.clone();
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(f(n, request).await)
        }
    })
}

/// A JSON response.
fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// The usual handler answer: `201 {"order_id": n}`.
fn created(n: usize) -> Response<Full<Bytes>> {
    json(StatusCode::CREATED, format!(r#"{{"order_id":{n}}}"#))
}

fn order_body(n: usize) -> String {
    format!(r#"{{"order_id":{n}}}"#)
}

// ---------------------------------------------------------------------------
// replay

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequential_duplicates_execute_once_and_replay_the_first_response() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        Response::builder()
            .status(StatusCode::CREATED)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::LOCATION, format!("/orders/{n}"))
            .header(header::ETAG, format!("\"v{n}\""))
            .header(header::LINK, "</orders>; rel=\"collection\"")
            .header(header::LINK, "</users/7>; rel=\"author\"")
            .header(header::SET_COOKIE, format!("session=s{n}; HttpOnly"))
            .header(header::DATE, "Sun, 30 Nov 2025 12:00:00 GMT")
            .header("x-request-id", format!("req-{n}"))
            .body(Full::new(Bytes::from(order_body(n))))
            .expect("a valid response")
    });
    let mut service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let mut replies = Vec::new();
    for _ in 0..10 {
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(post("/orders", Some("k-sequential"), ORDER))
            .await
            .expect("the service answers");
        replies.push(Reply::read(response).await);
    }

    assert_eq!(count(&calls), 1, "ten identical requests, one execution");
    let first = &replies[0];
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.text(), order_body(1));
    assert!(first.headers.contains_key(header::SET_COOKIE));
    assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 9);
    for replay in &replies[1..] {
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(replay.status, first.status);
        assert_eq!(replay.body, first.body);
        for name in [header::CONTENT_TYPE, header::LOCATION, header::ETAG] {
            assert_eq!(
                replay.headers.get(&name),
                first.headers.get(&name),
                "{name}"
            );
        }
        let links: Vec<&str> = replay
            .headers
            .get_all(header::LINK)
            .iter()
            .map(|v| v.to_str().expect("ASCII"))
            .collect();
        assert_eq!(
            links,
            [
                "</orders>; rel=\"collection\"",
                "</users/7>; rel=\"author\""
            ],
            "repeated Link headers are replayed, in order"
        );
        assert!(
            !replay.headers.contains_key(header::SET_COOKIE),
            "{replay:?}"
        );
        assert!(!replay.headers.contains_key(header::DATE), "{replay:?}");
        assert!(!replay.headers.contains_key("x-request-id"), "{replay:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_replayed_headers_stay_out_even_when_configured() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        let mut response = created(n);
        let headers = response.headers_mut();
        headers.insert("x-order-version", HeaderValue::from(n));
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("session=abc"));
        response
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .replay_header(HeaderName::from_static("x-order-version"))
        .replay_header(header::SET_COOKIE)
        .build();
    let service = idem.layer().layer(inner);

    let first = send(&service, post("/orders", Some("k-headers"), ORDER)).await;
    let replay = send(&service, post("/orders", Some("k-headers"), ORDER)).await;

    assert_eq!(count(&calls), 1);
    assert_eq!(first.header(header::SET_COOKIE), Some("session=abc"));
    assert!(replay.replayed());
    assert_eq!(replay.header("x-order-version"), Some("1"));
    assert!(
        !replay.headers.contains_key(header::SET_COOKIE),
        "Set-Cookie would hand one client's session to another: {replay:?}"
    );
}

// ---------------------------------------------------------------------------
// concurrency

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_execute_once() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        created(n)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let replies = concurrently(50, &service, || post("/orders", Some("k-burst"), ORDER)).await;

    assert_eq!(count(&calls), 1, "fifty concurrent copies, one execution");
    let originals = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .count();
    assert_eq!(originals, 1);
    for reply in &replies {
        match reply.status {
            StatusCode::CREATED => assert_eq!(reply.text(), order_body(1)),
            StatusCode::CONFLICT => {
                reply.assert_problem(StatusCode::CONFLICT, "in-flight");
                let after = reply.retry_after();
                assert!((1..=60).contains(&after), "Retry-After {after}");
            }
            _ => panic!("neither the first, a replay nor a 409: {reply:?}"),
        }
    }

    let later = send(&service, post("/orders", Some("k-burst"), ORDER)).await;
    assert!(later.replayed());
    assert_eq!(later.text(), order_body(1));
    assert_eq!(count(&calls), 1);
}

/// The in-flight 409 tells clients to come back soon (1 s by default, or as
/// configured), never later than the first request's lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_retry_after_is_short_and_never_past_the_lease() {
    for (idem, expected) in [
        (Idempotency::new(MemoryStore::new()), 1),
        (
            Idempotency::builder(MemoryStore::new())
                .in_flight_retry_after(Duration::from_secs(3))
                .build(),
            3,
        ),
        (
            Idempotency::builder(MemoryStore::new())
                .in_flight_retry_after(Duration::from_secs(30))
                .lease(Duration::from_millis(2500))
                .build(),
            2,
        ),
    ] {
        let calls = calls();
        let release = Arc::new(tokio::sync::Notify::new());
        let inner = {
            let release = Arc::clone(&release);
            counting(&calls, move |n, _| {
                let release = Arc::clone(&release);
                async move {
                    release.notified().await;
                    created(n)
                }
            })
        };
        let service = idem.layer().layer(inner);
        let first = tokio::spawn({
            let service = service.clone();
            async move { send(&service, post("/orders", Some("k-slow"), ORDER)).await }
        });
        wait_for_calls(&calls, 1).await;
        let duplicate = send(&service, post("/orders", Some("k-slow"), ORDER)).await;
        duplicate.assert_problem(StatusCode::CONFLICT, "in-flight");
        assert_eq!(duplicate.retry_after(), expected, "{idem:?}");
        release.notify_one();
        assert_eq!(
            first.await.expect("the first answers").status,
            StatusCode::CREATED
        );
        assert_eq!(count(&calls), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_all_receive_the_replayed_success() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        created(n)
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .in_flight(InFlightPolicy::Wait(Duration::from_secs(5)))
        .build();
    let service = idem.layer().layer(inner);

    let replies = concurrently(30, &service, || post("/orders", Some("k-wait"), ORDER)).await;

    assert_eq!(count(&calls), 1);
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        assert_eq!(reply.text(), order_body(1));
    }
    assert_eq!(replies.iter().filter(|r| !r.replayed()).count(), 1);
    assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 29);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layer_in_flight_setting_overrides_the_handle() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        created(n)
    });
    // The handle rejects duplicates at once; this route waits instead.
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .in_flight(InFlightPolicy::Wait(Duration::from_secs(5)))
        .layer(inner);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post("/orders", Some("k-override"), ORDER)).await }
    });
    wait_for_calls(&calls, 1).await;
    let duplicate = send(&service, post("/orders", Some("k-override"), ORDER)).await;
    let first = first.await.expect("no panic");

    assert_eq!(count(&calls), 1);
    assert!(!first.replayed());
    assert_eq!(duplicate.status, StatusCode::CREATED, "{duplicate:?}");
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, first.body);
}

// ---------------------------------------------------------------------------
// fingerprints

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_with_a_different_body_is_422_and_does_not_rerun() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let first = send(&service, post("/orders", Some("k-mismatch"), ORDER)).await;
    let other = send(&service, post("/orders", Some("k-mismatch"), OTHER_ORDER)).await;
    let again = send(&service, post("/orders", Some("k-mismatch"), ORDER)).await;

    assert_eq!(first.status, StatusCode::CREATED);
    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "fingerprint-mismatch");
    assert!(again.replayed(), "the mismatch left the record alone");
    assert_eq!(again.body, first.body);
    assert_eq!(count(&calls), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reserialized_json_body_is_the_same_request() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let first = send(&service, post("/orders", Some("k-json"), ORDER)).await;
    let reformatted = "{\n  \"qty\" : 2,\n  \"sku\" : \"A-1\"\n}\n";
    let retry = send(&service, post("/orders", Some("k-json"), reformatted)).await;

    assert_eq!(count(&calls), 1);
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mismatch_is_reported_before_the_in_flight_conflict() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        created(n)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post("/orders", Some("k-early"), ORDER)).await }
    });
    wait_for_calls(&calls, 1).await;
    let other = send(&service, post("/orders", Some("k-early"), OTHER_ORDER)).await;
    let same = send(&service, post("/orders", Some("k-early"), ORDER)).await;
    let first = first.await.expect("no panic");

    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "fingerprint-mismatch");
    same.assert_problem(StatusCode::CONFLICT, "in-flight");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(count(&calls), 1);
}

// ---------------------------------------------------------------------------
// keys

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_key_is_400_and_the_handler_is_not_called() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let absent = send(&service, post("/orders", None, ORDER)).await;
    let empty = send(&service, post_with_key_values(&[b""], ORDER)).await;

    absent.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    empty.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert_eq!(count(&calls), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_of_256_chars_is_400_and_255_chars_is_accepted() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let too_long = "k".repeat(256);
    let longest = "k".repeat(255);

    let rejected = send(&service, post("/orders", Some(&too_long), ORDER)).await;
    rejected.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(count(&calls), 0);

    let accepted = send(&service, post("/orders", Some(&longest), ORDER)).await;
    let replay = send(&service, post("/orders", Some(&longest), ORDER)).await;
    assert_eq!(accepted.status, StatusCode::CREATED);
    assert!(!accepted.replayed());
    assert!(replay.replayed());
    assert_eq!(count(&calls), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeated_key_header_is_400() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let same_twice = send(&service, post_with_key_values(&[b"k-1", b"k-1"], ORDER)).await;
    let two_keys = send(&service, post_with_key_values(&[b"k-1", b"k-2"], ORDER)).await;

    same_twice.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    two_keys.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(count(&calls), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_outside_visible_ascii_is_400() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let values: [&[u8]; 4] = [b"has space", b"tab\there", "café".as_bytes(), b"\xff\xfe"];
    for value in values {
        let reply = send(&service, post_with_key_values(&[value], ORDER)).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    }
    assert_eq!(count(&calls), 0);
}

// ---------------------------------------------------------------------------
// request body cap

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_over_the_cap_with_content_length_is_413_and_claims_nothing() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_body(64)
        .build();
    let service = idem.layer().layer(inner);
    let big = format!(r#"{{"sku":"A-1","note":"{}"}}"#, "x".repeat(200));

    let mut oversize = post("/orders", Some("k-big"), &big);
    oversize
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(big.len()));
    let rejected = send(&service, oversize).await;
    rejected.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large");
    assert_eq!(count(&calls), 0);

    // Nothing was claimed: the same key with a small body runs, and is not
    // a fingerprint mismatch against the rejected request.
    let small = send(&service, post("/orders", Some("k-big"), ORDER)).await;
    assert_eq!(small.status, StatusCode::CREATED, "{small:?}");
    assert!(!small.replayed());
    assert_eq!(count(&calls), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_body_over_the_cap_without_content_length_is_413_and_claims_nothing() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_body(64)
        .build();
    let service = idem.layer().layer(inner);

    let chunks = (0..4).map(|i| Bytes::from(vec![b'a' + i; 32])).collect();
    let oversize = Request::post("/orders")
        .header(KEY_HEADER, "k-stream-big")
        .body(streamed(chunks))
        .expect("a valid request");
    assert!(!oversize.headers().contains_key(header::CONTENT_LENGTH));
    assert_eq!(http_body::Body::size_hint(oversize.body()).upper(), None);
    let rejected = send(&service, oversize).await;
    rejected.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large");
    assert_eq!(count(&calls), 0);

    let small = send(&service, post("/orders", Some("k-stream-big"), ORDER)).await;
    assert_eq!(small.status, StatusCode::CREATED, "{small:?}");
    assert!(!small.replayed());
    assert_eq!(count(&calls), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_body_under_the_cap_reaches_the_handler_whole() {
    let calls = calls();
    let inner = counting(&calls, |_, request: Request<Body>| async move {
        let received = request
            .into_body()
            .collect()
            .await
            .expect("the buffered body")
            .to_bytes();
        json(
            StatusCode::CREATED,
            String::from_utf8(received.to_vec()).expect("UTF-8"),
        )
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let chunks = [&ORDER[..5], &ORDER[5..12], &ORDER[12..]]
        .into_iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect();
    let request = Request::post("/orders")
        .header(KEY_HEADER, "k-stream")
        .body(streamed(chunks))
        .expect("a valid request");
    let first = send(&service, request).await;
    // The same bytes sent whole are the same request.
    let again = send(&service, post("/orders", Some("k-stream"), ORDER)).await;

    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.text(), ORDER, "the handler saw the whole body");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(count(&calls), 1);
}

// ---------------------------------------------------------------------------
// tenants and users

/// What the authentication middleware puts in the request.
#[derive(Debug, Clone)]
struct UserId(String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Demo authentication: `Authorization: Bearer <user>` becomes a [`UserId`].
fn authenticate(mut request: Request<Body>) -> Request<Body> {
    let user = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|u| UserId(u.to_owned()));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    request
}

fn as_tenant(mut request: Request<Body>, tenant: &str) -> Request<Body> {
    request.headers_mut().insert(
        "x-tenant-id",
        HeaderValue::from_str(tenant).expect("a header value"),
    );
    request
}

fn as_user(request: Request<Body>, tenant: &str, user: &str) -> Request<Body> {
    let mut request = as_tenant(request, tenant);
    request.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {user}")).expect("a header value"),
    );
    request
}

/// A handler that answers with the order number and who it was for.
fn whose_order(
    calls: &Arc<AtomicUsize>,
) -> impl Service<
    Request<Body>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    counting(calls, |n, request: Request<Body>| async move {
        let tenant = request
            .headers()
            .get("x-tenant-id")
            .map(|v| v.to_str().expect("ASCII").to_owned())
            .unwrap_or_default();
        let user = request
            .extensions()
            .get::<UserId>()
            .map(ToString::to_string)
            .unwrap_or_default();
        json(
            StatusCode::CREATED,
            format!(r#"{{"order_id":{n},"tenant":"{tenant}","user":"{user}"}}"#),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_under_two_tenants_runs_twice_and_never_crosses() {
    let calls = calls();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build();
    let service = idem.layer().layer(whose_order(&calls));
    let request = |tenant: &str| as_tenant(post("/orders", Some("k-shared"), ORDER), tenant);

    let acme = send(&service, request("acme")).await;
    let globex = send(&service, request("globex")).await;
    assert_eq!(count(&calls), 2, "one execution per tenant");
    assert!(!acme.replayed());
    assert!(
        !globex.replayed(),
        "globex must not get acme's response: {globex:?}"
    );
    assert_eq!(acme.text(), r#"{"order_id":1,"tenant":"acme","user":""}"#);
    assert_eq!(
        globex.text(),
        r#"{"order_id":2,"tenant":"globex","user":""}"#
    );

    let acme_again = send(&service, request("acme")).await;
    let globex_again = send(&service, request("globex")).await;
    assert!(acme_again.replayed() && globex_again.replayed());
    assert_eq!(acme_again.body, acme.body);
    assert_eq!(globex_again.body, globex.body);
    assert_eq!(count(&calls), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_for_two_users_of_one_tenant_runs_twice_and_never_crosses() {
    let calls = calls();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .user(Resolver::extension::<UserId>())
        .build();
    let service = ServiceBuilder::new()
        .map_request(authenticate)
        .layer(idem.layer())
        .service(whose_order(&calls));
    let request = |user: &str| as_user(post("/orders", Some("k-shared"), ORDER), "acme", user);

    let alice = send(&service, request("alice")).await;
    let bob = send(&service, request("bob")).await;
    assert_eq!(count(&calls), 2, "one execution per user");
    assert!(
        !bob.replayed(),
        "bob must not get alice's response: {bob:?}"
    );
    assert_eq!(
        alice.text(),
        r#"{"order_id":1,"tenant":"acme","user":"alice"}"#
    );
    assert_eq!(bob.text(), r#"{"order_id":2,"tenant":"acme","user":"bob"}"#);

    let alice_again = send(&service, request("alice")).await;
    let bob_again = send(&service, request("bob")).await;
    assert!(alice_again.replayed() && bob_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(bob_again.body, bob.body);

    // No user: a 400 naming the part, never a key without the user in it.
    let anonymous = send(
        &service,
        as_tenant(post("/orders", Some("k-shared"), ORDER), "acme"),
    )
    .await;
    anonymous.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert_eq!(count(&calls), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_tenant_is_400_never_a_shorter_key() {
    let calls = calls();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build();
    let service = idem.layer().layer(whose_order(&calls));

    let reply = send(&service, post("/orders", Some("k-anon"), ORDER)).await;

    reply.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    assert!(
        reply.text().contains("tenant"),
        "the 400 names the part: {reply:?}"
    );
    assert_eq!(count(&calls), 0);
}

/// The key template names neither tenant nor user, yet a record is bound to
/// the caller who made it: another tenant's user sending the same key gets
/// a run of their own, never the first caller's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_are_bound_to_the_caller_whatever_the_template_names() {
    let calls = calls();
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .user(Resolver::extension::<UserId>())
        .build();
    let template = "refund:{path:charge_id}:{header:idempotency-key}";
    let layer = idem.layer_with_key(template).expect("a valid template");
    let service = ServiceBuilder::new()
        .map_request(authenticate)
        .layer(layer.clone().route("/charges/{charge_id}/refund"))
        .service(whose_order(&calls));
    let refund = |tenant: &str, user: &str| {
        as_user(
            post("/charges/ch_1/refund", Some("k-refund"), ORDER),
            tenant,
            user,
        )
    };

    let alice = send(&service, refund("acme", "alice")).await;
    let mallory = send(&service, refund("globex", "mallory")).await;
    let bob = send(&service, refund("acme", "bob")).await;
    let anonymous = send(
        &service,
        post("/charges/ch_1/refund", Some("k-refund"), ORDER),
    )
    .await;

    assert_eq!(
        alice.text(),
        r#"{"order_id":1,"tenant":"acme","user":"alice"}"#
    );
    for (reply, who) in [
        (&mallory, "globex/mallory"),
        (&bob, "acme/bob"),
        (&anonymous, "no one"),
    ] {
        assert!(!reply.replayed(), "{who} got a replay: {reply:?}");
        assert_ne!(reply.body, alice.body, "{who} got alice's response");
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    assert_eq!(count(&calls), 4, "one run per caller");

    let alice_again = send(&service, refund("acme", "alice")).await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(count(&calls), 4);

    // Opting in to one record shared by every caller is explicit.
    let shared_calls = crate::calls();
    let shared = ServiceBuilder::new()
        .map_request(authenticate)
        .layer(
            layer
                .shared_across_callers()
                .route("/charges/{charge_id}/refund"),
        )
        .service(whose_order(&shared_calls));
    let shared_refund = |tenant: &str, user: &str| {
        as_user(
            post("/charges/ch_2/refund", Some("k-refund"), ORDER),
            tenant,
            user,
        )
    };
    let first = send(&shared, shared_refund("acme", "alice")).await;
    let other = send(&shared, shared_refund("globex", "mallory")).await;
    assert!(other.replayed(), "{other:?}");
    assert_eq!(other.body, first.body);
    assert_eq!(count(&shared_calls), 1);
}

/// [`whose_order`] behind a layer with `template`, on a handle whose tenant
/// comes from `X-Tenant-Id`.
fn tenant_scoped(
    calls: &Arc<AtomicUsize>,
    template: &str,
) -> impl Service<
    Request<Body>,
    Response = Response<idem_tower::layer::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build()
        .layer_with_key(template)
        .expect("a valid template")
        .layer(whose_order(calls))
}

/// An identity the request gives ambiguously (the tenant header twice) is a
/// 400, even where the template does not name it: read as "no tenant", two
/// requests naming different tenants would share one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ambiguous_identity_is_refused_never_read_as_none() {
    let calls = calls();
    let service = tenant_scoped(&calls, "refund:{header:idempotency-key}");
    for tenants in [["acme", "globex"], ["globex", "acme"]] {
        let mut request = post("/refunds", Some("k-ambiguous"), ORDER);
        for tenant in tenants {
            request
                .headers_mut()
                .append("x-tenant-id", HeaderValue::from_static(tenant));
        }
        let reply = send(&service, request).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
        assert!(reply.text().contains("x-tenant-id"), "{reply:?}");
    }
    let mut unprintable = post("/refunds", Some("k-ambiguous"), ORDER);
    unprintable.headers_mut().insert(
        "x-tenant-id",
        HeaderValue::from_bytes(b"acme corp").expect("a header value"),
    );
    send(&service, unprintable)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(count(&calls), 0);
}

/// Many callers racing on one key: each caller's requests run once, and
/// no caller ever reads another's body.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_on_one_key_each_run_once_and_never_cross() {
    let calls = calls();
    let service = tenant_scoped(&calls, "order:{header:idempotency-key}");
    let barrier = Arc::new(tokio::sync::Barrier::new(40));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let service = service.clone();
            let barrier = Arc::clone(&barrier);
            let tenant = format!("t{}", i % 4);
            tokio::spawn(async move {
                barrier.wait().await;
                let request = as_tenant(post("/orders", Some("k-race"), ORDER), &tenant);
                (tenant, send(&service, request).await)
            })
        })
        .collect();
    for task in tasks {
        let (tenant, reply) = task.await.expect("no request task panics");
        if reply.status == StatusCode::CONFLICT {
            reply.assert_problem(StatusCode::CONFLICT, "in-flight");
            continue;
        }
        assert!(
            reply.text().contains(&format!(r#""tenant":"{tenant}""#)),
            "{tenant} read another caller's body: {reply:?}"
        );
    }
    assert_eq!(count(&calls), 4, "one run per tenant");
}

// ---------------------------------------------------------------------------
// outcome policy

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_error_releases_the_key_so_the_retry_runs_and_its_success_is_replayed() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            json(
                StatusCode::INTERNAL_SERVER_ERROR,
                r#"{"error":"boom"}"#.into(),
            )
        } else {
            created(n)
        }
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-5xx"), ORDER);

    let failed = send(&service, request()).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!failed.replayed());

    let retry = send(&service, request()).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed(), "the retry ran: {retry:?}");
    assert_eq!(retry.text(), order_body(2));
    assert_eq!(count(&calls), 2);

    let replay = send(&service, request()).await;
    assert!(replay.replayed());
    assert_eq!(replay.text(), order_body(2));
    assert_eq!(count(&calls), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn too_many_requests_and_conflict_from_the_handler_release_the_key() {
    for status in [StatusCode::TOO_MANY_REQUESTS, StatusCode::CONFLICT] {
        let calls = calls();
        let inner = counting(&calls, move |n, _| async move {
            if n == 1 {
                json(status, r#"{"error":"not now"}"#.into())
            } else {
                created(n)
            }
        });
        let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
        let request = || post("/orders", Some("k-transient"), ORDER);

        let refused = send(&service, request()).await;
        let retry = send(&service, request()).await;
        let replay = send(&service, request()).await;

        assert_eq!(refused.status, status);
        assert_eq!(retry.status, StatusCode::CREATED, "{status}: {retry:?}");
        assert!(!retry.replayed(), "{status}: the retry ran");
        assert!(replay.replayed());
        assert_eq!(replay.text(), order_body(2));
        assert_eq!(count(&calls), 2, "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deterministic_client_errors_from_the_handler_are_stored_and_replayed() {
    for status in [StatusCode::NOT_FOUND, StatusCode::UNPROCESSABLE_ENTITY] {
        let calls = calls();
        let inner = counting(&calls, move |n, _| async move {
            json(
                status,
                format!(r#"{{"error":"no such sku","attempt":{n}}}"#),
            )
        });
        let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
        let request = || post("/orders", Some("k-4xx"), ORDER);

        let first = send(&service, request()).await;
        let again = send(&service, request()).await;

        assert_eq!(first.status, status);
        assert_eq!(again.status, status);
        assert!(again.replayed(), "{status}: {again:?}");
        assert_eq!(again.body, first.body);
        assert_eq!(count(&calls), 1, "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_error_releases_the_key() {
    let calls = calls();
    let inner = {
        let calls = Arc::clone(&calls);
        service_fn(move |_: Request<Body>| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == 1 {
                    Err(std::io::Error::other("connection reset"))
                } else {
                    Ok(created(n))
                }
            }
        })
    };
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-err"), ORDER);

    let failed = service.clone().oneshot(request()).await;
    assert!(failed.is_err(), "the service error is passed on");
    let retry = Reply::read(service.clone().oneshot(request()).await.expect("ok")).await;

    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(count(&calls), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panicking_handler_propagates_the_panic_and_releases_the_key() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            panic!("handler blew up on its first call");
        }
        created(n)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-panic"), ORDER);

    let panicked = tokio::spawn(service.clone().oneshot(request()))
        .await
        .expect_err("the panic propagates");
    assert!(panicked.is_panic());
    assert_eq!(count(&calls), 1);

    let retry = send(&service, request()).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(retry.text(), order_body(2));
    let replay = send(&service, request()).await;
    assert!(replay.replayed());
    assert_eq!(count(&calls), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_request_releases_the_key_promptly() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        created(n)
    });
    // The lease is the default minute: only the release frees the key soon.
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-cancel"), ORDER);

    let cancelled =
        tokio::time::timeout(Duration::from_millis(200), send(&service, request())).await;
    assert!(cancelled.is_err(), "the first request was cut off");
    assert_eq!(count(&calls), 1);

    let dropped_at = Instant::now();
    let retry = loop {
        let reply = send(&service, request()).await;
        if reply.status != StatusCode::CONFLICT {
            break reply;
        }
        reply.assert_problem(StatusCode::CONFLICT, "in-flight");
        assert!(
            dropped_at.elapsed() < Duration::from_secs(1),
            "the key was not released within a second"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(retry.text(), order_body(2));
    assert_eq!(count(&calls), 2);
}

/// Once the handler has returned a final response its effect has happened;
/// a client disconnecting while the layer reads that response for storage
/// must not free the key for a second execution (ARCHITECTURE.md,
/// "Records": a consumed key after a failed attempt is the opposite
/// mistake; this is the "effect applied twice" one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancellation_after_the_handler_returned_does_not_run_it_again() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        let chunks = futures_util::stream::iter([
            (Duration::ZERO, format!(r#"{{"order_id":{n},"#)),
            (Duration::from_millis(500), r#""state":"paid"}"#.to_owned()),
        ])
        .then(|(delay, chunk)| async move {
            tokio::time::sleep(delay).await;
            Ok::<_, Infallible>(chunk)
        });
        Response::builder()
            .status(StatusCode::CREATED)
            .body(Body::from_stream(chunks))
            .expect("a valid response")
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-late-cancel"), ORDER);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    wait_for_calls(&calls, 1).await;
    // The handler has returned; the layer is reading its body.
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    assert!(first.await.expect_err("aborted").is_cancelled());
    tokio::time::sleep(Duration::from_millis(100)).await;

    let retry = send(&service, request()).await;
    assert_eq!(
        count(&calls),
        1,
        "the handler completed once; the retry ran it again: {retry:?}"
    );
    assert!(
        retry.status == StatusCode::CONFLICT || retry.replayed(),
        "{retry:?}"
    );
    // The work the aborted request left (reading the body, storing it) went
    // on without it: once the body is complete, retries replay it whole.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = send(&service, request()).await;
    assert!(later.replayed(), "{later:?}");
    assert_eq!(later.text(), r#"{"order_id":1,"state":"paid"}"#);
    assert_eq!(count(&calls), 1);
}

/// On a store that answers at once, a first request settles inside its own
/// future: no task is spawned for it. Polled once, with no tokio runtime to
/// spawn on, it is done, and its response is stored.
#[test]
fn a_first_request_settles_in_place_without_a_task() {
    let calls = calls();
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .layer(counting(&calls, |n, _| async move { created(n) }));
    let poll_once = |request| {
        service
            .clone()
            .oneshot(request)
            .now_or_never()
            .expect("the request waited on something")
            .expect("the service answers")
    };

    let first = poll_once(post("/orders", Some("k-in-place"), ORDER));
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = poll_once(post("/orders", Some("k-in-place"), ORDER));
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(count(&calls), 1);
}

// ---------------------------------------------------------------------------
// leases

/// What a handler that outlives a lost lease risks. One that blocks its
/// thread (here `std::thread::sleep`, in real life blocking I/O without
/// `spawn_blocking`) starves its own renewals, which run in the same
/// future: its lease ends, a duplicate takes the key over and runs the
/// effect a second time, and the first attempt's completion is refused, so
/// duplicates replay the second run's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_lease_is_taken_over_and_the_stale_completion_is_rejected() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            std::thread::sleep(Duration::from_secs(1));
        }
        created(n)
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_millis(300))
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/orders", Some("k-lease"), ORDER);

    let stale = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&calls), 1);

    let takeover = send(&service, request()).await;
    assert_eq!(takeover.status, StatusCode::CREATED, "{takeover:?}");
    assert!(
        !takeover.replayed(),
        "the lease had expired: the duplicate runs"
    );
    assert_eq!(takeover.text(), order_body(2));
    assert_eq!(count(&calls), 2);

    // The stale attempt still answers its own client, but cannot store.
    let stale = stale.await.expect("no panic");
    assert_eq!(stale.status, StatusCode::CREATED);
    assert_eq!(stale.text(), order_body(1));

    let replay = send(&service, request()).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(
        replay.text(),
        order_body(2),
        "the stale completion must not overwrite the new owner's"
    );
    assert_eq!(count(&calls), 2);
}

// ---------------------------------------------------------------------------
// stored response cap

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn response_too_large_to_store_reaches_the_first_client_whole_and_is_not_replayable() {
    let calls = calls();
    let big: Bytes = (0..4096u32).map(|i| b'a' + (i % 26) as u8).collect();
    let inner = counting(&calls, {
        let big = big.clone();
        move |_, _| {
            let big = big.clone();
            async move {
                Response::builder()
                    .status(StatusCode::OK)
                    .body(Full::new(big))
                    .expect("a valid response")
            }
        }
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_stored_response(1024)
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/reports", Some("k-big-response"), ORDER);

    let first = send(&service, request()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, big, "the first client gets the whole body");

    for _ in 0..2 {
        let duplicate = send(&service, request()).await;
        duplicate.assert_problem(StatusCode::CONFLICT, "not-replayable");
    }
    assert_eq!(count(&calls), 1, "not replayable is not a re-run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_response_too_large_to_store_reaches_the_first_client_in_order() {
    let calls = calls();
    let chunks: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![b'a' + i; 512])).collect();
    let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let inner = counting(&calls, {
        let chunks = chunks.clone();
        move |_, _| {
            let chunks = chunks.clone();
            async move {
                Response::builder()
                    .status(StatusCode::OK)
                    .body(streamed(chunks))
                    .expect("a valid response")
            }
        }
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_stored_response(1024)
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/reports", Some("k-big-stream"), ORDER);

    let first = send(&service, request()).await;
    let duplicate = send(&service, request()).await;

    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, expected, "every chunk, in order");
    duplicate.assert_problem(StatusCode::CONFLICT, "not-replayable");
    assert_eq!(count(&calls), 1);
}

// ---------------------------------------------------------------------------
// store failures

/// A store whose backend is down: every call fails as unavailable.
struct UnavailableStore;

fn connection_refused() -> idem_core::Error {
    idem_core::Error::unavailable(std::io::Error::other("connection refused"))
}

impl IdempotencyStore for UnavailableStore {
    async fn claim(
        &self,
        _: &IdempotencyKey,
        _: &Fingerprint,
        _: Duration,
        _: OwnerToken,
    ) -> Result<Claim, idem_core::Error> {
        Err(connection_refused())
    }

    async fn complete(
        &self,
        _: &IdempotencyKey,
        _: &OwnerToken,
        _: &Outcome,
        _: Duration,
    ) -> Result<(), idem_core::Error> {
        Err(connection_refused())
    }

    async fn release(&self, _: &IdempotencyKey, _: &OwnerToken) -> Result<(), idem_core::Error> {
        Err(connection_refused())
    }

    async fn renew(
        &self,
        _: &IdempotencyKey,
        _: &OwnerToken,
        _: Duration,
    ) -> Result<(), idem_core::Error> {
        Err(connection_refused())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unavailable_store_fails_closed_with_503_and_the_handler_is_not_called() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::builder(UnavailableStore)
        .unavailable_retry_after(Duration::from_secs(7))
        .build();
    let service = idem.layer().layer(inner);

    for _ in 0..3 {
        let reply = send(&service, post("/orders", Some("k-down"), ORDER)).await;
        reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable");
        assert_eq!(reply.retry_after(), 7);
    }
    assert_eq!(count(&calls), 0, "no handler call without dedup");
}

/// A memory store whose `complete` fails: the handler's outcome cannot be
/// recorded.
struct CompleteFails(MemoryStore);

impl IdempotencyStore for CompleteFails {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, idem_core::Error> {
        self.0.claim(key, fingerprint, lease, owner).await
    }

    async fn complete(
        &self,
        _: &IdempotencyKey,
        _: &OwnerToken,
        _: &Outcome,
        _: Duration,
    ) -> Result<(), idem_core::Error> {
        Err(connection_refused())
    }

    async fn release(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
    ) -> Result<(), idem_core::Error> {
        self.0.release(key, owner).await
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), idem_core::Error> {
        self.0.renew(key, owner, lease).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_completion_blocks_duplicates_instead_of_running_them() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(CompleteFails(MemoryStore::new()))
        .layer()
        .layer(inner);

    let first = send(&service, post("/orders", Some("k-unstored"), ORDER)).await;
    let duplicate = send(&service, post("/orders", Some("k-unstored"), ORDER)).await;

    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "the handler's answer still reaches its client"
    );
    duplicate.assert_problem(StatusCode::CONFLICT, "in-flight");
    assert_eq!(count(&calls), 1);
}

// ---------------------------------------------------------------------------
// optional keys

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn optional_key_passes_keyless_requests_through_and_deduplicates_keyed_ones() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .required(false)
        .layer(inner);

    let a = send(&service, post("/orders", None, ORDER)).await;
    let b = send(&service, post("/orders", None, ORDER)).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!a.replayed() && !b.replayed());
    assert_eq!(count(&calls), 2, "no key, no deduplication");

    let keyed = send(&service, post("/orders", Some("k-opt"), ORDER)).await;
    let keyed_again = send(&service, post("/orders", Some("k-opt"), ORDER)).await;
    assert!(!keyed.replayed());
    assert!(keyed_again.replayed());
    assert_eq!(keyed_again.body, keyed.body);
    assert_eq!(count(&calls), 3);

    let malformed = send(&service, post("/orders", Some(&"k".repeat(256)), ORDER)).await;
    malformed.assert_problem(StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(count(&calls), 3);
}

/// `IdempotencyLayer::required` documents: "a request whose client-supplied
/// key parts are ALL absent passes straight to the service [...]; a partly
/// present [...] key is still a 400".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn optional_key_partly_present_is_400() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::new(MemoryStore::new());
    let service = idem
        .layer_with_key("refund:{body:/order_no}:{header:idempotency-key}")
        .expect("a valid template")
        .required(false)
        .layer(inner);
    let refund = r#"{"order_no":"O-1","amount_cents":500}"#;

    // The body names the order but the key header is absent.
    let header_absent = send(&service, post("/refunds", None, refund)).await;
    // The key header is there but the body lacks the order number.
    let body_part_absent = send(
        &service,
        post("/refunds", Some("k-refund"), r#"{"amount_cents":500}"#),
    )
    .await;

    assert_eq!(
        count(&calls),
        0,
        "a partly present key passed through undeduplicated: {header_absent:?} / {body_part_absent:?}"
    );
    header_absent.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
    body_part_absent.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
}

// ---------------------------------------------------------------------------
// routes and path parameters

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn path_placeholder_is_read_with_the_configured_route_on_a_plain_service() {
    let calls = calls();
    let inner = counting(&calls, |n, request: Request<Body>| async move {
        json(
            StatusCode::OK,
            format!(r#"{{"credited":"{}","call":{n}}}"#, request.uri().path()),
        )
    });
    let service = Idempotency::new(MemoryStore::new())
        .layer_with_key("pay-callback:{path:payment_no}")
        .expect("a valid template")
        .route("/payments/{payment_no}/callback")
        .layer(inner);
    let paid = r#"{"status":"PAID","amount_cents":500}"#;

    let first = send(&service, post("/payments/P-1/callback", None, paid)).await;
    let again = send(&service, post("/payments/P-1/callback", None, paid)).await;
    let encoded = send(&service, post("/payments/P%2D1/callback", None, paid)).await;
    let other = send(&service, post("/payments/P-2/callback", None, paid)).await;

    assert_eq!(first.status, StatusCode::OK);
    assert!(!first.replayed());
    assert!(again.replayed() && encoded.replayed(), "{encoded:?}");
    assert_eq!(encoded.body, first.body, "P%2D1 is P-1");
    assert!(!other.replayed());
    assert_eq!(
        other.text(),
        r#"{"credited":"/payments/P-2/callback","call":2}"#
    );
    assert_eq!(count(&calls), 2);

    // A path parameter comes from the route, never the client: a request
    // the configured route does not match is the server's wiring, a 500.
    let unmatched = send(&service, post("/refunds/R-1", None, paid)).await;
    unmatched.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
    assert!(
        unmatched.text().contains("{path:payment_no}"),
        "{unmatched:?}"
    );
    assert_eq!(count(&calls), 2);
}

/// The default key is `{method}:{route}:{header:idempotency-key}`, and the
/// fingerprint covers the route *pattern*: with a parametrised route the same
/// client key sent for two different resources must not replay one
/// resource's response for the other (it should be a 422 or a second run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_on_two_resources_of_one_route_never_replays_across_them() {
    let calls = calls();
    let inner = counting(&calls, |n, request: Request<Body>| async move {
        json(
            StatusCode::OK,
            format!(r#"{{"paid":"{}","call":{n}}}"#, request.uri().path()),
        )
    });
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .route("/orders/{order_id}/pay")
        .layer(inner);

    let first = send(&service, post("/orders/1/pay", Some("k-pay"), "")).await;
    let second = send(&service, post("/orders/2/pay", Some("k-pay"), "")).await;

    assert_eq!(first.text(), r#"{"paid":"/orders/1/pay","call":1}"#);
    assert!(
        !second.replayed(),
        "order 2 got order 1's payment replayed and was never paid: {second:?} (calls: {})",
        count(&calls)
    );
    assert!(
        second.status == StatusCode::UNPROCESSABLE_ENTITY || count(&calls) == 2,
        "{second:?}"
    );
}

#[cfg(feature = "axum")]
mod behind_axum {
    use axum::Router;
    use axum::extract::{FromRef, FromRequestParts, Path, State};
    use axum::routing::{get as axum_get, post as axum_post};
    use idem_tower::{ErrorKind, HandlerRan};

    use super::*;

    /// The service's own authentication extractor: `Authorization: Bearer
    /// <user>`, or 401.
    struct CurrentUser(String);

    impl<S: Send + Sync> FromRequestParts<S> for CurrentUser {
        type Rejection = (StatusCode, &'static str);

        async fn from_request_parts(
            parts: &mut http::request::Parts,
            _: &S,
        ) -> Result<Self, Self::Rejection> {
            parts
                .headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(|user| CurrentUser(user.to_owned()))
                .ok_or((StatusCode::UNAUTHORIZED, "who are you?"))
        }
    }

    /// An orders route whose handler marks its responses as its own.
    fn marked_orders(calls: &Arc<AtomicUsize>, layer: idem_tower::IdempotencyLayer) -> Router {
        let calls = Arc::clone(calls);
        let create = move |CurrentUser(user): CurrentUser,
                           axum::Json(order): axum::Json<serde_json::Value>| {
            let calls = Arc::clone(&calls);
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    StatusCode::CREATED,
                    HandlerRan,
                    format!(
                        r#"{{"order_id":{n},"user":"{user}","sku":{}}}"#,
                        order["sku"]
                    ),
                )
            }
        };
        Router::new().route("/orders", axum_post(create).layer(layer))
    }

    fn signed(request: Request<Body>, user: &str) -> Request<Body> {
        let mut request = request;
        request.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {user}")).expect("a header value"),
        );
        request
    }

    /// Nothing happened when an extractor refused the request, so its key
    /// is not burnt: the corrected request with the same key runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_request_refused_before_the_handler_ran_leaves_its_key_free() {
        let calls = calls();
        let idem = Idempotency::new(MemoryStore::new());
        let layer = idem
            .layer_with_key("order:{header:idempotency-key}")
            .expect("a valid template")
            .require_handler_ran();
        let app = marked_orders(&calls, layer);

        let mut plain = signed(post("/orders", Some("k-415"), ORDER), "alice");
        plain
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let refused = send(&app, plain).await;
        assert_eq!(
            refused.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{refused:?}"
        );
        assert!(!refused.replayed());

        let malformed = send(
            &app,
            signed(post("/orders", Some("k-415"), "{\"sku\":"), "alice"),
        )
        .await;
        assert_eq!(malformed.status, StatusCode::BAD_REQUEST, "{malformed:?}");
        assert!(!malformed.replayed());

        let anonymous = send(&app, post("/orders", Some("k-415"), ORDER)).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{anonymous:?}");
        assert_eq!(count(&calls), 0);

        let fixed = send(&app, signed(post("/orders", Some("k-415"), ORDER), "alice")).await;
        assert_eq!(fixed.status, StatusCode::CREATED, "{fixed:?}");
        assert!(!fixed.replayed());
        let again = send(&app, signed(post("/orders", Some("k-415"), ORDER), "alice")).await;
        assert!(again.replayed(), "{again:?}");
        assert_eq!(again.body, fixed.body);
        assert_eq!(count(&calls), 1, "the handler ran once");
    }

    /// Without `require_handler_ran`, the layer cannot tell a rejection from
    /// the handler's answer, and keeps it like any deterministic 4xx: the
    /// reason the signal exists.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn without_the_signal_a_rejection_is_kept_like_any_answer() {
        let calls = calls();
        let idem = Idempotency::new(MemoryStore::new());
        let layer = idem
            .layer_with_key("order:{header:idempotency-key}")
            .expect("a valid template");
        let app = marked_orders(&calls, layer);
        let mut plain = signed(post("/orders", Some("k-kept"), ORDER), "alice");
        plain
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(
            send(&app, plain).await.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        let fixed = send(
            &app,
            signed(post("/orders", Some("k-kept"), ORDER), "alice"),
        )
        .await;
        assert!(fixed.replayed(), "{fixed:?}");
        assert_eq!(count(&calls), 0);
    }

    /// `require_handler_ran` on a handler that forgets to mark its
    /// responses: its successes are still kept (with a warning), never
    /// silently left undeduplicated.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_unmarked_success_is_kept_as_the_handlers() {
        let calls = calls();
        let idem = Idempotency::new(MemoryStore::new());
        let layer = idem
            .layer_with_key("order:{header:idempotency-key}")
            .expect("a valid template")
            .require_handler_ran();
        let handler = {
            let calls = Arc::clone(&calls);
            move || {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("order {n}")) }
            }
        };
        let app = Router::new().route("/orders", axum_post(handler).layer(layer));
        let first = send(&app, post("/orders", Some("k-unmarked"), ORDER)).await;
        let again = send(&app, post("/orders", Some("k-unmarked"), ORDER)).await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(again.replayed(), "{again:?}");
        assert_eq!(count(&calls), 1);
    }

    /// The user comes from the extractor the handlers already use; its
    /// rejection is answered as the extractor answers it, nothing claimed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_user_from_an_extractor_scopes_keys_and_its_rejection_claims_nothing() {
        let calls = calls();
        let idem = Idempotency::builder(MemoryStore::new())
            .user(Resolver::from_extractor(|CurrentUser(user)| user))
            .build();
        let layer = idem
            .layer_with_key("order:{user}:{header:idempotency-key}")
            .expect("a valid template")
            .require_handler_ran();
        let app = marked_orders(&calls, layer);

        let anonymous = send(&app, post("/orders", Some("k-user"), ORDER)).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            anonymous.text(),
            "who are you?",
            "the extractor's own answer"
        );
        assert_eq!(count(&calls), 0);

        let alice = send(
            &app,
            signed(post("/orders", Some("k-user"), ORDER), "alice"),
        )
        .await;
        let bob = send(&app, signed(post("/orders", Some("k-user"), ORDER), "bob")).await;
        assert_eq!(alice.status, StatusCode::CREATED);
        assert!(!bob.replayed() && bob.text().contains("bob"), "{bob:?}");
        let alice_again = send(
            &app,
            signed(post("/orders", Some("k-user"), ORDER), "alice"),
        )
        .await;
        assert!(alice_again.replayed());
        assert_eq!(alice_again.body, alice.body);
        assert_eq!(count(&calls), 2);
    }

    /// A user resolver that serves only the caller scope (the template does
    /// not name `{user}`): its refusal means a caller without a user, not a
    /// 401, and that caller's record is not the signed-in user's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_scope_only_resolver_refusal_is_a_caller_without_identity() {
        let calls = calls();
        let idem = Idempotency::builder(MemoryStore::new())
            .user(Resolver::from_extractor(|CurrentUser(user)| user))
            .build();
        let layer = idem
            .layer_with_key("order:{header:idempotency-key}")
            .expect("a valid template");
        let handler = {
            let calls = Arc::clone(&calls);
            move || {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("order {n}")) }
            }
        };
        let app = Router::new().route("/orders", axum_post(handler).layer(layer));

        let anonymous = send(&app, post("/orders", Some("k-scope"), ORDER)).await;
        let alice = send(
            &app,
            signed(post("/orders", Some("k-scope"), ORDER), "alice"),
        )
        .await;
        assert_eq!(anonymous.status, StatusCode::CREATED, "{anonymous:?}");
        assert!(
            !alice.replayed(),
            "alice got the anonymous caller's response"
        );
        assert_eq!(alice.text(), "order 2");
        let anonymous_again = send(&app, post("/orders", Some("k-scope"), ORDER)).await;
        assert!(anonymous_again.replayed());
        assert_eq!(anonymous_again.body, anonymous.body);
        assert_eq!(count(&calls), 2);
    }

    #[derive(Clone)]
    struct AppState {
        tokens: Arc<Vec<(&'static str, &'static str)>>,
    }

    /// An extractor that needs the router state: a token looked up in it.
    struct Session(String);

    impl FromRequestParts<AppState> for Session {
        type Rejection = StatusCode;

        async fn from_request_parts(
            parts: &mut http::request::Parts,
            state: &AppState,
        ) -> Result<Self, StatusCode> {
            let token = parts
                .headers
                .get("x-session")
                .and_then(|v| v.to_str().ok())
                .ok_or(StatusCode::UNAUTHORIZED)?;
            state
                .tokens
                .iter()
                .find(|(t, _)| *t == token)
                .map(|(_, user)| Session((*user).to_owned()))
                .ok_or(StatusCode::FORBIDDEN)
        }
    }

    impl FromRef<AppState> for Arc<Vec<(&'static str, &'static str)>> {
        fn from_ref(state: &AppState) -> Self {
            Arc::clone(&state.tokens)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stateful_extractor_resolves_with_the_layers_state() {
        let calls = calls();
        let idem = Idempotency::builder(MemoryStore::new())
            .user(Resolver::from_extractor_with_state::<AppState, _, _>(
                |Session(user)| user,
            ))
            .build();
        let state = AppState {
            tokens: Arc::new(vec![("s-1", "alice")]),
        };
        let template = "order:{user}:{header:idempotency-key}";
        let handler = {
            let calls = Arc::clone(&calls);
            move |State(_): State<AppState>| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, HandlerRan, format!("order {n}")) }
            }
        };
        let with_state = idem
            .layer_with_key(template)
            .expect("valid")
            .with_state(state.clone());
        let app: Router = Router::new()
            .route("/orders", axum_post(handler.clone()).layer(with_state))
            .route(
                "/forgot",
                axum_post(handler).layer(idem.layer_with_key(template).expect("valid")),
            )
            .with_state(state);
        let session = |path: &str, token: &str| {
            let mut request = post(path, Some("k-session"), ORDER);
            request
                .headers_mut()
                .insert("x-session", HeaderValue::from_str(token).expect("ASCII"));
            request
        };

        let forbidden = send(&app, session("/orders", "s-bad")).await;
        assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
        let first = send(&app, session("/orders", "s-1")).await;
        let again = send(&app, session("/orders", "s-1")).await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(count(&calls), 1);

        // The same resolver on a layer given no state: the server's error.
        let unwired = send(&app, session("/forgot", "s-1")).await;
        unwired.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
        assert!(unwired.text().contains("with_state"), "{unwired:?}");
        assert_eq!(count(&calls), 1);
    }

    /// One layer on a whole router: reads pass through untouched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn safe_methods_pass_through_a_layer_on_the_whole_router() {
        let calls = calls();
        let reads = Arc::new(AtomicUsize::new(0));
        let list = {
            let reads = Arc::clone(&reads);
            move || {
                reads.fetch_add(1, Ordering::SeqCst);
                async { "[]" }
            }
        };
        let create = {
            let calls = Arc::clone(&calls);
            move || {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("order {n}")) }
            }
        };
        let app = |idem: &Idempotency| {
            Router::new()
                .route("/items", axum_get(list.clone()).post(create.clone()))
                .layer(idem.layer())
        };
        let passing = app(&Idempotency::new(MemoryStore::new()));

        for method in [http::Method::GET, http::Method::HEAD, http::Method::GET] {
            let request = Request::builder()
                .method(method.clone())
                .uri("/items")
                .body(Body::empty())
                .expect("a request");
            let reply = send(&passing, request).await;
            assert_eq!(reply.status, StatusCode::OK, "{method}: {reply:?}");
            assert!(!reply.replayed());
        }
        assert_eq!(reads.load(Ordering::SeqCst), 3, "every read ran");
        let unkeyed = send(&passing, post("/items", None, ORDER)).await;
        unkeyed.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
        let created = send(&passing, post("/items", Some("k-items"), ORDER)).await;
        let replayed = send(&passing, post("/items", Some("k-items"), ORDER)).await;
        assert_eq!(created.status, StatusCode::CREATED);
        assert!(replayed.replayed());
        assert_eq!(count(&calls), 1);

        let strict = app(&Idempotency::builder(MemoryStore::new())
            .safe_methods_pass_through(false)
            .build());
        let get = Request::get("/items")
            .body(Body::empty())
            .expect("a request");
        send(&strict, get)
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "key-missing");
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn key_parts_only_the_server_supplies_are_refused_when_the_layer_is_built() {
        let idem = Idempotency::new(MemoryStore::new());
        for template in [
            "order:{user}:{header:idempotency-key}",
            "order:{tenant}:{query:id}",
        ] {
            let err = idem.layer_with_key(template).expect_err(template);
            assert_eq!(err.kind(), ErrorKind::Config, "{template}");
            let text = err.to_string();
            assert!(
                text.contains("resolver") && text.contains("Idempotency::builder"),
                "{text}"
            );
        }
        let err = idem
            .layer_with_key("order:{header:idempotency-key")
            .expect_err("unclosed");
        assert_eq!(err.kind(), ErrorKind::Config);
        let err = idem
            .layer_with_key("order:{header:idempotency-key}")
            .expect("valid")
            .transactional()
            .expect_err("the memory store has no transactions");
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("PgStore"), "{err}");
    }

    /// `{path:NAME}` naming a parameter the matched route lacks is the
    /// server's mistake: 500, never a 400 that blames the client.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_path_parameter_the_route_lacks_is_a_server_error() {
        let calls = calls();
        let idem = Idempotency::new(MemoryStore::new());
        let app = payments_app(&calls, &idem, "pay-callback:{path:payment_id}");
        let reply = send(&app, post("/payments/P-1/callback", None, ORDER)).await;
        reply.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
        assert!(
            reply.text().contains("/payments/{payment_no}/callback"),
            "{reply:?}"
        );
        assert_eq!(count(&calls), 0);
    }

    fn payments_app(calls: &Arc<AtomicUsize>, idem: &Idempotency, template: &str) -> Router {
        let calls = Arc::clone(calls);
        let handler = move |Path(payment_no): Path<String>| {
            let calls = Arc::clone(&calls);
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                (StatusCode::OK, format!("{payment_no} credited by call {n}"))
            }
        };
        let layer = match template {
            "" => idem.layer(),
            template => idem.layer_with_key(template).expect("a valid template"),
        };
        Router::new().route(
            "/payments/{payment_no}/callback",
            axum_post(handler).layer(layer),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn path_placeholder_is_read_from_the_axum_router() {
        let calls = calls();
        let idem = Idempotency::new(MemoryStore::new());
        let app = payments_app(&calls, &idem, "pay-callback:{path:payment_no}");
        let paid = r#"{"status":"PAID","amount_cents":500}"#;

        let first = send(&app, post("/payments/P-1/callback", None, paid)).await;
        let again = send(&app, post("/payments/P-1/callback", None, paid)).await;
        let encoded = send(&app, post("/payments/P%2D1/callback", None, paid)).await;
        let other = send(&app, post("/payments/P-2/callback", None, paid)).await;

        assert_eq!(first.status, StatusCode::OK);
        assert_eq!(first.text(), "P-1 credited by call 1");
        assert!(!first.replayed());
        assert!(again.replayed() && encoded.replayed(), "{encoded:?}");
        assert_eq!(encoded.body, first.body);
        assert_eq!(other.text(), "P-2 credited by call 2");
        assert!(!other.replayed());
        assert_eq!(count(&calls), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn default_layer_behind_axum_keys_by_header_and_matched_route() {
        let calls = calls();
        let idem = Idempotency::new(MemoryStore::new());
        let app = payments_app(&calls, &idem, "");
        let paid = r#"{"status":"PAID","amount_cents":500}"#;

        let missing = send(&app, post("/payments/P-1/callback", None, paid)).await;
        missing.assert_problem(StatusCode::BAD_REQUEST, "key-missing");
        let first = send(&app, post("/payments/P-1/callback", Some("k-ax"), paid)).await;
        let again = send(&app, post("/payments/P-1/callback", Some("k-ax"), paid)).await;

        assert_eq!(first.text(), "P-1 credited by call 1");
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(count(&calls), 1);
    }

    /// As `same_key_on_two_resources_of_one_route_never_replays_across_them`,
    /// behind axum, where the route comes from `MatchedPath`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn same_key_on_two_resources_behind_axum_never_replays_across_them() {
        let calls = calls();
        let idem = Idempotency::new(MemoryStore::new());
        let app = payments_app(&calls, &idem, "");
        let paid = r#"{"status":"PAID","amount_cents":500}"#;

        let first = send(&app, post("/payments/P-1/callback", Some("k-cb"), paid)).await;
        let second = send(&app, post("/payments/P-2/callback", Some("k-cb"), paid)).await;

        assert_eq!(first.text(), "P-1 credited by call 1");
        assert!(
            !second.replayed(),
            "P-2's callback got P-1's response replayed: {second:?} (calls: {})",
            count(&calls)
        );
        assert!(
            second.status == StatusCode::UNPROCESSABLE_ENTITY || count(&calls) == 2,
            "{second:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// lease renewal (plain mode)

/// The lease of the renewal tests: the layer renews it every 100 ms.
const RENEWED_LEASE: Duration = Duration::from_millis(300);

/// A handler running three leases long keeps its claim: the layer renews
/// the lease while it runs, so every duplicate, before and after the first
/// lease would have ended, is told "in flight" (never handed the key), and
/// once it returns they are replayed its response. One run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_running_three_leases_long_keeps_its_claim() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(RENEWED_LEASE * 3).await;
        created(n)
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(RENEWED_LEASE)
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/orders", Some("k-renewed"), ORDER);

    let started = Instant::now();
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    wait_for_calls(&calls, 1).await;
    let mut in_flight_at = Vec::new();
    while !first.is_finished() {
        let duplicate = send(&service, request()).await;
        if first.is_finished() && duplicate.replayed() {
            break;
        }
        duplicate.assert_problem(StatusCode::CONFLICT, "in-flight");
        in_flight_at.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = first.await.expect("the first answers");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.text(), order_body(1));
    let last = *in_flight_at.last().expect("duplicates while it ran");
    assert!(
        last > RENEWED_LEASE * 2,
        "no duplicate came after two leases: {in_flight_at:?}"
    );
    assert!(
        in_flight_at
            .iter()
            .filter(|at| **at > RENEWED_LEASE)
            .count()
            >= 5,
        "too few duplicates after the first lease: {in_flight_at:?}"
    );

    for _ in 0..3 {
        let replay = send(&service, request()).await;
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(replay.text(), order_body(1));
    }
    assert_eq!(count(&calls), 1, "three leases long, one run");
}

/// A duplicate that waits (`InFlightPolicy::Wait`) for a handler running three
/// leases long waits it out and replays its response: the renewals keep it
/// from taking the key over when the first lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_duplicate_outwaits_a_handler_three_leases_long_and_replays() {
    let calls = calls();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(RENEWED_LEASE * 3).await;
        created(n)
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(RENEWED_LEASE)
        .in_flight(InFlightPolicy::Wait(Duration::from_secs(5)))
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/orders", Some("k-renewed-wait"), ORDER);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    wait_for_calls(&calls, 1).await;
    let waited = send(&service, request()).await;
    let first = first.await.expect("the first answers");

    assert_eq!(first.status, StatusCode::CREATED);
    assert!(waited.replayed(), "{waited:?}");
    assert_eq!(waited.body, first.body);
    assert_eq!(count(&calls), 1);
}
