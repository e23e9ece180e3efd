//! The inner services the layer wraps, and the requests only this binary
//! sends.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use idem_core::{Claim, Error, Fingerprint, IdempotencyKey, Outcome, OwnerToken};
use idem_tower::MemoryStore;
use idem_tower::core::IdempotencyStore;
use tower::{Service, ServiceExt, service_fn};

use crate::support::{Calls, KEY_HEADER, Reply, post, send};

/// The order most tests send.
pub(crate) const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;
/// [`ORDER`] with another quantity: the same key for it is a mismatch.
pub(crate) const OTHER_ORDER: &str = r#"{"sku":"A-1","qty":3}"#;

/// Sends `n` copies of a request at once: each from its own task, released
/// together by a barrier.
pub(crate) async fn concurrently<S, B>(
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

/// A POST carrying the key header once per value given, values taken as raw
/// bytes.
pub(crate) fn post_with_key_values(values: &[&[u8]], body: &str) -> Request<Body> {
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
pub(crate) fn streamed(chunks: Vec<Bytes>) -> Body {
    let stream = futures_util::stream::iter(chunks).then(|chunk| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok::<_, Infallible>(chunk)
    });
    Body::from_stream(stream)
}

/// The handler: a `service_fn` that counts its runs in `calls` and answers
/// with `f(run number, request)`.
pub(crate) fn counting<F, Fut, B>(
    calls: &Calls,
    f: F,
) -> impl Service<Request<Body>, Response = Response<B>, Error = Infallible, Future: Send + 'static>
+ Clone
+ Send
+ 'static
where
    F: Fn(usize, Request<Body>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
{
    let calls = calls.clone();
    service_fn(move |request: Request<Body>| {
        let calls = calls.clone();
        let f = f.clone();
        async move { Ok(f(calls.run(), request).await) }
    })
}

/// A JSON response.
pub(crate) fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// The usual handler answer: `201 {"order_id": n}`.
pub(crate) fn created(n: usize) -> Response<Full<Bytes>> {
    json(StatusCode::CREATED, order_body(n))
}

/// The body of [`created`]`(n)`.
pub(crate) fn order_body(n: usize) -> String {
    format!(r#"{{"order_id":{n}}}"#)
}

/// A body of `data`, then `trailers`.
pub(crate) fn with_trailers(
    data: &'static str,
    trailers: HeaderMap,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
    StreamBody::new(futures_util::stream::iter([
        Ok(Frame::data(Bytes::from_static(data.as_bytes()))),
        Ok(Frame::trailers(trailers)),
    ]))
}

/// The status, the replay marker, the body and the trailers of a response.
pub(crate) async fn read<B>(response: Response<B>) -> (StatusCode, bool, Bytes, Option<HeaderMap>)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let collected = response.into_body().collect().await.expect("a whole body");
    let trailers = collected.trailers().cloned();
    (status, replayed, collected.to_bytes(), trailers)
}

/// A memory store that counts the claims it is asked for and fails its
/// first `failures` completions, as a store does through an outage (the
/// handler's outcome cannot be recorded); every other call goes to the
/// memory store.
#[derive(Default)]
pub(crate) struct WatchedStore {
    store: MemoryStore,
    pub(crate) claims: Arc<AtomicUsize>,
    failures: AtomicUsize,
}

impl WatchedStore {
    /// Every completion fails.
    pub(crate) fn completions_fail() -> Self {
        Self::first_completions_fail(usize::MAX)
    }

    /// The first `failures` completions fail.
    pub(crate) fn first_completions_fail(failures: usize) -> Self {
        Self {
            failures: failures.into(),
            ..Self::default()
        }
    }
}

impl IdempotencyStore for WatchedStore {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, Error> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.store.claim(key, fingerprint, lease, owner).await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error> {
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(connection_refused());
        }
        self.store.complete(key, owner, outcome, ttl).await
    }

    async fn release(&self, key: &IdempotencyKey, owner: &OwnerToken) -> Result<(), Error> {
        self.store.release(key, owner).await
    }

    async fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> Result<(), Error> {
        self.store.renew(key, owner, lease).await
    }
}

/// The error a store whose backend is down answers with.
pub(crate) fn connection_refused() -> Error {
    Error::unavailable(std::io::Error::other("connection refused"))
}

/// Sends `request()` until the answer is not 409 in flight, for `within` at
/// most: the first other answer.
pub(crate) async fn past_in_flight<S, B>(
    service: &S,
    request: impl Fn() -> Request<Body>,
    within: Duration,
) -> Reply
where
    S: Service<Request<Body>, Response = Response<B>> + Clone,
    S::Error: fmt::Debug,
    B: http_body::Body,
    B::Error: fmt::Debug,
{
    let started = Instant::now();
    loop {
        let reply = send(service, request()).await;
        if reply.status != StatusCode::CONFLICT {
            return reply;
        }
        reply.assert_problem(StatusCode::CONFLICT, "in-flight");
        assert!(
            started.elapsed() < within,
            "still in flight after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
