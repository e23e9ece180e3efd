//! Type erasure for stores: one object-safe form of [`IdempotencyStore`],
//! so that a handle can hold any backend as `Arc<dyn DynStore>`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{IdempotencyStore, TransactionalStore};
use crate::{Claim, Error, Fingerprint, IdempotencyKey, Outcome, OwnerToken};

/// A boxed, `Send` future: what the object-safe store traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`IdempotencyStore`] with boxed futures, so it can be a trait object.
/// Every store is one (a blanket implementation); the methods are those of
/// [`IdempotencyStore`], with the same contracts.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::MemoryStore;
/// use idem_core::DynStore;
///
/// let store: Arc<dyn DynStore> = Arc::new(MemoryStore::new());
/// assert!(store.transactional().is_none());
/// ```
pub trait DynStore: Send + Sync + 'static {
    /// [`IdempotencyStore::claim`].
    fn claim<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<Claim, Error>>;

    /// [`IdempotencyStore::complete`].
    fn complete<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// [`IdempotencyStore::release`].
    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// [`IdempotencyStore::renew`].
    fn renew<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// [`IdempotencyStore::transactional`].
    fn transactional(&self) -> Option<&dyn TransactionalStore>;
}

impl<S: IdempotencyStore> DynStore for S {
    fn claim<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<Claim, Error>> {
        Box::pin(IdempotencyStore::claim(
            self,
            key,
            fingerprint,
            lease,
            owner,
        ))
    }

    fn complete<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(IdempotencyStore::complete(self, key, owner, outcome, ttl))
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(IdempotencyStore::release(self, key, owner))
    }

    fn renew<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(IdempotencyStore::renew(self, key, owner, lease))
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        IdempotencyStore::transactional(self)
    }
}
