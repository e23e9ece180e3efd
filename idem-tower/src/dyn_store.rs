//! Type erasure for stores, so the [`Idempotency`](crate::Idempotency) handle
//! is one type whatever backend it carries.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::transaction::TransactionalStore;
use idem_core::{Claim, Error, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`IdempotencyStore`] with boxed futures: object safe.
pub(crate) trait DynStore: Send + Sync + 'static {
    fn claim<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<Claim, Error>>;

    fn complete<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
        outcome: &'a Outcome,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
    ) -> BoxFuture<'a, Result<(), Error>>;

    fn renew<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        owner: &'a OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

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
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(IdempotencyStore::complete(
            self, key, owner, outcome, retention,
        ))
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
