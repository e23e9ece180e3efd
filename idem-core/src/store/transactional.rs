//! Transactional mode: the claim, the handler's writes and the stored
//! outcome commit in one database transaction.
//!
//! A store that supports it returns itself from
//! [`IdempotencyStore::transactional`](super::IdempotencyStore::transactional).
//! The caller claims with [`TransactionalStore::claim_in_transaction`], lends
//! the open transaction to the handler through its [`TxHandle`], and finally
//! either [commits](OpenTransaction::commit) it with the outcome or
//! [rolls it back](OpenTransaction::rollback). Dropping an
//! [`OpenTransaction`] (a panic, a cancelled request, a crashed process)
//! rolls everything back: the business writes and the claim together, so a
//! retry finds the key free and the data untouched. So does dropping the
//! future of a claim or a rollback at any point; dropping a commit's
//! future is a commit whose answer is lost: it commits, or not, the writes
//! and the outcome together. Either way the store is left as whole as
//! before (idem-sql's conformance case
//! `claims_and_commits_dropped_midway_leave_the_store_whole`).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::BoxFuture;
use crate::{Duplicate, Error, Fingerprint, IdempotencyKey, Outcome, OwnerToken};

/// A store that can claim a key inside a database transaction.
pub trait TransactionalStore: Send + Sync + 'static {
    /// Begins a transaction and claims `key` in it.
    ///
    /// If another open transaction holds the key, this answers
    /// [`Duplicate::InFlight`] without waiting for it (and without keeping a
    /// connection); once it has committed, this answers as
    /// [`IdempotencyStore::claim`](super::IdempotencyStore::claim) would.
    /// A transaction that ended without committing (rolled back, or its
    /// process gone) holds nothing: the key is free. A
    /// [`TxClaim::Duplicate`] leaves no transaction open.
    fn claim_in_transaction<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<TxClaim, Error>>;
}

/// The answer to a transactional claim.
pub enum TxClaim {
    /// The key is claimed in this open transaction.
    Open(Box<dyn OpenTransaction>),
    /// The key was not free; no transaction is left open.
    Duplicate(Duplicate),
}

impl std::fmt::Debug for TxClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open(_) => f.write_str("Open(..)"),
            Self::Duplicate(duplicate) => f.debug_tuple("Duplicate").field(duplicate).finish(),
        }
    }
}

/// An open transaction holding a claim. Dropping it rolls back.
pub trait OpenTransaction: Send + 'static {
    /// The transaction, for the handler to write in: the caller puts it
    /// where the handler finds it (idem-tower: the request's extensions,
    /// where its `Tx` extractor looks).
    fn handle(&self) -> TxHandle;

    /// Records `outcome` for `ttl` in the key's record and commits the
    /// transaction: the handler's writes and the outcome become durable
    /// together, or (on error) neither does. If this future is dropped
    /// before it answers, the commit may have happened or not, still both
    /// together or neither.
    fn commit<'a>(
        self: Box<Self>,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Rolls back the handler's writes and the claim.
    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>>;
}

/// A shared handle on the open transaction of a claim: the handler borrows
/// the transaction through it while the claim's owner keeps the right to
/// commit or roll it back.
///
/// The handle holds whatever the store lends its handlers, of any type:
/// the SQL stores (idem-sql) lend a `TxSlot` of their database
/// (which idem-tower's `Tx` extractor asks for), and a store of your own
/// (on tokio-postgres, diesel-async, a DynamoDB transaction, ...) lends its
/// own type, which your handlers' extractor asks for the same way. Cloning
/// the handle shares the one value.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use idem_core::TxHandle;
///
/// /// A store's transaction, as its handlers borrow it.
/// #[derive(Clone, Default)]
/// struct MyTransaction(Arc<Mutex<Vec<String>>>);
///
/// let handle = TxHandle::new(MyTransaction::default());
/// let lent = handle.clone();
/// lent.get::<MyTransaction>().expect("lent by my store").0.lock().unwrap().push("INSERT ...".into());
/// assert_eq!(handle.get::<MyTransaction>().unwrap().0.lock().unwrap().len(), 1);
/// assert!(handle.get::<String>().is_none(), "another store's type");
/// ```
#[derive(Clone)]
pub struct TxHandle(Arc<dyn Any + Send + Sync>);

impl TxHandle {
    /// A handle lending `transaction`: what the store's handlers write
    /// through. It is shared, not copied, by every clone of the handle.
    pub fn new<T: Any + Send + Sync>(transaction: T) -> Self {
        Self(Arc::new(transaction))
    }

    /// The lent transaction, if it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Debug for TxHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxHandle").finish_non_exhaustive()
    }
}
