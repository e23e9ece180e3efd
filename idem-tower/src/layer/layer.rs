//! The layer's builder, the route's policy, and the settings every request
//! through it reads, resolved once against the handle.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Error, ErrorKind, FingerprintSpec, KeyScope, KeyTemplate};
use tower::Layer;

use super::IdempotencyService;
use super::route::RoutePattern;
use crate::idempotency::Config;
use crate::{Idempotency, InFlightPolicy};

/// One route's idempotency settings as its builder methods chose them;
/// unset ones fall back to the handle's, in [`Settings`]. Nothing in it
/// comes from a handle: `#[idempotent]` builds it once per handler and
/// shares it with every handle the handler serves (`__private::PolicyCell`).
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub(crate) template: KeyTemplate,
    pub(crate) fingerprint: FingerprintSpec,
    pub(crate) required: bool,
    pub(crate) lease: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) in_flight: Option<InFlightPolicy>,
    pub(crate) route: Option<RoutePattern>,
    /// The request paths deduplicated, if not all.
    pub(crate) only: Option<Arc<[Box<str>]>>,
    pub(crate) transactional: bool,
    pub(crate) scope: KeyScope,
    pub(crate) marking: Marking,
    pub(crate) state: Option<StateInserter>,
}

/// Which responses of the wrapped service are its handler's outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marking {
    /// All of them.
    None,
    /// Those marked [`HandlerRan`](crate::HandlerRan)
    /// ([`IdempotencyLayer::require_handler_ran`]): an error without the
    /// mark is a refusal from before the handler; a success or redirect
    /// without it may be a handler that forgot the mark, and is kept.
    ByHand,
    /// `#[idempotent]`'s: the attribute marks every response its function
    /// returns, so a response without the mark, whatever its status (an
    /// extractor's 401, or its redirect to a login page), is never the
    /// handler's.
    ByAttribute,
}

/// A route's policy over its handle's defaults, resolved once, when the
/// layer wraps a service: what every request through it reads, with no
/// fallback left to take.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) idem: Idempotency,
    pub(super) policy: Arc<Policy>,
    /// How long a claim holds its key from its claim or its last renewal.
    pub(super) lease: Duration,
    /// How long a completed response is kept and replayed.
    pub(super) ttl: Duration,
    /// What a duplicate of a running request gets.
    pub(super) in_flight: InFlightPolicy,
    /// The bug its claims' guards are built with, for the layer's loom
    /// check to catch (`service.rs`, `loom_checks`).
    #[cfg(all(test, idem_loom))]
    pub(super) bug: Option<super::guard::Bug>,
}

impl Settings {
    /// `policy` over the defaults of `idem`.
    fn resolve(idem: &Idempotency, policy: &Arc<Policy>) -> Self {
        let config = &idem.config;
        Self {
            idem: idem.clone(),
            policy: policy.clone(),
            lease: policy.lease.unwrap_or(config.lease),
            ttl: policy.ttl.unwrap_or(config.ttl),
            in_flight: policy.in_flight.unwrap_or(config.in_flight),
            #[cfg(all(test, idem_loom))]
            bug: None,
        }
    }

    /// The handle's configuration: the store, the resolvers, the caps.
    pub(super) fn config(&self) -> &Config {
        &self.idem.config
    }
}

/// Puts the route's router state in each request's extensions, for
/// resolvers that extract on it.
#[derive(Clone)]
pub(crate) struct StateInserter(pub(crate) Arc<dyn Fn(&mut http::Extensions) + Send + Sync>);

impl fmt::Debug for StateInserter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StateInserter")
    }
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
                ttl: None,
                in_flight: None,
                route: None,
                only: None,
                transactional: false,
                scope: KeyScope::Caller,
                marking: Marking::None,
                state: None,
            }),
        }
    }

    fn policy(&mut self) -> &mut Policy {
        Arc::make_mut(&mut self.policy)
    }

    /// How long this route's completed responses are kept and replayed;
    /// the handle's ([`IdempotencyBuilder::ttl`](crate::IdempotencyBuilder::ttl),
    /// 24 h by default) if unset.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.policy().ttl = Some(ttl);
        self
    }

    /// How long this route's first attempts hold their key from their claim
    /// or their last renewal; the handle's if unset. Without transactional
    /// mode the layer renews it every third of it while the handler runs:
    /// see [`IdempotencyBuilder::lease`](crate::IdempotencyBuilder::lease)
    /// for what that gives, and what a handler that outlives a lost lease
    /// risks.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.policy().lease = Some(lease);
        self
    }

    /// Whether a request must carry its key (the default). With `false`, a
    /// request whose client-supplied key parts (its headers, query and
    /// body; a body that is not JSON has none) are all absent passes
    /// straight to the service, without deduplication; a partly present or
    /// malformed key is still a 400. A path parameter is the route's, never
    /// absent: a key of path parameters and resolvers alone is always
    /// deduplicated.
    pub fn required(mut self, required: bool) -> Self {
        self.policy().required = required;
        self
    }

    /// What duplicates of a running request get on this route. A waiting
    /// duplicate holds nothing while it waits (no database connection, no
    /// lock): it checks again now and then, and replays the first's
    /// response once it is stored.
    pub fn in_flight(mut self, in_flight: InFlightPolicy) -> Self {
        self.policy().in_flight = Some(in_flight);
        self
    }

    /// Lets every caller with the same key share one record.
    ///
    /// By default a record is bound to the caller who created it: the
    /// tenant and user the handle's resolvers find are part of the stored
    /// key whether or not the template names them, so one caller is never
    /// replayed another's response. Opt out only for keys that name a
    /// resource any caller may act on in the same way, such as a payment
    /// platform's callback keyed by payment number
    /// (`pay-callback:{path:payment_no}`), which its retries may send from
    /// another address or without credentials.
    pub fn shared_across_callers(mut self) -> Self {
        self.policy().scope = KeyScope::Shared;
        self
    }

    /// Stores only the outcomes of a handler that ran: responses that carry
    /// [`HandlerRan`](crate::HandlerRan) in their extensions. An error
    /// response without it (an extractor that refused the request before
    /// the handler started: a malformed body, a wrong `Content-Type`,
    /// missing credentials) is sent as it is and its key released, so the
    /// corrected request can use the same key. A success or a redirect
    /// without it may be a handler that forgot the mark: it is kept as the
    /// handler's, with a warning in the log. `#[idempotent]` handlers get
    /// this, and the marking, without asking; and since the attribute marks
    /// every response its function returns, there a response without the
    /// mark of any status (an extractor's redirect to a login page too) is
    /// released.
    pub fn require_handler_ran(mut self) -> Self {
        let policy = self.policy();
        if policy.marking == Marking::None {
            policy.marking = Marking::ByHand;
        }
        self
    }

    /// The router state, for resolvers made with
    /// [`Resolver::from_extractor_with_state`](crate::Resolver::from_extractor_with_state):
    /// axum gives a layer no access to it, so the layer carries a clone.
    /// `#[idempotent]` handlers pass theirs without asking.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn with_state<S: Clone + Send + Sync + 'static>(mut self, state: S) -> Self {
        self.policy().state = Some(StateInserter(Arc::new(move |extensions| {
            extensions.insert(crate::resolver::RouterState(state.clone()));
        })));
        self
    }

    /// What the fingerprint covers ([`FingerprintSpec::Request`]).
    pub fn fingerprint(mut self, spec: FingerprintSpec) -> Self {
        self.policy().fingerprint = spec;
        self
    }

    /// Deduplicates only requests to these paths, such as the gRPC methods
    /// that make effects (`/payments.Payments/Charge`); every other request
    /// passes through untouched, decided from its head, its body streaming
    /// both ways and no key asked of it. This is how one layer sits on a
    /// whole tonic server beside its health service, reflection and
    /// streaming calls.
    ///
    /// ```
    /// use idem_tower::{Idempotency, MemoryStore};
    ///
    /// let layer = Idempotency::new(MemoryStore::new())
    ///     .layer()
    ///     .only(["/payments.Payments/Charge", "/payments.Payments/Refund"]);
    /// # let _ = layer;
    /// ```
    pub fn only<P: Into<Box<str>>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.policy().only = Some(paths.into_iter().map(Into::into).collect());
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
    /// Transactional mode: the claim, the handler's writes (through the
    /// `Tx` extractor) and the stored response commit in one database
    /// transaction. A response the outcome policy does not keep, an error or
    /// a panic rolls all of it back, and so does a crash: there is never a
    /// partial effect, and never a second one. A client that disconnects
    /// does not cancel the handler: it runs to its end, and commits or rolls
    /// back as if the client had waited.
    ///
    /// A duplicate that arrives while the first transaction is open learns
    /// it at once, without waiting on the first's row (see the crate docs,
    /// "Transactional mode"): 409, or under [`InFlightPolicy::Wait`] a wait that
    /// holds no connection, then the replay of what the first committed.
    /// A crashed first request's key is free as soon as the database has
    /// rolled its transaction back, behind the Redis gate too.
    ///
    /// Fails with [`ErrorKind::Config`] if the handle's store has no
    /// transactional mode (the SQL stores have one).
    pub fn transactional(mut self) -> Result<Self, Error> {
        if self.idem.config.store.transactional().is_none() {
            return Err(Error::new(
                ErrorKind::Config,
                "transactional mode needs a store that runs in the database transaction \
                 (PgStore, MySqlStore, SqliteStore, or a TieredStore in front of one)",
            ));
        }
        self.policy().transactional = true;
        Ok(self)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, Settings::resolve(&self.idem, &self.policy))
    }
}
