//! The transaction a transactional claim (or a phase) holds: begun by
//! sqlx, or by the claim's own first query.
//!
//! sqlx's `Transaction` sends its BEGIN alone, in a round trip of its own,
//! and counts itself open until its own COMMIT or ROLLBACK: a transaction
//! a statement of ours committed still gets a ROLLBACK when the handle is
//! dropped. On PostgreSQL and MySQL/MariaDB a claim does without it
//! ([`Dialect::OWN_BEGIN`]): BEGIN goes in the claim's round trip (its
//! lock, or its row, and its read follow in the same query), and COMMIT
//! in the completion's, which ends the transaction for good.
//! [`ClaimTx`] holds either kind. One begun by the claim is the pooled
//! connection itself: if it is dropped while open (the request's future
//! dropped, a panic), a task of its own rolls it back before the
//! connection goes back to the pool, and a connection that cannot roll
//! back is closed instead, so that no transaction is ever left open on
//! a pooled connection.

use std::ops::{Deref, DerefMut};

use idem_core::BoxFuture;
use sqlx::pool::PoolConnection;

use crate::Dialect;

/// Ends the transaction open on a connection: COMMIT if `commit`, else
/// ROLLBACK ([`Dialect::OWN_BEGIN`]).
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub type EndTx<DB> = for<'c> fn(
    &'c mut <DB as sqlx::Database>::Connection,
    bool,
) -> BoxFuture<'c, Result<(), sqlx::Error>>;

/// Ends the transaction open on `conn` with COMMIT or ROLLBACK: the
/// [`EndTx`] of a database whose claims begin their own
/// ([`Dialect::OWN_BEGIN`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn end_transaction<DB: Dialect>(
    conn: &mut DB::Connection,
    commit: bool,
) -> BoxFuture<'_, Result<(), sqlx::Error>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let statement = if commit { "COMMIT" } else { "ROLLBACK" };
    Box::pin(async move { sqlx::raw_sql(statement).execute(conn).await.map(drop) })
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
            }),
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

    /// Lets go of a transaction a statement of the caller's ended (a COMMIT
    /// in its query): a connection of our own goes back to the pool as it
    /// is; sqlx's handle rolls back what it still counts open.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn ended(self) {
        if let Kind::Own(mut own) = self.kind {
            own.conn = None;
        }
    }
}

impl<DB: Dialect> From<sqlx::Transaction<'static, DB>> for ClaimTx<DB> {
    fn from(tx: sqlx::Transaction<'static, DB>) -> Self {
        Self {
            kind: Kind::Sqlx(tx),
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
        (self.end)(self.conn_mut(), commit).await?;
        self.conn = None;
        Ok(())
    }
}

impl<DB: Dialect> Drop for Own<DB> {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let end = self.end;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            conn.close_on_drop();
            return;
        };
        runtime.spawn(async move {
            if let Err(err) = end(&mut conn, false).await {
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
