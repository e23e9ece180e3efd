//! The service the layer makes, and the one path a request takes through it.

use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use idem_core::BoxError;
use tower::Service;
use tracing::Instrument;

use super::answer::Wire;
use super::claim::Claimed;
use super::future::MustFinish;
use super::layer::Settings;
use super::{RebuildBody, ResponseFuture, claim, key, read, settle};
use crate::layer::ResponseBody;
use crate::metrics::{self, Handled, RouteLabel};

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
#[derive(Debug, Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    settings: Settings,
}

/// A generated tonic server keeps its name behind the layer, so the layer
/// can wrap one service: `Server::builder().add_service(layer.layer(svc))`.
#[cfg(feature = "grpc")]
impl<S: tonic::server::NamedService> tonic::server::NamedService for IdempotencyService<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> IdempotencyService<S> {
    pub(super) fn new(inner: S, settings: Settings) -> Self {
        Self { inner, settings }
    }
}

type Reply<B, E> = Result<Response<ResponseBody<B>>, E>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: RebuildBody + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Reply<ResBody, S::Error>>;

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
        let settings = self.settings.clone();
        ResponseFuture::new(|attempt| through(settings, ready, request, attempt).instrument(span))
    }
}

/// One request through the layer: read the request, resolve its caller and
/// key, claim the key, call the service, settle its outcome (ARCHITECTURE.md,
/// "Bird's-eye view"). Once the claim is sent, the rest cannot be cancelled
/// (ARCHITECTURE.md, "Records"): `attempt` says so to the
/// [`ResponseFuture`] this runs in. A step that answers the request itself ends the path
/// there, with the layer's own [`Answer`](super::answer::Answer).
async fn through<S, ReqBody, ResBody>(
    settings: Settings,
    mut inner: S,
    request: Request<ReqBody>,
    attempt: MustFinish,
) -> Reply<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: RebuildBody + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    let route = key::matched_route(request.extensions(), &settings.policy);
    let label = route.clone().unwrap_or_else(metrics::unknown_route);
    if read::passes_through(&settings, request.method()) {
        metrics::request(Handled::SafeMethod, &label);
        return Ok(inner.call(request).await?.map(ResponseBody::inner));
    }
    if read::not_selected(&settings, request.uri().path()) {
        metrics::request(Handled::Unkeyed, &label);
        return Ok(inner.call(request).await?.map(ResponseBody::inner));
    }

    // Read the request: who is calling (the resolvers run first), then,
    // unless the head already says the request carries no key, the body.
    let wire = Wire::of(request.headers());
    let (mut parts, body) = request.into_parts();
    let caller = match read::caller(&settings, &mut parts).await {
        Ok(caller) => caller,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };
    let params = key::path_params(&mut parts, &settings.policy).await;
    if key::absent_from_head(&settings, &parts, &params) {
        tracing::debug!("no idempotency key on an optional route; passing through");
        metrics::request(Handled::Unkeyed, &label);
        let request = Request::from_parts(parts, body);
        return Ok(inner.call(request).await?.map(ResponseBody::inner));
    }
    let body = match read::body(&settings, &parts.headers, body).await {
        Ok(body) => body,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };

    // Resolve the key; an optional key that is absent lets the request through.
    let target = match key::target(&settings, &parts, &params, &body, route, &caller) {
        Ok(Some(target)) => target,
        Ok(None) => {
            tracing::debug!("no idempotency key on an optional route; passing through");
            metrics::request(Handled::Unkeyed, &label);
            let request = Request::from_parts(parts, ReqBody::rebuild(body));
            return Ok(inner.call(request).await?.map(ResponseBody::inner));
        }
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };

    // Claim it: the key is ours, or a duplicate is answered. From here the
    // attempt is not cut off with its client: a claim already sent may land
    // in the store after the client has gone, and would then hold the key
    // until its lease ran out.
    attempt.set();
    let held = match claim::claim(&settings, target, &label, &attempt).await {
        Ok(held) => held,
        Err(answer) => return Ok(answer.respond(&settings, &label, wire)),
    };
    if attempt.client_gone() {
        // Nobody waits for a response: the key goes free at once, and the
        // service is not called. (The response below is read by no one.)
        metrics::request(Handled::NotRun, &label);
        held.abort("the client went away before the service was called")
            .await;
        return Ok(Response::new(ResponseBody::full(Bytes::new())));
    }

    // Call the service and settle its outcome, whether or not the client
    // waits for it: a handler that has started runs to its end even if the
    // client goes (its effect may be half made), and its outcome is settled
    // either way.
    call_and_settle(settings, held, inner, parts, body, label, wire).await
}

/// Calls the service while the claim is held, then keeps a final outcome or
/// lets the key go for a retry.
async fn call_and_settle<S, ReqBody, ResBody>(
    settings: Settings,
    mut claimed: Claimed,
    mut inner: S,
    mut parts: http::request::Parts,
    body: Bytes,
    label: RouteLabel,
    wire: Wire,
) -> Reply<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: RebuildBody,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send,
{
    claimed.lend(&mut parts.extensions);
    let request = Request::from_parts(parts, ReqBody::rebuild(body));
    let call = async { inner.call(request).await };
    let called = AssertUnwindSafe(claimed.hold(call, &label))
        .catch_unwind()
        .await;
    match called {
        Ok(Ok(response)) => Ok(settle::settle(settings, claimed, response, label, wire).await),
        Ok(Err(err)) => {
            metrics::request(Handled::Released, &label);
            claimed.abort("service error").await;
            Err(err)
        }
        Err(panic) => {
            metrics::request(Handled::Released, &label);
            claimed.abort("panicked").await;
            std::panic::resume_unwind(panic)
        }
    }
}
