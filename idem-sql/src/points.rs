//! Recovery points of phased handlers, in a table of their own beside the
//! records (`{table}_points`, made by `migrate()`): each SQL store is
//! idem-core's [`RecoveryPoints`], and a local phase's writes and its point
//! commit in one transaction on the store's pool. ARCHITECTURE.md,
//! "Recovery points".
//!
//! Not in the records table: a released attempt deletes its record, and
//! the points must outlive it for the next run to resume. The primary key
//! (operation, phase) decides which of two runs finished a phase: the
//! second's insert is skipped, and its transaction rolled back.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use idem_core::{Error, Recorded, RecoveryPoint, RecoveryPoints, expiry_millis};

use crate::dialect::{Dialect, Value};
use crate::{SqlStore, TxGuard, TxSlot, unavailable};

/// A local phase's transaction, lent to the phase
/// ([`Phases::transaction`](idem_core::Phases::transaction)): it derefs to
/// the connection, so `&mut *tx` is what sqlx's queries execute on, as with
/// idem-tower's `Tx` extractor. When the phase's future returns, the
/// phase's writes and its recovery point commit together; if it fails,
/// they roll back. Keep it inside the phase's future: a task it was handed
/// to that still holds it keeps the phase from committing (after 5 s the
/// phase fails, its writes rolled back).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn run(store: idem_sql::SqliteStore) -> Result<(), idem_core::Error> {
/// use std::time::Duration;
/// use idem_core::Phases;
/// use idem_sql::sqlx;
///
/// let phases = Phases::new(&store, [0; 32], Duration::from_secs(3600));
/// phases
///     .transaction("create-order", |mut tx| async move {
///         sqlx::query("INSERT INTO orders (state) VALUES ('pending')")
///             .execute(&mut *tx)
///             .await
///             .map_err(idem_core::Error::unavailable)?;
///         Ok::<_, idem_core::Error>(())
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub struct PhaseTx<DB: Dialect> {
    guard: TxGuard<DB>,
}

impl<DB: Dialect> Deref for PhaseTx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.guard
            .as_ref()
            .expect("a PhaseTx is only made from an open transaction")
    }
}

impl<DB: Dialect> DerefMut for PhaseTx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard
            .as_mut()
            .expect("a PhaseTx is only made from an open transaction")
    }
}

impl<DB: Dialect> fmt::Debug for PhaseTx<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PhaseTx").finish_non_exhaustive()
    }
}

/// The points' statements, rendered once for a store's table. Their
/// parameters: read (operation, phase), expire (operation, phase), insert
/// (operation, phase, output, ms to keep), count (operation), purge
/// (batch).
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub struct PointQueries {
    pub(crate) read: Arc<str>,
    pub(crate) expire: Arc<str>,
    pub(crate) insert: Arc<str>,
    pub(crate) count: Arc<str>,
    pub(crate) purge: Arc<str>,
}

impl PointQueries {
    /// The statements on `{table}_points`.
    pub(crate) fn new<DB: Dialect>(table: &str) -> Self {
        let points = format!("{table}_points");
        let p = DB::placeholder;
        let (now, left) = (DB::NOW, DB::ms_until("expires_at"));
        let mine = format!("operation = {} AND phase = {}", p(1), p(2));
        Self {
            read: format!("SELECT output, {left} FROM {points} WHERE {mine}").into(),
            expire: format!("DELETE FROM {points} WHERE {mine} AND expires_at <= {now}").into(),
            insert: DB::insert_or_skip(
                &format!("{points} (operation, phase, output, expires_at)"),
                &format!("{}, {}, {}, {}", p(1), p(2), p(3), DB::now_plus_ms(&p(4))),
            )
            .into(),
            count: format!(
                "SELECT {} FROM {points} WHERE operation = {} AND expires_at > {now}",
                DB::int("COUNT(*)"),
                p(1),
            )
            .into(),
            purge: DB::purge_points(&points).into(),
        }
    }
}

impl<DB: Dialect> SqlStore<DB> {
    /// The live output of `phase` of `operation`; an expired point is
    /// deleted on the way, so that an insert finds its key free.
    async fn live_point(
        &self,
        operation: &[u8; 32],
        phase: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        let q = &self.inner.points;
        let args = [Value::Bytes(operation), Value::Text(phase)];
        let mut conn = self.inner.pool.acquire().await.map_err(unavailable)?;
        match DB::point_read(&mut conn, &q.read, &args)
            .await
            .map_err(unavailable)?
        {
            Some((output, ms_left)) if ms_left > 0 => Ok(Some(output)),
            Some(_) => {
                DB::point_execute(&mut conn, &q.expire, &args)
                    .await
                    .map_err(unavailable)?;
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Deletes up to `batch` expired recovery points; how many.
    pub(crate) async fn purge_points(
        &self,
        conn: &mut DB::Connection,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        DB::point_execute(conn, &self.inner.points.purge, &[Value::Int(batch)]).await
    }
}

/// The points live beside the store's records: `migrate()` makes both
/// tables. A phase's transaction is begun on the store's pool as a
/// transactional claim's is (SQLite: BEGIN IMMEDIATE, the write lock taken
/// first, so a reader never has to become the writer).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(store: idem_sql::PgStore, operation: [u8; 32]) -> Result<(), idem_core::Error> {
/// use std::time::Duration;
/// use idem_core::Phases;
/// use idem_sql::sqlx;
///
/// let phases = Phases::new(&store, operation, Duration::from_secs(86_400));
/// let order_id: i64 = phases
///     .transaction("create-order", |mut tx| async move {
///         let id = sqlx::query_scalar("INSERT INTO orders (state) VALUES ('pending') RETURNING id")
///             .persistent(false)
///             .fetch_one(&mut *tx)
///             .await
///             .map_err(idem_core::Error::unavailable)?;
///         Ok::<i64, idem_core::Error>(id)
///     })
///     .await?;
/// # let _ = order_id; Ok(()) }
/// ```
impl<DB: Dialect> RecoveryPoints for SqlStore<DB> {
    type Transaction = PhaseTx<DB>;
    type Open = TxSlot<DB>;

    async fn point(&self, operation: &[u8; 32], phase: &str) -> Result<Option<Vec<u8>>, Error> {
        self.live_point(operation, phase).await
    }

    async fn begin(&self) -> Result<(PhaseTx<DB>, TxSlot<DB>), Error> {
        let pool = &self.inner.pool;
        let tx = match DB::TX_BEGIN {
            Some(statement) => pool.begin_with(statement).await,
            None => pool.begin().await,
        }
        .map_err(unavailable)?;
        let slot = TxSlot::new(tx.into());
        let guard = slot.lock().await;
        Ok((PhaseTx { guard }, slot))
    }

    async fn commit(&self, open: TxSlot<DB>, point: RecoveryPoint<'_>) -> Result<Recorded, Error> {
        let mut tx = open.take().await?;
        let args = [
            Value::Bytes(point.operation),
            Value::Text(point.phase),
            Value::Bytes(point.output),
            Value::Int(expiry_millis(point.keep)),
        ];
        let inserted = DB::point_execute(&mut tx, &self.inner.points.insert, &args)
            .await
            .map_err(unavailable)?;
        if inserted == 1 {
            tx.commit().await.map_err(unavailable)?;
            return Ok(Recorded::Committed);
        }
        // Another run's point is in the way (its transaction committed
        // first): nothing of this one is kept.
        tx.rollback().await.map_err(unavailable)?;
        match self.live_point(point.operation, point.phase).await? {
            Some(output) => Ok(Recorded::Existing(output)),
            None => Err(Error::unavailable(
                "the recovery point that refused this phase's went before it could be read",
            )),
        }
    }

    async fn finished(&self, operation: &[u8; 32]) -> Result<u64, Error> {
        let mut conn = self.inner.pool.acquire().await.map_err(unavailable)?;
        let count = DB::point_count(
            &mut conn,
            &self.inner.points.count,
            &[Value::Bytes(operation)],
        )
        .await
        .map_err(unavailable)?;
        Ok(count.max(0).unsigned_abs())
    }
}
