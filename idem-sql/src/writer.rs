//! Turns to write, on a database that has one writer at a time (SQLite).
//!
//! SQLite lets one connection write at a time and makes the others wait in
//! its busy handler, which sleeps (1, 2, 5, 10 ms and longer) and tries
//! again: under concurrent first requests most of a write's time was spent
//! asleep. So the store's own writes in this process take turns here
//! instead, first come first served, each handed the turn the moment the
//! one before it is done. A batch takes its turn before a connection, so
//! the writes waiting for a turn leave the pool to readers. A transactional
//! claim takes its connection and begins first (among at most
//! `max_transactions` open at once, the rest of the pool left to readers),
//! so that the turn it then holds to its commit does not also cover taking
//! a connection and BEGIN's round trip.
//!
//! What takes a turn: each batch of the store's plain writes (claims,
//! completions, releases and renewals, run together: `batch.rs`; the read
//! before a claim takes none), waited for up to the pool's acquire timeout
//! (then its writes are answered "unavailable"); and a transactional claim
//! for its whole transaction, since it holds SQLite's write lock from its
//! claim to its commit, waited for up to the store's lock timeout (then the
//! claim is answered "in flight", as a wait on SQLite's lock that runs out
//! is). Writes of other processes, and the application's own writes outside
//! the store, still meet SQLite's busy handler.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The store's turns to write: one at a time, or no waiting at all on a
/// database with concurrent writers.
#[derive(Debug)]
pub(crate) struct WriterTurns {
    one: Option<Arc<Semaphore>>,
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
        }
    }

    /// Whether writers take turns.
    pub(crate) fn one_at_a_time(&self) -> bool {
        self.one.is_some()
    }

    /// Waits for the turn to write, up to `timeout`; `None` if it did not
    /// come.
    pub(crate) async fn wait(&self, timeout: Duration) -> Option<Turn> {
        let Some(one) = &self.one else {
            return Some(Turn { _permit: None });
        };
        // The semaphore is never closed: only the timeout gives `None`.
        let permit = tokio::time::timeout(timeout, Arc::clone(one).acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(Turn {
            _permit: Some(permit),
        })
    }
}

#[cfg(test)]
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
