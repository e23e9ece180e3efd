//! The handle users hold: the store and the configuration every idempotent
//! route shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode, header};
use idem_core::store::DynStore;
use idem_core::{Error, ErrorKind, IdempotencyStore, KeyTemplate, Placeholder};

use crate::collisions::{Collision, Collisions};
use crate::{IdempotencyLayer, Resolver};

/// The default lease of a plain (non-transactional) claim: how long its key
/// stays held after the last renewal. The layer renews it every third of a
/// lease while the handler runs, so a handler may run longer than this; a
/// claim whose process died frees within about this long: 10 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// The default retention of a completed response: 24 hours.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// The default cap on a request body: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// The default cap on a stored response body: 256 KiB.
pub const DEFAULT_MAX_STORED_RESPONSE: usize = 256 * 1024;
/// The default `Retry-After` of the 409 a duplicate gets while the first
/// request runs: 1 second (never more than the first's remaining lease).
pub const DEFAULT_IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Response headers replayed by default (besides any added with
/// [`IdempotencyBuilder::replay_header`]): `Content-Type`,
/// `Content-Language`, `Content-Location`, `Location`, `ETag`,
/// `Last-Modified`, `Link` and `Cache-Control`.
pub const DEFAULT_REPLAY_HEADERS: [HeaderName; 8] = [
    header::CONTENT_TYPE,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
    header::CACHE_CONTROL,
];

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

/// What a duplicate gets while the first request is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InFlight {
    /// Answer `409 Conflict` with `Retry-After` at once (the default).
    #[default]
    Reject,
    /// Wait up to this long for the first to finish and replay its response;
    /// 409 if it is still running then.
    Wait(Duration),
}

/// Decides whether a handler's response is final (stored and replayed) or
/// the claim is released so the client can retry.
pub type KeepFn = fn(StatusCode) -> bool;

/// The default outcome policy: 2xx, 3xx and the deterministic 4xx are kept;
/// 5xx and the 4xx that say "try again" or "not you, not now" (401, 403, 408,
/// 409, 423, 425, 429) release the key.
pub fn keep_deterministic(status: StatusCode) -> bool {
    match status.as_u16() {
        200..=399 => true,
        401 | 403 | 408 | 409 | 423 | 425 | 429 => false,
        400..=499 => true,
        _ => false,
    }
}

pub(crate) struct Config {
    pub(crate) store: Arc<dyn DynStore>,
    pub(crate) tenant: Option<Resolver>,
    pub(crate) user: Option<Resolver>,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) max_body: usize,
    pub(crate) max_stored_response: usize,
    pub(crate) key_header: HeaderName,
    pub(crate) namespace: String,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) in_flight: InFlight,
    pub(crate) keep: KeepFn,
    pub(crate) unavailable_retry_after: Duration,
    pub(crate) in_flight_retry_after: Duration,
    pub(crate) safe_methods_pass_through: bool,
    pub(crate) collisions: Collisions,
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
///     .retention(Duration::from_secs(24 * 3600))
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
    /// A handle on `store` with the default configuration.
    pub fn new(store: impl IdempotencyStore) -> Self {
        Self::builder(store).build()
    }

    /// A builder for a handle on `store`.
    pub fn builder(store: impl IdempotencyStore) -> IdempotencyBuilder {
        IdempotencyBuilder {
            config: Config {
                store: Arc::new(store),
                tenant: None,
                user: None,
                lease: DEFAULT_LEASE,
                retention: DEFAULT_RETENTION,
                max_body: DEFAULT_MAX_BODY,
                max_stored_response: DEFAULT_MAX_STORED_RESPONSE,
                key_header: HeaderName::from_static("idempotency-key"),
                namespace: idem_core::DEFAULT_NAMESPACE.to_owned(),
                replay_headers: DEFAULT_REPLAY_HEADERS.to_vec(),
                in_flight: InFlight::Reject,
                keep: keep_deterministic,
                unavailable_retry_after: Duration::from_secs(1),
                in_flight_retry_after: DEFAULT_IN_FLIGHT_RETRY_AFTER,
                safe_methods_pass_through: true,
                collisions: Collisions::default(),
            },
        }
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
    /// [`TRACKED_KEYS`](crate::TRACKED_KEYS): a retry storm, or a client
    /// that reuses keys. Keys are cut to their first 64 characters.
    pub fn top_collisions(&self, n: usize) -> Vec<Collision> {
        self.config.collisions.top(n)
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
            .field("retention", &c.retention)
            .field("max_body", &c.max_body)
            .field("key_header", &c.key_header)
            .field("namespace", &c.namespace)
            .finish_non_exhaustive()
    }
}

/// Configures an [`Idempotency`] handle.
#[must_use]
pub struct IdempotencyBuilder {
    config: Config,
}

impl IdempotencyBuilder {
    /// Where `{tenant}` comes from.
    pub fn tenant(mut self, resolver: Resolver) -> Self {
        self.config.tenant = Some(resolver);
        self
    }

    /// Where `{user}` comes from.
    pub fn user(mut self, resolver: Resolver) -> Self {
        self.config.user = Some(resolver);
        self
    }

    /// How long a first attempt holds its key, from its claim or its last
    /// renewal, before a duplicate may take it over ([`DEFAULT_LEASE`],
    /// 10 s).
    ///
    /// Without transactional mode the layer renews the lease every third of
    /// it while the handler runs (one owner-checked write to the store each
    /// time; see `idem_lease_renewals_total` in [`metrics`](crate#observability)),
    /// so a handler may run for many leases and keep its key, and a claim
    /// whose process crashed frees within about one lease: shorter frees a
    /// crashed claim sooner, and costs more renewals. Set it well above the
    /// store's worst round trip, so that one slow or failed renewal does not
    /// lose the key.
    ///
    /// A handler can still outlive a lost lease: its renewals all failed for
    /// a whole lease (the store unreachable), or could not run (the process
    /// paused, or a handler blocking its thread without `spawn_blocking`,
    /// which starves its own renewals). Then another attempt with the same
    /// key may take the key over and run the effect again, and the first
    /// attempt's completion is refused ([`ErrorKind::LeaseLost`]; its client
    /// still gets its response, duplicates get the other attempt's). An
    /// effect that must never run twice belongs in transactional mode
    /// ([`IdempotencyLayer::transactional`]), whose claim lives exactly as
    /// long as its transaction, or behind a business-side guard.
    ///
    /// In transactional mode the claim is not renewed: it lives exactly as
    /// long as its transaction.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long completed responses are replayed ([`DEFAULT_RETENTION`]).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// The largest request body buffered, in bytes; larger ones get 413 and
    /// claim nothing ([`DEFAULT_MAX_BODY`]).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.config.max_body = bytes;
        self
    }

    /// The largest response body stored for replay
    /// ([`DEFAULT_MAX_STORED_RESPONSE`]). A larger response is still sent,
    /// and its key is completed as not replayable: duplicates get 409.
    pub fn max_stored_response(mut self, bytes: usize) -> Self {
        self.config.max_stored_response = bytes;
        self
    }

    /// The header carrying the client's key in [`Idempotency::layer`]'s
    /// template (`Idempotency-Key`).
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.config.key_header = name;
        self
    }

    /// The prefix of every stored key (`idem:`), so several services can
    /// share one store. It is used as given: end it with a separator
    /// (`"billing:"`), or keys read `billing{...}`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = namespace.into();
        self
    }

    /// Also store and replay this response header. `Set-Cookie`, `Date`,
    /// `Content-Length` and hop-by-hop headers are never replayed, even if
    /// named here.
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        if !self.config.replay_headers.contains(&name) {
            self.config.replay_headers.push(name);
        }
        self
    }

    /// What duplicates of a running request get ([`InFlight::Reject`]).
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.config.in_flight = in_flight;
        self
    }

    /// Which handler statuses are final ([`keep_deterministic`]).
    pub fn keep(mut self, keep: KeepFn) -> Self {
        self.config.keep = keep;
        self
    }

    /// The `Retry-After` sent with 503 when the store is unavailable (1 s).
    pub fn unavailable_retry_after(mut self, after: Duration) -> Self {
        self.config.unavailable_retry_after = after;
        self
    }

    /// The `Retry-After` of the 409 a duplicate gets while the first
    /// request still runs ([`DEFAULT_IN_FLIGHT_RETRY_AFTER`], 1 s). It is
    /// never more than the first request's remaining lease: once that ends,
    /// a retry may take the key over.
    pub fn in_flight_retry_after(mut self, after: Duration) -> Self {
        self.config.in_flight_retry_after = after;
        self
    }

    /// Whether requests with a safe method (GET, HEAD, OPTIONS, TRACE) pass
    /// through the layer untouched, so one layer can sit on a whole router
    /// (`true`, the default). With `false` they are deduplicated like any
    /// other.
    pub fn safe_methods_pass_through(mut self, pass: bool) -> Self {
        self.config.safe_methods_pass_through = pass;
        self
    }

    /// The handle.
    pub fn build(self) -> Idempotency {
        Idempotency {
            config: Arc::new(self.config),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_policy_keeps_deterministic_answers_only() {
        for kept in [200, 201, 204, 303, 400, 404, 410, 422] {
            assert!(
                keep_deterministic(StatusCode::from_u16(kept).unwrap()),
                "{kept}"
            );
        }
        for released in [401, 403, 408, 409, 423, 425, 429, 500, 502, 503, 504] {
            assert!(
                !keep_deterministic(StatusCode::from_u16(released).unwrap()),
                "{released}"
            );
        }
    }
}
