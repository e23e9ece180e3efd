//! What `#[idempotent]` expansions name, and nothing else: not a public API,
//! exempt from semver. Generated code reaches everything it needs through
//! `::idem_tower::__private`, so it compiles whatever the user's crate
//! imports, renames or shadows.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use axum::extract::{FromRef, Request};
use axum::handler::Handler;
use axum::response::Response;
use tower::{Layer, Service};

use crate::layer::Policy;

pub use ::axum;
pub use core::clone::Clone;
pub use core::fmt::Debug;
pub use core::marker::{Copy, Send, Sync};
pub use std::time::Duration;

pub use crate::{FingerprintSpec, Idempotency, IdempotencyLayer, InFlight};

/// The `T` of an annotated handler's `Handler<T, S>` impl. `M` is the last
/// extractor's `FromRequest` marker, threaded through so the impl is not
/// ambiguous.
pub struct Marker<M>(PhantomData<fn() -> M>);

/// A router state an annotated handler can serve: one that gives an
/// [`Idempotency`] handle through `FromRef`. Named in the generated impl
/// instead of `Idempotency: FromRef<S>` itself, which has a single impl and
/// would make the compiler guess the state is the handle.
#[diagnostic::on_unimplemented(
    message = "the router state `{Self}` does not give an `Idempotency` handle",
    label = "`#[idempotent]` handlers need the handle from the router state",
    note = "implement `FromRef<{Self}> for Idempotency`, returning the handle kept in the state, or use the `Idempotency` handle itself as the state"
)]
pub trait StateWithHandle: Clone + Send + Sync + 'static {
    /// The handle.
    fn idempotency(&self) -> Idempotency;
}

impl<S> StateWithHandle for S
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
{
    fn idempotency(&self) -> Idempotency {
        Idempotency::from_ref(self)
    }
}

/// The future an annotated handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Response> + Send>>;

/// One annotated handler's route policy (key template, retention, lease,
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

/// `idem.layer_with_key(template)`, for a template the macro has already
/// parsed with the same `KeyTemplate::parse` at compile time.
pub fn layer_with_key(idem: &Idempotency, template: &str) -> IdempotencyLayer {
    idem.layer_with_key(template)
        .unwrap_or_else(|err| unreachable!("#[idempotent] checked this template: {err}"))
}

/// Marks the layer transactional. Whether the handle's store can run
/// transactions is known only per handle, so [`call`] checks it per request.
pub fn transactional(mut layer: IdempotencyLayer) -> IdempotencyLayer {
    Arc::make_mut(&mut layer.policy).transactional = true;
    layer
}

/// `FingerprintSpec::JsonFields` from the pointers the macro checked.
pub fn json_fields(pointers: &[&str]) -> FingerprintSpec {
    FingerprintSpec::JsonFields(pointers.iter().map(|&p| p.to_owned()).collect())
}

/// The body of an annotated handler's `Handler::call`: the handler's layer
/// (see [`PolicyCell`]) around `handler.with_state(state)`, exactly the
/// service a tower user gets from `post(handler).layer(layer)`.
pub fn call<H, T, S>(
    policy: &'static PolicyCell,
    build: fn(&Idempotency) -> IdempotencyLayer,
    handler: H,
    request: Request,
    state: S,
) -> HandlerFuture
where
    H: Handler<T, S>,
    T: 'static,
    S: StateWithHandle,
{
    let layer = policy.layer(state.idempotency(), build);
    if layer.policy.transactional && layer.idem.config.store.transactional().is_none() {
        tracing::error!(
            "#[idempotent(transactional)] handler on a store without transactions: \
             use PgStore, MySqlStore or SqliteStore"
        );
        return Box::pin(std::future::ready(
            crate::Problem::TransactionMissing.to_response(),
        ));
    }
    let mut service = layer.layer(handler.with_state(state));
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
