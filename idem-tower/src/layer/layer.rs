use std::sync::Arc;
use std::time::Duration;

use idem_core::{FingerprintSpec, KeyTemplate};
use tower::Layer;

use super::IdempotencyService;
use crate::route::RoutePattern;
use crate::{Idempotency, InFlight};

/// One route's idempotency settings; unset ones fall back to the handle's.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub(crate) template: KeyTemplate,
    pub(crate) fingerprint: FingerprintSpec,
    pub(crate) required: bool,
    pub(crate) lease: Option<Duration>,
    pub(crate) retention: Option<Duration>,
    pub(crate) in_flight: Option<InFlight>,
    pub(crate) route: Option<RoutePattern>,
}

/// Makes the wrapped service idempotent: see the [module docs](crate::layer).
///
/// Made by [`Idempotency::layer`] or [`Idempotency::layer_with_key`]; the
/// methods here override the handle's settings for this route.
#[derive(Debug, Clone)]
#[must_use]
pub struct IdempotencyLayer {
    pub(crate) idem: Idempotency,
    pub(crate) policy: Arc<Policy>,
}

impl IdempotencyLayer {
    pub(crate) fn new(idem: Idempotency, template: KeyTemplate) -> Self {
        Self {
            idem,
            policy: Arc::new(Policy {
                template,
                fingerprint: FingerprintSpec::Request,
                required: true,
                lease: None,
                retention: None,
                in_flight: None,
                route: None,
            }),
        }
    }

    fn policy(&mut self) -> &mut Policy {
        Arc::make_mut(&mut self.policy)
    }

    /// How long this route's completed responses are replayed.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.policy().retention = Some(retention);
        self
    }

    /// How long this route's first attempts hold their key.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.policy().lease = Some(lease);
        self
    }

    /// Whether a request must carry its key (the default). With `false`, a
    /// request whose client-supplied key parts are all absent passes straight
    /// to the service, without deduplication; a partly present or malformed
    /// key is still a 400.
    pub fn required(mut self, required: bool) -> Self {
        self.policy().required = required;
        self
    }

    /// What duplicates of a running request get on this route.
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.policy().in_flight = Some(in_flight);
        self
    }

    /// What the fingerprint covers ([`FingerprintSpec::Request`]).
    pub fn fingerprint(mut self, spec: FingerprintSpec) -> Self {
        self.policy().fingerprint = spec;
        self
    }

    /// The route pattern, such as `/payments/{payment_no}/callback`, for
    /// `{path:...}` placeholders and the fingerprint when the service is not
    /// behind an axum router (which tells the layer its matched route).
    pub fn route(mut self, pattern: &str) -> Self {
        self.policy().route = Some(RoutePattern::new(pattern));
        self
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.clone())
    }
}
