//! The write lock relayed from one transactional claim to the next, on a
//! database with one writer at a time (SQLite).
//!
//! A transactional claim there holds the turn to write (`writer.rs`) and
//! the database's write lock from its start to its commit, and under load
//! the next claim waits for both. Were the turn given back and taken
//! again, the next claim would start with a call of its own to SQLite's
//! worker thread (BEGIN IMMEDIATE and the read of its key) after the
//! commit's: four calls under the turn per first request, the claim's, the
//! handler's two and the commit's, where the bare endpoint's own
//! transaction makes three. Instead a committing claim that finds another
//! waiting here starts that one in its commit's call
//! ([`Dialect::tx_commit_and_claim`]: COMMIT, BEGIN IMMEDIATE and the next
//! key's read on the same connection) and hands it the transaction, what
//! its read found and the turn ([`Baton`]). The next claim starts where
//! the last one's commit ends, without a call of its own under the turn.
//!
//! The turn is never in two hands: a claim is taken from the line only by
//! the turn's holder, which hands it on with the baton or gives it back to
//! the writers' queue; a waiting claim takes a turn from that queue or a
//! baton, whichever comes first, and then leaves the line (a baton already
//! on its way when its turn came cannot be, since the turn it would carry
//! is the one it holds). The line yields to other writers: a claim is not
//! taken from it while a batch of plain writes or a purge waits for the
//! turn, so that transactional claims under load do not keep them waiting
//! to their timeout.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

use super::dialect::{ClaimStep, Dialect};
use super::writer::{Turn, WriterTurns};

/// Counts the claims started in the commit of the one before and handed
/// the turn.
pub(crate) const RELAYED: &str = "idem_sqlite_claims_relayed_total";

/// The transactional claims waiting for the turn to write, in order.
pub(crate) struct Relay<DB: Dialect> {
    line: Mutex<VecDeque<InLine<DB>>>,
    next_place: AtomicU64,
}

/// A claim in the line: its key, and where its baton goes.
struct InLine<DB: Dialect> {
    place: u64,
    key_hash: [u8; 32],
    baton: oneshot::Sender<Baton<DB>>,
}

/// What a committing claim hands the next: its connection, with the next
/// claim's transaction begun (holding the write lock), what the read of
/// the next claim's key found, and the turn to write.
pub(crate) struct Baton<DB: Dialect> {
    pub(crate) tx: sqlx::Transaction<'static, DB>,
    pub(crate) step: ClaimStep,
    pub(crate) turn: Turn,
}

/// How a waiting claim's turn came.
pub(crate) enum Waited<DB: Dialect> {
    /// From the writers' queue: the claim starts its own transaction.
    Turn(Turn),
    /// Relayed: the claim's transaction is begun and its key read.
    Relayed(Baton<DB>),
}

/// The claim taken from the line by the turn's holder, to start in its
/// commit and hand the [`Baton`].
pub(crate) struct Next<DB: Dialect> {
    key_hash: [u8; 32],
    baton: oneshot::Sender<Baton<DB>>,
}

impl<DB: Dialect> Relay<DB> {
    pub(crate) fn new() -> Self {
        Self {
            line: Mutex::new(VecDeque::new()),
            next_place: AtomicU64::new(0),
        }
    }

    /// Waits for the turn to write, up to `within`, in the line as the claim
    /// of `key_hash`: from the writers' queue or relayed, whichever comes
    /// first; `None` if neither came.
    pub(crate) async fn wait(
        &self,
        writer: &WriterTurns,
        key_hash: [u8; 32],
        within: Duration,
    ) -> Option<Waited<DB>> {
        let (baton, mut relayed) = oneshot::channel();
        let place = self.next_place.fetch_add(1, Ordering::Relaxed);
        self.lock().push_back(InLine {
            place,
            key_hash,
            baton,
        });
        // Out of the line however this ends, this future dropped included.
        let in_line = Leave { relay: self, place };
        let queued = writer.wait(within);
        tokio::pin!(queued);
        let turn = tokio::select! {
            biased;
            baton = &mut relayed => match baton {
                Ok(baton) => return Some(Waited::Relayed(baton)),
                // Taken from the line and dropped: its taker could not
                // start this claim and gave the turn back to the queue.
                Err(_) => return queued.await.map(Waited::Turn),
            },
            turn = &mut queued => turn,
        };
        if in_line.leave() {
            return turn.map(Waited::Turn);
        }
        // Taken from the line meanwhile. With a turn in hand, its taker
        // gave up (it held the only turn until then); without one, the
        // baton is on its way, or its taker gave up.
        match turn {
            Some(turn) => Some(Waited::Turn(turn)),
            None => relayed.await.ok().map(Waited::Relayed),
        }
    }

    /// The first claim in the line, for the turn's holder to start in its
    /// commit; `None` if there is none, or if another writer waits for the
    /// turn (the line yields to it).
    pub(crate) fn next(&self, writer: &WriterTurns) -> Option<Next<DB>> {
        let mut line = self.lock();
        // Every claim in the line also waits in the writers' queue; anyone
        // more there is another writer.
        if writer.waiting() > line.len() {
            return None;
        }
        line.pop_front().map(|claim| Next {
            key_hash: claim.key_hash,
            baton: claim.baton,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<InLine<DB>>> {
        // Nothing panics while holding it; a poisoned line is still whole.
        self.line
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<DB: Dialect> Next<DB> {
    /// The key of the claim to start.
    pub(crate) fn key_hash(&self) -> &[u8; 32] {
        &self.key_hash
    }

    /// Hands the baton to the claim; gives it back if that claim is gone
    /// (its request dropped).
    pub(crate) fn hand(self, baton: Baton<DB>) -> Option<Baton<DB>> {
        self.baton.send(baton).err()
    }
}

/// A claim's place in the line, left when dropped.
struct Leave<'a, DB: Dialect> {
    relay: &'a Relay<DB>,
    place: u64,
}

impl<DB: Dialect> Leave<'_, DB> {
    /// Leaves the line; `false` if the claim had been taken from it (or
    /// had left already).
    fn leave(&self) -> bool {
        let mut line = self.relay.lock();
        let at = line.iter().position(|claim| claim.place == self.place);
        at.and_then(|at| line.remove(at)).is_some()
    }
}

impl<DB: Dialect> Drop for Leave<'_, DB> {
    fn drop(&mut self) {
        self.leave();
    }
}
