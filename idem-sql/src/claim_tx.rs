//! The transaction a transactional claim (or a phase) holds: begun by
//! sqlx, or by the claim's own first query.
//!
//! sqlx's `Transaction` sends its BEGIN alone, in a round trip of its own.
//! On PostgreSQL and MySQL/MariaDB a claim does without it
//! ([`Dialect::OWN_BEGIN`]): BEGIN goes in the claim's round trip (its
//! lock, or its row, and its read follow in the same query), and COMMIT
//! in the completion's. [`ClaimTx`] holds either kind. One begun by the
//! claim is the pooled connection itself: if it is dropped while open (the
//! request's future dropped, a panic), a task of its own rolls it back
//! before the connection goes back to the pool, and a connection that
//! cannot roll back is closed instead, so that no transaction is ever left
//! open on a pooled connection.
//!
//! Lent to a handler, the transaction is counted open by sqlx
//! ([`ClaimTx::lend`]): sqlx keeps, per connection, how deep the
//! transactions it began are, and a `begin()` on a connection at depth 0
//! sends BEGIN, its `commit()` COMMIT. Without the count a handler's nested
//! `begin()`/`commit()` (as sqlx users write on a `Transaction`) would
//! commit the claim's transaction halfway; with it they are a savepoint
//! and its release, as on a `Transaction` of sqlx's. Lending costs the
//! winning claim one round trip, which the database's dialect fills with
//! the marker its settling checks (`Dialect::lend_statement`): whether the
//! transaction is still the claim's when the store commits or rolls it
//! back (ARCHITECTURE.md, "The claim's transaction belongs to idem").

use std::ops::{Deref, DerefMut};

use idem_core::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, SqlSafeStr};
use sqlx_core::transaction::TransactionManager;

use crate::Dialect;

/// Ends the transaction open on a connection: COMMIT if `commit`, else
/// ROLLBACK ([`Dialect::OWN_BEGIN`]); `lent` if [`ClaimTx::lend`] was
/// sent on it (and may have changed the session: MySQL's autocommit).
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub type EndTx<DB> = for<'c> fn(
    &'c mut <DB as sqlx::Database>::Connection,
    bool,
    bool,
) -> BoxFuture<'c, Result<(), sqlx::Error>>;

/// sqlx's transaction manager of `DB`: how deep sqlx counts the
/// transactions open on a connection, and the statements that change it.
type Manager<DB> = <DB as sqlx::Database>::TransactionManager;

/// Ends the transaction open on `conn` with COMMIT or ROLLBACK: the
/// [`EndTx`] of PostgreSQL, whose claims begin their own
/// ([`Dialect::OWN_BEGIN`]; MySQL's has its session to set back,
/// `mysql.rs`). Where the transaction was lent ([`ClaimTx::lend`]),
/// through sqlx, which then counts it ended.
#[cfg(feature = "postgres")]
pub(crate) fn end_transaction<DB: Dialect>(
    conn: &mut DB::Connection,
    commit: bool,
    _: bool,
) -> BoxFuture<'_, Result<(), sqlx::Error>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    Box::pin(async move {
        if Manager::<DB>::get_transaction_depth(conn) == 0 {
            let statement = if commit { "COMMIT" } else { "ROLLBACK" };
            return sqlx::raw_sql(statement).execute(conn).await.map(drop);
        }
        // A savepoint the handler began and never ended (a nested
        // transaction it leaked) is released or rolled back first, level
        // by level, as sqlx counts them.
        while Manager::<DB>::get_transaction_depth(conn) > 0 {
            if commit {
                Manager::<DB>::commit(conn).await?;
            } else {
                Manager::<DB>::rollback(conn).await?;
            }
        }
        Ok(())
    })
}

/// The open transaction of a transactional claim, lent to the handler
/// through [`TxSlot`](crate::TxSlot): it dereferences to the connection,
/// which is what `Tx` and [`PhaseTx`](crate::PhaseTx) hand out. Committed
/// or rolled back by the store, never by the handler.
///
/// ```
/// # #[cfg(feature = "postgres")]
/// # async fn write(slot: &idem_sql::TxSlot<idem_sql::sqlx::Postgres>) -> Result<(), idem_sql::sqlx::Error> {
/// let mut guard = slot.lock().await;
/// if let Some(tx) = guard.as_mut() {
///     // `&mut **tx` is the connection, inside the claim's transaction.
///     idem_sql::sqlx::query("INSERT INTO orders DEFAULT VALUES")
///         .execute(&mut **tx)
///         .await?;
/// }
/// # Ok(()) }
/// ```
pub struct ClaimTx<DB: Dialect> {
    kind: Kind<DB>,
    /// On SQLite, while the transaction is lent: its commits refused
    /// (`sqlite/lent.rs`).
    #[cfg(feature = "sqlite")]
    lent: Option<crate::sqlite::Lent>,
}

enum Kind<DB: Dialect> {
    /// Begun by sqlx (`Pool::begin`, `begin_with`).
    Sqlx(sqlx::Transaction<'static, DB>),
    /// Begun by the claim's own query.
    Own(Own<DB>),
}

/// A transaction begun by a statement of ours on a pooled connection.
struct Own<DB: Dialect> {
    /// `None` once the transaction ended (the connection went back to the
    /// pool).
    conn: Option<PoolConnection<DB>>,
    end: EndTx<DB>,
    /// Whether [`ClaimTx::lend`] was sent (whether or not it answered).
    lent: bool,
}

impl<DB: Dialect> ClaimTx<DB> {
    /// `conn`, on which the caller's next query begins the transaction
    /// itself; `end` ends it. Until then, and if that query fails before its
    /// BEGIN, ending it sends a ROLLBACK the database answers with a warning
    /// that no transaction is in progress.
    pub(crate) fn own(conn: PoolConnection<DB>, end: EndTx<DB>) -> Self {
        Self {
            kind: Kind::Own(Own {
                conn: Some(conn),
                end,
                lent: false,
            }),
            #[cfg(feature = "sqlite")]
            lent: None,
        }
    }

    /// Commits.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        match self.kind {
            Kind::Sqlx(tx) => tx.commit().await,
            Kind::Own(own) => own.end(true).await,
        }
    }

    /// Rolls back.
    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        match self.kind {
            Kind::Sqlx(tx) => tx.rollback().await,
            Kind::Own(own) => own.end(false).await,
        }
    }

    /// Counts the transaction open in sqlx, so that a handler's nested
    /// `begin()` on it is a savepoint (the module's docs): on a transaction
    /// of the claim's own, sqlx's transaction manager runs `statement`, which
    /// must leave the transaction open, and counts a transaction begun. One
    /// round trip. A transaction sqlx began is counted already.
    pub(crate) async fn lend(&mut self, statement: String) -> Result<(), sqlx::Error> {
        if let Kind::Own(own) = &mut self.kind {
            own.lent = true;
            let statement = AssertSqlSafe(statement).into_sql_str();
            Manager::<DB>::begin(own.conn_mut(), Some(statement)).await?;
        }
        Ok(())
    }

    /// Keeps `lent` (SQLite's hooks, `sqlite/lent.rs`) as long as the
    /// transaction.
    #[cfg(feature = "sqlite")]
    pub(crate) fn watch(&mut self, lent: crate::sqlite::Lent) {
        self.lent = Some(lent);
    }

    /// Takes the transaction back from the handler: whether it ended while
    /// lent (SQLite, `sqlite/lent.rs`).
    #[cfg(feature = "sqlite")]
    pub(crate) fn settle_lent(&self) -> bool {
        self.lent.as_ref().is_some_and(crate::sqlite::Lent::settle)
    }

    /// Lets go of a transaction a statement of the caller's ended (a COMMIT
    /// in its query): a connection of our own goes back to the pool, sqlx's
    /// count of it set back by a ROLLBACK queued to go with the pool's
    /// check of the connection (a lent transaction's COMMIT is
    /// `COMMIT AND CHAIN` where a ROLLBACK of nothing would warn); sqlx's
    /// handle rolls back what it still counts open.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn ended(self) {
        if let Kind::Own(mut own) = self.kind {
            if let Some(conn) = own.conn.as_mut() {
                uncount::<DB>(conn);
            }
            own.conn = None;
        }
    }
}

impl<DB: Dialect> ClaimTx<DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    /// Rolls back with `script`, which checks first that the transaction
    /// is still the claim's and ends it (a dialect's `tx_rollback`):
    /// whether the check found it ended. On any failure of the script the
    /// transaction (whatever the handler left open after it ended the
    /// claim's, or the claim's own, aborted by a statement of the
    /// handler's) is rolled back; `ended` says which failures are the
    /// check's.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) async fn rollback_checked(
        mut self,
        script: String,
        ended: fn(&sqlx::Error) -> bool,
    ) -> Result<bool, sqlx::Error> {
        match sqlx::raw_sql(AssertSqlSafe(script))
            .execute(&mut *self)
            .await
        {
            Ok(_) => {
                self.ended();
                Ok(false)
            }
            Err(err) => {
                self.rollback().await?;
                Ok(ended(&err))
            }
        }
    }
}

/// Sets sqlx's count of the transactions open on `conn` back to none, once
/// a statement of ours ended the transaction: a ROLLBACK queued for each,
/// sent with the connection's next use (the pool's check of it when it is
/// released), which finds no transaction, or the empty one a
/// `COMMIT AND CHAIN` began.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn uncount<DB: Dialect>(conn: &mut DB::Connection) {
    while Manager::<DB>::get_transaction_depth(conn) > 0 {
        Manager::<DB>::start_rollback(conn);
    }
}

impl<DB: Dialect> From<sqlx::Transaction<'static, DB>> for ClaimTx<DB> {
    fn from(tx: sqlx::Transaction<'static, DB>) -> Self {
        Self {
            kind: Kind::Sqlx(tx),
            #[cfg(feature = "sqlite")]
            lent: None,
        }
    }
}

impl<DB: Dialect> Own<DB> {
    fn conn(&self) -> &PoolConnection<DB> {
        self.conn
            .as_ref()
            .expect("a claim's own transaction is open until consumed")
    }

    fn conn_mut(&mut self) -> &mut PoolConnection<DB> {
        self.conn
            .as_mut()
            .expect("a claim's own transaction is open until consumed")
    }

    /// Ends the transaction; the connection stays here until the statement
    /// answered, so that a caller dropped meanwhile, or a failed statement,
    /// leaves it to [`Drop`].
    async fn end(mut self, commit: bool) -> Result<(), sqlx::Error> {
        let lent = self.lent;
        (self.end)(self.conn_mut(), commit, lent).await?;
        self.conn = None;
        Ok(())
    }
}

impl<DB: Dialect> Drop for Own<DB> {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let (end, lent) = (self.end, self.lent);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            conn.close_on_drop();
            return;
        };
        runtime.spawn(async move {
            if let Err(err) = end(&mut conn, false, lent).await {
                tracing::warn!(
                    error = %err,
                    "rolling back a dropped transactional claim failed; its connection is closed"
                );
                conn.close_on_drop();
            }
        });
    }
}

impl<DB: Dialect> Deref for ClaimTx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match &self.kind {
            Kind::Sqlx(tx) => tx,
            Kind::Own(own) => own.conn(),
        }
    }
}

impl<DB: Dialect> DerefMut for ClaimTx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        match &mut self.kind {
            Kind::Sqlx(tx) => tx,
            Kind::Own(own) => own.conn_mut(),
        }
    }
}

impl<DB: Dialect> std::fmt::Debug for ClaimTx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Sqlx(_) => "sqlx",
            Kind::Own(_) => "own",
        };
        f.debug_struct("ClaimTx").field("begun_by", &kind).finish()
    }
}
