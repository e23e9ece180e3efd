//! The SQL stores of [idem](https://docs.rs/idem-tower) on [sqlx]: the
//! source of truth. PostgreSQL ([`PgStore`], feature `postgres`),
//! MySQL/MariaDB ([`MySqlStore`], `mysql`) and SQLite ([`SqliteStore`],
//! `sqlite`), each an [`IdempotencyStore`](idem_core::IdempotencyStore)
//! with a transactional mode, built on idem-core's public store interface
//! alone. Users of idem-tower reach them through its database features
//! (`idem_tower::PgStore`, `idem_tower::sql`).
//!
//! One table, one row per key, the key's hash as primary key: the unique
//! index is what makes a claim atomic across any number of processes. Every
//! transition, and every renewal of a lease (an `UPDATE` of the expiry), is
//! one statement guarded by the owner token, and every expiry is judged by
//! the database's clock (`now()`, `UTC_TIMESTAMP(6)`, SQLite's
//! `julianday('now')`), never the app server's.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_sql::{PgStore, sqlx::PgPool};
//!
//! let pool = PgPool::connect("postgres://localhost/app").await?;
//! let store = PgStore::new(pool);
//! store.migrate().await?; // idempotent; its own version table
//! # Ok(()) }
//! ```
//!
//! # Purging expired rows
//!
//! Expired rows are dead (a claim takes them over), but they take space.
//! [`SqlStore::purge_in_background`] deletes them every period on a task of
//! its own, until the [`PurgeTask`] it returns is stopped or dropped:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(store: idem_sql::PgStore) {
//! use idem_sql::PurgeOptions;
//!
//! let purge = store.purge_in_background(PurgeOptions::default()); // every minute
//! // ... serve ...
//! purge.stop().await;
//! # }
//! ```
//!
//! It deletes in bounded batches, one short statement each, counts what it
//! deletes in `idem_records_purged_total`, logs what fails and tries again
//! next period. Run it in every instance: purgers on one table share the
//! work, each row deleted once, without waiting on one another (SQLite's
//! take turns). [`SqlStore::purge_expired`] is one pass, for a scheduler
//! you already have.
//!
//! # How a claim runs
//!
//! A claim reads the key's row first, without locking it, with the time it
//! has left by the database's clock. A live row answers at once (a replay,
//! "in flight" or a fingerprint mismatch) with no write, so duplicates of a
//! key take no lock and never queue behind one another or behind a
//! transaction holding the row. Only when the row is absent or expired does
//! the claim write: one upsert that inserts the row or takes over the
//! expired one, and the unique index lets exactly one of any number of
//! concurrent claims acquire. If another claim won meanwhile, the row it
//! wrote is read and answered from; a row that vanishes or expires between
//! statements sends the claim round again.
//!
//! | database | read | write |
//! |---|---|---|
//! | PostgreSQL | in the same statement (a `WITH live AS (SELECT ...)` the insert depends on): one round trip either way | `INSERT ... SELECT ... WHERE NOT EXISTS (live) ON CONFLICT DO UPDATE ... WHERE expired RETURNING` |
//! | SQLite | a `SELECT` before | `INSERT ... ON CONFLICT DO UPDATE ... WHERE expired RETURNING` |
//! | MySQL/MariaDB | a `SELECT` before | `INSERT ... ON DUPLICATE KEY UPDATE` with every column behind `IF(expired, ...)`, then a read of the owner |
//!
//! # Transactional mode
//!
//! Each store is also a
//! [`TransactionalStore`](idem_core::TransactionalStore): the claim,
//! the handler's business writes and the stored response commit in one
//! transaction. See [`TransactionalStore`](idem_core::TransactionalStore) and the `Tx` extractor of
//! `idem-tower`. A claim in transactional mode lives exactly as long as its
//! transaction: a crash rolls it back and frees the key at once.
//!
//! | database | what holds the key while the transaction is open | at commit |
//! |---|---|---|
//! | PostgreSQL | a transaction-scoped advisory lock on the key (`pg_try_advisory_xact_lock`), then a plain read of the row: a live one answers, and nothing is written | the completed row is inserted (or takes over an expired one): one row version per request |
//! | SQLite, MySQL/MariaDB | the claim's row, written first, without the read before (see the comment in `claim_in_transaction`) | the row is completed |
//!
//! On PostgreSQL a plain claim that finds no live row takes the same lock,
//! shared: plain claims never wait for one another, and one that meets an
//! open transactional claim of its key waits for it, then answers from the
//! row it committed. The unique
//! index is still the last word at commit: a live row that got into the
//! table meanwhile (written past the store) makes the insert find it, the
//! commit fail, and none of the handler's writes stay.
//!
//! A duplicate never waits on the first's transaction while holding a
//! connection:
//!
//! - a duplicate of a key this process has open is answered "in flight"
//!   from memory, with no connection;
//! - a duplicate from another process takes a connection for one statement
//!   and learns "in flight" without waiting: PostgreSQL tries the
//!   key's advisory lock (in the same round trip as the lock timeout);
//!   MariaDB runs the claim with no lock wait
//!   (`innodb_lock_wait_timeout = 0`; MySQL's least is 1 s, so there the
//!   duplicate waits up to a second);
//! - at most [`SqlStoreBuilder::max_transactions`] claims are open at once (half
//!   the pool by default), and a claim past that waits for its turn
//!   without a connection, so the handlers' own reads through the pool
//!   always find one.
//!
//! SQLite has one writer at a time: an open claim holds the database's
//! write lock for its whole handler, so every other transactional claim,
//! whatever its key, waits for it: in this process for its turn (in order,
//! up to [`SqlStoreBuilder::lock_timeout`]), from other processes on the
//! pool's `busy_timeout`; a wait that runs out is answered "in flight".
//! In-process duplicates are still answered from memory. That lock is what
//! holds the claim's key there (nothing is written for it until its
//! commit, as on PostgreSQL), and under load it passes from one claim to
//! the next without being let go: a claim that commits while others wait
//! starts the first of them in its commit's own call to SQLite and hands
//! it the transaction (counted in `idem_sqlite_claims_relayed_total`), at
//! most four times in a row, so that writers outside the store find the
//! lock free now and then (unless the store is the file's sole writer:
//! [`SqlStoreBuilder::sole_writer`]).
//! Keep SQLite's transactional handlers short, or use PostgreSQL for
//! concurrent writers.
//!
//! # One writer at a time
//!
//! On SQLite the store's writes in this process take turns, first come
//! first served, before they take a connection: SQLite's own way, a busy
//! handler that sleeps and tries again, left most of a contended write's
//! time asleep. A plain claim's read does not take a turn.
//!
//! Plain writes that arrive while the turn is taken wait for the next one
//! together: a batch runs every waiting claim in one statement and every
//! waiting completion in another, on a connection of the store's own
//! (opened with the pool's connect options, outside the pool), so under
//! load a commit (and, with `synchronous = FULL`, an fsync) is shared by
//! many requests. Each write
//! is answered once the statement that carried it has committed, as if it
//! had run alone; a claim whose caller gave up before its batch ran is
//! skipped, and one acquired for a caller gone meanwhile is released.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a database feature there is no store to use the statements
// (`cargo check --workspace` builds the crate so): no warnings for that.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_macros)
)]

mod batch;
mod builder;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;
mod dialect;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod hex_digits;
#[cfg(feature = "mysql")]
mod mysql;
mod open;
mod plain;
#[cfg(feature = "postgres")]
mod postgres;
mod purge;
mod relay;
mod slot;
#[cfg(feature = "sqlite")]
mod sqlite;
mod transactional;
mod writer;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use batch::Batches;
pub use builder::SqlStoreBuilder;
pub use dialect::Dialect;
use dialect::{ClaimArgs, ClaimStep, Queries, Started};
pub use dialect::{Value, bind_all};
/// How idem-guards writes its PostgreSQL statements' values into their
/// text (ARCHITECTURE.md, "Behind a pooler"); not for users.
#[cfg(feature = "postgres")]
#[doc(hidden)]
pub mod __postgres {
    pub use crate::postgres::inline;
}
/// idem-core, for the conformance macros' expansions.
#[doc(hidden)]
pub use idem_core as __core;
use open::OpenClaims;
pub use purge::{PurgeOptions, PurgeTask};
use relay::Relay;
pub use slot::{TxGuard, TxSlot};
/// The sqlx crate this store is built on, so your pool is the very type the
/// store takes.
pub use sqlx;
use writer::{Turn, WriterTurns};

use idem_core::{Claim, Error, ErrorKind, Fingerprint, IdempotencyKey, OwnerToken};

/// The table records go in unless configured otherwise.
pub const DEFAULT_TABLE: &str = "idem_records";
/// How long a transactional claim waits on another transaction's row: 5 s.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a claim retries a row that vanished or expired between
/// its statements, before it reports the store unavailable.
const CLAIM_ATTEMPTS: usize = 8;

/// A store on PostgreSQL.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub type PgStore = SqlStore<sqlx::Postgres>;
/// A store on MySQL or MariaDB.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub type MySqlStore = SqlStore<sqlx::MySql>;
/// A store on SQLite.
///
/// The pool is yours, and two of its settings decide the speed: WAL with
/// `synchronous = NORMAL` survives a process crash, not an OS crash (FULL
/// survives both, at an fsync per commit); and
/// `test_before_acquire(false)` spares each acquire a ping of a file that
/// cannot go stale. The store's plain writes run in batches (see the
/// module docs, "One writer at a time") on one connection of the store's
/// own, opened with the pool's connect options besides the pool's
/// connections: the pool's `after_connect` hook does not run on it.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_sql::SqliteStore;
/// use idem_sql::sqlx::sqlite::{
///     SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
/// };
///
/// let options = SqliteConnectOptions::new()
///     .filename("app.db")
///     .create_if_missing(true)
///     .journal_mode(SqliteJournalMode::Wal)
///     .synchronous(SqliteSynchronous::Normal);
/// let pool = SqlitePoolOptions::new()
///     .max_connections(8)
///     .test_before_acquire(false)
///     .connect_with(options)
///     .await?;
/// let store = SqliteStore::new(pool);
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub type SqliteStore = SqlStore<sqlx::Sqlite>;

/// Idempotency records in a SQL table, on your own sqlx pool.
pub struct SqlStore<DB: Dialect> {
    inner: Arc<Inner<DB>>,
}

struct Inner<DB: Dialect> {
    pool: sqlx::Pool<DB>,
    table: String,
    queries: Queries,
    lock_timeout: Duration,
    open: Arc<OpenClaims>,
    writer: WriterTurns,
    relay: Relay<Started<DB>>,
    batches: Batches<DB>,
}

impl<DB: Dialect> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<DB: Dialect> fmt::Debug for SqlStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("database", &<DB as sqlx::Database>::NAME)
            .field("table", &self.inner.table)
            .field("lock_timeout", &self.inner.lock_timeout)
            .field("max_transactions", &self.inner.open.max())
            .finish_non_exhaustive()
    }
}

impl<DB: Dialect> SqlStore<DB> {
    /// A store on `pool`, in table [`DEFAULT_TABLE`], with the defaults of
    /// [`SqlStoreBuilder`].
    pub fn new(pool: sqlx::Pool<DB>) -> Self {
        let max = transactional::default_max_transactions(&pool);
        Self::from_parts(
            pool,
            DEFAULT_TABLE.to_owned(),
            DEFAULT_LOCK_TIMEOUT,
            max,
            false,
        )
    }

    /// A builder for a store on `pool`: its table, lock timeout and open
    /// transaction limit.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use idem_sql::{PgStore, sqlx::PgPool};
    ///
    /// let pool = PgPool::connect("postgres://localhost/app").await?;
    /// let store = PgStore::builder(pool)
    ///     .table("billing_idempotency")
    ///     .lock_timeout(Duration::from_secs(2))
    ///     .build()?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(pool: sqlx::Pool<DB>) -> SqlStoreBuilder<DB> {
        SqlStoreBuilder::new(pool)
    }

    /// A store of these parts; `sole_writer`: the store's pool is the
    /// only writer of the database (SQLite), so its relay of the write lock
    /// has no limit in a row (`relay.rs`).
    fn from_parts(
        pool: sqlx::Pool<DB>,
        table: String,
        lock_timeout: Duration,
        max: usize,
        sole_writer: bool,
    ) -> Self {
        let relay = if sole_writer {
            Relay::handing_on_at_most(usize::MAX)
        } else {
            Relay::new()
        };
        Self {
            inner: Arc::new(Inner {
                queries: DB::queries(&table),
                pool,
                table,
                lock_timeout,
                open: Arc::new(OpenClaims::new(max)),
                writer: WriterTurns::new(DB::ONE_WRITER),
                relay,
                batches: Batches::new(),
            }),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.inner.pool
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// Creates the records table and its index if missing, recording what
    /// it applied in its own version table (`{table}_schema`, never sqlx's
    /// `_sqlx_migrations`). Safe to run at every start, from several
    /// processes at once.
    pub async fn migrate(&self) -> Result<(), Error> {
        DB::migrate(&self.inner.pool, &self.inner.table)
            .await
            .map_err(unavailable)
    }

    /// Claims on `conn` (`key_hash` is `key`'s), retrying while the row in
    /// the way vanishes or expires between statements. With a lock timeout,
    /// a transactional claim in the transaction open on `conn`
    /// ([`Dialect::tx_claim`]; another open transaction holding the key
    /// answers "in flight").
    #[allow(clippy::too_many_arguments)] // one claim's values, passed through
    async fn claim_on(
        &self,
        conn: &mut DB::Connection,
        key: &IdempotencyKey,
        key_hash: &[u8; 32],
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
        in_transaction: Option<Duration>,
    ) -> Result<Claim, sqlx::Error> {
        for _ in 0..CLAIM_ATTEMPTS {
            let args = ClaimArgs {
                key_hash,
                key: key.as_str(),
                fingerprint,
                owner: &owner,
                lease_ms: expiry_millis(lease),
            };
            let queries = &self.inner.queries;
            let step = match in_transaction {
                Some(lock_timeout) => DB::tx_claim(conn, queries, args, lock_timeout).await?,
                None => DB::claim(conn, queries, args).await?,
            };
            if let Some(claim) = settle(step, fingerprint, lease, owner)? {
                return Ok(claim);
            }
        }
        Err(sqlx::Error::Protocol(
            "idempotency record kept changing under the claim".into(),
        ))
    }
}

/// The claim a claim's step comes to; `None` if the record in the way
/// vanished or expired meanwhile, and the claim should be tried again.
fn settle(
    step: ClaimStep,
    fingerprint: &Fingerprint,
    lease: Duration,
    owner: OwnerToken,
) -> Result<Option<Claim>, sqlx::Error> {
    match step {
        ClaimStep::Acquired => Ok(Some(Claim::Acquired(owner))),
        ClaimStep::Locked => Ok(Some(Claim::InFlight { retry_after: lease })),
        ClaimStep::Vanished => Ok(None),
        ClaimStep::Existing(row) => row
            .answer(fingerprint)
            .map_err(|err| sqlx::Error::Decode(err.into())),
    }
}

pub(crate) fn key_hash(key: &IdempotencyKey) -> [u8; 32] {
    *blake3::hash(key.as_str().as_bytes()).as_bytes()
}

use idem_core::expiry_millis;

/// Maps a database error to the store error contract.
fn unavailable(err: sqlx::Error) -> Error {
    match err {
        sqlx::Error::Decode(source) => match source.downcast::<Error>() {
            Ok(err) => *err,
            Err(source) => Error::new(ErrorKind::Corrupt, source),
        },
        other => Error::unavailable(other),
    }
}

/// Checks that `name` is an identifier, as every table and column name
/// spliced into SQL unquoted must be (the stores' tables, the guards' tables
/// and columns): ASCII letters, digits and underscores, not starting with a
/// digit, at most 48 bytes. An [`ErrorKind::Config`] error if not.
///
/// ```
/// use idem_sql::validate_identifier;
///
/// assert!(validate_identifier("idem_records").is_ok());
/// assert!(validate_identifier("records; DROP TABLE users").is_err());
/// ```
pub fn validate_identifier(name: &str) -> Result<(), Error> {
    let mut bytes = name.bytes();
    let valid = name.len() <= 48
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "{name:?} is not a valid SQL identifier: use ASCII letters, digits and \
                 underscores, not starting with a digit, at most 48 bytes"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        for ok in ["idem_records", "_t", "T2", &"a".repeat(48)] {
            assert!(validate_identifier(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1t",
            "t-t",
            "t;drop table x",
            "s.t",
            "t t",
            &"a".repeat(49),
            "é",
        ] {
            let err = validate_identifier(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad}");
        }
    }
}
