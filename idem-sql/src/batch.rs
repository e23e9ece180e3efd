//! Group commit: the plain writes of a database with one writer at a time
//! (SQLite), run together.
//!
//! A plain claim writes twice (the claim, then its completion), and on
//! SQLite each write was a transaction of its own: a turn to write, a
//! connection, a statement on the connection's worker thread, a commit (a
//! WAL append, and an fsync with `synchronous = FULL`), then the turn
//! handed to the next writer's task. One after the other, those hand-offs
//! between threads bounded the store, with the machine half idle. Here a
//! write joins a queue, and one runner takes all the writes waiting, on one
//! turn, and the dialect runs them in as few statements as it can
//! (`Dialect::run_writes`; SQLite: every claim in one statement, every
//! completion in another, `sql/sqlite.rs`).
//!
//! - A write is answered once the statement that carried it has committed:
//!   a claim is acquired only once its row is durable, as before.
//! - A statement is all or nothing: one that fails fails the writes it
//!   carried, and none of them stays. Writes are independent of one
//!   another (each its own key and owner), so the batch needs no
//!   transaction around its statements.
//! - A write whose caller is gone before its batch runs (the request was
//!   dropped, or gave up waiting) is skipped: it holds nothing. A claim
//!   acquired for a caller that never reads the answer (gone while its
//!   batch ran, or after the answer was sent) is released in a later batch
//!   when the unread answer is dropped (`Delivery`), so no key is held for
//!   nobody.
//! - The runner is a blocking-pool thread driving the batches with the
//!   runtime's handle, spawned by the write that found none running; it runs
//!   batches while writes keep coming and ends when the queue is empty. On
//!   a thread of its own it wakes the moment a statement's answer comes back
//!   from the connection's worker thread, rather than queued behind the
//!   runtime's tasks: that wait, once per statement, was most of a write's
//!   time under load. If it is dropped, the writes it held are answered
//!   "unavailable" and the next write spawns another.
//! - The batches take the store's turn to write (`writer.rs`), which a
//!   transactional claim holds for its whole transaction: they wait for it
//!   as one write did.
//! - They run on a connection of their own, opened with the pool's options
//!   outside the pool and kept from batch to batch: a batch never queues
//!   for a connection behind the pool's readers, nor holds one of theirs
//!   while it waits for its turn.

use std::mem;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

use sqlx::Connection;

use super::writer::Turn;
use super::{Dialect, SqlStore, unavailable};
use idem_core::{Claim, Error, ErrorKind, Fingerprint, IdempotencyKey, OwnerToken};

/// At most this many writes in one batch; the rest wait for the next.
const MAX_BATCH: usize = 256;

/// One plain write of the store, with what it needs to run later.
#[doc(hidden)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum Write {
    Claim {
        key: IdempotencyKey,
        key_hash: [u8; 32],
        fingerprint: Fingerprint,
        lease: Duration,
        owner: OwnerToken,
    },
    Complete {
        key_hash: [u8; 32],
        owner: OwnerToken,
        outcome: Bytes,
        ttl_ms: i64,
    },
    Release {
        key_hash: [u8; 32],
        owner: OwnerToken,
    },
    Renew {
        key_hash: [u8; 32],
        owner: OwnerToken,
        lease_ms: i64,
    },
}

/// What a write did.
#[doc(hidden)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum Written {
    Claim(Claim),
    /// An owner-fenced write (complete, release, renew): whether the record
    /// was the owner's.
    Fenced(bool),
}

impl Written {
    /// A claim's answer; a claim is only ever answered with one.
    pub(super) fn claim(self) -> Claim {
        match self {
            Self::Claim(claim) => claim,
            Self::Fenced(_) => unreachable!("a claim is answered with a claim"),
        }
    }

    /// An owner-fenced write's answer: `Ok`, or the lease was lost.
    pub(super) fn fenced(self) -> Result<(), Error> {
        match self {
            Self::Fenced(done) => Error::fenced(done),
            Self::Claim(_) => unreachable!("a fenced write is answered with whether it happened"),
        }
    }
}

type Answer<DB> = oneshot::Sender<Delivery<DB>>;

/// A write's answer on its way to its caller. A claim acquired for a
/// caller that never reads it (gone before it was sent, or after, with the
/// answer unread in the channel) is released when the answer is dropped, so
/// no key is held for nobody.
struct Delivery<DB: Dialect> {
    written: Result<Written, Error>,
    /// The store and the key of a claim, to release it if unread.
    claim: Option<(SqlStore<DB>, [u8; 32])>,
}

impl<DB: Dialect> Delivery<DB> {
    /// The answer, read: nothing is released any more.
    fn read(mut self) -> Result<Written, Error> {
        self.claim = None;
        // What is left behind is dropped unread, and releases nothing.
        mem::replace(
            &mut self.written,
            Err(Error::from_kind(ErrorKind::Unavailable)),
        )
    }
}

impl<DB: Dialect> Drop for Delivery<DB> {
    fn drop(&mut self) {
        if let Some((store, key_hash)) = self.claim.take()
            && let Ok(Written::Claim(Claim::Acquired(owner))) = self.written
        {
            let release = Queued {
                write: Write::Release { key_hash, owner },
                answer: None,
            };
            store.queue(release, tokio::runtime::Handle::try_current().ok());
        }
    }
}

/// A write waiting for its batch, and where its answer goes (`None`: a
/// release queued for a claim nobody read, which nobody waits for).
struct Queued<DB: Dialect> {
    write: Write,
    answer: Option<Answer<DB>>,
}

impl<DB: Dialect> Queued<DB> {
    /// Whether the write's caller stopped waiting for it.
    fn abandoned(&self) -> bool {
        self.answer.as_ref().is_some_and(Answer::is_closed)
    }
}

/// The writes waiting for the next batch, whether a task runs them, and
/// the connection the batches run on between runners.
pub(super) struct Batches<DB: Dialect> {
    state: Mutex<State<DB>>,
    connection: Mutex<Option<DB::Connection>>,
}

struct State<DB: Dialect> {
    queue: Vec<Queued<DB>>,
    running: bool,
}

impl<DB: Dialect> Default for State<DB> {
    fn default() -> Self {
        Self {
            queue: Vec::new(),
            running: false,
        }
    }
}

impl<DB: Dialect> Batches<DB> {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::default(),
            connection: Mutex::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<DB>> {
        // Nothing is left half-done under the lock: a poisoned one is fine.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The batches' connection, if one is kept.
    fn take_connection(&self) -> Option<DB::Connection> {
        let mut kept = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        kept.take()
    }

    /// Keeps `conn` for the next batch.
    fn keep_connection(&self, conn: DB::Connection) {
        let mut kept = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *kept = Some(conn);
    }

    /// Queues `queued`; `true` if no task runs the batches and the caller
    /// must start one.
    fn push(&self, queued: Queued<DB>) -> bool {
        let mut state = self.state();
        state.queue.push(queued);
        !mem::replace(&mut state.running, true)
    }

    /// The next batch; `None`, and no task running any more, if the queue
    /// is empty.
    fn next(&self) -> Option<Vec<Queued<DB>>> {
        let mut state = self.state();
        if state.queue.is_empty() {
            state.running = false;
            return None;
        }
        let len = state.queue.len().min(MAX_BATCH);
        Some(state.queue.drain(..len).collect())
    }

    /// No runner could be started for what was just queued (no runtime):
    /// the next write's runner runs it.
    fn stopped(&self) {
        self.state().running = false;
    }

    /// The running task was dropped: the queue's writes go unanswered (their
    /// callers are told "unavailable") and the next write starts a task.
    fn abandon(&self) -> Vec<Queued<DB>> {
        let mut state = self.state();
        state.running = false;
        mem::take(&mut state.queue)
    }
}

/// The task that runs the batches; if dropped before the queue is empty,
/// it hands the queue back (`Batches::abandon`).
struct Runner<DB: Dialect> {
    store: SqlStore<DB>,
    finished: bool,
}

impl<DB: Dialect> Drop for Runner<DB> {
    fn drop(&mut self) {
        if !self.finished {
            // Dropped here, outside the lock: their callers learn at once.
            drop(self.store.inner.batches.abandon());
        }
    }
}

impl<DB: Dialect> Runner<DB> {
    async fn run(mut self) {
        while let Some(batch) = self.store.inner.batches.next() {
            self.store.commit_batch(batch).await;
        }
        self.finished = true;
    }
}

impl<DB: Dialect> SqlStore<DB> {
    /// Runs `write`: in the next batch where writers take turns, on a
    /// connection of its own elsewhere.
    pub(super) async fn write(&self, write: Write) -> Result<Written, Error> {
        if !self.inner.writer.one_at_a_time() {
            let mut conn = self.inner.pool.acquire().await.map_err(unavailable)?;
            return self.run_write(&mut conn, &write).await.map_err(unavailable);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(Error::unavailable(
                "no tokio runtime to run this SQLite store's writes on",
            ));
        };
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            write,
            answer: Some(answer),
        };
        self.queue(queued, Some(runtime));
        // As long as a write once waited for its turn and its connection.
        let timeout = self.inner.pool.options().get_acquire_timeout();
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(delivery)) => delivery.read(),
            Ok(Err(_)) => Err(Error::unavailable(
                "the task running this store's writes stopped before this one committed",
            )),
            Err(_) => Err(Error::unavailable(format!(
                "this store's writes did not commit within {timeout:?}"
            ))),
        }
    }

    /// Queues `queued` for the next batch, and starts a runner on `runtime`
    /// if none runs (with no runtime, it waits for the next write's).
    fn queue(&self, queued: Queued<DB>, runtime: Option<tokio::runtime::Handle>) {
        if !self.inner.batches.push(queued) {
            return;
        }
        let Some(runtime) = runtime else {
            self.inner.batches.stopped();
            return;
        };
        let runner = Runner {
            store: self.clone(),
            finished: false,
        };
        let handle = runtime.clone();
        runtime.spawn_blocking(move || handle.block_on(runner.run()));
    }

    /// Runs `batch` on the turn to write, as the dialect runs many writes
    /// at once (`Dialect::run_writes`), and answers each write in it.
    async fn commit_batch(&self, mut batch: Vec<Queued<DB>>) {
        let written = match self.batch_connection().await {
            Ok((_turn, mut conn)) => {
                // Given up while the batch waited for its turn: skipped.
                batch.retain(|queued| !queued.abandoned());
                let writes: Vec<&Write> = batch.iter().map(|queued| &queued.write).collect();
                let written = DB::run_writes(self, &mut conn, &writes).await;
                // A connection that failed a write is closed, not kept.
                if written.iter().all(Result::is_ok) {
                    self.inner.batches.keep_connection(conn);
                }
                written
            }
            Err(failed) => {
                let failed = Arc::new(failed);
                batch
                    .iter()
                    .map(|_| Err(Error::unavailable(Arc::clone(&failed))))
                    .collect()
            }
        };
        for (queued, written) in batch.into_iter().zip(written) {
            let Some(answer) = queued.answer else {
                continue;
            };
            let claim = match queued.write {
                Write::Claim { key_hash, .. } => Some((self.clone(), key_hash)),
                _ => None,
            };
            // If the caller is gone, the answer comes back and is dropped
            // here, which releases a claim it acquired (`Delivery`).
            let _ = answer.send(Delivery { written, claim });
        }
    }

    /// The turn to write, then the batches' own connection: opened with the
    /// pool's options, outside the pool, and kept from one batch to the
    /// next. Outside the pool, because a batch waits for its turn holding
    /// it (so it never queues for a connection behind the pool's readers,
    /// nor holds one of theirs while a transactional claim has the turn).
    async fn batch_connection(&self) -> Result<(Turn, DB::Connection), Error> {
        let timeout = self.inner.pool.options().get_acquire_timeout();
        let turn = self.inner.writer.wait(timeout).await.ok_or_else(|| {
            Error::unavailable(format!(
                "no turn to write among this store's writes within {timeout:?}"
            ))
        })?;
        if let Some(conn) = self.inner.batches.take_connection() {
            return Ok((turn, conn));
        }
        let options = self.inner.pool.connect_options();
        let conn = tokio::time::timeout(timeout, DB::Connection::connect_with(&options))
            .await
            .map_err(|_| {
                Error::unavailable(format!(
                    "could not open the store's writing connection within {timeout:?}"
                ))
            })?
            .map_err(unavailable)?;
        Ok((turn, conn))
    }

    /// Runs `writes` on `conn` one at a time, each a statement (or two) of
    /// its own.
    pub(super) async fn run_each(
        &self,
        conn: &mut DB::Connection,
        writes: &[&Write],
    ) -> Vec<Result<Written, Error>> {
        let mut written = Vec::with_capacity(writes.len());
        for write in writes {
            written.push(self.run_write(conn, write).await.map_err(unavailable));
        }
        written
    }

    /// Runs one write on `conn`.
    pub(super) async fn run_write(
        &self,
        conn: &mut DB::Connection,
        write: &Write,
    ) -> Result<Written, sqlx::Error> {
        let queries = &self.inner.queries;
        Ok(match write {
            Write::Claim {
                key,
                key_hash,
                fingerprint,
                lease,
                owner,
            } => Written::Claim(
                self.claim_on(conn, key, key_hash, fingerprint, *lease, *owner, false)
                    .await?,
            ),
            Write::Complete {
                key_hash,
                owner,
                outcome,
                ttl_ms,
            } => Written::Fenced(
                DB::complete(conn, queries, key_hash, owner, outcome, *ttl_ms).await?,
            ),
            Write::Release { key_hash, owner } => {
                Written::Fenced(DB::release(conn, queries, key_hash, owner).await?)
            }
            Write::Renew {
                key_hash,
                owner,
                lease_ms,
            } => Written::Fenced(DB::renew(conn, queries, key_hash, owner, *lease_ms).await?),
        })
    }
}
