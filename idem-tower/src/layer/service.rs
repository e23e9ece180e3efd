use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{
    BoxError, Claim, ErrorKind, Fingerprint, IdempotencyKey, KeyError, Outcome, RequestView,
    StoredResponse,
};
use tower::Service;
use tracing::Instrument;

use super::{IdempotencyLayer, ResponseFuture};
use crate::body::ResponseBody;
use crate::guard::ClaimGuard;
use crate::problem::Problem;
use crate::{InFlight, REPLAYED_HEADER};

/// How often a completion that failed on a store error is tried in all.
const COMPLETE_ATTEMPTS: u32 = 3;

/// The service made by [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    layer: IdempotencyLayer,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, layer: IdempotencyLayer) -> Self {
        Self { inner, layer }
    }
}

type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Answer<ResBody, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone takes the place of the service that was polled ready.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let span = tracing::info_span!(
            "idempotency",
            method = %request.method(),
            key = tracing::field::Empty
        );
        ResponseFuture::new(attempt(self.layer.clone(), ready, request).instrument(span))
    }
}

/// Where one request's claim lives.
struct Target {
    key: IdempotencyKey,
    fingerprint: Fingerprint,
}

/// One request through the layer, DESIGN section 2's data flow.
async fn attempt<S, ReqBody, ResBody>(
    layer: IdempotencyLayer,
    mut inner: S,
    request: Request<ReqBody>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: Body + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    let config = &layer.idem.config;
    let (mut parts, body) = request.into_parts();
    let body = match read_body(body, config.max_body, &parts.headers).await {
        Ok(body) => body,
        Err(problem) => return Ok(problem.to_response()),
    };
    let target = match target(&layer, &mut parts, &body).await {
        Ok(Some(target)) => target,
        Ok(None) => {
            tracing::debug!("no idempotency key on an optional route; passing through");
            let response = inner.call(Request::from_parts(parts, ReqBody::from(body)));
            return Ok(response.await?.map(ResponseBody::inner));
        }
        Err(problem) => return Ok(problem.to_response()),
    };
    tracing::Span::current().record("key", target.key.redacted());

    let claim = match claim(&layer, &target).await {
        Ok(claim) => claim,
        Err(err) => {
            tracing::error!(error = %err, "idempotency store unavailable; handler not called");
            return Ok(Problem::StoreUnavailable {
                retry_after: config.unavailable_retry_after,
            }
            .to_response());
        }
    };
    let owner = match claim {
        Claim::Acquired(owner) => owner,
        Claim::Replay(Outcome::Response(stored)) => {
            tracing::info!(status = stored.status().as_u16(), "replayed stored response");
            return Ok(replay(stored));
        }
        Claim::Replay(Outcome::NotReplayable) => {
            tracing::info!("completed without a replayable response");
            return Ok(Problem::NotReplayable.to_response());
        }
        Claim::InFlight { retry_after } => {
            tracing::info!(?retry_after, "duplicate of a request in flight");
            return Ok(Problem::InFlight { retry_after }.to_response());
        }
        Claim::Mismatch => {
            tracing::warn!("idempotency key reused with a different request");
            return Ok(Problem::FingerprintMismatch.to_response());
        }
    };
    tracing::debug!("claimed; calling the service");
    let guard = ClaimGuard::new(config.store.clone(), target.key, owner);

    let request = Request::from_parts(parts, ReqBody::from(body));
    let called = AssertUnwindSafe(async { inner.call(request).await })
        .catch_unwind()
        .await;
    match called {
        Ok(Ok(response)) => Ok(finish(&layer, guard, response).await),
        Ok(Err(err)) => {
            guard.release("service error").await;
            Err(err)
        }
        Err(panic) => {
            guard.release("panicked").await;
            std::panic::resume_unwind(panic)
        }
    }
}

/// Buffers the request body up to `limit` bytes.
async fn read_body<B>(body: B, limit: usize, headers: &HeaderMap) -> Result<Bytes, Problem>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Problem::BodyTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(Problem::BodyTooLarge { limit })
        }
        Err(_) => Err(Problem::BodyUnreadable),
    }
}

/// Builds the key and fingerprint; `None` when an optional key is absent.
async fn target(
    layer: &IdempotencyLayer,
    parts: &mut Parts,
    body: &Bytes,
) -> Result<Option<Target>, Problem> {
    let config = &layer.idem.config;
    let policy = &*layer.policy;
    let route = route_of(parts, policy);
    let params = path_params(parts, policy).await;
    let tenant = config.tenant.as_ref().and_then(|r| r.resolve(parts));
    let user = config.user.as_ref().and_then(|r| r.resolve(parts));
    let view = RequestView::new(&parts.method, &route, &parts.headers)
        .path_params(&params)
        .query(parts.uri.query())
        .body(body)
        .tenant(tenant.as_deref())
        .user(user.as_deref());
    let key = match policy.template.evaluate(&view, &config.namespace) {
        Ok(key) => key,
        Err(KeyError::Missing(p)) if !policy.required && p.is_client_supplied() => {
            return Ok(None);
        }
        Err(err) => return Err(key_problem(err)),
    };
    let fingerprint = Fingerprint::of(&view, &policy.fingerprint).map_err(key_problem)?;
    Ok(Some(Target { key, fingerprint }))
}

fn key_problem(err: KeyError) -> Problem {
    match err {
        KeyError::Missing(_) => Problem::KeyMissing(err.to_string()),
        _ => Problem::KeyInvalid(err.to_string()),
    }
}

fn route_of(parts: &Parts, policy: &super::Policy) -> String {
    #[cfg(feature = "axum")]
    if let Some(route) = crate::axum::matched_route(parts) {
        return route.to_owned();
    }
    match &policy.route {
        Some(pattern) => pattern.as_str().to_owned(),
        None => parts.uri.path().to_owned(),
    }
}

async fn path_params(parts: &mut Parts, policy: &super::Policy) -> Vec<(String, String)> {
    let needs_params = policy
        .template
        .placeholders()
        .any(|p| matches!(p, idem_core::Placeholder::Path(_)));
    if !needs_params {
        return Vec::new();
    }
    #[cfg(feature = "axum")]
    if let Some(params) = crate::axum::path_params(parts).await {
        return params;
    }
    policy
        .route
        .as_ref()
        .and_then(|pattern| pattern.captures(parts.uri.path()))
        .unwrap_or_default()
}

/// Claims the key, waiting for an in-flight first attempt if so configured.
async fn claim(layer: &IdempotencyLayer, target: &Target) -> Result<Claim, idem_core::Error> {
    let config = &layer.idem.config;
    let lease = layer.policy.lease.unwrap_or(config.lease);
    let store = &*config.store;
    let wait = match layer.policy.in_flight.unwrap_or(config.in_flight) {
        InFlight::Reject => return store.claim(&target.key, &target.fingerprint, lease).await,
        InFlight::Wait(wait) => wait,
    };
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(10);
    loop {
        let claim = store.claim(&target.key, &target.fingerprint, lease).await?;
        let Claim::InFlight { retry_after } = claim else {
            return Ok(claim);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(claim);
        }
        let nap = pause.min(left).min(retry_after).max(Duration::from_millis(1));
        tokio::time::sleep(nap).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

fn replay<B: Body>(stored: StoredResponse) -> Response<ResponseBody<B>> {
    let (status, headers, body) = stored.into_parts();
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// What became of a response body read for storage.
enum Buffered<B: Body> {
    Whole(Bytes),
    /// Over the cap: the part read, and the rest still to stream.
    Partial(Bytes, Pin<Box<B>>),
    /// The body failed after this much.
    Failed(Bytes, B::Error),
}

async fn buffer_response<B: Body<Data = Bytes>>(body: B, cap: usize) -> Buffered<B> {
    let mut body = Box::pin(body);
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > cap {
                        return Buffered::Partial(buf.freeze(), body);
                    }
                }
            }
            Err(err) => return Buffered::Failed(buf.freeze(), err),
        }
    }
    Buffered::Whole(buf.freeze())
}

/// Classifies the handler's response, stores it or releases the key, and
/// returns what the client gets.
async fn finish<B>(
    layer: &IdempotencyLayer,
    guard: ClaimGuard,
    response: Response<B>,
) -> Response<ResponseBody<B>>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let config = &layer.idem.config;
    let status = response.status();
    if !(config.keep)(status) {
        guard.release("response not final").await;
        return response.map(ResponseBody::inner);
    }
    let (parts, body) = response.into_parts();
    let (outcome, body) = match buffer_response(body, config.max_stored_response).await {
        Buffered::Whole(bytes) => {
            let headers = replay_headers(layer, &parts.headers);
            let stored = StoredResponse::new(status, headers, bytes.clone());
            (Outcome::Response(stored), ResponseBody::full(bytes))
        }
        Buffered::Partial(prefix, rest) => {
            tracing::warn!(
                limit = config.max_stored_response,
                "response too large to store; duplicates will get 409"
            );
            (Outcome::NotReplayable, ResponseBody::prefixed(prefix, rest))
        }
        Buffered::Failed(prefix, err) => {
            // The handler ran; its effect must not run again.
            tracing::warn!("response body failed; completing as not replayable");
            (Outcome::NotReplayable, ResponseBody::failed(prefix, err))
        }
    };
    complete(layer, &guard, &outcome).await;
    guard.defuse();
    Response::from_parts(parts, body)
}

/// Stores the outcome. On failure the key stays claimed until its lease
/// ends, which blocks duplicates for that long; releasing instead would let a
/// retry run the effect a second time.
async fn complete(layer: &IdempotencyLayer, guard: &ClaimGuard, outcome: &Outcome) {
    let config = &layer.idem.config;
    let retention = layer.policy.retention.unwrap_or(config.retention);
    for attempt in 1..=COMPLETE_ATTEMPTS {
        let err = match guard
            .store()
            .complete(guard.key(), guard.owner(), outcome, retention)
            .await
        {
            Ok(()) => {
                tracing::debug!("completed");
                return;
            }
            Err(err) => err,
        };
        if err.kind() == ErrorKind::LeaseLost {
            tracing::error!(
                "lease expired before the handler finished and another attempt took the key; \
                 raise the lease above the handler's time budget"
            );
            return;
        }
        if attempt == COMPLETE_ATTEMPTS {
            tracing::error!(error = %err, "could not store the outcome; the key stays blocked until its lease ends");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
    }
}

fn replay_headers(layer: &IdempotencyLayer, headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for (name, value) in headers {
        if layer.idem.replays(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}
