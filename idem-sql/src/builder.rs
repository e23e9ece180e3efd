//! Configuring a SQL store: its table, lock timeout and open transaction
//! limit, fixed when it is built.

use std::time::Duration;

use super::identifier::validate_identifier;
use super::{DEFAULT_LOCK_TIMEOUT, DEFAULT_TABLE, Dialect, SqlStore};
use idem_core::Error;

/// The longest lock timeout: 24 days, under PostgreSQL's largest
/// `lock_timeout` (2^31 - 1 ms, about 24.8 days).
const MAX_LOCK_TIMEOUT: Duration = Duration::from_secs(24 * 24 * 60 * 60);

/// Configures a [`SqlStore`]; made by [`SqlStore::builder`].
#[must_use]
pub struct SqlStoreBuilder<DB: Dialect> {
    pool: sqlx::Pool<DB>,
    table: String,
    lock_timeout: Duration,
    max_transactions: Option<usize>,
    sole_writer: bool,
}

impl<DB: Dialect> std::fmt::Debug for SqlStoreBuilder<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStoreBuilder")
            .field("table", &self.table)
            .field("lock_timeout", &self.lock_timeout)
            .field("max_transactions", &self.max_transactions)
            .field("sole_writer", &self.sole_writer)
            .finish_non_exhaustive()
    }
}

impl<DB: Dialect> SqlStoreBuilder<DB> {
    pub(super) fn new(pool: sqlx::Pool<DB>) -> Self {
        Self {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            max_transactions: None,
            sole_writer: false,
        }
    }

    /// The table records go in ([`DEFAULT_TABLE`]): an identifier of ASCII
    /// letters, digits and underscores, not starting with a digit, at most
    /// 48 bytes. Anything else makes [`build`](Self::build) fail.
    pub fn table(mut self, table: &str) -> Self {
        table.clone_into(&mut self.table);
        self
    }

    /// How long statements in a claim's transaction wait for row locks
    /// ([`DEFAULT_LOCK_TIMEOUT`]): the handler's own writes through `Tx`.
    /// A duplicate of a claim held by another transaction does not wait:
    /// it answers "in flight" at once. On SQLite, the longest a
    /// transactional claim waits for its turn to write among this process's
    /// claims (then "in flight"); claims of other processes wait for the
    /// pool's `busy_timeout`.
    ///
    /// Taken as at least 1 ms (PostgreSQL reads 0 as "wait for ever") and
    /// at most 24 days (PostgreSQL's largest, which refuses more). On MySQL
    /// and MariaDB it is whole seconds, at least 1, and it is the session's
    /// `innodb_lock_wait_timeout`: it stays on the pooled connection, so
    /// the application's own statements on a connection the store has used
    /// wait this long for row locks, not the server's default (50 s).
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout.clamp(Duration::from_millis(1), MAX_LOCK_TIMEOUT);
        self
    }

    /// At most `n` transactional claims open at once in this process (by
    /// default half the pool's `max_connections`, at least 1). Each open
    /// claim holds a connection for its whole handler; a claim past the
    /// limit waits for its turn without holding one, up to the pool's
    /// acquire timeout (then the store is unavailable: 503). The other half
    /// of the pool stays for what the handlers read through the pool, for
    /// duplicates' checks and for the rest of the application. Duplicates
    /// of a key open in this process never wait for a turn: they are
    /// answered "in flight" from memory. On SQLite, where one claim writes
    /// at a time, the claims waiting for the turn to write hold no
    /// connection either, and under load each is handed the connection of
    /// the claim that commits before it.
    pub fn max_transactions(mut self, n: usize) -> Self {
        self.max_transactions = Some(n);
        self
    }

    /// The store; fails with [`ErrorKind::Config`](idem_core::ErrorKind::Config)
    /// if the table name is not an identifier.
    pub fn build(self) -> Result<SqlStore<DB>, Error> {
        validate_identifier(&self.table)?;
        let max = self
            .max_transactions
            .unwrap_or_else(|| super::transactional::default_max_transactions(&self.pool));
        Ok(SqlStore::from_parts(
            self.pool,
            self.table,
            self.lock_timeout,
            max,
            self.sole_writer,
        ))
    }
}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl SqlStoreBuilder<sqlx::Sqlite> {
    /// Whether this store's pool is the only writer of the database file
    /// (default `false`).
    ///
    /// Under load a committing transactional claim hands SQLite's write
    /// lock straight to the next waiting one, without letting it go. By
    /// default it does so at most four times in a row, then lets the lock
    /// go for as long as the next claim takes to start on its own: writers
    /// outside the store (the application's own writes through its pool,
    /// other processes on the file, a migration tool) wait in SQLite's busy
    /// handler, which sleeps and tries again, and would otherwise find the
    /// lock free too seldom and time out. That pause costs about a fifth of
    /// the throughput of transactional first requests under load.
    ///
    /// With `true` the lock is handed on for as long as claims wait. Choose
    /// it when nothing else writes the file while the service runs: every
    /// write goes through this store, its transactional handlers (`Tx`) or
    /// its plain writes, which take turns with the claims in the process
    /// and are never starved (the claims' line yields to them). Keep the
    /// default if anything else writes: with `true` under sustained load
    /// such a writer may wait out its busy timeout (`SQLITE_BUSY`).
    ///
    /// ```no_run
    /// # async fn run(pool: idem_sql::sqlx::SqlitePool) -> Result<(), idem_core::Error> {
    /// use idem_sql::SqliteStore;
    ///
    /// // Only this service's store writes app.db.
    /// let store = SqliteStore::builder(pool).sole_writer(true).build()?;
    /// # Ok(()) }
    /// ```
    pub fn sole_writer(mut self, sole: bool) -> Self {
        self.sole_writer = sole;
        self
    }
}
