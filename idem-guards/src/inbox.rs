//! The idempotent consumer: a consume log (inbox) whose row commits in the
//! same transaction as the handler's writes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::sql::{Ident, Params, Value, check_short_text, create_table, db_error, is_retryable};
use crate::GuardDb;
use idem_core::BoxFuture;
use idem_core::expiry_millis;
use idem_core::{Error, ErrorKind};

/// The table [`Inbox`] keeps its log in unless told otherwise.
pub const DEFAULT_INBOX_TABLE: &str = "idem_inbox";

/// How many times a record retries when the row it collided with vanished
/// (purged) before it could be read.
const ATTEMPTS: usize = 4;

/// What the log says about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a duplicate must be acknowledged and skipped"]
pub enum Delivery {
    /// First time: handle it in the same transaction, then commit and
    /// acknowledge.
    First,
    /// Seen before: acknowledge it and do nothing.
    Duplicate(DuplicateOf),
}

/// Which earlier message a duplicate repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuplicateOf {
    /// The same message id: a redelivery, or the publisher's retry.
    Message,
    /// Another message id but the same business id: the event re-published
    /// as a new message (a producer that retried a whole send, a replay
    /// from an outbox, an operator's re-drive).
    BusinessEvent,
}

/// What [`Inbox::process`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed<T> {
    /// The handler ran and its writes committed with the log row.
    Done(T),
    /// A duplicate: the handler did not run, nothing was written.
    Skipped(DuplicateOf),
}

/// Why [`Inbox::process`] failed; either way nothing was committed, so do
/// not acknowledge: let the broker redeliver.
#[derive(Debug)]
pub enum ProcessError<E> {
    /// The log (or the database under it) failed.
    Inbox(Error),
    /// The handler failed; its writes and the log row were rolled back.
    Failed(E),
}

impl<E: fmt::Display> fmt::Display for ProcessError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inbox(err) => write!(f, "inbox: {err}"),
            Self::Failed(err) => write!(f, "handler: {err}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ProcessError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Inbox(err) => Some(err),
            Self::Failed(err) => Some(err),
        }
    }
}

/// The consume log of one consumer: one row per handled message, unique on
/// the message id and, separately, on the business id, written in the same
/// transaction as the handler's effects.
///
/// At-least-once delivery plus this log is effectively-once processing:
///
/// - a redelivered message (same message id) finds its row: skipped;
/// - an event re-published under a new message id finds its business id:
///   skipped;
/// - a handler error rolls back its writes *and* the row, so the message is
///   not acknowledged and the broker delivers it again;
/// - a crash before the commit leaves nothing; a crash after the commit but
///   before the acknowledgement leaves the row, so the redelivery is skipped;
/// - two consumers handed the same message at once: the second insert waits
///   for the first transaction and then finds its row.
///
/// Acknowledge only after [`Inbox::process`] returns `Ok` (done or skipped).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(pool: idem_sql::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_guards::{Inbox, Processed};
/// use idem_sql::sqlx;
///
/// let inbox = Inbox::new(pool, "ledger")?;
/// inbox.migrate().await?;
/// // for each delivered message:
/// let (message_id, transfer_id, cents) = ("m-1", "T-1", 500_i64);
/// let done = inbox
///     .process(message_id, transfer_id, |conn| {
///         Box::pin(async move {
///             sqlx::query("UPDATE accounts SET cents = cents + $1 WHERE id = 'a'")
///                 .bind(cents)
///                 .execute(&mut *conn)
///                 .await
///         })
///     })
///     .await?;
/// // Processed::Done or Processed::Skipped: acknowledge the message either way.
/// # let _ = done; Ok(()) }
/// ```
pub struct Inbox<DB: GuardDb> {
    inner: Arc<Inner<DB>>,
}

struct Inner<DB: GuardDb> {
    pool: sqlx::Pool<DB>,
    table: Ident,
    consumer: String,
}

impl<DB: GuardDb> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<DB: GuardDb> fmt::Debug for Inbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("database", &<DB as sqlx::Database>::NAME)
            .field("table", &self.inner.table)
            .field("consumer", &self.inner.consumer)
            .finish_non_exhaustive()
    }
}

impl<DB: GuardDb> Inbox<DB> {
    /// The log of `consumer` (1 to 255 bytes; consumers sharing a table keep
    /// separate logs) in [`DEFAULT_INBOX_TABLE`] on `pool`.
    pub fn new(pool: sqlx::Pool<DB>, consumer: &str) -> Result<Self, Error> {
        Self::build(pool, Ident::known(DEFAULT_INBOX_TABLE), consumer)
    }

    /// The log of `consumer` in `table`, an [`Ident`].
    pub fn with_table(pool: sqlx::Pool<DB>, table: &str, consumer: &str) -> Result<Self, Error> {
        Self::build(pool, Ident::new(table)?, consumer)
    }

    fn build(pool: sqlx::Pool<DB>, table: Ident, consumer: &str) -> Result<Self, Error> {
        check_short_text("a consumer name", consumer)?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                table,
                consumer: consumer.to_owned(),
            }),
        })
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.inner.pool
    }

    /// Creates the table if missing. Safe to run at every start, from
    /// several processes.
    pub async fn migrate(&self) -> Result<(), Error> {
        let columns = format!(
            "consumer {text} NOT NULL, \
             message_id {text} NOT NULL, \
             business_id {text} NOT NULL, \
             received_at {ts} NOT NULL, \
             PRIMARY KEY (consumer, message_id), \
             UNIQUE (consumer, business_id)",
            text = DB::SHORT_TEXT,
            ts = DB::TIMESTAMP,
        );
        create_table(&self.inner.pool, &self.inner.table, &columns).await
    }

    /// Records `message_id` / `business_id` on `conn`, which must be in the
    /// transaction that will carry the handler's writes: commit both, or
    /// roll both back.
    ///
    /// [`Delivery::First`] means the row is now in your transaction (and
    /// holds its unique keys until you commit or roll back: a concurrent
    /// duplicate waits, then finds it). Ids must be 1 to 255 bytes, else an
    /// [`ErrorKind::Config`] error.
    pub async fn record(
        &self,
        conn: &mut DB::Connection,
        message_id: &str,
        business_id: &str,
    ) -> Result<Delivery, Error> {
        check_short_text("a message id", message_id)?;
        check_short_text("a business id", business_id)?;
        let t = &self.inner.table;
        let mut p = Params::<DB>::new();
        // Ids are length-checked above, so MySQL's INSERT IGNORE can only
        // skip a duplicate key here: the message id or the business id.
        let insert = DB::insert_or_skip(
            &format!("{t} (consumer, message_id, business_id, received_at)"),
            &format!("{}, {}, {}, {}", p.next(), p.next(), p.next(), DB::NOW),
        );
        let consumer = self.inner.consumer.as_str();
        let args = [
            Value::Text(consumer),
            Value::Text(message_id),
            Value::Text(business_id),
        ];
        let find = |column: &str| {
            let mut p = Params::<DB>::new();
            format!(
                "SELECT {} FROM {t} WHERE consumer = {} AND {column} = {}{}",
                DB::int("1"),
                p.next(),
                p.next(),
                DB::FOR_SHARE
            )
        };
        let (by_message, by_business) = (find("message_id"), find("business_id"));

        for _ in 0..ATTEMPTS {
            if DB::execute(conn, insert.clone(), &args)
                .await
                .map_err(db_error)?
                == 1
            {
                return Ok(Delivery::First);
            }
            for (find, id, of) in [
                (&by_message, message_id, DuplicateOf::Message),
                (&by_business, business_id, DuplicateOf::BusinessEvent),
            ] {
                let args = [Value::Text(consumer), Value::Text(id)];
                if DB::fetch_ints(conn, find.clone(), &args)
                    .await
                    .map_err(db_error)?
                    .is_some()
                {
                    return Ok(Delivery::Duplicate(of));
                }
            }
            // The row in the way was purged meanwhile: insert again.
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "the inbox row kept vanishing under the insert",
        ))
    }

    /// Handles one message exactly once: begins a transaction, records the
    /// message, runs `handler` on the transaction's connection, and commits
    /// the handler's writes with the log row. A duplicate is
    /// [`Processed::Skipped`] without running the handler; a handler error
    /// rolls everything back and comes back as [`ProcessError::Failed`]
    /// (do not acknowledge: the broker redelivers).
    pub async fn process<T, E, F>(
        &self,
        message_id: &str,
        business_id: &str,
        handler: F,
    ) -> Result<Processed<T>, ProcessError<E>>
    where
        F: for<'c> FnOnce(&'c mut DB::Connection) -> BoxFuture<'c, Result<T, E>>,
    {
        let inbox = |err: sqlx::Error| ProcessError::Inbox(db_error(err));
        let mut attempt = 1;
        let mut tx = loop {
            let mut tx = self.inner.pool.begin().await.map_err(inbox)?;
            match self.record(&mut tx, message_id, business_id).await {
                Ok(Delivery::First) => break tx,
                Ok(Delivery::Duplicate(of)) => {
                    tx.rollback().await.map_err(inbox)?;
                    return Ok(Processed::Skipped(of));
                }
                // A deadlock among concurrent duplicates (InnoDB picks a
                // victim): nothing ran yet, so start over.
                Err(err) if is_retryable(&err) && attempt < ATTEMPTS => {
                    drop(tx);
                    attempt += 1;
                }
                Err(err) => return Err(ProcessError::Inbox(err)),
            }
        };
        match handler(&mut tx).await {
            Ok(value) => {
                tx.commit().await.map_err(inbox)?;
                Ok(Processed::Done(value))
            }
            Err(err) => {
                // Dropping the transaction would roll back too; saying so
                // returns the connection to the pool clean at once.
                let _ = tx.rollback().await;
                Err(ProcessError::Failed(err))
            }
        }
    }

    /// Deletes this consumer's rows older than `age` by the database's
    /// clock; how many. Keep `age` well past the longest time a message (or
    /// a re-publication of its business event) can still arrive: after
    /// that, a duplicate would be handled again.
    pub async fn purge_older_than(&self, age: Duration) -> Result<u64, Error> {
        let mut p = Params::<DB>::new();
        let sql = format!(
            "DELETE FROM {t} WHERE consumer = {} AND received_at < {}",
            p.next(),
            DB::now_plus_ms(&p.next()),
            t = self.inner.table,
        );
        let args = [
            Value::Text(&self.inner.consumer),
            Value::Int(-expiry_millis(age)),
        ];
        let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
        DB::execute(&mut *conn, sql, &args).await.map_err(db_error)
    }
}
