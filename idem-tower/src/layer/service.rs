use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::{Either, select};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::store::{OpenTransaction, TxClaim};
use idem_core::{
    BoxError, Claim, ErrorKind, Fingerprint, IdempotencyKey, KeyError, KeyScope, Outcome,
    OwnerToken, Placeholder, RequestView, StoredResponse,
};
use tower::Service;
use tracing::Instrument;

use super::{IdempotencyLayer, ResponseFuture};
use crate::body::ResponseBody;
use crate::guard::ClaimGuard;
use crate::metrics::{self, Renewal, RequestOutcome};
use crate::problem::Problem;
use crate::resolver::Unresolved;
use crate::{HandlerRan, Idempotency, InFlightPolicy};

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

/// Safe methods, passed through untouched unless configured otherwise.
fn is_safe(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS | http::Method::TRACE
    )
}

/// One request through the layer: read the request, resolve the key,
/// claim, call, settle.
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
    ResBody::Error: Send,
{
    let config = &layer.idem.config;
    let route = matched_route(request.extensions(), &layer.policy);
    let label = route
        .clone()
        .unwrap_or_else(|| metrics::UNKNOWN_ROUTE.to_owned());
    if config.safe_methods_pass_through && is_safe(request.method()) {
        metrics::request(RequestOutcome::SafeMethod, &label);
        return Ok(inner.call(request).await?.map(ResponseBody::inner));
    }
    let (mut parts, body) = request.into_parts();
    if let Some(state) = &layer.policy.state {
        (state.0)(&mut parts.extensions);
    }
    let caller = match caller(&layer, &mut parts).await {
        Ok(caller) => caller,
        Err(Unresolved::Rejected(rejection)) => {
            tracing::debug!(
                status = rejection.status().as_u16(),
                "the caller's identity was refused; nothing claimed"
            );
            metrics::request(RequestOutcome::NotRun, &label);
            return Ok(rejection.map(ResponseBody::full));
        }
        Err(Unresolved::Misconfigured(why)) => return Ok(misconfigured(&label, why)),
        Err(Unresolved::Invalid(why)) => return Ok(rejected(&Problem::KeyInvalid(why), &label)),
    };
    let body = match read_body(body, config.max_body, &parts.headers).await {
        Ok(body) => body,
        Err(problem) => return Ok(rejected(&problem, &label)),
    };
    let route_or_path = route.as_deref().unwrap_or(parts.uri.path()).to_owned();
    let target = match target(&layer, &mut parts, &body, &route_or_path, &caller).await {
        Ok(Some(target)) => target,
        Ok(None) => {
            tracing::debug!("no idempotency key on an optional route; passing through");
            metrics::request(RequestOutcome::Unkeyed, &label);
            let response = inner.call(Request::from_parts(parts, ReqBody::from(body)));
            return Ok(response.await?.map(ResponseBody::inner));
        }
        Err(KeyProblem::Client(problem)) => return Ok(rejected(&problem, &label)),
        Err(KeyProblem::Server(why)) => return Ok(misconfigured(&label, why)),
    };
    let span = tracing::Span::current();
    // The redacted key is a hash: only worth computing if someone listens.
    if !span.is_disabled() {
        span.record("key", target.key.redacted());
    }

    if layer.policy.transactional {
        return in_transaction(&layer, inner, parts, body, target, label).await;
    }
    let started = Instant::now();
    let claimed = claim(&layer, &target).await;
    metrics::claim_latency(started.elapsed(), &label);
    let claim = match claimed {
        Ok(claim) => claim,
        Err(err) => return Ok(unavailable(&layer, &err, &label)),
    };
    let owner = match decide(&layer, &target.key, claim, &label) {
        Decision::Run(owner) => owner,
        Decision::Respond(response) => return Ok(response),
    };
    tracing::debug!("claimed; calling the service");
    let guard = ClaimGuard::new(config.store.clone(), target.key, owner);
    let lease = layer.policy.lease.unwrap_or(config.lease);

    let request = Request::from_parts(parts, ReqBody::from(body));
    let call = async { inner.call(request).await };
    let called = AssertUnwindSafe(renewing(&guard, lease, &label, call))
        .catch_unwind()
        .await;
    match called {
        Ok(Ok(response)) => Ok(detached(settle(layer.clone(), guard, response, label)).await),
        Ok(Err(err)) => {
            metrics::request(RequestOutcome::Released, &label);
            guard.release("service error").await;
            Err(err)
        }
        Err(panic) => {
            metrics::request(RequestOutcome::Released, &label);
            guard.release("panicked").await;
            std::panic::resume_unwind(panic)
        }
    }
}

/// Runs `call`, the service of a plain (non-transactional) claim, while
/// renewing the claim's lease every third of it, so that a handler may run
/// for many leases and a claim whose process died still frees within about
/// one. The renewals are polled in the same future as the handler, not
/// spawned: they stop when it returns or is dropped, and a handler that
/// finishes in its first poll never starts a timer.
async fn renewing<F: Future>(
    guard: &ClaimGuard,
    lease: Duration,
    route: &str,
    call: F,
) -> F::Output {
    let call = pin!(call);
    let heartbeat = pin!(heartbeat(guard, lease, route));
    match select(call, heartbeat).await {
        Either::Left((output, _)) => output,
        // The lease was lost: nothing left to renew.
        Either::Right(((), call)) => call.await,
    }
}

/// Renews the lease every third of it, on one timer, until the lease is
/// lost. A renewal that fails is logged and counted, and the next one is
/// tried a third of a lease later; one that has not answered by then is
/// given up and counted as failed, so a stalled store cannot hold the
/// renewals back. Returns once the store says the claim is no longer ours.
async fn heartbeat(guard: &ClaimGuard, lease: Duration, route: &str) {
    if tokio::runtime::Handle::try_current().is_err() {
        tracing::warn!(
            "no tokio runtime to time lease renewals; the claim lives by its first lease only"
        );
        return std::future::pending().await;
    }
    // Bounded, so that a lease meant as "forever" cannot overflow a deadline.
    let every = (lease / 3).clamp(Duration::from_millis(1), Duration::from_secs(86_400));
    let mut tick = pin!(tokio::time::sleep(every));
    loop {
        tick.as_mut().await;
        // The next tick is also this renewal's deadline.
        tick.as_mut().reset(tokio::time::Instant::now() + every);
        let renewal = guard.store().renew(guard.key(), guard.owner(), lease);
        match select(renewal, tick.as_mut()).await {
            Either::Left((Ok(()), _)) => metrics::renewal(Renewal::Ok, route),
            Either::Left((Err(err), _)) if err.kind() == ErrorKind::LeaseLost => {
                metrics::renewal(Renewal::Lost, route);
                tracing::error!(
                    ?lease,
                    "idempotency lease lost while the handler runs: another attempt may take \
                     the key over and run the effect again, and this attempt's outcome will not \
                     be stored"
                );
                return;
            }
            Either::Left((Err(err), _)) => {
                metrics::renewal(Renewal::Failed, route);
                tracing::warn!(error = %err, ?lease, "could not renew the idempotency lease; trying again");
            }
            Either::Right(((), _)) => {
                metrics::renewal(Renewal::Failed, route);
                tracing::warn!(
                    ?lease,
                    "renewing the idempotency lease timed out; trying again"
                );
                // Due already: the next renewal starts at once.
                tick.as_mut().reset(tokio::time::Instant::now());
            }
        }
    }
}

/// The request's tenant and user, as the handle's resolvers find them.
#[derive(Default)]
struct Caller {
    tenant: Option<String>,
    user: Option<String>,
}

/// Runs the resolvers the route needs: for the placeholders its template
/// names, and for the caller scope every record is bound to. A resolver
/// that refuses the request is answered with its rejection only where the
/// key names it; for the scope alone, a caller without identity is a scope
/// of its own.
async fn caller(layer: &IdempotencyLayer, parts: &mut Parts) -> Result<Caller, Unresolved> {
    let config = &layer.idem.config;
    let policy = &*layer.policy;
    let scoped = policy.scope == KeyScope::Caller;
    let mut caller = Caller::default();
    for (resolver, placeholder, slot) in [
        (&config.tenant, Placeholder::Tenant, &mut caller.tenant),
        (&config.user, Placeholder::User, &mut caller.user),
    ] {
        let Some(resolver) = resolver else { continue };
        let named = policy.template.placeholders().any(|p| *p == placeholder);
        if !named && !scoped {
            continue;
        }
        *slot = match resolver.resolve(parts).await {
            Ok(value) => value,
            Err(Unresolved::Rejected(_)) if !named => None,
            Err(err) => return Err(err),
        };
    }
    Ok(caller)
}

/// A route wired so that no request can succeed: the server's error, logged
/// with the fix.
fn misconfigured<B: Body>(route: &str, why: String) -> Response<ResponseBody<B>> {
    metrics::request(RequestOutcome::Misconfigured, route);
    tracing::error!(route, "idempotency misconfigured: {why}");
    Problem::Misconfigured(why).to_response()
}

/// A request the layer refused before claiming anything.
fn rejected<B: Body>(problem: &Problem, route: &str) -> Response<ResponseBody<B>> {
    metrics::request(
        match problem {
            Problem::BodyTooLarge { .. } => RequestOutcome::BodyTooLarge,
            Problem::KeyMissing(_) => RequestOutcome::MissingKey,
            _ => RequestOutcome::InvalidKey,
        },
        route,
    );
    problem.to_response()
}

/// Transactional mode: claim in a transaction, lend it to the handler, then
/// commit the handler's writes with the outcome, or roll both back.
async fn in_transaction<S, ReqBody, ResBody>(
    layer: &IdempotencyLayer,
    mut inner: S,
    mut parts: Parts,
    body: Bytes,
    target: Target,
    label: String,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: Body + From<Bytes>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    let config = &layer.idem.config;
    let Some(store) = config.store.transactional() else {
        // IdempotencyLayer::transactional checked this when it was built.
        unreachable!("a transactional layer on a store without transactions");
    };
    let lease = layer.policy.lease.unwrap_or(config.lease);
    let started = Instant::now();
    let mut patience = Patience::new(layer);
    let claimed = loop {
        let claimed = store
            .claim_in_transaction(
                &target.key,
                &target.fingerprint,
                lease,
                OwnerToken::generate(),
            )
            .await;
        match claimed {
            Ok(TxClaim::Duplicate(idem_core::Duplicate::InFlight { retry_after }))
                if patience.wait(retry_after).await => {}
            claimed => break claimed,
        }
    };
    metrics::claim_latency(started.elapsed(), &label);
    let tx = match claimed {
        Ok(TxClaim::Open(tx)) => tx,
        Ok(TxClaim::Duplicate(duplicate)) => {
            let claim = Claim::from(duplicate);
            return Ok(match decide(layer, &target.key, claim, &label) {
                Decision::Respond(response) => response,
                // The store broke its contract: Acquired comes with a transaction.
                Decision::Run(_) => unavailable(layer, &ErrorKind::Config.into(), &label),
            });
        }
        Err(err) => return Ok(unavailable(layer, &err, &label)),
    };
    tracing::debug!("claimed in a transaction; calling the service");
    parts.extensions.insert(tx.handle());
    let request = Request::from_parts(parts, ReqBody::from(body));
    let called = AssertUnwindSafe(async { inner.call(request).await })
        .catch_unwind()
        .await;
    let response = match called {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => {
            metrics::request(RequestOutcome::Released, &label);
            rollback(tx, "service error").await;
            return Err(err);
        }
        Err(panic) => {
            metrics::request(RequestOutcome::Released, &label);
            rollback(tx, "panicked").await;
            std::panic::resume_unwind(panic)
        }
    };
    Ok(detached(settle_transaction(layer.clone(), tx, response, label)).await)
}

/// Runs the work after the handler returned (storing or committing its
/// outcome) in place, and makes sure a client that disconnects now cannot
/// cancel it: the handler's effect happened, and its outcome must be stored
/// (or, on SQL, committed) whether or not anyone is still listening.
/// Otherwise the claim would be released and a retry would run the effect
/// again. If the request future is dropped before the work is done, the work
/// moves to a task of its own and finishes there (see [`Settling`]).
async fn detached<B>(
    settling: impl Future<Output = Response<ResponseBody<B>>> + Send + 'static,
) -> Response<ResponseBody<B>>
where
    B: Body + Send + 'static,
    B::Error: Send,
{
    Settling(Some(Box::pin(settling.in_current_span()))).await
}

/// Work that must finish once started: polled in place (no task to spawn on
/// the common path, where the client waits for its answer), and handed to a
/// spawned task if dropped unfinished.
struct Settling<F: Future<Output: Send> + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future<Output: Send> + Send + 'static> Future for Settling<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Taken out while polled: if the poll panics, the drop below finds
        // nothing to hand on, and the half-run future is not resumed.
        let mut settling = self.0.take().expect("polled after completion");
        match settling.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => {
                self.0 = Some(settling);
                Poll::Pending
            }
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for Settling<F> {
    fn drop(&mut self) {
        let Some(settling) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                tracing::debug!("request dropped while storing its outcome; finishing on a task");
                runtime.spawn(async move {
                    settling.await;
                });
            }
            // Dropping it here releases the claim through its guard, or rolls
            // the transaction back: the retry then runs the effect again.
            Err(_) => tracing::error!(
                "no tokio runtime to finish storing an outcome; the request's claim is abandoned"
            ),
        }
    }
}

/// Stores a final response, or releases the key for anything else.
async fn settle<B>(
    layer: IdempotencyLayer,
    guard: ClaimGuard,
    response: Response<B>,
    label: String,
) -> Response<ResponseBody<B>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
{
    match classify(&layer, response).await {
        Classified::Final(outcome, response) => {
            complete(&layer, &guard, &outcome).await;
            guard.defuse();
            metrics::request(RequestOutcome::First, &label);
            response
        }
        Classified::NotFinal(response) => {
            metrics::request(RequestOutcome::Released, &label);
            guard.release("response not final").await;
            response
        }
        Classified::NotRun(response) => {
            metrics::request(RequestOutcome::NotRun, &label);
            guard.release("refused before the handler ran").await;
            response
        }
    }
}

/// Commits a final response with the handler's writes, or rolls both back.
async fn settle_transaction<B>(
    layer: IdempotencyLayer,
    tx: Box<dyn OpenTransaction>,
    response: Response<B>,
    label: String,
) -> Response<ResponseBody<B>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
{
    match classify(&layer, response).await {
        Classified::Final(outcome, response) => {
            let config = &layer.idem.config;
            let retention = layer.policy.retention.unwrap_or(config.retention);
            match tx.commit(&outcome, retention).await {
                Ok(()) => {
                    tracing::debug!("committed the handler's writes with the outcome");
                    metrics::request(RequestOutcome::First, &label);
                    response
                }
                // Nothing committed: the handler's writes are gone too, so
                // the client must not see its success.
                Err(err) => unavailable(&layer, &err, &label),
            }
        }
        Classified::NotFinal(response) => {
            metrics::request(RequestOutcome::Released, &label);
            rollback(tx, "response not final").await;
            response
        }
        Classified::NotRun(response) => {
            metrics::request(RequestOutcome::NotRun, &label);
            rollback(tx, "refused before the handler ran").await;
            response
        }
    }
}

async fn rollback(tx: Box<dyn OpenTransaction>, reason: &'static str) {
    match tx.rollback().await {
        Ok(()) => tracing::info!(reason, "rolled back the handler's writes and the claim"),
        // The transaction ends with its connection either way.
        Err(err) => tracing::warn!(reason, error = %err, "rollback failed"),
    }
}

fn unavailable<B: Body>(
    layer: &IdempotencyLayer,
    err: &idem_core::Error,
    route: &str,
) -> Response<ResponseBody<B>> {
    metrics::request(RequestOutcome::StoreError, route);
    tracing::error!(error = %err, "idempotency store unavailable; handler not called or its writes not kept");
    Problem::StoreUnavailable {
        retry_after: layer.idem.config.unavailable_retry_after,
    }
    .to_response()
}

/// What to do with a claim's answer.
enum Decision<B: Body> {
    /// The key is ours: run the service.
    Run(OwnerToken),
    /// A duplicate: send this.
    Respond(Response<ResponseBody<B>>),
}

fn decide<B: Body>(
    layer: &IdempotencyLayer,
    key: &IdempotencyKey,
    claim: Claim,
    route: &str,
) -> Decision<B> {
    let outcome = match &claim {
        Claim::Acquired(_) => None,
        Claim::Replay(Outcome::Response(_)) => Some(RequestOutcome::Replayed),
        Claim::Replay(Outcome::NotReplayable) => Some(RequestOutcome::NotReplayable),
        Claim::InFlight { .. } => Some(RequestOutcome::InFlight),
        Claim::Mismatch => Some(RequestOutcome::Mismatch),
    };
    if let Some(outcome) = outcome {
        metrics::request(outcome, route);
        if outcome.is_collision() {
            layer.idem.config.duplicated.record(key.composite());
        }
    }
    match claim {
        Claim::Acquired(owner) => Decision::Run(owner),
        Claim::Replay(Outcome::Response(stored)) => {
            tracing::info!(
                status = stored.status().as_u16(),
                "replayed stored response"
            );
            Decision::Respond(replay(stored))
        }
        Claim::Replay(Outcome::NotReplayable) => {
            tracing::info!("completed without a replayable response");
            Decision::Respond(Problem::NotReplayable.to_response())
        }
        Claim::InFlight {
            retry_after: lease_left,
        } => {
            let retry_after = layer.idem.config.in_flight_retry_after.min(lease_left);
            tracing::info!(?retry_after, "duplicate of a request in flight");
            Decision::Respond(Problem::InFlight { retry_after }.to_response())
        }
        Claim::Mismatch => {
            tracing::warn!("idempotency key reused with a different request");
            Decision::Respond(Problem::FingerprintMismatch.to_response())
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

/// Why no key could be built: the client's request (400), or the route's
/// wiring (500).
enum KeyProblem {
    Client(Problem),
    Server(String),
}

/// Builds the key and fingerprint; `None` when an optional key is absent.
async fn target(
    layer: &IdempotencyLayer,
    parts: &mut Parts,
    body: &Bytes,
    route: &str,
    caller: &Caller,
) -> Result<Option<Target>, KeyProblem> {
    let config = &layer.idem.config;
    let policy = &*layer.policy;
    let params = path_params(parts, policy).await;
    let view = RequestView::new(&parts.method, route, &parts.headers)
        .path_params(&params)
        .query(parts.uri.query())
        .body(body)
        .tenant(caller.tenant.as_deref())
        .user(caller.user.as_deref());
    let key = match policy
        .template
        .evaluate_scoped(&view, &config.namespace, policy.scope)
    {
        Ok(key) => key,
        // Path parameters come from the route, never the client: one the
        // route lacks is a template written for another route.
        Err(KeyError::Missing(Placeholder::Path(name))) => {
            return Err(KeyProblem::Server(format!(
                "the key template `{}` reads {{path:{name}}}, and the route `{route}` has no \
                 such parameter: fix the template, or name the route's pattern with \
                 IdempotencyLayer::route when the service is not behind an axum router",
                policy.template
            )));
        }
        Err(KeyError::Missing(_)) if !policy.required && no_client_part(policy, &view) => {
            return Ok(None);
        }
        Err(err) => return Err(KeyProblem::Client(key_problem(err))),
    };
    let fingerprint = Fingerprint::of(&view, &policy.fingerprint)
        .map_err(|err| KeyProblem::Client(key_problem(err)))?;
    Ok(Some(Target { key, fingerprint }))
}

/// Whether the request carries none of the key's client-supplied parts: the
/// only case an optional key lets through undeduplicated.
fn no_client_part(policy: &super::Policy, view: &RequestView<'_>) -> bool {
    policy
        .template
        .placeholders()
        .filter(|p| p.is_client_supplied())
        .all(|p| !view.is_present(p))
}

fn key_problem(err: KeyError) -> Problem {
    match err {
        KeyError::Missing(_) => Problem::KeyMissing(err.to_string()),
        _ => Problem::KeyInvalid(err.to_string()),
    }
}

/// The route pattern: as axum matched it, or as the layer was told.
fn matched_route(extensions: &http::Extensions, policy: &super::Policy) -> Option<String> {
    #[cfg(feature = "axum")]
    if let Some(route) = extensions.get::<axum::extract::MatchedPath>() {
        return Some(route.as_str().to_owned());
    }
    #[cfg(not(feature = "axum"))]
    let _ = extensions;
    policy.route.as_ref().map(|p| p.as_str().to_owned())
}

/// The matched route's parameters: they name the resource, so they feed the
/// fingerprint even when the key does not read them.
async fn path_params(parts: &mut Parts, policy: &super::Policy) -> Vec<(String, String)> {
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
    let mut patience = Patience::new(layer);
    loop {
        let owner = OwnerToken::generate();
        let claim = store
            .claim(&target.key, &target.fingerprint, lease, owner)
            .await?;
        match claim {
            Claim::InFlight { retry_after } if patience.wait(retry_after).await => continue,
            claim => return Ok(claim),
        }
    }
}

/// How long a duplicate may still wait for the first attempt to finish,
/// under [`InFlightPolicy::Wait`]. Waiting holds nothing: no connection, no lock.
struct Patience {
    deadline: Option<Instant>,
    pause: Duration,
}

impl Patience {
    fn new(layer: &IdempotencyLayer) -> Self {
        let deadline = match layer
            .policy
            .in_flight
            .unwrap_or(layer.idem.config.in_flight)
        {
            InFlightPolicy::Reject => None,
            InFlightPolicy::Wait(wait) => Some(Instant::now() + wait),
        };
        Self {
            deadline,
            pause: Duration::from_millis(10),
        }
    }

    /// Sleeps before the next try (backing off, never past `retry_after`
    /// or the deadline); `false` if there is no time left to wait.
    async fn wait(&mut self, retry_after: Duration) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let nap = self
            .pause
            .min(left)
            .min(retry_after)
            .max(Duration::from_millis(1));
        tokio::time::sleep(nap).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(250));
        true
    }
}

fn replay<B: Body>(stored: StoredResponse) -> Response<ResponseBody<B>> {
    let (status, headers, body) = stored.into_parts();
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        Idempotency::REPLAYED_HEADER,
        HeaderValue::from_static("true"),
    );
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

/// A handler's response, sorted by the outcome policy.
enum Classified<B: Body> {
    /// Final: keep this outcome; send this response.
    Final(Outcome, Response<ResponseBody<B>>),
    /// Not final (5xx, 429, ...): release the key; send this response.
    NotFinal(Response<ResponseBody<B>>),
    /// Not the handler's: a rejection from before it ran, on a route that
    /// requires [`HandlerRan`]. Release the key; send this response.
    NotRun(Response<ResponseBody<B>>),
}

/// Applies the outcome policy, buffering a final response for storage.
async fn classify<B>(layer: &IdempotencyLayer, response: Response<B>) -> Classified<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let config = &layer.idem.config;
    let status = response.status();
    if layer.policy.require_handler_ran && response.extensions().get::<HandlerRan>().is_none() {
        // A refusal from before the handler is a client error; a success
        // without the mark is a handler that forgot it, and releasing it
        // would deduplicate nothing: kept, and said.
        if status.is_client_error() || status.is_server_error() {
            tracing::debug!(
                status = status.as_u16(),
                "refused before the handler ran; nothing kept"
            );
            return Classified::NotRun(response.map(ResponseBody::inner));
        }
        tracing::warn!(
            status = status.as_u16(),
            "a response without HandlerRan on a route that requires it: kept as the \
             handler's; mark the handler's responses with HandlerRan"
        );
    }
    if !(config.final_status)(status) {
        return Classified::NotFinal(response.map(ResponseBody::inner));
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
    Classified::Final(outcome, Response::from_parts(parts, body))
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
                "the lease ran out before the handler finished (its renewals failed, or could not \
                 run: a handler that blocks its thread starves them) and another attempt took \
                 the key; this outcome is not stored"
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
