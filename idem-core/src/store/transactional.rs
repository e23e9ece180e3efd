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
//! retry finds the key free and the data untouched.

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
    /// together, or (on error) neither does.
    fn commit<'a>(
        self: Box<Self>,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Rolls back the handler's writes and the claim.
    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>>;
}

/// A shared handle on the open transaction of a claim, typed by database:
/// the handler borrows the transaction through it while the claim's owner
/// keeps the right to commit or roll back (see
/// [`TxSlot`](crate::sql::TxSlot)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TxHandle {
    /// A PostgreSQL transaction.
    #[cfg(feature = "postgres")]
    Postgres(crate::sql::TxSlot<sqlx::Postgres>),
    /// A MySQL or MariaDB transaction.
    #[cfg(feature = "mysql")]
    MySql(crate::sql::TxSlot<sqlx::MySql>),
    /// A SQLite transaction.
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sql::TxSlot<sqlx::Sqlite>),
}

#[cfg(feature = "sql")]
impl TxHandle {
    /// The transaction's slot, if it is a transaction on `DB`.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(handle: idem_core::TxHandle) {
    /// use idem_core::sql::sqlx::Postgres;
    ///
    /// let slot = handle.slot::<Postgres>().expect("a PostgreSQL transaction");
    /// let mut guard = slot.lock().await;
    /// let conn = guard.as_mut().expect("still open");
    /// # let _ = conn; }
    /// ```
    pub fn slot<DB: crate::sql::Dialect>(&self) -> Option<&crate::sql::TxSlot<DB>> {
        let slot: &dyn std::any::Any = match *self {
            #[cfg(feature = "postgres")]
            Self::Postgres(ref slot) => slot,
            #[cfg(feature = "mysql")]
            Self::MySql(ref slot) => slot,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(ref slot) => slot,
        };
        slot.downcast_ref()
    }
}
