//! The transactional outbox: events enqueued in the transaction of the
//! business writes (and of the idempotency record, in transactional mode),
//! so they commit with them or not at all, and a [`Relay`] that publishes
//! the committed ones at least once.
//!
//! "Write, then publish" loses the event when the process dies between the
//! two, and publishes a phantom when the publish succeeds and the write
//! rolls back. With the outbox the event *is* a write: the relay reads it
//! after the commit and publishes it until the broker acknowledges it, with
//! the event id as the broker's deduplication id; a consumer's
//! [`Inbox`](super::Inbox) then makes the downstream effect exactly once.
//!
//! # Order
//!
//! Every event has a sequence number, taken when it is enqueued. Events of
//! one *key* are published one at a time, in sequence order, by one relay
//! at a time: an event is claimed only when every earlier unsent event of
//! its key is claimable too, and a failed publish holds back the key's later
//! events until it succeeds. Events of different keys have no order among
//! them. Two transactions that enqueue under one key without serialising on
//! a common row (say, the entity's own row) are concurrent, and so are their
//! events: the one that commits first may be published first.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(pool: idem_sql::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_guards::{Event, Outbox};
//! use idem_sql::sqlx;
//!
//! let outbox = Outbox::new(pool.clone())?;
//! outbox.migrate().await?;
//!
//! let mut tx = pool.begin().await?;
//! let order_id: i64 = sqlx::query_scalar("INSERT INTO orders (sku) VALUES ('book') RETURNING id")
//!     .fetch_one(&mut *tx)
//!     .await?;
//! let event = Event::new("order.created", order_id.to_string(), format!(r#"{{"order_id":{order_id}}}"#))?;
//! outbox.enqueue(&mut *tx, &event).await?;
//! tx.commit().await?; // the order and its event, or neither
//! # Ok(()) }
//! ```

mod event;
mod queue;
mod relay;

#[cfg(feature = "nats")]
mod nats;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::sql::{Ident, Params, Value, create_table, db_error};
use crate::GuardDb;
use idem_core::Error;

pub use event::{Enqueued, Event, PendingEvent};
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use nats::{EVENT_KEY_HEADER, JetStreamPublisher};
pub use relay::{Pass, Published, Publisher, Relay};

/// The table [`Outbox`] keeps its events in unless told otherwise; its
/// claim lock is the same name with `_lock` appended.
pub const DEFAULT_OUTBOX_TABLE: &str = "idem_outbox";

/// A table of events waiting to be published, on `DB`.
///
/// [`Outbox::enqueue`] runs on your transaction's connection; a [`Relay`]
/// publishes what committed. Clones share the table.
pub struct Outbox<DB: GuardDb> {
    inner: Arc<Inner<DB>>,
}

struct Inner<DB: GuardDb> {
    pool: sqlx::Pool<DB>,
    table: Ident,
    lock: Ident,
}

impl<DB: GuardDb> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<DB: GuardDb> fmt::Debug for Outbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("database", &<DB as sqlx::Database>::NAME)
            .field("table", &self.inner.table)
            .finish_non_exhaustive()
    }
}

impl<DB: GuardDb> Outbox<DB> {
    /// The outbox in [`DEFAULT_OUTBOX_TABLE`] on `pool`.
    pub fn new(pool: sqlx::Pool<DB>) -> Result<Self, Error> {
        Self::with_table(pool, DEFAULT_OUTBOX_TABLE)
    }

    /// The outbox in `table`, an [`Ident`] of at most 43 bytes (its lock
    /// table is `{table}_lock`).
    pub fn with_table(pool: sqlx::Pool<DB>, table: &str) -> Result<Self, Error> {
        let lock = Ident::new(&format!("{table}_lock"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                table: Ident::new(table)?,
                lock,
            }),
        })
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.inner.pool
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        self.inner.table.as_str()
    }

    /// Creates the tables if missing. Safe to run at every start, from
    /// several processes.
    pub async fn migrate(&self) -> Result<(), Error> {
        let columns = format!(
            "seq {serial}, \
             event_id {text} NOT NULL, \
             topic {text} NOT NULL, \
             event_key {text} NOT NULL, \
             payload {blob} NOT NULL, \
             headers {long_text} NOT NULL, \
             created_at {ts} NOT NULL, \
             attempts BIGINT NOT NULL, \
             next_attempt_at {ts} NOT NULL, \
             locked_by {text} NULL, \
             locked_until {ts} NULL, \
             sent_at {ts} NULL, \
             UNIQUE (event_id), \
             UNIQUE (event_key, seq), \
             UNIQUE (sent_at, seq)",
            serial = DB::SERIAL_KEY,
            text = DB::SHORT_TEXT,
            blob = DB::BLOB,
            long_text = DB::LONG_TEXT,
            ts = DB::TIMESTAMP,
        );
        let pool = &self.inner.pool;
        create_table(pool, &self.inner.table, &columns).await?;
        create_table(pool, &self.inner.lock, "id BIGINT PRIMARY KEY").await?;
        let mut conn = pool.acquire().await.map_err(db_error)?;
        let insert = DB::insert_or_skip(&format!("{} (id)", self.inner.lock), "1");
        DB::execute(&mut conn, insert, &[])
            .await
            .map_err(db_error)?;
        Ok(())
    }

    /// Enqueues `event` on `conn`, which must be in the transaction of the
    /// writes it reports: it commits with them, or not at all. With
    /// idem-tower's transactional mode, `conn` is the `Tx` extractor's
    /// connection, and the event also commits with the idempotency record.
    ///
    /// An event whose id is already in the outbox is not enqueued twice
    /// ([`Enqueued::AlreadyQueued`]).
    pub async fn enqueue(
        &self,
        conn: &mut DB::Connection,
        event: &Event,
    ) -> Result<Enqueued, Error> {
        let mut p = Params::<DB>::new();
        // Every value fits its column (ids, topic and key are length-checked
        // by `Event`; payload and headers have columns of any length), so
        // MySQL's INSERT IGNORE can only skip a duplicate event id here, not
        // cut a value short.
        let insert = DB::insert_or_skip(
            &format!(
                "{} (event_id, topic, event_key, payload, headers, created_at, attempts, \
                 next_attempt_at)",
                self.inner.table
            ),
            &format!("{}, {now}, 0, {now}", p.list(5), now = DB::NOW),
        );
        let headers = event.headers_json();
        let args = [
            Value::Text(event.id()),
            Value::Text(event.topic()),
            Value::Text(event.key()),
            Value::Bytes(event.payload()),
            Value::Text(&headers),
        ];
        let inserted = DB::execute(conn, insert, &args).await.map_err(db_error)?;
        Ok(if inserted == 1 {
            Enqueued::New
        } else {
            Enqueued::AlreadyQueued
        })
    }

    /// How long the oldest unsent event has waited, by the database's
    /// clock; `None` when every event is sent.
    pub async fn lag(&self) -> Result<Option<Duration>, Error> {
        let sql = format!(
            "SELECT {} FROM {} WHERE sent_at IS NULL",
            DB::ms_until("MIN(created_at)"),
            self.inner.table
        );
        let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
        let row = DB::fetch_ints(&mut conn, sql, &[])
            .await
            .map_err(db_error)?;
        let until = row.and_then(|columns| columns.first().copied().flatten());
        Ok(until.map(|ms| Duration::from_millis(ms.saturating_neg().max(0).unsigned_abs())))
    }

    /// How many events are not sent yet.
    pub async fn unsent(&self) -> Result<u64, Error> {
        let sql = format!(
            "SELECT {} FROM {} WHERE sent_at IS NULL",
            DB::int("COUNT(*)"),
            self.inner.table
        );
        let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
        let row = DB::fetch_ints(&mut conn, sql, &[])
            .await
            .map_err(db_error)?;
        let count = row.and_then(|columns| columns.first().copied().flatten());
        Ok(count.map_or(0, i64::unsigned_abs))
    }
}
