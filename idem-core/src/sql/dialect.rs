//! What differs between databases: SQL text, clocks and error codes.
//!
//! [`Dialect`] is sealed: its items are public so they can appear in its
//! signatures, but this module is private, so nothing outside the crate can
//! name them or implement the trait.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::{Claim, Error, ErrorKind, Fingerprint, Outcome, OwnerToken, Record};

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

/// What one claim statement found.
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum ClaimStep {
    /// The row is ours: inserted, or taken over from an expired one.
    Acquired,
    /// A live row is in the way.
    Existing(RecordRow),
    /// The row vanished between statements (released or purged): try again.
    Vanished,
}

impl ClaimStep {
    /// What a claim that wrote nothing found in the way on reading the row
    /// back: the row, or nothing if it went meanwhile.
    pub(crate) fn found(row: Option<RecordRow>) -> Self {
        row.map_or(Self::Vanished, Self::Existing)
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

/// A database idem can keep records in.
pub trait Dialect: sqlx::Database + Sized + sealed::Sealed {
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
        retention_ms: i64,
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

    /// Deletes up to `batch` expired rows; how many it deleted.
    #[doc(hidden)]
    fn purge(
        conn: &mut Self::Connection,
        queries: &Queries,
        batch: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Opens a transactional claim of `key_hash` in the transaction on
    /// `conn`, so that a duplicate learns "in flight" without waiting on it:
    /// `false` if another open transaction holds the key. Also bounds how
    /// long the claim waits on any other lock.
    #[doc(hidden)]
    fn begin_claim(
        conn: &mut Self::Connection,
        key_hash: &[u8; 32],
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// After the claim statement, on every path: sets how long the
    /// handler's own statements wait for row locks (`timeout`).
    #[doc(hidden)]
    fn end_claim(
        conn: &mut Self::Connection,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Whether `err` means a lock wait ran out (or a deadlock was broken):
    /// another transaction holds the key.
    #[doc(hidden)]
    fn is_lock_timeout(err: &sqlx::Error) -> bool;

    /// The open transaction of a claim, as the handle its handler borrows
    /// it through.
    #[doc(hidden)]
    fn handle(slot: super::TxSlot<Self>) -> crate::store::TxHandle;
}

/// The methods whose Rust side is the same on every database: the SQL of
/// each dialect takes the same parameters in the same order (read: key hash;
/// complete: outcome, retention in ms, key hash, owner; release: key hash,
/// owner; renew: lease in ms, key hash, owner; purge: batch).
macro_rules! shared_statements {
    ($conn:ty) => {
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
            retention_ms: i64,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(AssertSqlSafe(q.complete.clone()))
                .bind(outcome)
                .bind(retention_ms)
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

        async fn purge(conn: &mut $conn, q: &Queries, batch: i64) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(AssertSqlSafe(q.purge.clone()))
                .bind(batch)
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected())
        }
    };
}
pub(crate) use shared_statements;

/// Binds a claim's parameters, the same five in the same order everywhere:
/// key hash, key, owner, fingerprint, lease in ms.
pub(crate) fn bind_claim<'q, DB>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    args: &ClaimArgs<'q>,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    query
        .bind(&args.key_hash[..])
        .bind(args.key)
        .bind(&args.owner.as_bytes()[..])
        .bind(&args.fingerprint.as_bytes()[..])
        .bind(args.lease_ms)
}

/// Reads a [`RecordRow`] from a row with the columns of `Queries::select`.
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

/// Renders a statement for `table`.
pub(crate) fn render(template: &str, table: &str) -> Arc<str> {
    template.replace("{table}", table).into()
}

/// Whether `err` is a database error with one of these codes.
pub(crate) fn has_code(err: &sqlx::Error, codes: &[&str]) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| codes.contains(&code.as_ref()))
}

pub(crate) mod sealed {
    #[allow(unreachable_pub)] // sealed: named only inside the crate
    pub trait Sealed {}
}
