//! The SQL stores of [idem](https://docs.rs/idem-tower) on [sqlx]: the
//! source of truth, one row per key under a unique index. Users of
//! idem-tower reach them through its database features
//! (`idem_tower::PgStore`, `idem_tower::sql`).
//!
//! | store | database | feature |
//! |---|---|---|
//! | [`PgStore`] | PostgreSQL 12 or later | `postgres` |
//! | [`MySqlStore`] | MySQL, MariaDB | `mysql` |
//! | [`SqliteStore`] | SQLite | `sqlite` |
//!
//! Each is an [`IdempotencyStore`](idem_core::IdempotencyStore) and a
//! [`TransactionalStore`](idem_core::TransactionalStore) (the claim, the
//! handler's writes and the stored response in one transaction), built on
//! idem-core's public store interface alone, on your own sqlx pool
//! ([`sqlx`] is re-exported, so your pool is the very type the store
//! takes):
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_sql::{PgStore, PurgeOptions, sqlx::PgPool};
//!
//! let pool = PgPool::connect("postgres://localhost/app").await?;
//! let store = PgStore::new(pool); // or PgStore::builder(pool)...build()?
//! store.migrate().await?; // idempotent, with its own version table
//! let purge = store.purge_in_background(PurgeOptions::default()); // every minute
//! // ... hand `store` to idem-tower's `Idempotency::new` and serve; then:
//! purge.stop().await;
//! # Ok(()) }
//! ```
//!
//! Each store also keeps the recovery points of phased handlers
//! ([`idem_core::Phases`]), beside its records: a phase's writes and its
//! point commit in one transaction on your pool ([`PhaseTx`]).
//!
//! The feature `test-util` adds the `conformance` module: the cases only a SQL
//! store can show (its table, transactional mode), run with idem-core's
//! store suite.
//!
//! The guides, in the repository's `docs/`: `stores.md` (how a SQL store
//! holds a key, and SQLite's one writer), `transactional.md` (the `Tx`
//! extractor, and how each database holds the key of an open
//! transaction), `operations.md` (pool sizing, purging expired records,
//! SQLite's settings) and `poolers.md` (PgBouncer).

#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a database feature there is no store to use the statements
// (`cargo check --workspace` builds the crate so): no warnings for that.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, unused_imports, unused_macros)
)]

mod batch;
mod builder;
mod claim_tx;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;
mod dialect;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod hex_digits;
mod identifier;
#[cfg(feature = "mysql")]
mod mysql;
mod open;
mod plain;
mod points;
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
pub use claim_tx::ClaimTx;
pub use dialect::Dialect;
use dialect::{ClaimArgs, ClaimStep, Queries, Started};
/// What idem-guards builds its statements with: the values it binds, how
/// it binds them, the check of its identifiers and, on PostgreSQL, its
/// values written into the text (ARCHITECTURE.md, "Behind a pooler"); with
/// the SQL text items of [`Dialect`], hidden there for the same reason.
///
/// For idem-guards only: not part of idem-sql's API, and not covered by
/// semver.
#[doc(hidden)]
pub mod __guards {
    pub use crate::dialect::{Value, bind_all};
    pub use crate::identifier::validate_identifier;
    #[cfg(feature = "postgres")]
    pub use crate::postgres::inline;
}
/// idem-core, for the conformance macros' expansions.
#[doc(hidden)]
pub use idem_core as __core;
use open::OpenClaims;
pub use points::PhaseTx;
use points::PointQueries;
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
/// The pool is yours, and two of its settings decide the speed:
/// `synchronous` (NORMAL or FULL: how durable a commit is) and
/// `test_before_acquire(false)` (`docs/operations.md`, "SQLite"). The
/// store's plain writes run in batches on one connection of the store's
/// own, opened with the pool's connect options besides the pool's
/// connections, so the pool's `after_connect` hook does not run on it
/// (`docs/stores.md`, "SQLite").
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
    points: PointQueries,
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
                points: PointQueries::new::<DB>(&table),
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

    /// Creates the records table and its index if missing, and beside it
    /// the recovery points of phased handlers (`{table}_points`, see
    /// [`PhaseTx`]), recording what it applied in its own version table
    /// (`{table}_schema`, never sqlx's `_sqlx_migrations`). Safe to run at
    /// every start, from several processes at once.
    pub async fn migrate(&self) -> Result<(), Error> {
        DB::migrate(&self.inner.pool, &self.inner.table)
            .await
            .map_err(unavailable)
    }

    /// What the record of `key_hash`, read on `conn` without a lock or a
    /// write, answers a claim with `fingerprint`; `None` if the key is
    /// absent or expired, and the claim is to be made. A live record is
    /// final: the read sees committed rows only, and a completed record
    /// stays as it is until it expires. Read before a plain claim
    /// (`plain.rs`) and before a transactional claim waits for the turn
    /// to write (`SqlStore::read_before_turn`).
    async fn answer_from_read(
        &self,
        conn: &mut DB::Connection,
        key_hash: &[u8; 32],
        fingerprint: &Fingerprint,
    ) -> Result<Option<Claim>, Error> {
        match DB::read(conn, &self.inner.queries, key_hash)
            .await
            .map_err(unavailable)?
        {
            Some(row) => row.answer(fingerprint),
            None => Ok(None),
        }
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
