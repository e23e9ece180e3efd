//! Group commit: the plain writes of a database with one writer at a time
//! (SQLite), run together (what for: docs/stores.md, "SQLite").
//!
//! A write joins a queue, and one runner takes all the writes waiting, on one
//! turn, and the dialect runs them in as few statements as it can
//! (`Dialect::run_writes`; SQLite: every claim in one statement, every
//! completion in another, `sql/sqlite.rs`).
//!
//! - A write is answered once the statement that carried it has committed:
//!   a claim is acquired only once its row is durable.
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
//!
//! The queue, the runner's hand-off and `Delivery` are in `batch/queue.rs`,
//! with nothing of the database, so that loom checks them (`.ci/loom`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;

use sqlx::Connection;

use super::writer::Turn;
use super::{Dialect, SqlStore, unavailable};
use idem_core::{Claim, Error, Fingerprint, IdempotencyKey, OwnerToken};

mod queue;

use queue::{Batch, Queue, Queued, Releases};

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

/// The writes waiting for the next batch, whether a task runs them, and
/// the connection the batches run on between runners.
pub(super) struct Batches<DB: Dialect> {
    queue: Queue<SqlStore<DB>>,
    connection: Mutex<Option<DB::Connection>>,
}

impl<DB: Dialect> Batches<DB> {
    pub(super) fn new() -> Self {
        Self {
            queue: Queue::new(),
            connection: Mutex::new(None),
        }
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
}

impl<DB: Dialect> Releases for SqlStore<DB> {
    fn release_unread(&self, release: Queued<Self>) {
        self.queue(release, tokio::runtime::Handle::try_current().ok());
    }
}

/// The task that runs the batches; if dropped before the queue is empty,
/// it hands the queue back (`Queue::abandon`).
struct Runner<DB: Dialect> {
    store: SqlStore<DB>,
    finished: bool,
}

impl<DB: Dialect> Drop for Runner<DB> {
    fn drop(&mut self) {
        if !self.finished {
            // Dropped here, outside the lock: their callers learn at once.
            drop(self.store.inner.batches.queue.abandon());
        }
    }
}

impl<DB: Dialect> Runner<DB> {
    async fn run(mut self) {
        while let Some(batch) = self.store.inner.batches.queue.next() {
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
        let (queued, answered) = Queued::answered(write);
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
    fn queue(&self, queued: Queued<Self>, runtime: Option<tokio::runtime::Handle>) {
        if !self.inner.batches.queue.push(queued) {
            return;
        }
        let Some(runtime) = runtime else {
            self.inner.batches.queue.stopped();
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
    async fn commit_batch(&self, mut batch: Batch<Self>) {
        let written = match self.batch_connection().await {
            Ok((_turn, mut conn)) => {
                // Given up while the batch waited for its turn: skipped.
                batch.skip_abandoned();
                let written = DB::run_writes(self, &mut conn, &batch.writes()).await;
                // A connection that failed a write is closed, not kept.
                if written.iter().all(Result::is_ok) {
                    self.inner.batches.keep_connection(conn);
                }
                written
            }
            Err(failed) => {
                let failed = Arc::new(failed);
                batch
                    .writes()
                    .iter()
                    .map(|_| Err(Error::unavailable(Arc::clone(&failed))))
                    .collect()
            }
        };
        batch.answer(written, self);
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
                self.claim_on(conn, key, key_hash, fingerprint, *lease, *owner, None)
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
