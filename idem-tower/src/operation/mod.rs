//! The handler's view of the operation it runs for: [`Operation`], the
//! keys its calls out carry ([`Operation::key_for`], an [`OperationKey`]),
//! and its phases' recovery points ([`Operation::phases`]).
//! docs/outbound.md is the guide; ARCHITECTURE.md, "Calls out of a
//! handler", the invariants.

mod key;

use std::fmt;
use std::time::Duration;

use idem_core::{Fingerprint, IdempotencyKey, Phases, RecoveryPoints};

pub use key::{KeyForm, OperationKey};

/// The smallest secret [`IdempotencyBuilder::outbound_key_secret`](crate::IdempotencyBuilder::outbound_key_secret)
/// takes, in bytes.
pub(crate) const MIN_SECRET: usize = 32;

/// The keys an operation's identity and its outbound keys are hashed
/// with, derived once from the deployment's secret.
#[derive(Clone)]
pub(crate) struct OutboundKeys {
    id: [u8; 32],
    child: [u8; 32],
    phases: [u8; 32],
}

impl OutboundKeys {
    /// The keys of `secret`, one per use, so an identity never doubles as
    /// an outbound key.
    pub(crate) fn new(secret: &[u8]) -> Self {
        Self {
            id: blake3::derive_key("idem 2026 operation identity", secret),
            child: blake3::derive_key("idem 2026 outbound idempotency key", secret),
            phases: blake3::derive_key("idem 2026 phases of one request", secret),
        }
    }

    /// The operation the request claimed under `key` (the stored key:
    /// namespace, scope, template's parts, tenant and user) runs for, on a
    /// route that keeps its records for `ttl`; its phases are those of the
    /// request with `fingerprint`.
    pub(crate) fn operation(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        ttl: Duration,
    ) -> Operation {
        let id = *blake3::keyed_hash(&self.id, key.as_str().as_bytes()).as_bytes();
        let mut phases = blake3::Hasher::new_keyed(&self.phases);
        phases.update(&id);
        phases.update(fingerprint.as_bytes());
        Operation {
            id,
            child: self.child,
            phases: *phases.finalize().as_bytes(),
            ttl,
        }
    }
}

impl fmt::Debug for OutboundKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OutboundKeys(..)")
    }
}

/// The operation a request runs for, as its handler sees it: an identity
/// that is the same on every run of the operation (every retry with the
/// same key, on any instance, after any crash), and the keys its calls out
/// carry ([`key_for`](Self::key_for)).
///
/// The layer puts it in the request's extensions before calling the
/// service, once it holds the claim, when the handle has a secret
/// ([`IdempotencyBuilder::outbound_key_secret`](crate::IdempotencyBuilder::outbound_key_secret)):
/// an axum handler takes it as an extractor (feature `axum`), a tower
/// service or a tonic method reads `request.extensions().get::<Operation>()`.
///
/// The identity is derived from the stored key (its namespace, the route's
/// template, the client's key and the caller's tenant and user) with the
/// secret; it never shows the key itself, so a handler may log it or send
/// it. Two callers' operations differ even when their clients chose the
/// same key, unless the route shares its records across callers
/// ([`IdempotencyLayer::shared_across_callers`](crate::IdempotencyLayer::shared_across_callers)).
///
/// Whether this run follows an earlier attempt is not known to the layer:
/// a released attempt (a 5xx, a rollback) leaves no record behind, and a
/// store answers a claim that took over an expired lease as it answers a
/// fresh one. So a handler must treat every run as one that may follow an
/// attempt that got as far as any of its calls out; a derived key makes
/// those calls safe to make again (docs/outbound.md). A handler made of
/// [`phases`](Self::phases) learns the part that is recorded: how many of
/// its phases earlier runs finished ([`Phases::finished`]).
///
/// ```
/// # #[cfg(feature = "axum")] mod example {
/// use axum::{Json, http::StatusCode};
/// use idem_tower::Operation;
///
/// async fn pay(operation: Operation, Json(order): Json<serde_json::Value>) -> StatusCode {
///     // The same on every run of this operation, a different one per label.
///     let charge_key = operation.key_for("psp-charge");
///     tracing::info!(operation = operation.id(), "charging with {}", charge_key.as_str());
///     StatusCode::CREATED
/// }
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Operation {
    id: [u8; 32],
    child: [u8; 32],
    /// The identity its phases are recorded under: the operation's and
    /// the request's fingerprint.
    phases: [u8; 32],
    ttl: Duration,
}

impl Operation {
    /// The operation's identity: 64 lowercase hexadecimal digits, the same
    /// on every run of the operation, different per operation and caller.
    pub fn id(&self) -> String {
        blake3::Hash::from_bytes(self.id).to_hex().to_string()
    }

    /// The `Idempotency-Key` of the call out this operation makes under
    /// `label` (`"psp-charge"`, `"ship"`): the same on every run of the
    /// operation, different per label, operation, tenant and user, 64
    /// lowercase hexadecimal digits, and unguessable without the
    /// deployment's secret.
    ///
    /// Put it in the call's extensions and the client half sends it
    /// (feature `client`: the tower layer and its gRPC form read it from
    /// the request's extensions, reqwest-middleware from
    /// `RequestBuilder::with_extension`); or write it in the header
    /// yourself. A label names one call, not one attempt: the client half
    /// retries it with the same key.
    ///
    /// ```
    /// # #[cfg(feature = "client")] fn doc(operation: idem_tower::Operation) {
    /// let mut charge = http::Request::post("https://psp.example/v1/charges")
    ///     .body(String::from("amount=1200"))
    ///     .unwrap();
    /// charge.extensions_mut().insert(operation.key_for("psp-charge"));
    /// # }
    /// ```
    pub fn key_for(&self, label: &str) -> OperationKey {
        let mut hasher = blake3::Hasher::new_keyed(&self.child);
        hasher.update(&self.id);
        hasher.update(label.as_bytes());
        let hex = hasher.finalize().to_hex();
        OperationKey(http::HeaderValue::from_str(&hex).expect("hex digits are a header value"))
    }
}

impl Operation {
    /// The operation's phases, their recovery points kept in `points` (a
    /// SQL store: `&PgStore`, `&MySqlStore`, `&SqliteStore`; or
    /// [`MemoryPoints`](crate::core::MemoryPoints) in tests) for the
    /// route's ttl: a run after a crash, a failure or a released attempt
    /// resumes after the last phase an earlier run finished, with its
    /// output (docs/outbound.md, "Phases").
    ///
    /// The points are keyed by the operation's identity and the request's
    /// fingerprint: the same on every retry of the request, and outside
    /// the record, which a released attempt deletes. A key reused for
    /// another request (another body) once the first's attempts were
    /// released starts with no phase finished, instead of resuming the
    /// first request's order and charge; its calls out still carry the
    /// same derived keys, which a provider that compares requests refuses.
    /// They are kept for the route's ttl from when each is recorded, so
    /// they are gone before the operation's completed record is, and a
    /// key used again after its record expired starts a new operation with
    /// no points. Completion does not delete them; the store's purge
    /// does, once expired.
    ///
    /// A payment in three phases: the order created pending, the provider
    /// charged under the operation's derived key, the order marked paid.
    /// On a route in plain mode (the layer without `.transactional()`):
    /// each phase commits on its own.
    ///
    /// ```no_run
    /// # #[cfg(all(feature = "axum", feature = "postgres"))] mod example {
    /// use axum::{Json, extract::State, http::StatusCode};
    /// use idem_tower::sql::sqlx;
    /// use idem_tower::{Operation, PgStore};
    ///
    /// # async fn charge(_: &str, _: i64, _: &idem_tower::OperationKey) -> Result<String, PayError> { todo!() }
    /// # #[derive(Debug)] struct PayError;
    /// # impl From<idem_tower::Error> for PayError { fn from(_: idem_tower::Error) -> Self { PayError } }
    /// # impl From<sqlx::Error> for PayError { fn from(_: sqlx::Error) -> Self { PayError } }
    /// # impl axum::response::IntoResponse for PayError {
    /// #     fn into_response(self) -> axum::response::Response { StatusCode::BAD_GATEWAY.into_response() }
    /// # }
    /// # fn routes() -> axum::Router<PgStore> { axum::Router::new().route("/pay", axum::routing::post(pay)) }
    /// async fn pay(
    ///     State(store): State<PgStore>,
    ///     operation: Operation,
    ///     Json(amount_cents): Json<i64>,
    /// ) -> Result<Json<String>, PayError> {
    ///     let phases = operation.phases(&store);
    ///     // 1. A local transaction: its insert and its point commit together.
    ///     let order_id: i64 = phases
    ///         .transaction("create-order", |mut tx| async move {
    ///             let id = sqlx::query_scalar(
    ///                 "INSERT INTO orders (amount_cents, state) VALUES ($1, 'pending') RETURNING id",
    ///             )
    ///             .bind(amount_cents)
    ///             .fetch_one(&mut *tx)
    ///             .await?;
    ///             Ok::<_, PayError>(id)
    ///         })
    ///         .await?;
    ///     // 2. The call out, under a key that is the same on every run.
    ///     let key = operation.key_for("psp-charge");
    ///     let charge_id: String = phases
    ///         .call("psp-charge", || charge("order", amount_cents, &key))
    ///         .await?;
    ///     // 3. A local transaction with the charge's id.
    ///     let paid_with = charge_id.clone();
    ///     phases
    ///         .transaction("mark-paid", |mut tx| async move {
    ///             sqlx::query("UPDATE orders SET state = 'paid', charge_id = $1 WHERE id = $2")
    ///                 .bind(paid_with)
    ///                 .bind(order_id)
    ///                 .execute(&mut *tx)
    ///                 .await?;
    ///             Ok::<_, PayError>(())
    ///         })
    ///         .await?;
    ///     Ok(Json(charge_id))
    /// }
    /// # }
    /// ```
    pub fn phases<'p, P: RecoveryPoints + ?Sized>(&self, points: &'p P) -> Phases<'p, P> {
        Phases::new(points, self.phases, self.ttl)
    }
}

impl fmt::Debug for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operation")
            .field("id", &self.id())
            .finish_non_exhaustive()
    }
}

/// Why an [`Operation`] could not be extracted: the route has no
/// idempotency layer, or the handle has no secret to derive it with
/// ([`IdempotencyBuilder::outbound_key_secret`](crate::IdempotencyBuilder::outbound_key_secret)).
/// The server's mistake: answered 500, logged.
#[cfg(feature = "axum")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationRejection;

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for OperationRejection {
    fn into_response(self) -> axum::response::Response {
        let fix = "the Operation extractor needs an IdempotencyLayer on its route and a secret \
                   on the handle: IdempotencyBuilder::outbound_key_secret";
        tracing::error!("{fix}");
        let mut response = crate::Problem::Misconfigured(fix.to_owned()).to_response();
        response.extensions_mut().insert(self);
        response
    }
}

#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Operation {
    type Rejection = OperationRejection;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Operation>()
            .cloned()
            .ok_or(OperationRejection)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SECRET: &[u8] = b"a deployment secret of 32+ bytes!!";

    fn operation(secret: &[u8], composite: &str) -> Operation {
        OutboundKeys::new(secret).operation(
            &IdempotencyKey::new("idem:", composite),
            &Fingerprint::from_bytes([0; 32]),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn the_identity_never_shows_the_key() {
        let op = operation(SECRET, "pay:@tenant=acme:@user=ann:order-42");
        let id = op.id();
        assert_eq!(id.len(), 64);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        for part in ["acme", "ann", "order-42"] {
            assert!(!id.contains(part));
            assert!(!format!("{op:?}").contains(part));
        }
    }

    #[test]
    fn a_namespace_is_part_of_the_operation() {
        let keys = OutboundKeys::new(SECRET);
        let (fp, ttl) = (Fingerprint::from_bytes([0; 32]), Duration::from_secs(60));
        let a = keys.operation(&IdempotencyKey::new("billing:", "pay:42"), &fp, ttl);
        let b = keys.operation(&IdempotencyKey::new("shipping:", "pay:42"), &fp, ttl);
        assert_ne!(a.id(), b.id());
    }

    #[test]
    fn phases_are_the_requests_and_the_same_on_every_run() {
        let keys = OutboundKeys::new(SECRET);
        let key = IdempotencyKey::new("idem:", "pay:@tenant=acme:@user=ann:order-42");
        let ttl = Duration::from_secs(60);
        let [one, other] = [[1; 32], [2; 32]].map(Fingerprint::from_bytes);
        let first = keys.operation(&key, &one, ttl);
        let retry = OutboundKeys::new(SECRET).operation(&key, &one, ttl);
        let reused = keys.operation(&key, &other, ttl);
        assert_eq!(first.phases, retry.phases);
        // Another body under the same key: the same operation, the same
        // keys out, but phases of its own.
        assert_eq!(first.id(), reused.id());
        assert_eq!(first.key_for("psp-charge"), reused.key_for("psp-charge"));
        assert_ne!(first.phases, reused.phases);
        assert_ne!(first.phases, first.id);
    }

    proptest! {
        #[test]
        fn child_keys_are_the_same_on_every_run(
            composite in ".{1,80}",
            label in ".{0,40}",
        ) {
            // Two runs: two processes, each deriving from the secret.
            let first = operation(SECRET, &composite);
            let again = operation(SECRET, &composite);
            prop_assert_eq!(first.id(), again.id());
            prop_assert_eq!(first.key_for(&label), again.key_for(&label));
        }

        #[test]
        fn child_keys_are_short_visible_ascii(composite in ".{1,300}", label in ".{0,300}") {
            let key = operation(SECRET, &composite).key_for(&label);
            prop_assert!(key.as_str().len() <= 255);
            prop_assert!(key.as_str().bytes().all(|b| b.is_ascii_graphic()));
        }

        #[test]
        fn child_keys_differ_per_label_operation_and_caller(
            id in "[a-z0-9-]{1,20}",
            other_id in "[a-z0-9-]{1,20}",
            (tenant, other_tenant) in ("[a-z]{1,8}", "[a-z]{1,8}"),
            (user, other_user) in ("[a-z]{1,8}", "[a-z]{1,8}"),
            (label, other_label) in ("[a-z-]{0,12}", "[a-z-]{0,12}"),
        ) {
            let composite = |t: &str, u: &str, i: &str| format!("pay:@tenant={t}:@user={u}:{i}");
            let base = operation(SECRET, &composite(&tenant, &user, &id));
            let key = base.key_for(&label);
            if label != other_label {
                prop_assert_ne!(&key, &base.key_for(&other_label));
            }
            if id != other_id {
                prop_assert_ne!(&key, &operation(SECRET, &composite(&tenant, &user, &other_id)).key_for(&label));
            }
            if tenant != other_tenant {
                prop_assert_ne!(&key, &operation(SECRET, &composite(&other_tenant, &user, &id)).key_for(&label));
            }
            if user != other_user {
                prop_assert_ne!(&key, &operation(SECRET, &composite(&tenant, &other_user, &id)).key_for(&label));
            }
        }

        #[test]
        fn child_keys_depend_on_the_secret(composite in ".{1,80}", label in ".{0,20}") {
            // Whoever knows the key, the caller and the label, but not the
            // secret, computes another key.
            let theirs = operation(b"a guess at the deployment's secret", &composite);
            let ours = operation(SECRET, &composite);
            prop_assert_ne!(ours.key_for(&label), theirs.key_for(&label));
            prop_assert_ne!(ours.id(), theirs.id());
        }

        #[test]
        fn the_identity_is_no_outbound_key(composite in ".{1,80}", label in ".{0,20}") {
            let op = operation(SECRET, &composite);
            let key = op.key_for(&label);
            prop_assert_ne!(key.as_str(), op.id());
        }
    }
}
