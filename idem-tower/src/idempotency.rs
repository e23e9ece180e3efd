//! The handle users hold: the store and the configuration every idempotent
//! route shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, header};
use idem_core::DynStore;
use idem_core::{Error, ErrorKind, IdempotencyStore, KeyTemplate, Placeholder};

use crate::duplicated::{self, DuplicatedKey, DuplicatedKeys};
use crate::{FinalStatusFn, IdempotencyBuilder, IdempotencyLayer, InFlightPolicy, Resolver};

/// Headers never stored for replay, whatever the configuration says: they
/// describe one connection or one moment, or would hand one response's
/// session to another client.
const NEVER_REPLAYED: [HeaderName; 11] = [
    header::SET_COOKIE,
    header::DATE,
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::AGE,
];

pub(crate) struct Config {
    pub(crate) store: Arc<dyn DynStore>,
    pub(crate) tenant: Option<Resolver>,
    pub(crate) user: Option<Resolver>,
    pub(crate) lease: Duration,
    pub(crate) ttl: Duration,
    pub(crate) max_body: usize,
    pub(crate) max_stored_response: usize,
    pub(crate) key_header: HeaderName,
    pub(crate) namespace: String,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) in_flight: InFlightPolicy,
    pub(crate) final_status: FinalStatusFn,
    pub(crate) final_response: Option<crate::FinalResponseFn>,
    pub(crate) unavailable_retry_after: Duration,
    pub(crate) in_flight_retry_after: Duration,
    pub(crate) safe_methods_pass_through: bool,
    pub(crate) duplicated: DuplicatedKeys,
    /// What operations and their outbound keys are derived with; `None`
    /// until the deployment gives a secret.
    pub(crate) outbound: Option<crate::operation::OutboundKeys>,
}

/// The idempotency handle: a store and the configuration shared by every
/// idempotent route. Cheap to clone; put it in your router state.
///
/// ```
/// use std::time::Duration;
/// use idem_tower::{Idempotency, MemoryStore, Resolver};
///
/// let idem = Idempotency::builder(MemoryStore::new())
///     .tenant(Resolver::header("x-tenant-id"))
///     .lease(Duration::from_secs(30))
///     .ttl(Duration::from_secs(24 * 3600))
///     .build();
///
/// // One layer per route, each with its own key template.
/// let layer = idem.layer_with_key("order-create:{tenant}:{header:idempotency-key}")?;
/// # let _ = layer;
/// # Ok::<(), idem_tower::Error>(())
/// ```
#[derive(Clone)]
pub struct Idempotency {
    pub(crate) config: Arc<Config>,
}

impl Idempotency {
    /// How many keys [`top_duplicated_keys`](Self::top_duplicated_keys)
    /// tracks.
    pub const TRACKED_KEYS: usize = duplicated::TRACKED_KEYS;

    /// The header set on replayed responses: `Idempotent-Replayed: true`.
    pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

    /// A handle on `store` with the default configuration.
    pub fn new(store: impl IdempotencyStore) -> Self {
        Self::builder(store).build()
    }

    /// A builder for a handle on `store`.
    pub fn builder(store: impl IdempotencyStore) -> IdempotencyBuilder {
        IdempotencyBuilder::new(Arc::new(store))
    }

    /// A layer keyed the way the IETF draft describes: the key header,
    /// scoped by method, route, and the tenant and user when resolvers are
    /// configured (`{method}:{route}:{tenant}:{user}:{header:idempotency-key}`).
    pub fn layer(&self) -> IdempotencyLayer {
        let c = &self.config;
        let mut template = String::from("{method}:{route}:");
        if c.tenant.is_some() {
            template.push_str("{tenant}:");
        }
        if c.user.is_some() {
            template.push_str("{user}:");
        }
        template.push_str(&format!("{{header:{}}}", c.key_header));
        let template = KeyTemplate::parse(&template).expect("the default template is valid");
        IdempotencyLayer::new(self.clone(), template)
    }

    /// A layer with its own key template, such as
    /// `pay-callback:{path:payment_no}`. The template is checked here, once.
    ///
    /// Fails with [`ErrorKind::Config`] if the template does not parse, or
    /// names `{tenant}` or `{user}` and the handle has no resolver for it:
    /// every request would be refused for something only the server can
    /// supply.
    ///
    /// ```
    /// use idem_tower::{ErrorKind, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let err = idem.layer_with_key("order:{user}:{header:idempotency-key}").unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Config);
    /// assert!(err.to_string().contains("no user resolver"));
    /// ```
    pub fn layer_with_key(&self, template: &str) -> Result<IdempotencyLayer, Error> {
        let template: KeyTemplate = template.parse()?;
        if let Some(why) = self.missing_resolver(&template) {
            return Err(Error::new(ErrorKind::Config, why));
        }
        Ok(IdempotencyLayer::new(self.clone(), template))
    }

    /// What is wrong if `template` names `{tenant}` or `{user}` and this
    /// handle has no resolver for it.
    pub(crate) fn missing_resolver(&self, template: &KeyTemplate) -> Option<String> {
        [
            (Placeholder::Tenant, &self.config.tenant, "tenant"),
            (Placeholder::User, &self.config.user, "user"),
        ]
        .into_iter()
        .find(|(placeholder, resolver, _)| {
            resolver.is_none() && template.placeholders().any(|p| p == placeholder)
        })
        .map(|(placeholder, _, method)| {
            format!(
                "the key template `{template}` names {{{placeholder}}}, and the Idempotency \
                 handle has no {method} resolver: add `.{method}(Resolver::...)` to \
                 Idempotency::builder"
            )
        })
    }

    /// The name of the header that carries the client's key.
    pub fn key_header(&self) -> &HeaderName {
        &self.config.key_header
    }

    /// The `n` keys that duplicates hit most (replays, in-flight conflicts,
    /// mismatches), from a bounded table of
    /// [`TRACKED_KEYS`](Self::TRACKED_KEYS): a retry storm, or a client
    /// that reuses keys. Keys are cut to their first 64 characters.
    pub fn top_duplicated_keys(&self, n: usize) -> Vec<DuplicatedKey> {
        self.config.duplicated.top(n)
    }

    pub(crate) fn replays(&self, name: &HeaderName) -> bool {
        self.config.replay_headers.contains(name) && !NEVER_REPLAYED.contains(name)
    }
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("Idempotency")
            .field("tenant", &c.tenant)
            .field("user", &c.user)
            .field("lease", &c.lease)
            .field("ttl", &c.ttl)
            .field("max_body", &c.max_body)
            .field("key_header", &c.key_header)
            .field("namespace", &c.namespace)
            .finish_non_exhaustive()
    }
}
