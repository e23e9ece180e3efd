//! The stores' side of the dialect: the statements of one store's table,
//! what a claim writes and reads back, and the Rust side of the statements
//! that is the same on every database.

use std::sync::Arc;
use std::time::Duration;

use sqlx::AssertSqlSafe;

use super::{Dialect, Value};
use idem_core::{Claim, Error, ErrorKind, Fingerprint, Outcome, OwnerToken, Record};

/// The statements of one store, rendered once for its table.
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub struct Queries {
    pub(crate) claim: Arc<str>,
    pub(crate) select: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) purge: Arc<str>,
    /// The table, for the statements written per claim: the scripts of
    /// transactional claims (`postgres/script.rs`, `sqlite/script.rs`),
    /// MySQL's lease stamped again (`mysql.rs`).
    pub(crate) table: Arc<str>,
    /// MySQL/MariaDB only: whether the server takes MariaDB's scripts
    /// (`mysql/script.rs`), learned at the store's first transactional
    /// claim.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) mariadb: std::sync::OnceLock<bool>,
}

/// The values a claim writes.
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub struct ClaimArgs<'a> {
    pub(crate) key_hash: &'a [u8; 32],
    pub(crate) key: &'a str,
    pub(crate) fingerprint: &'a Fingerprint,
    pub(crate) owner: &'a OwnerToken,
    pub(crate) lease_ms: i64,
}

impl<'a> ClaimArgs<'a> {
    /// The claim's parameters, the same five in the same order everywhere:
    /// key hash, key, owner, fingerprint, lease in ms.
    pub(crate) fn values(&self) -> [Value<'a>; 5] {
        [
            Value::Bytes(self.key_hash),
            Value::Text(self.key),
            Value::Bytes(self.owner.as_bytes()),
            Value::Bytes(self.fingerprint.as_bytes()),
            Value::Int(self.lease_ms),
        ]
    }
}

/// What one claim statement found.
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum ClaimStep {
    /// The row is ours: inserted, or taken over from an expired one.
    Acquired,
    /// A live row is in the way.
    Existing(RecordRow),
    /// The row vanished between statements (released or purged): try again.
    Vanished,
    /// Another open transaction holds the key (a transactional claim only):
    /// its lock, or on MySQL/MariaDB its uncommitted claim row.
    Locked,
}

impl ClaimStep {
    /// What a claim that wrote nothing found in the way on reading the row
    /// back: the row, or nothing if it went meanwhile. (MySQL's claim
    /// always reads back, and tells the three apart by the owner.)
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn found(row: Option<RecordRow>) -> Self {
        row.map_or(Self::Vanished, Self::Existing)
    }

    /// What a transactional claim's read under the lock that holds its key
    /// found: a live record answers; absent or expired, the key is the
    /// claim's, and its commit inserts the completed record.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn under_lock(found: Option<RecordRow>) -> Self {
        Self::live(found).unwrap_or(Self::Acquired)
    }

    /// What a transactional claim whose key another transaction holds
    /// found by a read without the lock, of the record as last committed:
    /// a live record answers (a claim of a completed key holds the key for
    /// a moment, and another process's duplicate meeting it replays); a
    /// key being written is not seen until it commits, and is in flight.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn held_elsewhere(found: Option<RecordRow>) -> Self {
        Self::live(found).unwrap_or(Self::Locked)
    }

    /// `found`, if it is a live record.
    fn live(found: Option<RecordRow>) -> Option<Self> {
        found.filter(|row| row.ms_left > 0).map(Self::Existing)
    }
}

/// A record row as read back, with the time left by the database's clock.
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub struct RecordRow {
    pub(crate) state: String,
    pub(crate) owner: Option<Vec<u8>>,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) outcome: Option<Vec<u8>>,
    pub(crate) ms_left: i64,
}

impl RecordRow {
    /// What a claim with `fingerprint` gets from this row; `None` if the row
    /// expired meanwhile and the claim should be tried again.
    pub(crate) fn answer(self, fingerprint: &Fingerprint) -> Result<Option<Claim>, Error> {
        if self.ms_left <= 0 {
            return Ok(None);
        }
        let corrupt = |what: &'static str| Error::new(ErrorKind::Corrupt, what);
        let stored_fp = Fingerprint::from_bytes(
            self.fingerprint
                .try_into()
                .map_err(|_| corrupt("fingerprint is not 32 bytes"))?,
        );
        let record = match self.state.as_str() {
            "I" => Record::InFlight {
                owner: OwnerToken::from_bytes(
                    self.owner
                        .ok_or_else(|| corrupt("in-flight record without owner"))?
                        .try_into()
                        .map_err(|_| corrupt("owner is not 16 bytes"))?,
                ),
                fingerprint: stored_fp,
            },
            "C" => Record::Completed {
                fingerprint: stored_fp,
                outcome: Outcome::decode(
                    &self
                        .outcome
                        .ok_or_else(|| corrupt("completed record without outcome"))?,
                )?,
            },
            _ => return Err(corrupt("unknown record state")),
        };
        let left = Duration::from_millis(self.ms_left.unsigned_abs());
        Ok(Some(record.claim_answer(fingerprint, left)))
    }
}

/// The methods whose Rust side is the same on every database: the SQL of
/// each dialect takes the same parameters in the same order (read: key hash;
/// complete: outcome, ttl in ms, key hash, owner; release: key hash,
/// owner; renew: lease in ms, key hash, owner; purge: batch). A dialect
/// whose purge is more than its one statement (MySQL's, `mysql.rs`) writes
/// its own and takes the rest with `shared_statements!(Conn, own purge)`.
/// (PostgreSQL's run as simple queries: `postgres/session.rs`.)
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! shared_statements {
    ($conn:ty) => {
        $crate::dialect::shared_statements!($conn, own purge);

        async fn purge(
            conn: &mut $conn,
            q: &Queries,
            _table: &str,
            batch: i64,
        ) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(AssertSqlSafe(q.purge.clone()))
                .bind(batch)
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected())
        }
    };
    ($conn:ty, own purge) => {
        async fn read(
            conn: &mut $conn,
            q: &Queries,
            key_hash: &[u8; 32],
        ) -> Result<Option<RecordRow>, sqlx::Error> {
            let row = sqlx::query(AssertSqlSafe(q.select.clone()))
                .bind(&key_hash[..])
                .fetch_optional(&mut *conn)
                .await?;
            row.as_ref().map(record_row).transpose()
        }

        async fn complete(
            conn: &mut $conn,
            q: &Queries,
            key_hash: &[u8; 32],
            owner: &OwnerToken,
            outcome: &[u8],
            ttl_ms: i64,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(AssertSqlSafe(q.complete.clone()))
                .bind(outcome)
                .bind(ttl_ms)
                .bind(&key_hash[..])
                .bind(&owner.as_bytes()[..])
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn release(
            conn: &mut $conn,
            q: &Queries,
            key_hash: &[u8; 32],
            owner: &OwnerToken,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(AssertSqlSafe(q.release.clone()))
                .bind(&key_hash[..])
                .bind(&owner.as_bytes()[..])
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn renew(
            conn: &mut $conn,
            q: &Queries,
            key_hash: &[u8; 32],
            owner: &OwnerToken,
            lease_ms: i64,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(AssertSqlSafe(q.renew.clone()))
                .bind(lease_ms)
                .bind(&key_hash[..])
                .bind(&owner.as_bytes()[..])
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }
    };
}
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use shared_statements;

/// Brings a store's table up to the last of `migrations` on `conn`, which
/// holds the database's migration lock: creates the version table
/// (`{table}_schema`) with `create_versions`, reads the last version applied
/// with `last_applied`, then runs each later migration and records it.
pub(crate) async fn run_migrations<DB>(
    conn: &mut DB::Connection,
    table: &str,
    migrations: &[(i64, &str)],
    create_versions: String,
    last_applied: String,
) -> Result<(), sqlx::Error>
where
    DB: Dialect + sqlx::database::HasStatementCache,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB> + sqlx::Decode<'q, DB>,
{
    sqlx::raw_sql(AssertSqlSafe(create_versions))
        .execute(&mut *conn)
        .await?;
    // Unnamed statements: in the migration's transaction, parse and run
    // reach one server session even through a pooler, and nothing is left
    // on a session it shares (ARCHITECTURE.md, "Behind a pooler").
    let applied: Option<i64> = sqlx::query_scalar(AssertSqlSafe(last_applied))
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
    for (version, sql) in migrations {
        if applied.is_some_and(|a| a >= *version) {
            continue;
        }
        sqlx::raw_sql(AssertSqlSafe(sql.replace("{table}", table)))
            .execute(&mut *conn)
            .await?;
        sqlx::query(AssertSqlSafe(DB::insert_or_skip(
            &format!("{table}_schema (version)"),
            &DB::placeholder(1),
        )))
        .persistent(false)
        .bind(version)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Reads a [`RecordRow`] from a row with the columns of `Queries::select`.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn record_row<R>(row: &R) -> Result<RecordRow, sqlx::Error>
where
    R: sqlx::Row,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    usize: sqlx::ColumnIndex<R>,
{
    Ok(RecordRow {
        state: row.try_get(0)?,
        owner: row.try_get(1)?,
        fingerprint: row.try_get(2)?,
        outcome: row.try_get(3)?,
        ms_left: row.try_get(4)?,
    })
}

/// Whether `err` is a database error with one of these codes.
pub(crate) fn has_code(err: &sqlx::Error, codes: &[&str]) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| codes.contains(&code.as_ref()))
}
