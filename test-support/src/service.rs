//! What the layer's tests (idem-tower's `layer` and `attribute`) drive
//! their services with: requests, replies, and a count of handler runs. Every
//! test asserts that count: the point of the layer is how many times the
//! handler runs, not only what status the client sees.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{HeaderValue, Request, Response, header};
use tower::{Service, ServiceExt};

pub use crate::reply::Reply;

/// The header the default key template reads.
pub const KEY_HEADER: &str = "idempotency-key";

/// How many times a handler ran, shared by the test and its handler.
#[derive(Debug, Clone, Default)]
pub struct Calls(Arc<AtomicUsize>);

impl Calls {
    /// Counts one run and returns its number, from 1.
    pub fn run(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The runs so far.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits until the handler has been entered `n` times (5 s at most).
    pub async fn wait_for(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.get() < n {
            assert!(Instant::now() < deadline, "the handler was not called");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Sends one request through a clone of `service` and reads the reply.
pub async fn send<S, B>(service: &S, request: Request<Body>) -> Reply
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

/// A POST with a JSON body and, if given, an `Idempotency-Key`.
pub fn post(path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header(KEY_HEADER, key);
    }
    builder
        .body(Body::from(body.to_owned()))
        .expect("a valid request")
}

/// `request`, signed in as `user`: `Authorization: Bearer <user>`.
pub fn signed(mut request: Request<Body>, user: &str) -> Request<Body> {
    request.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {user}")).expect("a header value"),
    );
    request
}

/// The service's own authentication extractor: the user of a [`signed`]
/// request, or 401.
pub struct CurrentUser(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for CurrentUser {
    type Rejection = (http::StatusCode, &'static str);

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
            .ok_or((http::StatusCode::UNAUTHORIZED, "who are you?"))
    }
}
