//! What differs between databases, each fact once: how parameters are
//! spelled, the clock, lock clauses, casts, DDL types and options, error
//! codes, and the statements the SQL stores run. The facts are written in
//! `postgres.rs`, `mysql.rs` and `sqlite.rs`; SQL text elsewhere is built
//! from them.
//!
//! [`Dialect`] is sealed (implemented for the three databases only) and
//! public only as a bound (`SqlStore<DB: Dialect>`). Its items are hidden:
//! the SQL text items are what idem-guards builds its statements from (with
//! `crate::__guards`; its own `GuardDb` holds what only the guards run), the
//! stores' statements how the stores run. Neither is covered by semver.

mod bind;
mod record;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use bind::{Value, bind_all};
pub(crate) use record::{ClaimArgs, ClaimStep, Queries, RecordRow, has_code, run_migrations};
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use record::{record_row, shared_statements};

use super::ClaimTx;
use super::SqlStore;
use super::batch::{Write, Written};
use super::claim_tx::EndTx;
use idem_core::{Error, OwnerToken};

/// The next transactional claim started by
/// [`Dialect::tx_commit_and_claim`]: its transaction and what its claim
/// found.
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub type Started<DB> = (ClaimTx<DB>, ClaimStep);

/// How a transactional claim's transaction was settled, committed or
/// rolled back ([`Dialect::tx_commit`], [`Dialect::tx_rollback`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum Settled {
    /// As asked: committed with the record, or rolled back.
    Done,
    /// Not committed: another claim's live row was in the way, or the
    /// claim's row was no longer its own (the database rolled the
    /// transaction back under the handler: a deadlock, a Galera abort).
    /// Nothing of the transaction committed.
    Fenced,
    /// The transaction was no longer the claim's: the handler ended it,
    /// and what it wrote before may have committed without the record.
    /// The key is kept from running again by a record that is not
    /// replayable (ARCHITECTURE.md, "The claim's transaction belongs to
    /// idem").
    Ended,
}

impl Settled {
    /// [`Settled::Done`] if `done`, else [`Settled::Fenced`].
    pub(crate) fn from_done(done: bool) -> Self {
        if done { Self::Done } else { Self::Fenced }
    }

    /// [`Settled::Ended`] if `ended`, else [`Settled::Done`].
    pub(crate) fn ended_if(ended: bool) -> Self {
        if ended { Self::Ended } else { Self::Done }
    }
}

/// A database idem keeps records in and runs its guards on: PostgreSQL
/// (`sqlx::Postgres`), MySQL or MariaDB (`sqlx::MySql`), SQLite
/// (`sqlx::Sqlite`).
///
/// Sealed: it is implemented for these three and names them in bounds,
/// e.g. `SqlStore<DB: Dialect>`, `Inbox<DB: Dialect>`.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem_sql::{Dialect, SqlStore, sqlx::Sqlite};
///
/// fn table_of<DB: Dialect>(store: &SqlStore<DB>) -> &str {
///     store.table()
/// }
/// # let _ = table_of::<Sqlite>;
/// # }
/// ```
pub trait Dialect: sqlx::Database + Sized + sealed::Sealed {
    // ----- SQL text, for idem-guards (`crate::__guards`) -----

    /// The `n`-th parameter of a statement, counted from 1: `$1`, `?` or
    /// `?1`.
    #[doc(hidden)]
    fn placeholder(n: usize) -> String;

    /// The database's clock, as a value of a [`Dialect::TIMESTAMP`] column.
    #[doc(hidden)]
    const NOW: &'static str;

    /// The database's clock plus `ms` (a parameter or literal) milliseconds,
    /// as a value of a [`Dialect::TIMESTAMP`] column.
    #[doc(hidden)]
    fn now_plus_ms(ms: &str) -> String;

    /// Milliseconds from the database's clock until the timestamp
    /// `column`, as a 64-bit integer.
    #[doc(hidden)]
    fn ms_until(column: &str) -> String;

    /// `expr` read as a 64-bit integer, whatever integer type it has.
    #[doc(hidden)]
    fn int(expr: &str) -> String;

    /// `INSERT INTO {into} VALUES ({values})` that inserts nothing, without
    /// an error, where the row would repeat a unique key. MySQL's `INSERT
    /// IGNORE` also turns some other errors (a value too long) into
    /// warnings: check values first.
    #[doc(hidden)]
    fn insert_or_skip(into: &str, values: &str) -> String;

    /// What a re-read appends to lock the row and read its latest committed
    /// version (MySQL's plain reads see the transaction's snapshot).
    #[doc(hidden)]
    const FOR_UPDATE: &'static str;

    /// What a re-read appends to read the latest committed version of a row
    /// under a shared lock: enough where the caller only needs to see it,
    /// and no deadlock with others that hold the same shared lock (as
    /// MySQL's duplicate-key check leaves them).
    #[doc(hidden)]
    const FOR_SHARE: &'static str;

    /// The type of a timestamp column: what [`Dialect::NOW`] is.
    #[doc(hidden)]
    const TIMESTAMP: &'static str;

    /// The type of a short text key column (at most 255 bytes), compared
    /// byte for byte as PostgreSQL and SQLite do by default: ids that
    /// differ only by case, an accent or a trailing space are different
    /// ids. On MySQL and MariaDB that is a binary string, `VARBINARY(255)`
    /// (a character column would compare by a collation that ignores
    /// them): bind UTF-8 text to it as usual, but read it back as text
    /// with `CONVERT(column USING utf8mb4)`, as sqlx decodes a binary
    /// column as bytes only.
    #[doc(hidden)]
    const SHORT_TEXT: &'static str;

    /// The type of a 32-byte hash column.
    #[doc(hidden)]
    const HASH: &'static str;

    /// What follows `CREATE TABLE (...)`.
    #[doc(hidden)]
    const TABLE_OPTIONS: &'static str;

    // ----- the stores -----

    #[doc(hidden)]
    fn queries(table: &str) -> Queries;

    #[doc(hidden)]
    fn migrate(
        pool: &sqlx::Pool<Self>,
        table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Whether [`Dialect::claim`] answers a live row without writing by
    /// itself; if not, a claim outside a transaction reads first.
    #[doc(hidden)]
    const CLAIM_READS_FIRST: bool;

    /// Whether the database lets one connection write at a time, so that
    /// the store's writes take turns in the process (see `sql/writer.rs`).
    #[doc(hidden)]
    const ONE_WRITER: bool;

    /// The statement that begins a transactional claim's transaction where
    /// it is not sqlx's plain BEGIN: SQLite's BEGIN IMMEDIATE, which takes
    /// the write lock that holds the claim's key. Begun by sqlx, which
    /// keeps its count of open transactions true even if the claim is
    /// dropped while it waits for the lock.
    #[doc(hidden)]
    const TX_BEGIN: Option<&'static str> = None;

    /// Where a transactional claim begins its transaction itself, in the
    /// query of [`Dialect::tx_claim`] (PostgreSQL), rather than by sqlx in
    /// a round trip of its own: how it is ended (`claim_tx.rs`). Then
    /// [`Dialect::tx_claim`] gets a connection with no transaction open,
    /// and [`Dialect::tx_commit`] ends it for good.
    #[doc(hidden)]
    const OWN_BEGIN: Option<EndTx<Self>> = None;

    #[doc(hidden)]
    fn claim(
        conn: &mut Self::Connection,
        queries: &Queries,
        args: ClaimArgs<'_>,
    ) -> impl Future<Output = Result<ClaimStep, sqlx::Error>> + Send;

    /// The row of `key_hash` with the time it has left, by a plain
    /// (non-locking) read; `None` if there is none.
    #[doc(hidden)]
    fn read(
        conn: &mut Self::Connection,
        queries: &Queries,
        key_hash: &[u8; 32],
    ) -> impl Future<Output = Result<Option<RecordRow>, sqlx::Error>> + Send;

    /// `true` if the row was ours and is now completed.
    #[doc(hidden)]
    fn complete(
        conn: &mut Self::Connection,
        queries: &Queries,
        key_hash: &[u8; 32],
        owner: &OwnerToken,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// `true` if the row was ours and is now gone.
    #[doc(hidden)]
    fn release(
        conn: &mut Self::Connection,
        queries: &Queries,
        key_hash: &[u8; 32],
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// `true` if the row was ours, in flight with a live lease, and now
    /// expires `lease_ms` from now.
    #[doc(hidden)]
    fn renew(
        conn: &mut Self::Connection,
        queries: &Queries,
        key_hash: &[u8; 32],
        owner: &OwnerToken,
        lease_ms: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Runs plain writes that came together, where writers take turns
    /// ([`Dialect::ONE_WRITER`], `sql/batch.rs`), each answered in order.
    /// One at a time unless the database has a statement for many at once.
    #[doc(hidden)]
    fn run_writes(
        store: &SqlStore<Self>,
        conn: &mut Self::Connection,
        writes: &[&Write],
    ) -> impl Future<Output = Vec<Result<Written, Error>>> + Send {
        store.run_each(conn, writes)
    }

    /// Deletes up to `batch` expired rows of `table` (whose statements
    /// `queries` are) in one short statement or transaction, skipping rows
    /// another transaction holds where the database has row locks (see
    /// `purge.rs`); how many it deleted.
    #[doc(hidden)]
    fn purge(
        conn: &mut Self::Connection,
        queries: &Queries,
        table: &str,
        batch: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The claim of a transactional claim, in the transaction open on
    /// `conn` (where [`Dialect::OWN_BEGIN`], one its query begins), with
    /// everything it takes: [`ClaimStep::Locked`] at once,
    /// without waiting, if another open transaction holds the key, so that
    /// a duplicate learns "in flight" while the first runs. On every path
    /// it leaves the handler's own statements waiting for locks up to
    /// `lock_timeout`.
    ///
    /// Where a lock alone holds the key to the end of the transaction
    /// (PostgreSQL's advisory lock, SQLite's write lock), a read under that
    /// lock: a live row answers, anything else leaves the key to this
    /// claim, and nothing is written until [`Dialect::tx_commit`].
    /// Elsewhere (MySQL/MariaDB) [`Dialect::claim`], which writes the
    /// claim's row: that row, written in the transaction, holds the key.
    #[doc(hidden)]
    fn tx_claim(
        conn: &mut Self::Connection,
        queries: &Queries,
        args: ClaimArgs<'_>,
        lock_timeout: Duration,
    ) -> impl Future<Output = Result<ClaimStep, sqlx::Error>> + Send {
        // Here nothing waits on a lock longer than the connection's own
        // setting (SQLite: its busy timeout).
        let _ = lock_timeout;
        async move {
            match Self::claim(conn, queries, args).await {
                Err(err) if Self::is_lock_timeout(&err) => Ok(ClaimStep::Locked),
                step => step,
            }
        }
    }

    /// The statement a won transactional claim's transaction is lent to
    /// the handler with ([`ClaimTx::lend`]: sqlx then counts it open, so a
    /// nested `begin()` is a savepoint), which marks the transaction as
    /// the claim's, so that [`Dialect::tx_commit`] and
    /// [`Dialect::tx_rollback`] can tell whether it still is, and bounds
    /// how long it may sit idle where the database can (PostgreSQL: the
    /// claim's `lease`). `None` where sqlx began the transaction (SQLite):
    /// there is nothing to lend.
    #[doc(hidden)]
    fn lend_statement(owner: &OwnerToken, lease: Duration) -> Option<String> {
        let _ = (owner, lease);
        None
    }

    /// Lends a won transactional claim's transaction to the handler: by
    /// default [`ClaimTx::lend`] with [`Dialect::lend_statement`].
    #[doc(hidden)]
    fn tx_lend(
        tx: &mut ClaimTx<Self>,
        owner: &OwnerToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let statement = Self::lend_statement(owner, lease);
        async move {
            if let Some(statement) = statement {
                tx.lend(statement).await?;
            }
            Ok(())
        }
    }

    /// Records a transactional claim's `outcome` and commits, writes and
    /// record together. [`Settled::Fenced`] if another claim's live row is
    /// in the way: then nothing is committed. By default the claim's row
    /// is completed, then COMMIT.
    #[doc(hidden)]
    fn tx_commit(
        mut tx: ClaimTx<Self>,
        queries: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> impl Future<Output = Result<Settled, sqlx::Error>> + Send {
        async move {
            let done = Self::complete(&mut tx, queries, args.key_hash, args.owner, outcome, ttl_ms)
                .await?;
            if done {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
            Ok(Settled::from_done(done))
        }
    }

    /// Rolls a transactional claim's transaction back, the handler's
    /// writes with it. [`Settled::Ended`] if the transaction was no longer
    /// the claim's ([`Dialect::tx_keep_ended`] follows). By default the
    /// ROLLBACK alone.
    #[doc(hidden)]
    fn tx_rollback(
        tx: ClaimTx<Self>,
        args: ClaimArgs<'_>,
    ) -> impl Future<Output = Result<Settled, sqlx::Error>> + Send {
        let _ = args;
        async move {
            tx.rollback().await?;
            Ok(Settled::Done)
        }
    }

    /// After [`Settled::Ended`], the claim's transaction rolled back: keeps
    /// the key of the claim from running again, for `ttl_ms`, with
    /// `outcome` (a record that is not replayable), where something of the
    /// transaction may have committed. `false` if nothing of it did: the
    /// database rolled it back (the claim's row is gone), or, on SQLite,
    /// refused every commit while it was lent; the key is then free as
    /// after a rollback. By default the claim's row completed, if still its
    /// own (the handler's COMMIT committed it in flight).
    #[doc(hidden)]
    fn tx_keep_ended(
        pool: &sqlx::Pool<Self>,
        queries: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        async move {
            let mut conn = pool.acquire().await?;
            Self::complete(
                &mut conn,
                queries,
                args.key_hash,
                args.owner,
                outcome,
                ttl_ms,
            )
            .await
        }
    }

    /// [`Dialect::tx_commit`], and in the same call to the database the
    /// start of the next transactional claim, of `next_hash`, on the same
    /// connection, where writers take turns ([`Dialect::ONE_WRITER`],
    /// `sql/relay.rs`): that claim's transaction, holding the write lock,
    /// and what its claim found, if the commit went through and the next
    /// claim started. By default the commit alone.
    #[doc(hidden)]
    fn tx_commit_and_claim(
        tx: ClaimTx<Self>,
        queries: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
        next_hash: &[u8; 32],
    ) -> impl Future<Output = Result<(Settled, Option<Started<Self>>), sqlx::Error>> + Send {
        let _ = next_hash;
        async move {
            let settled = Self::tx_commit(tx, queries, args, outcome, ttl_ms).await?;
            Ok((settled, None))
        }
    }

    /// Whether `err` means a lock wait ran out (or a deadlock was broken):
    /// another transaction holds the key.
    #[doc(hidden)]
    fn is_lock_timeout(err: &sqlx::Error) -> bool;

    // ----- recovery points (`points.rs`) -----

    /// The statement that deletes up to `$1` expired rows of the points
    /// table `points`, skipping rows another transaction holds where the
    /// database can.
    #[doc(hidden)]
    fn purge_points(points: &str) -> String;

    /// Runs a points statement that reads one row: its output and the
    /// milliseconds it has left.
    #[doc(hidden)]
    fn point_read(
        conn: &mut Self::Connection,
        sql: &Arc<str>,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<(Vec<u8>, i64)>, sqlx::Error>> + Send;

    /// Runs a points statement that writes; the rows it changed.
    #[doc(hidden)]
    fn point_execute(
        conn: &mut Self::Connection,
        sql: &Arc<str>,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Runs a points statement that counts.
    #[doc(hidden)]
    fn point_count(
        conn: &mut Self::Connection,
        sql: &Arc<str>,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

/// The points statements of [`Dialect`], their values bound as parameters
/// (MySQL/MariaDB and SQLite; PostgreSQL's go as simple queries, their
/// values written into the text, which a pooler never splits).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! bound_point_statements {
    ($conn:ty) => {
        async fn point_read(
            conn: &mut $conn,
            sql: &std::sync::Arc<str>,
            args: &[$crate::dialect::Value<'_>],
        ) -> Result<Option<(Vec<u8>, i64)>, sqlx::Error> {
            let row =
                $crate::dialect::bind_all(sqlx::query(sqlx::AssertSqlSafe(sql.clone())), args)
                    .fetch_optional(&mut *conn)
                    .await?;
            row.map(|row| Ok((sqlx::Row::try_get(&row, 0)?, sqlx::Row::try_get(&row, 1)?)))
                .transpose()
        }

        async fn point_execute(
            conn: &mut $conn,
            sql: &std::sync::Arc<str>,
            args: &[$crate::dialect::Value<'_>],
        ) -> Result<u64, sqlx::Error> {
            let done =
                $crate::dialect::bind_all(sqlx::query(sqlx::AssertSqlSafe(sql.clone())), args)
                    .execute(&mut *conn)
                    .await?;
            Ok(done.rows_affected())
        }

        async fn point_count(
            conn: &mut $conn,
            sql: &std::sync::Arc<str>,
            args: &[$crate::dialect::Value<'_>],
        ) -> Result<i64, sqlx::Error> {
            let row =
                $crate::dialect::bind_all(sqlx::query(sqlx::AssertSqlSafe(sql.clone())), args)
                    .fetch_one(&mut *conn)
                    .await?;
            sqlx::Row::try_get(&row, 0)
        }
    };
}
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use bound_point_statements;

pub(crate) mod sealed {
    #[allow(unreachable_pub)] // sealed: named only inside the crate
    pub trait Sealed {}
}
