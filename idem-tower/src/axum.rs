//! Axum integration outside the layer: the handle as an extractor. (The
//! matched route and its parameters are read where the key is built, in
//! `layer/key.rs`.)

use axum::extract::{FromRef, FromRequestParts};
use http::request::Parts;

use crate::Idempotency;

/// The handle from router state, for handlers that want it.
///
/// ```
/// use axum::{Router, extract::FromRef, routing::get};
/// use idem_tower::{Idempotency, MemoryStore};
///
/// #[derive(Clone)]
/// struct AppState { idem: Idempotency }
///
/// impl FromRef<AppState> for Idempotency {
///     fn from_ref(state: &AppState) -> Self { state.idem.clone() }
/// }
///
/// async fn handler(idem: Idempotency) -> String { idem.key_header().to_string() }
///
/// let app: Router = Router::new()
///     .route("/", get(handler))
///     .with_state(AppState { idem: Idempotency::new(MemoryStore::new()) });
/// ```
impl<S: Send + Sync> FromRequestParts<S> for Idempotency
where
    Idempotency: FromRef<S>,
{
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(_: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Idempotency::from_ref(state))
    }
}
