//! The write lock relayed from one transactional claim to the next, on a
//! database with one writer at a time (SQLite). What it is for, and why
//! it is let go now and then: docs/stores.md, "SQLite".
//!
//! A transactional claim there holds the turn to write (`writer.rs`) and
//! the database's write lock from its start to its commit. A committing
//! claim that finds another waiting here starts that one in its commit's
//! call (`Dialect::tx_commit_and_claim`: COMMIT, BEGIN IMMEDIATE and the
//! next key's read on the same connection) and hands it the transaction,
//! what its read found and the turn ([`Baton`]), so the next claim starts
//! without a call of its own under the turn; at most [`MOST_IN_A_ROW`]
//! times in a row, then the lock is let go.
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
use std::time::Duration;

#[cfg(idem_loom)]
use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicU64, AtomicUsize, Ordering},
};
#[cfg(not(idem_loom))]
use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicU64, AtomicUsize, Ordering},
};
use tokio::sync::oneshot;

use super::writer::{Turn, WriterTurns};

/// Counts the claims started in the commit of the one before and handed
/// the turn.
pub(crate) const RELAYED: &str = "idem_sqlite_claims_relayed_total";

/// The most claims handed the lock one after the other; then a commit lets
/// it go, for as long as the next claim takes to start on its own, so that
/// writers outside the store find it free now and then. Why four, and what
/// it costs: docs/stores.md, "SQLite". `tests/sqlite_relay.rs` checks the
/// bound. A store built with `sole_writer(true)` (no writer outside it to
/// make room for) has none.
const MOST_IN_A_ROW: usize = 4;

/// The transactional claims waiting for the turn to write, in order; `T`
/// is what a claim is handed with the turn (the store's: its transaction
/// begun and what its read found).
pub(crate) struct Relay<T> {
    line: Mutex<VecDeque<InLine<T>>>,
    next_place: AtomicU64,
    /// Claims handed the lock since a commit last let it go.
    in_a_row: AtomicUsize,
    /// The most handed on in a row: [`MOST_IN_A_ROW`], or no limit.
    most_in_a_row: usize,
    /// The bug this one is built with, for its loom check to catch.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

/// A known bug seeded into the relay under loom, that `loom_checks` must
/// catch.
#[cfg(all(test, idem_loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// A claim that stops waiting (its turn came from the queue, or never
    /// came) stays in the line.
    LeftInLine,
}

/// A claim in the line: its key, and where its baton goes.
struct InLine<T> {
    place: u64,
    key_hash: [u8; 32],
    baton: oneshot::Sender<Baton<T>>,
}

/// What a committing claim hands the next: the next claim's start (its
/// transaction begun on the committing claim's connection, holding the
/// write lock, and what the read of its key found) and the turn to write.
pub(crate) struct Baton<T> {
    pub(crate) started: T,
    pub(crate) turn: Turn,
}

/// How a waiting claim's turn came.
pub(crate) enum Waited<T> {
    /// From the writers' queue: the claim starts its own transaction.
    Turn(Turn),
    /// Relayed: the claim's transaction is begun and its key read.
    Relayed(Baton<T>),
}

/// The claim taken from the line by the turn's holder, to start in its
/// commit and hand the [`Baton`].
pub(crate) struct Next<T> {
    key_hash: [u8; 32],
    baton: oneshot::Sender<Baton<T>>,
}

impl<T> Relay<T> {
    pub(crate) fn new() -> Self {
        Self::handing_on_at_most(MOST_IN_A_ROW)
    }

    /// A relay that hands the lock on at most `most_in_a_row` times in a
    /// row (`usize::MAX`: for as long as claims wait).
    pub(crate) fn handing_on_at_most(most_in_a_row: usize) -> Self {
        Self {
            line: Mutex::new(VecDeque::new()),
            next_place: AtomicU64::new(0),
            in_a_row: AtomicUsize::new(0),
            most_in_a_row,
            #[cfg(all(test, idem_loom))]
            bug: None,
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
    ) -> Option<Waited<T>> {
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
    /// commit; `None` if there is none, if another writer waits for the
    /// turn (the line yields to it), or if the relay's most in a row
    /// ([`MOST_IN_A_ROW`] by default) were handed the lock since it was
    /// last let go.
    pub(crate) fn next(&self, writer: &WriterTurns) -> Option<Next<T>> {
        let mut line = self.lock();
        // Every claim in the line also waits in the writers' queue; anyone
        // more there is another writer.
        let yields = writer.waiting() > line.len();
        // Only the turn's holder gets here: one at a time.
        let in_a_row = self.in_a_row.load(Ordering::Relaxed);
        let next = match line.front() {
            Some(_) if !yields && in_a_row < self.most_in_a_row => line.pop_front(),
            _ => None,
        };
        let in_a_row = if next.is_some() {
            in_a_row.saturating_add(1)
        } else {
            0
        };
        self.in_a_row.store(in_a_row, Ordering::Relaxed);
        next.map(|claim| Next {
            key_hash: claim.key_hash,
            baton: claim.baton,
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<InLine<T>>> {
        // Nothing panics while holding it; a poisoned line is still whole.
        self.line
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<T> Next<T> {
    /// The key of the claim to start.
    pub(crate) fn key_hash(&self) -> &[u8; 32] {
        &self.key_hash
    }

    /// Hands the baton to the claim; gives it back if that claim is gone
    /// (its request dropped).
    pub(crate) fn hand(self, baton: Baton<T>) -> Option<Baton<T>> {
        self.baton.send(baton).err()
    }
}

/// A claim's place in the line, left when dropped.
struct Leave<'a, T> {
    relay: &'a Relay<T>,
    place: u64,
}

impl<T> Leave<'_, T> {
    /// Leaves the line; `false` if the claim had been taken from it (or
    /// had left already).
    fn leave(&self) -> bool {
        #[cfg(all(test, idem_loom))]
        if self.relay.bug == Some(Bug::LeftInLine) {
            return true;
        }
        let mut line = self.relay.lock();
        let at = line.iter().position(|claim| claim.place == self.place);
        at.and_then(|at| line.remove(at)).is_some()
    }
}

impl<T> Drop for Leave<'_, T> {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(all(test, idem_loom))]
mod loom_checks {
    //! The relay under loom (`.ci/loom`): every interleaving of a turn's
    //! holder that hands it on at its end and two claims waiting in line,
    //! one for as long as it takes, the other giving up at any moment (its
    //! timeout is loom's stand-in, `writer/loom_semaphore.rs`), each of
    //! which, once it has the turn (from the writers' queue or relayed),
    //! writes and hands it on or gives it back as a commit does.
    //! Properties: one writer at a time; a claim that waits for as long as
    //! it takes gets the turn and none waits forever (a deadlock loom
    //! reports); at the end the turn is free and the line empty.

    use std::panic::{AssertUnwindSafe, catch_unwind};

    use loom::future::block_on;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize;
    use loom::thread;

    use super::*;
    use crate::writer::loom_checks::write;

    /// A claim's end: the turn handed to the first claim in line, with a
    /// start of its own, or given back to the writers' queue.
    fn end(relay: &Relay<u8>, turns: &WriterTurns, turn: Turn) {
        match relay.next(turns) {
            Some(next) => drop(next.hand(Baton { started: 7, turn })),
            None => drop(turn),
        }
    }

    /// A claim that waits up to `within`; whether it got the turn.
    fn claim(
        relay: &Relay<u8>,
        turns: &WriterTurns,
        writing: &AtomicUsize,
        within: Duration,
    ) -> bool {
        let turn = match block_on(relay.wait(turns, [0; 32], within)) {
            Some(Waited::Turn(turn)) => turn,
            Some(Waited::Relayed(Baton { started, turn })) => {
                assert_eq!(started, 7, "relayed with its start");
                turn
            }
            None => return false,
        };
        write(writing);
        end(relay, turns, turn);
        true
    }

    /// A holder and two waiting claims, on a relay built with `bug`.
    fn claims_relayed(bug: Option<Bug>) {
        loom::model(move || {
            let turns = Arc::new(WriterTurns::new(true));
            let relay = Arc::new(Relay {
                bug,
                ..Relay::new()
            });
            let writing = Arc::new(AtomicUsize::new(0));
            let holder = block_on(turns.wait(Duration::MAX)).expect("the first turn");
            let waiting = [Duration::from_secs(1), Duration::MAX].map(|within| {
                let (relay, turns, writing) =
                    (Arc::clone(&relay), Arc::clone(&turns), Arc::clone(&writing));
                thread::spawn(move || claim(&relay, &turns, &writing, within))
            });
            write(&writing);
            end(&relay, &turns, holder);
            // The hasty one may or may not have got the turn.
            let [_hasty, patient] = waiting.map(|claim| claim.join().unwrap());
            assert!(
                patient,
                "the claim that waits as long as it takes got the turn"
            );
            assert_eq!(turns.free(), 1, "a turn was never given back");
            assert!(relay.lock().is_empty(), "a claim was left in the line");
        });
    }

    #[test]
    fn one_writer_at_a_time_and_every_claim_served_or_gone() {
        claims_relayed(None);
    }

    #[test]
    fn seeded_bug_a_claim_left_in_the_line_is_caught() {
        let caught = catch_unwind(AssertUnwindSafe(|| claims_relayed(Some(Bug::LeftInLine))));
        let panic = caught.expect_err("loom missed a claim left in the line");
        let message = panic.downcast_ref::<&str>().copied().unwrap_or_default();
        assert_eq!(message, "a claim was left in the line");
    }
}
