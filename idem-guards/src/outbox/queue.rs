//! The relay's side of the outbox table: claiming a batch under a lease,
//! marking events sent, putting one back for a later retry, purging what
//! was sent.
//!
//! Claims are taken one relay at a time, under a row lock on the outbox's
//! lock table (`FOR UPDATE SKIP LOCKED` where the database has row locks: a
//! relay that finds another claiming comes back later instead of queueing;
//! on SQLite, the database's one writer). That is what keeps a key's events
//! in order across relays: with claims serialised, "every earlier unsent
//! event of this key is claimable too" is judged on rows no other relay is
//! changing. The claim itself is a lease (an owner token and an expiry), so
//! publishing holds no transaction open, and a relay that dies mid-batch
//! leaves events that another relay claims once the lease is over. The
//! claim reads committed rows without locking them (MySQL's repeatable
//! read would take gap locks there, and deadlock with the inserts of the
//! business transactions enqueueing events).

use std::time::Duration;

use super::Outbox;
use super::event::PendingEvent;
use crate::GuardDb;
use crate::sql::{Params, Value, db_error};
use idem_core::Error;
use idem_core::expiry_millis;

/// A batch claimed by one relay: its events, in sequence order, and the
/// token its lease is held under.
#[derive(Debug)]
pub(super) struct Claimed {
    pub(super) token: String,
    pub(super) events: Vec<PendingEvent>,
}

impl<DB: GuardDb> Outbox<DB> {
    /// Claims up to `batch` events for `lease` under a new token of `relay`:
    /// unsent, not leased, due, and with no earlier unsent event of their
    /// key that is leased or waiting for a retry. Empty if there is none,
    /// or another relay is claiming right now.
    pub(super) async fn claim(
        &self,
        relay: &str,
        batch: usize,
        lease: Duration,
    ) -> Result<Claimed, Error> {
        let token = format!("{relay}:{:032x}", rand::random::<u128>());
        let (t, lock, now) = (&self.inner.table, &self.inner.lock, DB::NOW);
        let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
        if let Some(read_committed) = DB::NEXT_TRANSACTION_READ_COMMITTED {
            DB::execute(&mut conn, read_committed.to_owned(), &[])
                .await
                .map_err(db_error)?;
        }
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(db_error)?;

        let locked = match DB::SKIP_LOCKED {
            Some(skip_locked) => {
                let sql = format!("SELECT id FROM {lock} WHERE id = 1{skip_locked}");
                DB::fetch_ints(&mut tx, sql, &[])
                    .await
                    .map_err(db_error)?
                    .is_some()
            }
            None => {
                let sql = format!("UPDATE {lock} SET id = 1 WHERE id = 1");
                DB::execute(&mut tx, sql, &[]).await.map_err(db_error)? == 1
            }
        };
        if !locked {
            tx.rollback().await.map_err(db_error)?;
            return Ok(Claimed {
                token,
                events: Vec::new(),
            });
        }

        let mut p = Params::<DB>::new();
        let (owner, until) = (p.next(), DB::now_plus_ms(&p.next()));
        let limit = batch.max(1);
        // The derived table lets MySQL update the table its subquery reads.
        let lease_batch = format!(
            "UPDATE {t} SET locked_by = {owner}, locked_until = {until} \
             WHERE seq IN (SELECT seq FROM ( \
               SELECT o.seq FROM {t} o \
               WHERE o.sent_at IS NULL \
                 AND (o.locked_until IS NULL OR o.locked_until <= {now}) \
                 AND o.next_attempt_at <= {now} \
                 AND NOT EXISTS ( \
                   SELECT 1 FROM {t} e \
                   WHERE e.event_key = o.event_key AND e.seq < o.seq AND e.sent_at IS NULL \
                     AND (e.locked_until > {now} OR e.next_attempt_at > {now})) \
               ORDER BY o.seq LIMIT {limit}) claimable)"
        );
        let args = [Value::Text(&token), Value::Int(expiry_millis(lease))];
        DB::execute(&mut tx, lease_batch, &args)
            .await
            .map_err(db_error)?;

        let mut p = Params::<DB>::new();
        let read = format!(
            "SELECT seq, {}, {}, {}, payload, headers, attempts \
             FROM {t} WHERE locked_by = {} AND sent_at IS NULL ORDER BY seq",
            DB::short_text("event_id"),
            DB::short_text("topic"),
            DB::short_text("event_key"),
            p.next()
        );
        let rows = DB::fetch_events(&mut tx, read, &[Value::Text(&token)])
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        let events = rows
            .into_iter()
            .map(PendingEvent::from_row)
            .collect::<Result<_, _>>()?;
        Ok(Claimed { token, events })
    }

    /// Marks `seq` sent, if the lease of `token` still holds it; `false`
    /// if another relay took it over (it publishes the event again, under
    /// the same id).
    pub(super) async fn mark_sent(&self, token: &str, seq: i64) -> Result<bool, Error> {
        let mut p = Params::<DB>::new();
        let sql = format!(
            "UPDATE {} SET sent_at = {now}, locked_by = NULL, locked_until = NULL \
             WHERE seq = {} AND locked_by = {} AND sent_at IS NULL",
            self.inner.table,
            p.next(),
            p.next(),
            now = DB::NOW,
        );
        self.run(sql, &[Value::Int(seq), Value::Text(token)])
            .await
            .map(|rows| rows == 1)
    }

    /// Puts `seq` back to be retried after `delay`, counting a failed
    /// attempt, if the lease of `token` still holds it.
    pub(super) async fn retry_later(
        &self,
        token: &str,
        seq: i64,
        delay: Duration,
    ) -> Result<bool, Error> {
        let mut p = Params::<DB>::new();
        let sql = format!(
            "UPDATE {} SET attempts = attempts + 1, next_attempt_at = {}, \
               locked_by = NULL, locked_until = NULL \
             WHERE seq = {} AND locked_by = {}",
            self.inner.table,
            DB::now_plus_ms(&p.next()),
            p.next(),
            p.next(),
        );
        let args = [
            Value::Int(expiry_millis(delay)),
            Value::Int(seq),
            Value::Text(token),
        ];
        self.run(sql, &args).await.map(|rows| rows == 1)
    }

    /// Lets go of every event `token` still holds, unpublished, so they
    /// can be claimed again at once.
    pub(super) async fn release(&self, token: &str) -> Result<u64, Error> {
        let mut p = Params::<DB>::new();
        let sql = format!(
            "UPDATE {} SET locked_by = NULL, locked_until = NULL WHERE locked_by = {}",
            self.inner.table,
            p.next(),
        );
        self.run(sql, &[Value::Text(token)]).await
    }

    /// Deletes up to `batch` events sent more than `age` ago, oldest first;
    /// how many. A running [`Relay`](super::Relay) does this by itself
    /// ([`Relay::keep_sent`](super::Relay::keep_sent)).
    pub async fn purge_sent(&self, age: Duration, batch: usize) -> Result<u64, Error> {
        let mut p = Params::<DB>::new();
        let sql = format!(
            "DELETE FROM {t} WHERE seq IN (SELECT seq FROM ( \
               SELECT seq FROM {t} WHERE sent_at IS NOT NULL AND sent_at < {before} \
               ORDER BY seq LIMIT {limit}) sent)",
            t = self.inner.table,
            before = DB::now_plus_ms(&p.next()),
            limit = batch.max(1),
        );
        self.run(sql, &[Value::Int(-expiry_millis(age))]).await
    }

    async fn run(&self, sql: String, args: &[Value<'_>]) -> Result<u64, Error> {
        let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
        DB::execute(&mut conn, sql, args).await.map_err(db_error)
    }
}
