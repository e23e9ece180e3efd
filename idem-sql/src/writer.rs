//! Turns to write, on a database that has one writer at a time (SQLite).
//!
//! SQLite lets one connection write at a time and makes the others wait in
//! its busy handler, which sleeps and tries again (why that is slow:
//! docs/stores.md, "SQLite"). So the store's own writes in this process
//! take turns here instead, first come first served, each handed the turn the moment the
//! one before it is done. A batch takes its turn before a connection, and
//! so does a transactional claim, so the writes waiting for a turn leave
//! the pool to readers; under load a transactional claim's turn comes
//! relayed, with the committing claim's connection and its own
//! transaction begun on it (`relay.rs`), and it takes no connection at all.
//!
//! What takes a turn: each batch of the store's plain writes (claims,
//! completions, releases and renewals, run together: `batch.rs`; the read
//! before a claim takes none), waited for up to the pool's acquire timeout
//! (then its writes are answered "unavailable"); and a transactional claim
//! for its whole transaction, since it holds SQLite's write lock from its
//! claim to its commit, waited for up to the store's lock timeout (then the
//! claim is answered "in flight", as a wait on SQLite's lock that runs out
//! is); a transactional claim's turn may also come relayed, straight from
//! the commit before it (`relay.rs`). Writes of other processes, and the
//! application's own writes outside the store, still meet SQLite's busy
//! handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[cfg(not(idem_loom))]
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
#[cfg(not(idem_loom))]
use tokio::time::timeout;

#[cfg(idem_loom)]
mod loom_semaphore;
#[cfg(idem_loom)]
use loom_semaphore::{OwnedSemaphorePermit, Semaphore, timeout};

/// The store's turns to write: one at a time, or no waiting at all on a
/// database with concurrent writers.
#[derive(Debug)]
pub(crate) struct WriterTurns {
    one: Option<Arc<Semaphore>>,
    /// How many wait for a turn now (`relay.rs` yields to other writers).
    waiting: AtomicUsize,
    /// The bug this one is built with, for its loom check to catch.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

/// A known bug seeded into the turns under loom, that `loom_checks` must
/// catch.
#[cfg(all(test, idem_loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// A turn is never given back (its permit forgotten, as a turn kept
    /// past its batch would be): the writers after it wait forever.
    TurnKept,
}

/// One counted in [`WriterTurns::waiting`] until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A turn to write, given back when dropped; empty where writers do not
/// take turns.
#[derive(Debug)]
pub(crate) struct Turn {
    _permit: Option<OwnedSemaphorePermit>,
}

impl WriterTurns {
    /// Turns for a database with one writer at a time if `one_writer`.
    pub(crate) fn new(one_writer: bool) -> Self {
        Self {
            one: one_writer.then(|| Arc::new(Semaphore::new(1))),
            waiting: AtomicUsize::new(0),
            #[cfg(all(test, idem_loom))]
            bug: None,
        }
    }

    /// Whether writers take turns.
    pub(crate) fn one_at_a_time(&self) -> bool {
        self.one.is_some()
    }

    /// How many wait for a turn now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// How many turns are free now: 0 while a writer has the turn (or
    /// where writers take no turns).
    pub(crate) fn free(&self) -> usize {
        self.one.as_ref().map_or(0, |one| one.available_permits())
    }

    /// Waits for the turn to write, up to `within`; `None` if it did not
    /// come.
    pub(crate) async fn wait(&self, within: Duration) -> Option<Turn> {
        let Some(one) = &self.one else {
            return Some(Turn { _permit: None });
        };
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Waiting(&self.waiting);
        // The semaphore is never closed: only the timeout gives `None`.
        let permit = timeout(within, Arc::clone(one).acquire_owned())
            .await
            .ok()?
            .ok()?;
        #[cfg(all(test, idem_loom))]
        if self.bug == Some(Bug::TurnKept) {
            permit.forget();
            return Some(Turn { _permit: None });
        }
        Some(Turn {
            _permit: Some(permit),
        })
    }
}

#[cfg(all(test, not(idem_loom)))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_writer_at_a_time_in_order() {
        let turns = WriterTurns::new(true);
        let wait = Duration::from_millis(50);
        let first = turns.wait(wait).await.unwrap();
        assert!(turns.wait(wait).await.is_none(), "the turn is taken");
        drop(first);
        assert!(turns.wait(wait).await.is_some(), "given back");
    }

    #[tokio::test]
    async fn concurrent_writers_never_wait() {
        let turns = WriterTurns::new(false);
        let wait = Duration::from_millis(50);
        let _first = turns.wait(wait).await.unwrap();
        assert!(turns.wait(wait).await.is_some());
        assert!(!turns.one_at_a_time());
    }
}

#[cfg(all(test, idem_loom))]
pub(crate) mod loom_checks {
    //! The turns to write under loom (`.ci/loom`): every interleaving of
    //! writers taking turns, on this module's code with loom's stand-in for
    //! tokio's semaphore and timeout (`loom_semaphore.rs`). One writer
    //! waits for as long as it takes, the other may give up at any moment.
    //! Properties: one writer at a time; every turn is given back, a turn
    //! given up included, so a writer that waits gets it and none waits
    //! forever (a deadlock loom reports), and the turn is free once all
    //! are done.

    use std::panic::{AssertUnwindSafe, catch_unwind};

    use loom::future::block_on;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    use super::*;

    /// The writes of one turn: no other writer writes meanwhile (the relay's
    /// loom checks write with it too).
    pub(crate) fn write(writing: &AtomicUsize) {
        let before = writing.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two writers at once");
        writing.fetch_sub(1, Ordering::SeqCst);
    }

    /// Two writers on turns built with `bug`.
    fn writers_take_turns(bug: Option<Bug>) {
        loom::model(move || {
            let turns = Arc::new(WriterTurns {
                bug,
                ..WriterTurns::new(true)
            });
            let writing = Arc::new(AtomicUsize::new(0));
            let hasty = {
                let (turns, writing) = (Arc::clone(&turns), Arc::clone(&writing));
                thread::spawn(move || {
                    // Gives up at some point, or writes.
                    if let Some(turn) = block_on(turns.wait(Duration::from_secs(1))) {
                        write(&writing);
                        drop(turn);
                    }
                })
            };
            let turn = block_on(turns.wait(Duration::MAX)).expect("no timeout");
            write(&writing);
            drop(turn);
            hasty.join().unwrap();
            // Every turn came back, a turn given up included.
            let one = turns.one.as_ref().expect("one writer at a time");
            assert_eq!(one.available_permits(), 1, "a turn was never given back");
        });
    }

    #[test]
    fn one_writer_at_a_time_and_every_turn_given_back() {
        writers_take_turns(None);
    }

    #[test]
    fn seeded_bug_a_turn_never_given_back_is_caught() {
        let caught = catch_unwind(AssertUnwindSafe(|| writers_take_turns(Some(Bug::TurnKept))));
        let panic = caught.expect_err("loom missed a turn never given back");
        let message = panic.downcast_ref::<String>().map_or("", String::as_str);
        assert!(message.contains("a turn was never given back"), "{message}");
    }
}
