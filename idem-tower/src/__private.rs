//! What `#[idempotent]` expansions name, and nothing else: not a public API,
//! exempt from semver. Generated code reaches everything it needs through
//! `::idem_tower::__private`, so it compiles whatever the user's crate
//! imports, renames or shadows.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::future::Map;
use tower::{Layer, Service};

use crate::layer::{Marking, Policy};

pub use ::axum;
pub use core::clone::Clone;
pub use core::fmt::Debug;
pub use core::marker::{Copy, Send, Sync};
pub use core::ops::Deref;
pub use core::result::Result::{Err, Ok};
pub use std::boxed::Box;
pub use std::time::Duration;

pub use crate::{FingerprintSpec, Idempotency, IdempotencyLayer, InFlightPolicy};

/// The `T` of an annotated handler's `Handler<T, S>` impl. `M` is the last
/// extractor's `FromRequest` marker, threaded through so the impl is not
/// ambiguous.
pub struct Marker<M>(PhantomData<fn() -> M>);

/// A router state an annotated handler can serve: one that gives an
/// [`Idempotency`] handle through `FromRef`. Named in the generated impl
/// instead of `Idempotency: FromRef<S>` itself, so that a state without the
/// handle is reported in these words (`do_not_recommend` stops the compiler
/// from reporting the `FromRef` bound behind it instead).
#[diagnostic::on_unimplemented(
    message = "the router state `{Self}` does not give an `Idempotency` handle",
    label = "this `#[idempotent]` handler needs an `Idempotency` handle from the router state `{Self}`",
    note = "implement `FromRef<{Self}> for Idempotency`, returning the handle the state keeps, or make the `Idempotency` handle itself the router state"
)]
pub trait StateWithHandle: Clone + Send + Sync + 'static {
    /// The handle.
    fn idempotency(&self) -> Idempotency;
}

#[diagnostic::do_not_recommend]
impl<S> StateWithHandle for S
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
{
    fn idempotency(&self) -> Idempotency {
        Idempotency::from_ref(self)
    }
}

/// A router state `Self` on which `E` can be an argument before the last:
/// `E: FromRequestParts<Self>`.
///
/// The generated impl bounds the state (`S: HeadArg<E>`) rather than the
/// extractor (`E: FromRequestParts<S>`): the compiler then checks the bound
/// once it knows the router state, and reports a failure in these words,
/// pointing at the argument, instead of a bare "`Handler<_, _>` is not
/// satisfied" at the route.
#[diagnostic::on_unimplemented(
    message = "`{E}` is not an extractor for the router state `{Self}`, so it cannot be an argument of this `#[idempotent]` handler",
    label = "this handler takes `{E}` as an argument",
    note = "every argument but the last must implement `FromRequestParts<{Self}>`, as `Path`, `Query`, `HeaderMap`, `State` and the `Idempotency` handle do",
    note = "`State<T>`, or an extractor that reads `T` from the state, needs `impl FromRef<{Self}> for T`",
    note = "if `{E}` reads the request body (implements `FromRequest`), make it the last argument"
)]
pub trait HeadArg<E>: Sized {
    /// Extracts `E` from the request head.
    fn extract(parts: &mut Parts, state: &Self)
    -> impl Future<Output = Result<E, Response>> + Send;
}

#[diagnostic::do_not_recommend]
impl<S, E> HeadArg<E> for S
where
    S: Send + Sync,
    E: FromRequestParts<S>,
{
    async fn extract(parts: &mut Parts, state: &Self) -> Result<E, Response> {
        E::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)
    }
}

/// A router state `Self` on which `E` can be the last argument: `E:
/// FromRequest<Self, M>`, through its head or its body. See [`HeadArg`].
#[diagnostic::on_unimplemented(
    message = "`{E}` is not an extractor for the router state `{Self}`, so it cannot be an argument of this `#[idempotent]` handler",
    label = "this handler takes `{E}` as an argument",
    note = "the last argument must implement `FromRequest<{Self}>`, as `Json<T>`, `Form<T>`, `String` and `Bytes` do, or `FromRequestParts<{Self}>`",
    note = "`State<T>`, or an extractor that reads `T` from the state, needs `impl FromRef<{Self}> for T`"
)]
pub trait LastArg<E, M>: Sized {
    /// Extracts `E` from the request.
    fn extract(request: Request, state: &Self) -> impl Future<Output = Result<E, Response>> + Send;
}

#[diagnostic::do_not_recommend]
impl<S, E, M> LastArg<E, M> for S
where
    S: Send + Sync,
    E: FromRequest<S, M>,
{
    async fn extract(request: Request, state: &Self) -> Result<E, Response> {
        E::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)
    }
}

/// The annotated function's future, when it is called directly: what the
/// handler's `Deref` target returns.
pub type FnFuture<T> = idem_core::BoxFuture<'static, T>;

/// The future an annotated handler returns.
pub type HandlerFuture = idem_core::BoxFuture<'static, Response>;

/// One annotated handler's route policy (key template, ttl, lease,
/// ...), built on its first request by the same `layer_with_key` and
/// builder calls a tower user writes, then shared by every later request:
/// the template is parsed once per handler, never per request.
pub struct PolicyCell(OnceLock<Arc<Policy>>);

impl PolicyCell {
    /// An empty cell, for a `static`.
    pub const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The handler's layer on `idem`, building the policy with `build` if
    /// this is the first request.
    pub fn layer(
        &self,
        idem: Idempotency,
        build: fn(&Idempotency) -> IdempotencyLayer,
    ) -> IdempotencyLayer {
        let policy = self.0.get_or_init(|| build(&idem).policy).clone();
        IdempotencyLayer { idem, policy }
    }
}

impl Default for PolicyCell {
    fn default() -> Self {
        Self::new()
    }
}

/// `idem.layer_with_key(template).require_handler_ran()`, for a template
/// the macro has already parsed with the same `KeyTemplate::parse` at
/// compile time, and knowing that the attribute marks every response its
/// function returns (`Marking::ByAttribute`). The resolvers it needs are a property of the handle, which
/// comes with each request: [`call`] checks them then.
pub fn layer_with_key(idem: &Idempotency, template: &str) -> IdempotencyLayer {
    let template = template
        .parse()
        .unwrap_or_else(|err| unreachable!("#[idempotent] checked this template: {err}"));
    let mut layer = IdempotencyLayer::new(idem.clone(), template);
    Arc::make_mut(&mut layer.policy).marking = Marking::ByAttribute;
    layer
}

/// Marks the layer transactional. Whether the handle's store can run
/// transactions is known only per handle, so [`call`] checks it per request.
pub fn transactional(mut layer: IdempotencyLayer) -> IdempotencyLayer {
    Arc::make_mut(&mut layer.policy).transactional = true;
    layer
}

/// What an annotated function returns: a response.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a response, so this `#[idempotent]` handler cannot return it",
    label = "not a response",
    note = "a handler returns a type that implements `IntoResponse`, such as `StatusCode`, `String`, `Json<T>`, a tuple of response parts ending in one of these, or a `Result` of two of them"
)]
pub trait HandlerResponse {
    /// The response, marked as a handler's outcome.
    fn into_ran_response(self) -> Response;
}

#[diagnostic::do_not_recommend]
impl<R: IntoResponse> HandlerResponse for R {
    fn into_ran_response(self) -> Response {
        let mut response = self.into_response();
        response.extensions_mut().insert(crate::HandlerRan);
        response
    }
}

/// The response of the annotated function, marked as a handler's outcome
/// ([`HandlerRan`](crate::HandlerRan)): only these are kept.
pub fn handler_ran(response: impl HandlerResponse) -> Response {
    response.into_ran_response()
}

/// `FingerprintSpec::JsonFields` from the pointers the macro checked.
pub fn json_fields(pointers: &[&str]) -> FingerprintSpec {
    FingerprintSpec::JsonFields(pointers.iter().map(|&p| p.to_owned()).collect())
}

/// The body of an annotated handler's `Handler::call`: the handler's layer
/// (see [`PolicyCell`]) around `run`, which extracts the arguments and runs
/// the function (what axum's own `Handler` impl for a function does), the
/// service a tower user gets from `post(handler).layer(layer)`.
pub fn call<S, F, Fut>(
    policy: &'static PolicyCell,
    build: fn(&Idempotency) -> IdempotencyLayer,
    run: F,
    request: Request,
    state: S,
) -> HandlerFuture
where
    S: StateWithHandle,
    F: FnOnce(Request, S) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    let layer = policy.layer(state.idempotency(), build);
    if layer.policy.transactional && layer.idem.config.store.transactional().is_none() {
        tracing::error!(
            target: "idem_tower",
            route = request.uri().path(),
            "#[idempotent(transactional)] handler on a store without transactions: \
             use PgStore, MySqlStore, SqliteStore or a TieredStore in front of one"
        );
        return Box::pin(std::future::ready(
            crate::Problem::Misconfigured(
                "this #[idempotent(transactional)] handler's store has no transactions: \
                 build the Idempotency handle on PgStore, MySqlStore, SqliteStore or a TieredStore in front of one"
                    .to_owned(),
            )
            .to_response(),
        ));
    }
    if let Some(why) = layer.idem.missing_resolver(&layer.policy.template) {
        tracing::error!(
            target: "idem_tower",
            route = request.uri().path(),
            "#[idempotent] handler: {why}"
        );
        return Box::pin(std::future::ready(
            crate::Problem::Misconfigured(why).to_response(),
        ));
    }
    let mut request = request;
    // For resolvers that extract on the router state.
    request
        .extensions_mut()
        .insert(crate::resolver::RouterState(state.clone()));
    let mut service = layer.layer(Extracting { run, state });
    Box::pin(async move {
        let ready = std::future::poll_fn(|cx| Service::<Request>::poll_ready(&mut service, cx));
        let response = match ready.await {
            Ok(()) => service.call(request).await,
            Err(never) => match never {},
        };
        match response {
            Ok(response) => response.map(axum::body::Body::new),
            Err(never) => match never {},
        }
    })
}

/// The service inside the layer: extracts the arguments and runs the
/// function, on the router state.
#[derive(Clone)]
struct Extracting<F, S> {
    run: F,
    state: S,
}

impl<F, Fut, S> Service<Request> for Extracting<F, S>
where
    F: FnOnce(Request, S) -> Fut + Clone,
    Fut: Future<Output = Response>,
    S: Clone,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Map<Fut, fn(Response) -> Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        (self.run.clone())(request, self.state.clone()).map(Ok)
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::MemoryStore;

    #[test]
    fn the_policy_is_built_once_and_shared_across_handles() {
        static BUILDS: AtomicUsize = AtomicUsize::new(0);
        fn build(idem: &Idempotency) -> IdempotencyLayer {
            BUILDS.fetch_add(1, Ordering::SeqCst);
            layer_with_key(idem, "t:{header:idempotency-key}").required(false)
        }
        let cell = PolicyCell::new();
        let a = cell.layer(Idempotency::new(MemoryStore::new()), build);
        let b = cell.layer(Idempotency::new(MemoryStore::new()), build);
        assert_eq!(BUILDS.load(Ordering::SeqCst), 1);
        assert!(Arc::ptr_eq(&a.policy, &b.policy));
        assert!(!b.policy.required);
        assert!(!Arc::ptr_eq(&a.idem.config, &b.idem.config));
    }
}
