//! Deleting expired records: one pass ([`SqlStore::purge_expired`]) or a
//! task of the store's own that runs one every period
//! ([`SqlStore::purge_in_background`]) until its [`PurgeTask`] is stopped
//! or dropped.
//!
//! A pass deletes in batches, each one short statement (on MySQL/MariaDB
//! one short transaction of two round trips, `mysql.rs`), until a batch
//! deletes fewer rows than the batch size. Each batch takes a pooled
//! connection and, on SQLite, the store's turn to write (`writer.rs`), and
//! gives both back before the next, so a purge never holds a lock for long
//! nor keeps the store's writes waiting behind it.
//!
//! Several purgers on one table, in one process or many, delete each row
//! once. On PostgreSQL and MySQL/MariaDB they never wait on one another:
//! the rows a batch deletes are locked with `FOR UPDATE SKIP LOCKED`, which
//! skips rows another purger (or a claim) holds. SQLite has one writer, so
//! there purgers take turns: in this process through the store's turns,
//! across processes on the pool's `busy_timeout`. What still fails (a lock
//! wait that ran out, a server away) is logged and tried again next period:
//! it never ends the task. Every deleted row is counted in
//! `idem_records_purged_total`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::writer::Turn;
use super::{Dialect, SqlStore, unavailable};
use idem_core::Error;

/// The counter of deleted expired records (docs/metrics.md).
const PURGED: &str = "idem_records_purged_total";
/// The counter of deleted expired recovery points (docs/metrics.md).
const POINTS_PURGED: &str = "idem_recovery_points_purged_total";

/// How often, and in what batches, [`SqlStore::purge_in_background`]
/// deletes expired records.
///
/// ```
/// use std::time::Duration;
/// use idem_sql::PurgeOptions;
///
/// let options = PurgeOptions::every(Duration::from_secs(300)).batch(500);
/// assert_eq!(options.period(), Duration::from_secs(300));
/// assert_eq!(options.batch_size(), 500);
/// assert_eq!(PurgeOptions::default().period(), PurgeOptions::DEFAULT_PERIOD);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct PurgeOptions {
    period: Duration,
    batch: u32,
}

impl PurgeOptions {
    /// The pause between two passes unless told otherwise: a minute.
    pub const DEFAULT_PERIOD: Duration = Duration::from_secs(60);
    /// Rows one statement deletes unless told otherwise.
    pub const DEFAULT_BATCH: u32 = 1_000;
    /// The most rows one statement deletes, whatever the batch asked.
    pub const MAX_BATCH: u32 = 10_000;
    /// The shortest pause between passes, whatever the period asked.
    pub const MIN_PERIOD: Duration = Duration::from_millis(10);

    /// A pass every `period` (at least [`Self::MIN_PERIOD`]), in batches of
    /// [`Self::DEFAULT_BATCH`].
    pub fn every(period: Duration) -> Self {
        Self {
            period: period.max(Self::MIN_PERIOD),
            batch: Self::DEFAULT_BATCH,
        }
    }

    /// At most `rows` rows per statement (between 1 and
    /// [`Self::MAX_BATCH`]): the longest a purge holds its locks, and
    /// the most a pass deletes before it gives the connection back.
    pub fn batch(mut self, rows: u32) -> Self {
        self.batch = batch_size(rows);
        self
    }

    /// The pause between two passes.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The most rows one statement deletes.
    pub fn batch_size(&self) -> u32 {
        self.batch
    }
}

impl Default for PurgeOptions {
    /// A pass every [`Self::DEFAULT_PERIOD`] in batches of
    /// [`Self::DEFAULT_BATCH`].
    fn default() -> Self {
        Self::every(Self::DEFAULT_PERIOD)
    }
}

/// The purge [`SqlStore::purge_in_background`] started: it runs until
/// [`PurgeTask::stop`] is awaited or the task is dropped. Keep it for as
/// long as the purge should run (`let _ = ...` drops it at once).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn run(store: idem_sql::SqliteStore) {
/// use idem_sql::PurgeOptions;
///
/// let purge = store.purge_in_background(PurgeOptions::default());
/// // ... serve ...
/// let purged = purge.stop().await; // waits for a statement under way
/// tracing::info!(purged, "expired idempotency records deleted");
/// # }
/// ```
#[must_use = "dropping the PurgeTask stops the purge"]
pub struct PurgeTask {
    /// Dropping it tells the task to stop: its receiver then resolves.
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    purged: Arc<AtomicU64>,
}

impl fmt::Debug for PurgeTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PurgeTask")
            .field("purged", &self.purged())
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl PurgeTask {
    /// How many expired records this task has deleted so far.
    pub fn purged(&self) -> u64 {
        self.purged.load(Ordering::Relaxed)
    }

    /// Whether the task has ended. It ends only once told to stop, or
    /// with its runtime: a failed pass does not end it.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops the purge and waits for it: a statement under way finishes
    /// (and is counted), and no other starts. Returns how many expired
    /// records the task deleted in all.
    pub async fn stop(mut self) -> u64 {
        self.stop.take();
        if let Some(task) = self.task.take() {
            // Ends without panicking; an error here is its runtime shutting
            // down, which ends it too.
            let _ = task.await;
        }
        self.purged()
    }
}

impl Drop for PurgeTask {
    /// Tells the task to stop, without waiting: a statement under way
    /// finishes, and no other starts.
    fn drop(&mut self) {
        self.stop.take();
    }
}

/// Why one pass of the background purge ended.
enum PassEnd {
    /// A batch deleted fewer rows than the batch size, or failed.
    Done,
    /// The task was told to stop.
    Stopped,
}

impl<DB: Dialect> SqlStore<DB> {
    /// Deletes expired records and expired recovery points (of phased
    /// handlers, `idem_core::Phases`), `batch` rows per statement (at most
    /// [`PurgeOptions::MAX_BATCH`]), until a statement deletes fewer;
    /// returns how many records it deleted, also counted in
    /// `idem_records_purged_total`. Short statements keep locks short, and
    /// several purges may run at once (see [`SqlStore::purge_in_background`],
    /// which runs this every period for you).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(store: idem_sql::PgStore) -> Result<(), idem_core::Error> {
    /// let purged = store.purge_expired(1_000).await?;
    /// # Ok(()) }
    /// ```
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, Error> {
        let batch = batch_size(batch);
        // As long as the store's other writes wait for their turn.
        let turn_timeout = self.inner.pool.options().get_acquire_timeout();
        let mut total = 0;
        loop {
            let (mut conn, _turn) = self.purge_slot(turn_timeout).await?;
            let Batch {
                deleted,
                full,
                points,
            } = self
                .purge_batch(&mut conn, batch)
                .await
                .map_err(unavailable)?;
            total += deleted;
            points.map_err(unavailable)?;
            if !full {
                return Ok(total);
            }
        }
    }

    /// Starts deleting expired records every [`PurgeOptions::period`] on a
    /// task of its own, the way tower-sessions' `continuously_delete_expired`
    /// does for sessions; it runs until the returned [`PurgeTask`] is
    /// stopped or dropped. Run it in every instance if you like: several
    /// purgers on one table share the work, each row deleted once, and
    /// never wait on one another (on SQLite, which has one writer, they
    /// take turns).
    ///
    /// The first pass runs one period after the start, then one period
    /// after the end of each pass. A pass deletes in batches of
    /// [`PurgeOptions::batch`] rows, one short statement each (on
    /// MySQL/MariaDB one short transaction), until one deletes fewer, so no
    /// pass holds a lock for long however many rows expired. Each deleted record adds one to the counter
    /// `idem_records_purged_total`. An error (a lock wait that ran out,
    /// the database away) is logged (`tracing`: lock contention at `debug`,
    /// anything else at `warn`) and the task tries again next period; it
    /// never ends the task.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use idem_sql::{PgStore, PurgeOptions, sqlx::PgPool};
    ///
    /// let pool = PgPool::connect("postgres://localhost/app").await?;
    /// let store = PgStore::new(pool);
    /// store.migrate().await?;
    /// let purge = store.purge_in_background(PurgeOptions::every(Duration::from_secs(300)));
    ///
    /// // ... build the router on `store` and serve until shutdown ...
    ///
    /// purge.stop().await; // or drop it
    /// # Ok(()) }
    /// ```
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn purge_in_background(&self, options: PurgeOptions) -> PurgeTask {
        let (stop, stopped) = oneshot::channel();
        let purged = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(
            self.clone()
                .purge_every(options, stopped, Arc::clone(&purged)),
        );
        PurgeTask {
            stop: Some(stop),
            task: Some(task),
            purged,
        }
    }

    /// The background purge: a pass every period until `stopped` resolves
    /// (its sender sent or dropped), adding what it deletes to `purged`.
    async fn purge_every(
        self,
        options: PurgeOptions,
        mut stopped: oneshot::Receiver<()>,
        purged: Arc<AtomicU64>,
    ) {
        loop {
            tokio::select! {
                biased;
                _ = &mut stopped => return,
                () = tokio::time::sleep(options.period) => {}
            }
            if let PassEnd::Stopped = self.purge_pass(options.batch, &mut stopped, &purged).await {
                return;
            }
        }
    }

    /// One pass of the background purge: batches until one deletes fewer
    /// than `batch` rows or fails (logged), or until `stopped` resolves while
    /// waiting for a connection or the turn to write. A statement under way
    /// is never cut off: the database would finish it uncounted.
    async fn purge_pass(
        &self,
        batch: u32,
        stopped: &mut oneshot::Receiver<()>,
        purged: &AtomicU64,
    ) -> PassEnd {
        let table = self.table();
        let mut pass = 0;
        loop {
            let slot = tokio::select! {
                biased;
                _ = &mut *stopped => return PassEnd::Stopped,
                // No limit on the wait for the turn: the purge can wait,
                // however long a transactional claim holds it.
                slot = self.purge_slot(Duration::MAX) => slot,
            };
            let (mut conn, _turn) = match slot {
                Ok(slot) => slot,
                Err(error) => {
                    tracing::warn!(%table, %error, "no connection to purge expired idempotency records; trying again next period");
                    return PassEnd::Done;
                }
            };
            let error = match self.purge_batch(&mut conn, batch).await {
                Ok(Batch {
                    deleted,
                    full,
                    points,
                }) => {
                    // The records' rows are gone whatever the points'
                    // statement did after them: counted first.
                    purged.fetch_add(deleted, Ordering::Relaxed);
                    pass += deleted;
                    match points {
                        Ok(()) if full => continue,
                        Ok(()) => {
                            if pass > 0 {
                                tracing::debug!(%table, rows = pass, "purged expired idempotency records");
                            }
                            return PassEnd::Done;
                        }
                        Err(error) => error,
                    }
                }
                Err(error) => error,
            };
            if DB::is_lock_timeout(&error) {
                tracing::debug!(%table, %error, "purging expired idempotency records met a lock; trying again next period");
            } else {
                tracing::warn!(%table, %error, "purging expired idempotency records failed; trying again next period");
            }
            return PassEnd::Done;
        }
    }

    /// What one batch runs on: a pooled connection, then the turn to write
    /// where the store's writes take turns (SQLite, `writer.rs`), waited for
    /// up to `turn_timeout`. The connection first, as a transactional
    /// claim takes them, so the turn is never held while waiting for one.
    async fn purge_slot(
        &self,
        turn_timeout: Duration,
    ) -> Result<(PoolConnection<DB>, Turn), Error> {
        let conn = self.inner.pool.acquire().await.map_err(unavailable)?;
        let turn = self.inner.writer.wait(turn_timeout).await.ok_or_else(|| {
            Error::unavailable(format!(
                "no turn to write among this store's writes within {turn_timeout:?}"
            ))
        })?;
        Ok((conn, turn))
    }

    /// One batch: deletes up to `batch` expired records, then up to `batch`
    /// expired recovery points (`points.rs`), and counts them. The records'
    /// statement commits on its own, so its count stands even when the
    /// points' statement fails after it (on SQLite, another purger's
    /// statement holding the write lock): that error comes back in
    /// [`Batch::points`].
    async fn purge_batch(
        &self,
        conn: &mut DB::Connection,
        batch: u32,
    ) -> Result<Batch, sqlx::Error> {
        let deleted = DB::purge(conn, &self.inner.queries, self.table(), i64::from(batch)).await?;
        metrics::counter!(PURGED).increment(deleted);
        let mut full = deleted >= u64::from(batch);
        let points = match self.purge_points(conn, i64::from(batch)).await {
            Ok(points) => {
                metrics::counter!(POINTS_PURGED).increment(points);
                full |= points >= u64::from(batch);
                Ok(())
            }
            Err(error) => Err(error),
        };
        Ok(Batch {
            deleted,
            full,
            points,
        })
    }
}

/// What one batch of the purge did.
struct Batch {
    /// Expired records deleted.
    deleted: u64,
    /// Whether either statement filled its batch: then the pass goes on.
    full: bool,
    /// How the recovery points' statement, run after the records', ended.
    points: Result<(), sqlx::Error>,
}

/// `rows` as a batch size: between 1 and [`PurgeOptions::MAX_BATCH`].
fn batch_size(rows: u32) -> u32 {
    rows.clamp(1, PurgeOptions::MAX_BATCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_stay_within_their_bounds() {
        let options = PurgeOptions::every(Duration::ZERO).batch(0);
        assert_eq!(options.period(), PurgeOptions::MIN_PERIOD);
        assert_eq!(options.batch_size(), 1);
        let options = PurgeOptions::default().batch(u32::MAX);
        assert_eq!(options.batch_size(), PurgeOptions::MAX_BATCH);
        assert_eq!(options.period(), PurgeOptions::DEFAULT_PERIOD);
        assert_eq!(
            PurgeOptions::default().batch_size(),
            PurgeOptions::DEFAULT_BATCH
        );
    }
}
