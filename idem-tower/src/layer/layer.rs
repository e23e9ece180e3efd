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
    pub(crate) transactional: bool,
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
                transactional: false,
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

impl IdempotencyLayer {
    /// Transactional mode: the claim row, the handler's writes (through the
    /// `Tx` extractor) and the stored response commit in one database
    /// transaction. A response the outcome policy does not keep, an error, a
    /// panic or a cancelled request rolls all of it back, and so does a
    /// crash: there is never a partial effect, and never a second one.
    ///
    /// A duplicate that arrives while the first transaction is open waits
    /// for it (up to the store's lock timeout, then 409) and replays what it
    /// committed; [`InFlight::Wait`] does not apply.
    ///
    /// Fails if the handle's store has no transactional mode (the SQL
    /// stores have one).
    pub fn transactional(mut self) -> Result<Self, NotTransactional> {
        if self.idem.config.store.transactional().is_none() {
            return Err(NotTransactional);
        }
        self.policy().transactional = true;
        Ok(self)
    }
}

/// The store behind the handle cannot run transactional mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotTransactional;

impl std::fmt::Display for NotTransactional {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "transactional mode needs a store that runs in the database transaction \
             (PgStore, MySqlStore or SqliteStore)",
        )
    }
}

impl std::error::Error for NotTransactional {}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.clone())
    }
}
