//! Transactional mode: the claim, the handler's writes and the stored
//! outcome commit in one database transaction.
//!
//! A store that supports it returns itself from
//! [`IdempotencyStore::transactional`](crate::IdempotencyStore::transactional).
//! The layer then claims with [`TransactionalStore::claim_in_transaction`],
//! [attaches](ClaimTransaction::attach) the open transaction to the request
//! so the handler's extractor can write in it, and finally either
//! [commits](ClaimTransaction::commit) it with the outcome or
//! [rolls it back](ClaimTransaction::rollback). Dropping a
//! [`ClaimTransaction`] (a panic, a cancelled request, a crashed process)
//! rolls everything back: the business writes and the claim together, so a
//! retry finds the key free and the data untouched.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::{Claim, Error, Fingerprint, IdempotencyKey, Outcome, OwnerToken};

/// A boxed, `Send` future, for the object-safe traits of this module.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A store that can claim a key inside a database transaction.
pub trait TransactionalStore: Send + Sync + 'static {
    /// Begins a transaction and claims `key` in it.
    ///
    /// If another open transaction holds the key, this answers
    /// [`Claim::InFlight`] without waiting for it (and without keeping a
    /// connection); once it has committed, this answers as
    /// [`IdempotencyStore::claim`](crate::IdempotencyStore::claim) would.
    /// A transaction that ended without committing (rolled back, or its
    /// process gone) holds nothing: the key is free. Any answer but
    /// [`TransactionalClaim::Acquired`] leaves no transaction open.
    fn claim_in_transaction<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<TransactionalClaim, Error>>;
}

/// The answer to a transactional claim.
pub enum TransactionalClaim {
    /// The key is claimed in this open transaction.
    Acquired(Box<dyn ClaimTransaction>),
    /// The key was not free; no transaction is left open.
    Answered(Claim),
}

impl std::fmt::Debug for TransactionalClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Acquired(_) => f.write_str("Acquired(..)"),
            Self::Answered(claim) => f.debug_tuple("Answered").field(claim).finish(),
        }
    }
}

/// An open transaction holding a claim. Dropping it rolls back.
pub trait ClaimTransaction: Send + 'static {
    /// Makes the transaction reachable from the request, for the handler's
    /// transaction extractor.
    fn attach(&self, extensions: &mut http::Extensions);

    /// Records `outcome` for `retention` in the claim row and commits the
    /// transaction: the handler's writes and the outcome become durable
    /// together, or (on error) neither does.
    fn commit<'a>(
        self: Box<Self>,
        outcome: &'a Outcome,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Rolls back the handler's writes and the claim.
    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>>;
}
