//! What the SQL guards need from each database: how parameters are spelled,
//! how a row is locked for a re-read, the clock, and the few statements run
//! with sqlx.
//!
//! [`GuardConn`] is sealed: its items are public so they can appear in its
//! signatures, but this module is private, so nothing outside the crate can
//! name them or implement the trait.

use std::fmt;
use std::future::Future;

use sqlx::AssertSqlSafe;

use crate::sql::Dialect;
use crate::{Error, ErrorKind};

/// A validated SQL identifier: a table or column name made of ASCII letters,
/// digits and underscores, not starting with a digit, at most 48 bytes.
///
/// Identifiers are spliced into statements unquoted, so use the names as the
/// database folds them (lower case on PostgreSQL) and avoid reserved words.
///
/// ```
/// use idem_core::guards::Ident;
///
/// assert_eq!(Ident::new("orders_payments")?.as_str(), "orders_payments");
/// assert!(Ident::new("payments; DROP TABLE x").is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ident(String);

impl Ident {
    /// `name` if it is an identifier, else an [`ErrorKind::Config`] error.
    pub fn new(name: &str) -> Result<Self, Error> {
        crate::sql::validate_identifier(name).map_err(|_| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "{name:?} is not a valid SQL identifier: use ASCII letters, digits and \
                     underscores, not starting with a digit, at most 48 bytes"
                ),
            )
        })?;
        Ok(Self(name.to_owned()))
    }

    /// A name known at compile time to be an identifier.
    pub(crate) fn known(name: &'static str) -> Self {
        debug_assert!(crate::sql::validate_identifier(name).is_ok(), "{name}");
        Self(name.to_owned())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key of the row a guard works on: text or an integer, always bound as
/// a parameter.
///
/// ```
/// use idem_core::guards::RowId;
///
/// assert_eq!(RowId::from("P-1"), RowId::Text("P-1"));
/// assert_eq!(RowId::from(42_i64), RowId::Int(42));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowId<'a> {
    /// A text key (`TEXT`, `VARCHAR`).
    Text(&'a str),
    /// An integer key (`INTEGER`, `BIGINT`).
    Int(i64),
}

impl<'a> From<&'a str> for RowId<'a> {
    fn from(id: &'a str) -> Self {
        Self::Text(id)
    }
}

impl<'a> From<&'a String> for RowId<'a> {
    fn from(id: &'a String) -> Self {
        Self::Text(id)
    }
}

impl From<i64> for RowId<'_> {
    fn from(id: i64) -> Self {
        Self::Int(id)
    }
}

impl From<i32> for RowId<'_> {
    fn from(id: i32) -> Self {
        Self::Int(id.into())
    }
}

impl<'a> RowId<'a> {
    pub(crate) fn value(self) -> Value<'a> {
        match self {
            Self::Text(s) => Value::Text(s),
            Self::Int(i) => Value::Int(i),
        }
    }
}

/// A value bound to a guard's statement.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum Value<'a> {
    Text(&'a str),
    Int(i64),
    Bytes(&'a [u8]),
}

/// Which database a connection talks to.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum Kind {
    Postgres,
    MySql,
    Sqlite,
}

/// SQLite's clock in Unix milliseconds, as the SQLite store keeps it.
const SQLITE_NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

impl Kind {
    /// Numbers parameters in the order they appear: `$1`, `?` or `?1`.
    pub(crate) fn params(self) -> Params {
        Params {
            kind: self,
            next: 0,
        }
    }

    /// What a re-read appends to lock the row and read its latest committed
    /// version (MySQL's plain reads see the transaction's snapshot).
    pub(crate) fn lock(self) -> &'static str {
        match self {
            Self::Postgres | Self::MySql => " FOR UPDATE",
            Self::Sqlite => "",
        }
    }

    /// What a re-read appends to read the latest committed version of a row
    /// under a shared lock: enough where the caller only needs to see it,
    /// and no deadlock with others that hold the same shared lock (as
    /// MySQL's duplicate-key check leaves them).
    pub(crate) fn share_lock(self) -> &'static str {
        match self {
            Self::Postgres => " FOR SHARE",
            Self::MySql => " LOCK IN SHARE MODE",
            Self::Sqlite => "",
        }
    }

    /// `expr` read as a 64-bit integer, whatever integer type the column is.
    pub(crate) fn int(self, expr: &str) -> String {
        match self {
            Self::Postgres => format!("CAST({expr} AS BIGINT)"),
            Self::MySql => format!("CAST({expr} AS SIGNED)"),
            Self::Sqlite => expr.to_owned(),
        }
    }

    /// The type of a timestamp column kept by the guards.
    pub(crate) fn timestamp_type(self) -> &'static str {
        match self {
            Self::Postgres => "TIMESTAMPTZ",
            Self::MySql => "DATETIME(6)",
            Self::Sqlite => "INTEGER",
        }
    }

    /// The database's clock, as a value of [`Kind::timestamp_type`].
    pub(crate) fn now(self) -> &'static str {
        match self {
            Self::Postgres => "now()",
            Self::MySql => "UTC_TIMESTAMP(6)",
            Self::Sqlite => SQLITE_NOW_MS,
        }
    }

    /// The database's clock plus `ms` (a parameter or literal) milliseconds.
    pub(crate) fn now_plus_ms(self, ms: &str) -> String {
        match self {
            Self::Postgres => format!("now() + {ms}::bigint * interval '1 millisecond'"),
            Self::MySql => format!("UTC_TIMESTAMP(6) + INTERVAL ({ms} * 1000) MICROSECOND"),
            Self::Sqlite => format!("{SQLITE_NOW_MS} + {ms}"),
        }
    }

    /// Milliseconds from the database's clock until `column`.
    pub(crate) fn ms_until(self, column: &str) -> String {
        match self {
            Self::Postgres => {
                format!("(EXTRACT(EPOCH FROM ({column} - now())) * 1000)::int8")
            }
            Self::MySql => format!(
                "CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), {column}) DIV 1000 AS SIGNED)"
            ),
            Self::Sqlite => format!("{column} - {SQLITE_NOW_MS}"),
        }
    }

    /// The type of a short text key column (at most 255 bytes).
    pub(crate) fn key_type(self) -> &'static str {
        match self {
            Self::Postgres | Self::Sqlite => "TEXT",
            Self::MySql => "VARCHAR(255)",
        }
    }

    /// The type of a 32-byte hash column.
    pub(crate) fn hash_type(self) -> &'static str {
        match self {
            Self::Postgres => "BYTEA",
            Self::MySql => "VARBINARY(32)",
            Self::Sqlite => "BLOB",
        }
    }

    /// What follows `CREATE TABLE (...)`.
    pub(crate) fn table_options(self) -> &'static str {
        match self {
            Self::MySql => " ENGINE = InnoDB",
            Self::Postgres | Self::Sqlite => "",
        }
    }
}

/// Hands out parameter placeholders in order.
pub(crate) struct Params {
    kind: Kind,
    next: usize,
}

impl Params {
    /// The next placeholder.
    pub(crate) fn next(&mut self) -> String {
        self.next += 1;
        match self.kind {
            Kind::Postgres => format!("${}", self.next),
            Kind::MySql => "?".to_owned(),
            Kind::Sqlite => format!("?{}", self.next),
        }
    }

    /// `n` placeholders, comma-separated.
    pub(crate) fn list(&mut self, n: usize) -> String {
        (0..n).map(|_| self.next()).collect::<Vec<_>>().join(", ")
    }
}

/// A connection the SQL guards run on: PostgreSQL's, MySQL's (MariaDB's) or
/// SQLite's, inside a transaction or not.
///
/// Pass `&mut *tx` for a `sqlx::Transaction`, a pooled connection, or
/// `idem-tower`'s `Tx` extractor: each dereferences to the connection.
pub trait GuardConn: Send + sealed::Sealed {
    #[doc(hidden)]
    const KIND: Kind;

    /// Runs a statement; the number of rows it affected.
    #[doc(hidden)]
    fn execute(
        &mut self,
        sql: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The first column of the first row, as text.
    #[doc(hidden)]
    fn fetch_text(
        &mut self,
        sql: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send;

    /// Every column of the first row, as nullable 64-bit integers.
    #[doc(hidden)]
    fn fetch_ints(
        &mut self,
        sql: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<Vec<Option<i64>>>, sqlx::Error>> + Send;

    /// In a transaction of its own (a savepoint inside an open one): reads
    /// with `select` (which locks the row), then runs `delete` with the same
    /// arguments. The read's integers, if the delete removed the row.
    #[doc(hidden)]
    fn read_then_delete(
        &mut self,
        select: String,
        delete: String,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<Vec<Option<i64>>>, sqlx::Error>> + Send;

    /// Whether `DELETE ... RETURNING` works on this server (PostgreSQL,
    /// SQLite 3.35+, MariaDB 10.5+; not MySQL).
    #[doc(hidden)]
    fn delete_returning(&mut self) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// A database whose connections the SQL guards run on, for the guards that
/// keep tables of their own ([`SqlTokens`](super::SqlTokens),
/// [`Inbox`](super::Inbox)).
pub trait GuardDb: Dialect + sqlx::Database<Connection: GuardConn> {
    /// Creates a guard's table if missing, one process at a time.
    #[doc(hidden)]
    fn create_table(
        pool: &sqlx::Pool<Self>,
        table: &str,
        ddl: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// Binds `args` to a query, in order.
macro_rules! bind_all {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for arg in $args {
            query = match *arg {
                Value::Text(s) => query.bind(s),
                Value::Int(i) => query.bind(i),
                Value::Bytes(b) => query.bind(b),
            };
        }
        query
    }};
}

/// Reads every column of `row` as a nullable `i64`.
macro_rules! ints_of {
    ($row:expr) => {{
        let row = $row;
        (0..sqlx::Row::len(&row))
            .map(|i| sqlx::Row::try_get::<Option<i64>, _>(&row, i))
            .collect::<Result<Vec<_>, sqlx::Error>>()
    }};
}

/// The statements, written once per database with its concrete connection
/// type (no higher-ranked bounds over `sqlx::Executor`).
macro_rules! guard_conn {
    ($db:ty, $conn:ty, $kind:expr) => {
        impl sealed::Sealed for $conn {}

        impl GuardConn for $conn {
            const KIND: Kind = $kind;

            async fn execute(
                &mut self,
                sql: String,
                args: &[Value<'_>],
            ) -> Result<u64, sqlx::Error> {
                let query = bind_all!(sqlx::query(AssertSqlSafe(sql)), args);
                Ok(query.execute(&mut *self).await?.rows_affected())
            }

            async fn fetch_text(
                &mut self,
                sql: String,
                args: &[Value<'_>],
            ) -> Result<Option<String>, sqlx::Error> {
                let query = bind_all!(sqlx::query_scalar(AssertSqlSafe(sql)), args);
                query.fetch_optional(&mut *self).await
            }

            async fn fetch_ints(
                &mut self,
                sql: String,
                args: &[Value<'_>],
            ) -> Result<Option<Vec<Option<i64>>>, sqlx::Error> {
                let query = bind_all!(sqlx::query(AssertSqlSafe(sql)), args);
                match query.fetch_optional(&mut *self).await? {
                    Some(row) => ints_of!(row).map(Some),
                    None => Ok(None),
                }
            }

            async fn read_then_delete(
                &mut self,
                select: String,
                delete: String,
                args: &[Value<'_>],
            ) -> Result<Option<Vec<Option<i64>>>, sqlx::Error> {
                let mut tx = sqlx::Connection::begin(&mut *self).await?;
                let read = bind_all!(sqlx::query(AssertSqlSafe(select)), args)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(row) = read else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let ints = ints_of!(row)?;
                let deleted = bind_all!(sqlx::query(AssertSqlSafe(delete)), args)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok((deleted == 1).then_some(ints))
            }

            async fn delete_returning(&mut self) -> Result<bool, sqlx::Error> {
                match $kind {
                    Kind::MySql => {
                        let version: String = sqlx::query_scalar("SELECT VERSION()")
                            .fetch_one(&mut *self)
                            .await?;
                        Ok(mariadb_has_delete_returning(&version))
                    }
                    Kind::Postgres | Kind::Sqlite => Ok(true),
                }
            }
        }
    };
}

/// Whether a MySQL-protocol server takes `DELETE ... RETURNING`: MariaDB
/// 10.5 and later (it appeared in 10.0.5, but no release line before 10.5 is
/// still supported, so the floor costs nothing); MySQL has none.
fn mariadb_has_delete_returning(version: &str) -> bool {
    if !version.to_ascii_lowercase().contains("mariadb") {
        return false;
    }
    let mut parts = version.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (10, 5),
        _ => false,
    }
}

#[cfg(feature = "postgres")]
guard_conn!(sqlx::Postgres, sqlx::postgres::PgConnection, Kind::Postgres);
#[cfg(feature = "mysql")]
guard_conn!(sqlx::MySql, sqlx::mysql::MySqlConnection, Kind::MySql);
#[cfg(feature = "sqlite")]
guard_conn!(sqlx::Sqlite, sqlx::sqlite::SqliteConnection, Kind::Sqlite);

#[cfg(feature = "postgres")]
impl GuardDb for sqlx::Postgres {
    async fn create_table(
        pool: &sqlx::Pool<Self>,
        table: &str,
        ddl: String,
    ) -> Result<(), sqlx::Error> {
        // Concurrent CREATE TABLE IF NOT EXISTS can collide in pg_type: one
        // creator at a time, the lock ending with the transaction.
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("idem-guards:{table}"))
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
        tx.commit().await
    }
}

#[cfg(feature = "mysql")]
impl GuardDb for sqlx::MySql {
    async fn create_table(
        pool: &sqlx::Pool<Self>,
        _table: &str,
        ddl: String,
    ) -> Result<(), sqlx::Error> {
        // DDL commits by itself; CREATE TABLE IF NOT EXISTS is safe to race.
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(pool)
            .await
            .map(drop)
    }
}

#[cfg(feature = "sqlite")]
impl GuardDb for sqlx::Sqlite {
    async fn create_table(
        pool: &sqlx::Pool<Self>,
        _table: &str,
        ddl: String,
    ) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
        tx.commit().await
    }
}

/// Whether `err` is a deadlock or serialization failure: the database rolled
/// the transaction back, and running it again from the start is safe.
pub(crate) fn is_retryable(err: &Error) -> bool {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .and_then(|err| err.as_database_error())
        .and_then(|err| err.code())
        .is_some_and(|code| matches!(code.as_ref(), "40001" | "40P01"))
}

/// Runs `update`, a conditional UPDATE of the one row whose `id_col` is the
/// id it binds: `true` if it moved that row, `false` if the condition kept
/// it (or there is none); a [`ErrorKind::Config`] error if it moved several,
/// as `{table}.{id_col}` is then not unique. `what` names the change.
pub(crate) async fn update_one<C: GuardConn>(
    conn: &mut C,
    update: &str,
    args: &[Value<'_>],
    (table, id_col): (&Ident, &Ident),
    what: &str,
) -> Result<bool, Error> {
    match conn
        .execute(update.to_owned(), args)
        .await
        .map_err(db_error)?
    {
        0 => Ok(false),
        1 => Ok(true),
        rows => Err(config(format!(
            "{table}.{id_col} is not unique: {what} moved {rows} rows"
        ))),
    }
}

/// A database error, kept whole as the source.
pub(crate) fn db_error(err: sqlx::Error) -> Error {
    Error::unavailable(err)
}

/// An [`ErrorKind::Config`] error saying `what`.
pub(crate) fn config(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, what.into())
}

pub(crate) mod sealed {
    #[allow(unreachable_pub)] // sealed: named only inside the crate
    pub trait Sealed {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        assert!(Ident::new("orders_payments").is_ok());
        for bad in ["", "1a", "a-b", "a;b", "a b", "é"] {
            assert_eq!(Ident::new(bad).unwrap_err().kind(), ErrorKind::Config);
        }
    }

    #[test]
    fn placeholders_per_database() {
        let mut p = Kind::Postgres.params();
        assert_eq!((p.next(), p.list(2)), ("$1".into(), "$2, $3".into()));
        let mut p = Kind::Sqlite.params();
        assert_eq!((p.next(), p.list(2)), ("?1".into(), "?2, ?3".into()));
        let mut p = Kind::MySql.params();
        assert_eq!((p.next(), p.list(2)), ("?".into(), "?, ?".into()));
    }

    #[test]
    fn delete_returning_by_server_version() {
        assert!(mariadb_has_delete_returning("10.11.19-MariaDB-0+deb12u1"));
        assert!(mariadb_has_delete_returning("11.4.2-MariaDB"));
        assert!(!mariadb_has_delete_returning("10.4.30-MariaDB"));
        assert!(!mariadb_has_delete_returning("8.0.36"));
    }
}
