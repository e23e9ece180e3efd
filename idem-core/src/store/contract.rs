//! The contract every backend implements.

use std::future::Future;
use std::time::Duration;

use super::TransactionalStore;
use crate::{Claim, Error, Fingerprint, IdempotencyKey, Outcome, OwnerToken};

/// Where idempotency records live.
///
/// Every method is one atomic step of the record state machine (see
/// [`Record`](crate::Record)); implementations must make each one a single
/// compare-and-set against the store's own clock, so that any number of
/// processes sharing the store agree on who owns a key.
///
/// Errors: [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when the
/// backend could not answer (the outcome of the call is then unknown), and
/// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) from `complete`,
/// `release` or `renew` when the caller no longer owns the record.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Claim, Fingerprint, IdempotencyKey, IdempotencyStore, MemoryStore, Outcome, OwnerToken};
///
/// # tokio_test();
/// # fn tokio_test() { tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let key = IdempotencyKey::new("idem:", "charge:42");
/// let fp = Fingerprint::from_bytes([1; 32]);
///
/// let owner = OwnerToken::generate();
/// let Claim::Acquired(owner) = store.claim(&key, &fp, Duration::from_secs(30), owner).await? else {
///     panic!("a fresh key is free");
/// };
/// // ... run the handler, renewing the lease while it runs ...
/// store.renew(&key, &owner, Duration::from_secs(30)).await?;
/// store.complete(&key, &owner, &Outcome::NotReplayable, Duration::from_secs(86_400)).await?;
/// let again = store.claim(&key, &fp, Duration::from_secs(30), OwnerToken::generate()).await?;
/// assert_eq!(again, Claim::Replay(Outcome::NotReplayable));
/// # Ok::<(), idem_core::Error>(()) }).unwrap(); }
/// ```
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key` for a request with `fingerprint`, atomically:
    ///
    /// - absent, or in flight with an expired lease: becomes in flight under
    ///   `owner` (a fresh [`OwnerToken::generate`], chosen by the caller so
    ///   that stores in layers can share it) with a lease of `lease`; returns
    ///   [`Claim::Acquired`] with that token;
    /// - live with another fingerprint: [`Claim::Mismatch`] (checked first);
    /// - in flight with a live lease: [`Claim::InFlight`] with the lease left;
    /// - completed: [`Claim::Replay`] with the stored outcome.
    ///
    /// At most one of any number of concurrent claims of a free key acquires it.
    fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> impl Future<Output = Result<Claim, Error>> + Send;

    /// Completes `key` with `outcome`, kept for `ttl`, if `owner` still
    /// holds it in flight; otherwise fails with `LeaseLost` and changes
    /// nothing.
    fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Removes `key` so the next request may run, if `owner` still holds it in
    /// flight; otherwise fails with `LeaseLost` and changes nothing.
    fn release(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Renews the lease of `key`'s in-flight claim: its lease becomes `lease`
    /// from now, by the store's clock, if `owner` still holds it in flight
    /// and its lease has not run out; otherwise fails with `LeaseLost` and
    /// changes nothing (the record was taken over after its lease ended,
    /// completed, released, or has expired and may be taken over at any
    /// moment).
    ///
    /// The idempotency layer calls it while the handler of a plain
    /// (non-transactional) claim runs, every third of the lease, so that a
    /// short lease suffices for a long handler and a claim whose process
    /// died frees within about one lease. `lease` replaces the time left,
    /// whatever it was: it may also shorten it.
    fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// This store's transactional mode, if it has one (the SQL stores do):
    /// see [`TransactionalStore`].
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }
}

impl<S: IdempotencyStore + ?Sized> IdempotencyStore for std::sync::Arc<S> {
    fn claim(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> impl Future<Output = Result<Claim, Error>> + Send {
        (**self).claim(key, fingerprint, lease, owner)
    }

    fn complete(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        outcome: &Outcome,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        (**self).complete(key, owner, outcome, ttl)
    }

    fn release(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        (**self).release(key, owner)
    }

    fn renew(
        &self,
        key: &IdempotencyKey,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        (**self).renew(key, owner, lease)
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        (**self).transactional()
    }
}
