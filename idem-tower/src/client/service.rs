//! `IdempotencyClient`: one logical request, its key made once, its body
//! buffered once, sent until an answer is final or the policy says stop.

use std::fmt;
use std::future::{Future, poll_fn};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use idem_core::BoxError;
use tower::Service;
use tracing::Instrument;

use super::attempt::{Schedule, within};
use super::key::{self, KEY_HEADER, KeyOrigin, KeyStyle, OperationKey};
use super::policy::{Cause, RetryPolicy, Verdict};
use super::report::{ClientError, ClientErrorKind, RetryReport};
use crate::layer::RebuildBody;

/// An HTTP client service that sends each request with an
/// `Idempotency-Key` (the caller's, or one made for it) and retries it,
/// same key, same body, on transient failures ([`RetryPolicy`]).
///
/// The body is buffered (up to `RetryPolicy::max_body`) so it can be
/// re-sent, and each attempt hands the inner service a body of type `IB`
/// made again from those bytes ([`RebuildBody`]): `Full<Bytes>` by
/// default, tonic's body for a tonic `Channel`
/// ([`IdempotencyClientLayer::grpc`](super::IdempotencyClientLayer::grpc)).
/// Every response carries a [`RetryReport`] extension.
pub struct IdempotencyClient<S, IB = Full<Bytes>> {
    inner: S,
    policy: Arc<RetryPolicy>,
    keys: KeyStyle,
    body: PhantomData<fn() -> IB>,
}

impl<S: Clone, IB> Clone for IdempotencyClient<S, IB> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.policy), self.keys)
    }
}

impl<S: fmt::Debug, IB> fmt::Debug for IdempotencyClient<S, IB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyClient")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .field("keys", &self.keys)
            .finish()
    }
}

impl<S, IB> IdempotencyClient<S, IB> {
    pub(crate) fn new(inner: S, policy: Arc<RetryPolicy>, keys: KeyStyle) -> Self {
        Self {
            inner,
            policy,
            keys,
            body: PhantomData,
        }
    }

    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, B, IB, RB> Service<Request<B>> for IdempotencyClient<S, IB>
where
    S: Service<Request<IB>, Response = Response<RB>> + Clone + Send + 'static,
    IB: RebuildBody + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = ClientError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, ClientError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each attempt waits for a clone of the inner service to be ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let policy = Arc::clone(&self.policy);
        Box::pin(deliver(inner, policy, self.keys, request))
    }
}

/// What one attempt came to.
enum Attempt<RB> {
    Answered(Response<RB>),
    Failed(Cause, Option<BoxError>),
}

async fn deliver<S, B, IB, RB>(
    inner: S,
    policy: Arc<RetryPolicy>,
    keys: KeyStyle,
    request: Request<B>,
) -> Result<Response<RB>, ClientError>
where
    S: Service<Request<IB>, Response = Response<RB>> + Clone,
    IB: RebuildBody,
    S::Error: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    // Once per logical request, never per attempt.
    let given = parts.extensions.get::<OperationKey>();
    let origin = key::ensure(&parts.method, &mut parts.headers, given, keys);
    let key = parts
        .headers
        .get(KEY_HEADER)
        .cloned()
        .filter(|_| origin != KeyOrigin::NotSent);
    let body = buffer(body, policy.max_body)
        .await
        .map_err(|e| e.with_report(key.clone(), origin))?;
    let mut schedule = Schedule::start(policy);

    loop {
        let mut request = Request::new(IB::rebuild(body.clone()));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.version_mut() = parts.version;
        *request.headers_mut() = parts.headers.clone();
        *request.extensions_mut() = parts.extensions.clone();

        let span = schedule.begin(&parts.method, parts.uri.path());
        let attempt = send(inner.clone(), request, schedule.timeout())
            .instrument(span.clone())
            .await;
        let attempts = schedule.attempts();

        let (cause, retry_after, attempt) = match attempt {
            Attempt::Answered(response) => {
                span.record("status", response.status().as_u16());
                match schedule
                    .policy()
                    .classify(response.status(), response.headers())
                {
                    Verdict::Final => return Ok(answer(response, attempts, key, origin)),
                    Verdict::Retry { cause, retry_after } => {
                        (cause, retry_after, Attempt::Answered(response))
                    }
                }
            }
            Attempt::Failed(cause, source) => (cause, None, Attempt::Failed(cause, source)),
        };

        let Some(wait) = schedule.retry(&span, cause, retry_after) else {
            return match attempt {
                Attempt::Answered(response) => Ok(answer(response, attempts, key, origin)),
                Attempt::Failed(cause, source) => {
                    Err(
                        ClientError::new(ClientErrorKind::Exhausted(cause), attempts, source)
                            .with_report(key, origin),
                    )
                }
            };
        };
        // The answer being retried is dropped (its connection closed or
        // returned) before the wait.
        drop(attempt);
        tokio::time::sleep(wait).await;
    }
}

/// The body, whole, or why it cannot be re-sent.
async fn buffer<B>(body: B, max: usize) -> Result<Bytes, ClientError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => {
            Err(ClientError::new(ClientErrorKind::BodyTooLarge, 0, Some(e)))
        }
        Err(e) => Err(ClientError::new(ClientErrorKind::Body, 0, Some(e))),
    }
}

async fn send<S, IB, RB>(
    mut inner: S,
    request: Request<IB>,
    timeout: Option<Duration>,
) -> Attempt<RB>
where
    S: Service<Request<IB>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    let call = async move {
        poll_fn(|cx| inner.poll_ready(cx)).await?;
        inner.call(request).await
    };
    match within(timeout, call).await {
        Ok(Ok(response)) => Attempt::Answered(response),
        Ok(Err(e)) => Attempt::Failed(Cause::Connection, Some(e.into())),
        Err(elapsed) => Attempt::Failed(Cause::Timeout, Some(Box::new(elapsed))),
    }
}

/// The final answer, with how it was obtained in its extensions.
fn answer<RB>(
    mut response: Response<RB>,
    attempts: u32,
    key: Option<HeaderValue>,
    origin: KeyOrigin,
) -> Response<RB> {
    let delivery = RetryReport::new(attempts, response.headers(), key, origin);
    // A gRPC error in the head (trailers-only) becomes a `tonic::Status`,
    // which keeps the head's fields and not the extensions.
    if crate::layer::grpc::status(response.headers()).is_some_and(|code| code != 0) {
        delivery.mark(response.headers_mut());
    }
    response.extensions_mut().insert(delivery);
    response
}
