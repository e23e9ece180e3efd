//! The databases the SQL guards run on, and what only the guards need of
//! each: column types, lock clauses, and how their statements are run and
//! read back. Everything the stores share with the guards (parameters, the
//! clock, the SQL text of types) is idem-sql's [`Dialect`], which
//! [`GuardDb`] extends.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod statements;

use std::future::Future;

use idem_sql::sqlx;

use idem_sql::__guards::Value;
use idem_sql::Dialect;

pub(crate) use statements::EventRow;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use statements::{event_row, guard_statements, int_columns};

/// The databases the SQL guards run on: PostgreSQL (`sqlx::Postgres`),
/// MySQL or MariaDB (`sqlx::MySql`), SQLite (`sqlx::Sqlite`), each a
/// [`Dialect`] of idem-sql's stores too. The bound on the guards' types.
///
/// Sealed: its items are how the guards run their statements.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem_guards::{GuardDb, Inbox};
///
/// fn pool_of<DB: GuardDb>(inbox: &Inbox<DB>) -> &idem_sql::sqlx::Pool<DB> {
///     inbox.pool()
/// }
/// # let _ = pool_of::<idem_sql::sqlx::Sqlite>;
/// # }
/// ```
pub trait GuardDb: Dialect + sealed::Sealed {
    /// The type of a column of bytes of any length.
    #[doc(hidden)]
    const BLOB: &'static str;

    /// The type of a column of UTF-8 text of any length (not MySQL's
    /// `TEXT`, which holds 64 KiB: `INSERT IGNORE` would cut a longer
    /// value short with a warning alone).
    #[doc(hidden)]
    const LONG_TEXT: &'static str;

    /// `column`, a [`Dialect::SHORT_TEXT`] column, as a value sqlx reads
    /// as text (MySQL's binary string is read as bytes alone).
    #[doc(hidden)]
    fn short_text(column: &str) -> String;

    /// A 64-bit integer primary key column the database numbers itself, in
    /// insertion order.
    #[doc(hidden)]
    const SERIAL_KEY: &'static str;

    /// The statement that makes the connection's next transaction read
    /// committed, where that is not the default (MySQL's repeatable read
    /// takes gap locks that deadlock a relay's claim with the inserts of
    /// business transactions).
    #[doc(hidden)]
    const NEXT_TRANSACTION_READ_COMMITTED: Option<&'static str>;

    /// What a read appends to lock the rows it reads, skipping those another
    /// transaction holds; `None` where there are no row locks (SQLite, whose
    /// writer holds the whole database).
    #[doc(hidden)]
    const SKIP_LOCKED: Option<&'static str>;

    /// Runs a guard's statement; the number of rows it affected.
    #[doc(hidden)]
    fn execute(
        conn: &mut Self::Connection,
        sql: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The first column of the first row, as text: `None` if there is no
    /// row, `Some(None)` if the column is NULL.
    #[doc(hidden)]
    fn fetch_text(
        conn: &mut Self::Connection,
        sql: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<Option<String>>, sqlx::Error>> + Send;

    /// Every row, read as outbox events.
    #[doc(hidden)]
    fn fetch_events(
        conn: &mut Self::Connection,
        sql: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Vec<EventRow>, sqlx::Error>> + Send;

    /// Every column of the first row, as nullable 64-bit integers.
    #[doc(hidden)]
    fn fetch_ints(
        conn: &mut Self::Connection,
        sql: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<Vec<Option<i64>>>, sqlx::Error>> + Send;

    /// In a transaction of its own (a savepoint inside an open one): reads
    /// with `select` (which locks the row), then runs `delete` with the same
    /// arguments. The read's integers, if the delete removed the row.
    #[doc(hidden)]
    fn read_then_delete(
        conn: &mut Self::Connection,
        select: String,
        delete: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<Vec<Option<i64>>>, sqlx::Error>> + Send;

    /// Whether `DELETE ... RETURNING` works on the server behind `conn`
    /// (PostgreSQL, SQLite 3.35+, MariaDB 10.5+; not MySQL).
    #[doc(hidden)]
    fn delete_returning(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Runs `ddl`, a guard's `CREATE TABLE IF NOT EXISTS {table}`, one
    /// process at a time.
    #[doc(hidden)]
    fn create_table(
        pool: &sqlx::Pool<Self>,
        table: &str,
        ddl: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

mod sealed {
    #[allow(unreachable_pub)] // sealed: named only inside the crate
    pub trait Sealed {}
}
