//! Transactional mode on SQL: a claim in a transaction the handler then
//! writes in, committed with the stored outcome. On PostgreSQL an advisory
//! lock holds the key, on SQLite the database's write lock, and the
//! completed row is inserted at commit; on MySQL/MariaDB the claim's row,
//! written first, holds it and is completed at commit. On SQLite a commit
//! starts the next waiting claim and hands it the lock (`relay.rs`).

use std::ops::ControlFlow;
use std::time::Duration;

use tokio::sync::watch;

use super::dialect::Settled;
use super::open::{Check, Held, Marked};
use super::relay::{Baton, RELAYED, Waited};
use super::{
    ClaimArgs, ClaimStep, ClaimTx, Dialect, SqlStore, Turn, TxSlot, key_hash, settle, unavailable,
};
use idem_core::{BoxFuture, OpenTransaction, TransactionalStore, TxClaim, TxHandle};
use idem_core::{Claim, Duplicate, Error, ErrorKind, Fingerprint, IdempotencyKey, Outcome};
use idem_core::{OwnerToken, expiry_millis};

impl<DB: Dialect> TransactionalStore for SqlStore<DB> {
    fn claim_in_transaction<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<TxClaim, Error>> {
        Box::pin(async move {
            let hash = key_hash(key);
            let mark = match self.inner.open.mark(hash) {
                Marked::Mine(mark) => mark,
                Marked::Theirs(check) => {
                    return Ok(self.answer_from_memory(check, fingerprint, lease).await);
                }
            };
            let turn_within = match self.before_turn(&hash, fingerprint).await {
                ControlFlow::Break(duplicate) => {
                    mark.checked(Check::Answered(*fingerprint, duplicate.clone()));
                    return Ok(TxClaim::Duplicate(duplicate));
                }
                ControlFlow::Continue(within) => within,
            };
            // Our turn among this process's open claims, waited for without a
            // connection.
            let acquire_timeout = self.inner.pool.options().get_acquire_timeout();
            let Some(held) = self.inner.open.hold(mark, acquire_timeout).await else {
                return Err(Error::unavailable(format!(
                    "no turn among the {} open transactional claims within {acquire_timeout:?}",
                    self.inner.open.max()
                )));
            };
            let Some(Begun {
                mut tx,
                turn,
                relayed,
            }) = self.begin_in_turn(&hash, turn_within).await?
            else {
                return Ok(in_flight(lease));
            };
            // Anything but our claim: nothing of ours to keep. Rolled back
            // here and now, not left to the drop (sqlx rolls a dropped
            // transaction back lazily): until then it would hold the key's
            // try-lock, and the next claim would be told "in flight" instead
            // of replaying.
            let claimed = match relayed.map(|step| settle(step, fingerprint, lease, owner)) {
                Some(Ok(Some(claim))) => Ok(claim),
                Some(Err(err)) => Err(unavailable(err)),
                // Not relayed, or its record expired meanwhile: read again.
                Some(Ok(None)) | None => {
                    self.claim_in(&mut tx, key, &hash, fingerprint, lease, owner)
                        .await
                }
            };
            let owner = match claimed.map(Claim::acquired) {
                Ok(Ok(owner)) => owner,
                Ok(Err(duplicate)) => {
                    held.checked(Check::Answered(*fingerprint, duplicate.clone()));
                    finish(tx).await;
                    return Ok(TxClaim::Duplicate(duplicate));
                }
                Err(err) => {
                    finish(tx).await;
                    return Err(err);
                }
            };
            // Counted open by sqlx from here on, so that the handler's
            // nested `begin()` is a savepoint (`claim_tx.rs`); a failure
            // drops the transaction, which rolls it back.
            DB::tx_lend(&mut tx, &owner, lease)
                .await
                .map_err(unavailable)?;
            held.checked(Check::Open);
            Ok(TxClaim::Open(Box::new(SqlOpenTransaction {
                slot: TxSlot::new(tx),
                store: self.clone(),
                key: key.clone(),
                key_hash: hash,
                fingerprint: *fingerprint,
                owner,
                _held: held,
                turn,
            })))
        })
    }
}

impl<DB: Dialect> SqlStore<DB> {
    /// A duplicate of a key this process has marked, answered from memory
    /// without a connection: with what the marking request's check finds,
    /// waited for up to the lock timeout.
    async fn answer_from_memory(
        &self,
        mut check: watch::Receiver<Check>,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> TxClaim {
        let checked = tokio::time::timeout(
            self.inner.lock_timeout,
            check.wait_for(|check| !matches!(check, Check::Running)),
        )
        .await;
        match checked.as_ref().map(|c| c.as_deref()) {
            Ok(Ok(Check::Answered(of, duplicate))) if of == fingerprint => {
                TxClaim::Duplicate(duplicate.clone())
            }
            // Open, gone without an answer, another request's answer, or
            // still running: in flight.
            _ => in_flight(lease),
        }
    }

    /// Before a transactional claim waits for the turn to write: the
    /// answer to a duplicate of a completed key, where writers take turns
    /// and the turn is taken (SQLite), or else how long the claim may wait
    /// for the turn: the lock timeout, less what the read waited for its
    /// connection, so that the claim waits no longer than the lock timeout
    /// in all.
    async fn before_turn(
        &self,
        hash: &[u8; 32],
        fingerprint: &Fingerprint,
    ) -> ControlFlow<Duplicate, Duration> {
        let lock_timeout = self.inner.lock_timeout;
        if !DB::ONE_WRITER || self.inner.writer.free() > 0 {
            return ControlFlow::Continue(lock_timeout);
        }
        let reading = tokio::time::Instant::now();
        match self.read_before_turn(hash, fingerprint).await {
            Some(duplicate) => ControlFlow::Break(duplicate),
            None => ControlFlow::Continue(lock_timeout.saturating_sub(reading.elapsed())),
        }
    }

    /// What a plain read of `hash`'s record answers a claim with
    /// `fingerprint` ([`SqlStore::answer_from_read`], as before a plain
    /// claim), made before the turn to write ([`SqlStore::before_turn`]);
    /// `None` if the key is absent or expired, and the claim is to be made.
    ///
    /// There a transactional claim reads the key under the write lock, in
    /// the turn of every writer of the process: a duplicate of a completed
    /// key would wait its turn behind the first requests, to read, and
    /// under a storm of retries the duplicates would hold the turn the
    /// first requests need. A plain read sees the committed records
    /// without waiting for anyone (a WAL reader). What it does not answer,
    /// the claim reads again under the lock.
    ///
    /// Made only while another writer has the turn: a claim that finds it
    /// free reads under the lock at once, and a first request pays for no
    /// read of its own. Under load the read is paid: about 60 µs of CPU
    /// per first request at 2,000 a second on the benchmark's machine, not
    /// its throughput at saturation (docs/benchmark-history.md).
    ///
    /// Its connection is waited for up to the lock timeout, not the pool's
    /// acquire timeout: with every connection taken (by the open claims
    /// and the application's own queries) the claim would otherwise wait
    /// far longer than for the turn, and under load the turn comes with a
    /// connection of its own. `None` too if no connection came in time or
    /// the read failed: the read saves a duplicate the wait for the turn,
    /// and the claim's read under the lock reports what this one met.
    async fn read_before_turn(
        &self,
        hash: &[u8; 32],
        fingerprint: &Fingerprint,
    ) -> Option<Duplicate> {
        let acquired =
            tokio::time::timeout(self.inner.lock_timeout, self.inner.pool.acquire()).await;
        let mut conn = acquired.ok()?.ok()?;
        let answer = self.answer_from_read(&mut conn, hash, fingerprint).await;
        // A record in the way answers as a duplicate (never "acquired").
        answer.ok()??.acquired().err()
    }

    /// A transaction begun for the claim of `hash`, with the turn to
    /// write; `None` if the turn did not come `within` (what is left of
    /// the lock timeout).
    ///
    /// On SQLite the transaction holds the write lock from its claim to its
    /// commit: it takes the turn to write for all of it, and a turn that
    /// does not come in time is answered as SQLite's lock would be. The
    /// claim waits for the turn without a connection. Under load the turn
    /// comes relayed (`relay.rs`), with the committing claim's connection,
    /// this claim's transaction begun on it and its key read; otherwise the
    /// turn was free, or given back by another writer, and the claim takes
    /// a connection and begins with BEGIN IMMEDIATE, which takes the lock
    /// ([`SqlStore::begin_claim`]).
    async fn begin_in_turn(
        &self,
        hash: &[u8; 32],
        within: Duration,
    ) -> Result<Option<Begun<DB>>, Error> {
        let writer = &self.inner.writer;
        let waited = if writer.one_at_a_time() {
            self.inner.relay.wait(writer, *hash, within).await
        } else {
            // No turns to take: an empty one, at once.
            writer.wait(within).await.map(Waited::Turn)
        };
        match waited {
            Some(Waited::Turn(turn)) => Ok(self.begin_claim().await?.map(|tx| Begun {
                tx,
                turn,
                relayed: None,
            })),
            Some(Waited::Relayed(Baton {
                started: (tx, step),
                turn,
            })) => Ok(Some(Begun {
                tx,
                turn,
                relayed: Some(step),
            })),
            None => Ok(None),
        }
    }

    /// A transactional claim's transaction, begun with
    /// [`Dialect::TX_BEGIN`]; `None` if that found the database locked past
    /// the connection's own timeout (on SQLite another process's writer
    /// held the write lock past the busy timeout), answered as a lock held
    /// by the key's first claim is.
    async fn begin_claim(&self) -> Result<Option<ClaimTx<DB>>, Error> {
        let pool = &self.inner.pool;
        if let Some(end) = DB::OWN_BEGIN {
            // The claim's query begins it (`claim_tx.rs`).
            let conn = pool.acquire().await.map_err(unavailable)?;
            return Ok(Some(ClaimTx::own(conn, end)));
        }
        let begun = match DB::TX_BEGIN {
            Some(statement) => pool.begin_with(statement).await,
            None => pool.begin().await,
        };
        match begun {
            Ok(tx) => Ok(Some(tx.into())),
            Err(err) if DB::is_lock_timeout(&err) => Ok(None),
            Err(err) => Err(unavailable(err)),
        }
    }

    /// The claim of `key` in `tx` ([`Dialect::tx_claim`]): another open
    /// transaction's claim of the key is found at once, without waiting
    /// for it. On PostgreSQL it only reads, under the key's advisory lock,
    /// and the completed row is written at commit. Elsewhere, unlike
    /// `claim`, nothing reads first: the claim writes its row before it
    /// reads. A plain read there cannot see another transaction's
    /// uncommitted claim, and it has effects: on MySQL/MariaDB (REPEATABLE
    /// READ) it fixes the transaction's read view, so the handler would
    /// read its data as of before the claim; on SQLite it opens the
    /// transaction as a reader, and a reader that another connection's
    /// commit overtook cannot become the writer (SQLITE_BUSY_SNAPSHOT).
    async fn claim_in(
        &self,
        tx: &mut ClaimTx<DB>,
        key: &IdempotencyKey,
        hash: &[u8; 32],
        fingerprint: &Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    ) -> Result<Claim, Error> {
        self.claim_on(
            tx,
            key,
            hash,
            fingerprint,
            lease,
            owner,
            Some(self.inner.lock_timeout),
        )
        .await
        .map_err(unavailable)
    }
}

/// A transactional claim's transaction, with the turn to write.
struct Begun<DB: Dialect> {
    tx: ClaimTx<DB>,
    turn: Turn,
    /// What the claim found, if its transaction came relayed with its key
    /// read; else the claim has yet to read it.
    relayed: Option<ClaimStep>,
}

/// The answer to a claim of a key another attempt holds.
fn in_flight(lease: Duration) -> TxClaim {
    TxClaim::Duplicate(Duplicate::InFlight { retry_after: lease })
}

/// Rolls back a claim's transaction that holds nothing of ours. A failed
/// rollback leaves a broken connection, which sqlx closes rather than
/// reuse; the database then ends the transaction with its session.
async fn finish<DB: Dialect>(tx: ClaimTx<DB>) {
    if let Err(err) = tx.rollback().await {
        tracing::warn!(error = %err, "rolling back an unused claim transaction failed");
    }
}

/// Half the pool: see [`SqlStoreBuilder::max_transactions`](super::SqlStoreBuilder::max_transactions).
pub(super) fn default_max_transactions<DB: Dialect>(pool: &sqlx::Pool<DB>) -> usize {
    (pool.options().get_max_connections() as usize / 2).max(1)
}

/// A claim held in an open transaction, shared with the handler through a
/// [`TxSlot`].
struct SqlOpenTransaction<DB: Dialect> {
    slot: TxSlot<DB>,
    store: SqlStore<DB>,
    key: IdempotencyKey,
    key_hash: [u8; 32],
    fingerprint: Fingerprint,
    owner: OwnerToken,
    /// The key's mark and the turn among open claims, given up with the
    /// transaction.
    _held: Held,
    /// The turn to write, on SQLite; given up with the transaction, or
    /// handed on with the next claim's at commit.
    turn: Turn,
}

impl<DB: Dialect> OpenTransaction for SqlOpenTransaction<DB> {
    fn handle(&self) -> TxHandle {
        TxHandle::new(self.slot.clone())
    }

    fn commit<'a>(
        self: Box<Self>,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let this = *self;
        let (outcome, ttl_ms) = (outcome.encode(), expiry_millis(ttl));
        Box::pin(async move {
            if !this.store.inner.writer.one_at_a_time() {
                return this.commit_encoded(outcome, ttl_ms).await;
            }
            // On SQLite the commit is a query of several statements with a
            // COMMIT and a BEGIN among them (`sqlite/script.rs`), which
            // sqlx's worker stops between two statements if its caller is
            // dropped: the transaction committed, and none begun where sqlx
            // counts one open. So it runs on a task of its own, to its end
            // whether this request is still waiting or not (outside a
            // tokio runtime, where it cannot, it runs here).
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return this.commit_encoded(outcome, ttl_ms).await;
            };
            match runtime.spawn(this.commit_encoded(outcome, ttl_ms)).await {
                Ok(committed) => committed,
                Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                Err(err) => Err(Error::unavailable(format!(
                    "the transactional commit's task: {err}"
                ))),
            }
        })
    }

    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            let tx = self.slot.take().await?;
            let settled = DB::tx_rollback(tx, self.args())
                .await
                .map_err(unavailable)?;
            match settled {
                Settled::Done | Settled::Fenced => Ok(()),
                // Nothing kept is what a rollback is for.
                Settled::Ended => self
                    .keep_ended(expiry_millis(ENDED_TTL))
                    .await
                    .map_or(Ok(()), Err),
            }
        })
    }
}

/// How long the key of a claim whose transaction the handler ended is
/// kept from running again when the handler's response was not final
/// (the route's ttl is not known there): a day, the default ttl.
const ENDED_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What the store counts when a claim's transaction was ended by its
/// handler (a raw COMMIT or ROLLBACK on the connection it was lent).
pub(crate) const ENDED: &str = "idem_transactions_ended_total";

impl<DB: Dialect> SqlOpenTransaction<DB> {
    /// Commits with the outcome encoded, `ttl_ms` its retention; on a
    /// database with one writer, starts the next claim waiting for the
    /// turn in the same call and hands it the turn (`relay.rs`).
    async fn commit_encoded(self, outcome: bytes::Bytes, ttl_ms: i64) -> Result<(), Error> {
        let tx = self.slot.take().await?;
        let args = self.args();
        let inner = &self.store.inner;
        // Another claim waiting for the turn starts in this commit's
        // call and gets the turn with its transaction (`relay.rs`).
        let next = if inner.writer.one_at_a_time() {
            inner.relay.next(&inner.writer)
        } else {
            None
        };
        let Some(next) = next else {
            let settled = DB::tx_commit(tx, &inner.queries, args, &outcome, ttl_ms)
                .await
                .map_err(unavailable)?;
            return self.settled(settled, ttl_ms).await;
        };
        let (settled, started) =
            DB::tx_commit_and_claim(tx, &inner.queries, args, &outcome, ttl_ms, next.key_hash())
                .await
                .map_err(unavailable)?;
        // Before the turn is handed on, which takes it from `self`.
        let answer = self.settled(settled, ttl_ms).await;
        if let Some(started) = started {
            let baton = Baton {
                started,
                turn: self.turn,
            };
            match next.hand(baton) {
                None => metrics::counter!(RELAYED).increment(1),
                // That claim is gone; its transaction holds the lock.
                Some(Baton {
                    started: (tx, _), ..
                }) => finish(tx).await,
            }
        }
        answer
    }

    /// The claim's arguments to the dialect's settling statements.
    fn args(&self) -> ClaimArgs<'_> {
        ClaimArgs {
            key_hash: &self.key_hash,
            key: self.key.as_str(),
            fingerprint: &self.fingerprint,
            owner: &self.owner,
            lease_ms: 0,
        }
    }

    /// The answer to a commit that `settled`.
    async fn settled(&self, settled: Settled, ttl_ms: i64) -> Result<(), Error> {
        match settled {
            Settled::Done => Ok(()),
            Settled::Fenced => Err(Error::lease_lost()),
            // Nothing kept: nothing committed, as over a live row.
            Settled::Ended => Err(self
                .keep_ended(ttl_ms)
                .await
                .unwrap_or_else(Error::lease_lost)),
        }
    }

    /// After the claim's transaction was found ended ([`Settled::Ended`]):
    /// counted ([`ENDED`]) and logged, and the key kept from running again
    /// for `ttl_ms` where something of the transaction may have committed
    /// ([`Dialect::tx_keep_ended`]): then the error to fail the request
    /// with; `None` if nothing of it committed and the key is free.
    async fn keep_ended(&self, ttl_ms: i64) -> Option<Error> {
        let inner = &self.store.inner;
        metrics::counter!(ENDED).increment(1);
        let outcome = Outcome::NotReplayable.encode();
        let kept =
            DB::tx_keep_ended(&inner.pool, &inner.queries, self.args(), &outcome, ttl_ms).await;
        match kept {
            // The database rolled the transaction back under the handler
            // (a deadlock, a Galera abort), the handler did, or SQLite
            // refused its commit: nothing of it committed, nor after it
            // (`mysql/script.rs`, `lend`; `sqlite/lent.rs`).
            Ok(false) => {
                tracing::warn!(
                    "the idempotency transaction had ended before idem settled it; \
                     nothing of it was kept, and its key is free"
                );
                None
            }
            Ok(true) => {
                tracing::error!(
                    "the handler ended the idempotency transaction (a COMMIT or ROLLBACK \
                     sent on the connection it was lent, not through sqlx's begin()): \
                     its writes may have committed without the record; the key is kept \
                     from running again with a record that is not replayable"
                );
                Some(Error::new(
                    ErrorKind::TransactionEnded,
                    "the claim's transaction was ended by the handler",
                ))
            }
            Err(err) => {
                tracing::error!(
                    error = %err,
                    "the handler ended the idempotency transaction, and the record that \
                     keeps its key from running again could not be written"
                );
                Some(Error::new(ErrorKind::TransactionEnded, err))
            }
        }
    }
}
