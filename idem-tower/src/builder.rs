//! Configuring the handle: the defaults every idempotent route starts
//! from, and what a duplicate of a running request gets.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode, header};
use idem_core::DynStore;

use crate::Resolver;
use crate::duplicated::DuplicatedKeys;
use crate::idempotency::{Config, Idempotency};

/// What a duplicate gets while the first request is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InFlightPolicy {
    /// Answer `409 Conflict` with `Retry-After` at once (the default).
    #[default]
    Reject,
    /// Wait up to this long for the first to finish and replay its response;
    /// 409 if it is still running then.
    Wait(Duration),
}

/// Decides whether a handler's response is final (stored and replayed) or
/// not (the claim is released so the client can retry): see
/// [`IdempotencyBuilder::final_status`].
pub type FinalStatusFn = fn(StatusCode) -> bool;

/// The default: 2xx, 3xx and the deterministic 4xx are final; 5xx and the
/// 4xx that say "try again" or "not you, not now" (401, 403, 408, 409, 423,
/// 425, 429) are not, and release the key.
///
/// ```
/// use http::StatusCode;
/// use idem_tower::final_if_deterministic;
///
/// assert!(final_if_deterministic(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!final_if_deterministic(StatusCode::SERVICE_UNAVAILABLE));
/// ```
pub fn final_if_deterministic(status: StatusCode) -> bool {
    match status.as_u16() {
        200..=399 => true,
        401 | 403 | 408 | 409 | 423 | 425 | 429 => false,
        400..=499 => true,
        _ => false,
    }
}

/// Configures an [`Idempotency`] handle.
#[must_use]
pub struct IdempotencyBuilder {
    config: Config,
}

impl IdempotencyBuilder {
    /// The default lease of a plain (non-transactional) claim: how long its key
    /// stays held after the last renewal. The layer renews it every third of a
    /// lease while the handler runs, so a handler may run longer than this; a
    /// claim whose process died frees within about this long: 10 seconds.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
    /// The default `ttl` of a completed response, how long it is kept and
    /// replayed: 24 hours.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
    /// The default cap on a request body: 1 MiB.
    pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
    /// The default cap on a stored response body: 256 KiB.
    pub const DEFAULT_MAX_STORED_RESPONSE: usize = 256 * 1024;
    /// The default `Retry-After` of the 409 a duplicate gets while the first
    /// request runs: 1 second (never more than the first's remaining lease).
    pub const DEFAULT_IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

    /// Response headers replayed by default (besides any added with
    /// [`replay_header`](Self::replay_header)): `Content-Type`,
    /// `Content-Language`, `Content-Location`, `Location`, `ETag`,
    /// `Last-Modified`, `Link` and `Cache-Control`. Whatever the list, a
    /// replay always carries the stored body's encodings
    /// (`Content-Encoding`, `grpc-encoding`; dropped with the body decoded
    /// for a requester that does not accept them) and gRPC's `grpc-status`,
    /// `grpc-message` and `grpc-status-details-bin`.
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

    pub(crate) fn new(store: Arc<dyn DynStore>) -> Self {
        Self {
            config: Config {
                store,
                tenant: None,
                user: None,
                lease: Self::DEFAULT_LEASE,
                ttl: Self::DEFAULT_TTL,
                max_body: Self::DEFAULT_MAX_BODY,
                max_stored_response: Self::DEFAULT_MAX_STORED_RESPONSE,
                key_header: HeaderName::from_static("idempotency-key"),
                namespace: idem_core::DEFAULT_NAMESPACE.to_owned(),
                replay_headers: Self::DEFAULT_REPLAY_HEADERS.to_vec(),
                in_flight: InFlightPolicy::Reject,
                final_status: final_if_deterministic,
                final_response: None,
                unavailable_retry_after: Duration::from_secs(1),
                in_flight_retry_after: Self::DEFAULT_IN_FLIGHT_RETRY_AFTER,
                safe_methods_pass_through: true,
                duplicated: DuplicatedKeys::default(),
                outbound: None,
            },
        }
    }

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
    /// renewal, before a duplicate may take it over ([`DEFAULT_LEASE`](Self::DEFAULT_LEASE),
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
    /// attempt's completion is refused ([`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost); its client
    /// still gets its response, duplicates get the other attempt's). An
    /// effect that must never run twice belongs in transactional mode
    /// ([`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional)), whose claim lives exactly as
    /// long as its transaction, or behind a business-side guard.
    ///
    /// In transactional mode the claim is not renewed: it lives exactly as
    /// long as its transaction.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long a completed response is kept and replayed to duplicates
    /// ([`DEFAULT_TTL`](Self::DEFAULT_TTL), 24 h), by the store's clock. After
    /// it the key is free again: a request with it runs as a first one.
    ///
    /// Not the [`lease`](Self::lease), which is how long a *running* claim
    /// holds its key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_tower::{Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .ttl(Duration::from_secs(72 * 3600))
    ///     .build();
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// The largest request body buffered, in bytes; larger ones get 413 and
    /// claim nothing ([`DEFAULT_MAX_BODY`](Self::DEFAULT_MAX_BODY)).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.config.max_body = bytes;
        self
    }

    /// The largest response body stored for replay
    /// ([`DEFAULT_MAX_STORED_RESPONSE`](Self::DEFAULT_MAX_STORED_RESPONSE)).
    /// A larger response is still sent, and its key is completed as not
    /// replayable: duplicates get 409 (`ALREADY_EXISTS` on gRPC). It is
    /// settled when the cap is reached, from its head: its trailers, and a
    /// gRPC call's final status in them, are not awaited, so a larger gRPC
    /// reply is completed as not replayable whatever status it ends with.
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

    /// What duplicates of a running request get ([`InFlightPolicy::Reject`]).
    pub fn in_flight(mut self, in_flight: InFlightPolicy) -> Self {
        self.config.in_flight = in_flight;
        self
    }

    /// Which handler statuses are final, stored and replayed to
    /// duplicates ([`final_if_deterministic`]); any other releases the key
    /// so the client can retry. Decided on the status alone, before the
    /// body is read; a gRPC response (always HTTP 200) is then judged by its
    /// `grpc-status` as well. To see the whole response, trailers included,
    /// use [`final_response`](Self::final_response).
    pub fn final_status(mut self, is_final: FinalStatusFn) -> Self {
        self.config.final_status = is_final;
        self
    }

    /// Which handler responses are final, decided on the whole response:
    /// status, headers and trailers ([`FinishedResponse`](crate::FinishedResponse)),
    /// once its body has been read. Replaces both
    /// [`final_status`](Self::final_status) and the gRPC rule;
    /// [`final_by_default`](crate::final_by_default) is that default, to
    /// build on. Every response is then buffered (up to
    /// [`max_stored_response`](Self::max_stored_response)) before the
    /// decision, the released ones too.
    ///
    /// ```
    /// use idem_tower::{FinishedResponse, Idempotency, MemoryStore, final_by_default};
    ///
    /// /// gRPC's `NOT_FOUND` is, in this service, an entity not yet
    /// /// replicated: worth retrying, so not final.
    /// fn not_found_is_transient(response: &FinishedResponse<'_>) -> bool {
    ///     response.grpc_status() != Some(5) && final_by_default(response)
    /// }
    ///
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .final_response(not_found_is_transient)
    ///     .build();
    /// # let _ = idem;
    /// ```
    pub fn final_response(mut self, is_final: crate::FinalResponseFn) -> Self {
        self.config.final_response = Some(is_final);
        self
    }

    /// The `Retry-After` sent with 503 when the store is unavailable (1 s).
    pub fn unavailable_retry_after(mut self, after: Duration) -> Self {
        self.config.unavailable_retry_after = after;
        self
    }

    /// The `Retry-After` of the 409 a duplicate gets while the first
    /// request still runs ([`DEFAULT_IN_FLIGHT_RETRY_AFTER`](Self::DEFAULT_IN_FLIGHT_RETRY_AFTER), 1 s). It is
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

    /// The deployment's secret, from which each request's [`Operation`](crate::Operation)
    /// and the keys of its calls out ([`Operation::key_for`](crate::Operation::key_for))
    /// are derived. Without one, handlers get no `Operation`.
    ///
    /// Every instance of the service, and every version deployed while
    /// its records live, must have the same secret: an operation retried
    /// on an instance with another would derive other keys, and its calls
    /// out would reach the provider as new operations. Keep it as you keep
    /// other secrets (not in the repository); anyone who has it can compute
    /// the keys of your calls out from a client's key, tenant and user.
    /// There is no default: a random one per process would change the keys
    /// with every restart (the crash they are for), and a fixed one would be
    /// no secret.
    ///
    /// # Panics
    ///
    /// If `secret` is shorter than 32 bytes.
    ///
    /// ```
    /// use idem_tower::{Idempotency, MemoryStore};
    ///
    /// # let secret = [7u8; 32];
    /// // In production: read from the secret store, the same on every instance.
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .outbound_key_secret(secret)
    ///     .build();
    /// # let _ = idem;
    /// ```
    pub fn outbound_key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        let secret = secret.as_ref();
        assert!(
            secret.len() >= crate::operation::MIN_SECRET,
            "IdempotencyBuilder::outbound_key_secret takes a secret of at least {} bytes, got {}",
            crate::operation::MIN_SECRET,
            secret.len()
        );
        self.config.outbound = Some(crate::operation::OutboundKeys::new(secret));
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
                final_if_deterministic(StatusCode::from_u16(kept).unwrap()),
                "{kept}"
            );
        }
        for released in [401, 403, 408, 409, 423, 425, 429, 500, 502, 503, 504] {
            assert!(
                !final_if_deterministic(StatusCode::from_u16(released).unwrap()),
                "{released}"
            );
        }
    }
}
