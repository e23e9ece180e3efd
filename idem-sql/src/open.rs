//! The transactional claims a store has open in this process: which keys,
//! and how many at once.
//!
//! Both exist so that waiting never holds a pooled connection. A duplicate
//! of a key this process already has open is answered from memory, with no
//! connection at all: "in flight" if its claim is open, or, while the
//! request that marked it is still checking the store, whatever that check
//! finds (so a burst of retries of a completed request makes one check and
//! every retry gets the replay). And a new claim waits for a permit
//! before it takes a connection: each open claim holds one connection for
//! its whole handler, and a handler that also reads through the pool needs
//! a second, so with more claims open than half the pool, every connection
//! could be held by a claim waiting for another one.

use std::collections::HashMap;
use std::sync::Arc;
#[cfg(not(idem_loom))]
use std::sync::Mutex;
use std::time::Duration;

#[cfg(idem_loom)]
use loom::sync::Mutex;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use idem_core::{Duplicate, Fingerprint};

/// The open claims of one store.
#[derive(Debug)]
pub(crate) struct OpenClaims {
    keys: Mutex<HashMap<[u8; 32], watch::Receiver<Check>>>,
    permits: Arc<Semaphore>,
    max: usize,
    /// The bug this table is built with, for its loom check to catch.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

/// A known bug seeded into the table under loom, that `loom_checks` must
/// catch.
#[cfg(all(test, idem_loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// Marking finds the key unmarked under the lock, lets the lock go,
    /// and marks it under a second one: two requests that both looked
    /// before either marked each take the key as theirs.
    MarksAfterLooking,
}

/// How the check of a marked key goes, as other requests for the key see
/// it.
#[derive(Debug, Clone)]
pub(crate) enum Check {
    /// The request that marked it is still claiming it.
    Running,
    /// Its claim is open in a transaction of this process: in flight.
    Open,
    /// The claim found this answer for a request with this fingerprint.
    Answered(Fingerprint, Duplicate),
}

/// What marking a key came to.
pub(crate) enum Marked {
    /// The key is ours to claim.
    Mine(OpenKey),
    /// Another request of this process has it marked; its check, to wait on.
    Theirs(watch::Receiver<Check>),
}

/// A key marked open until this is dropped.
#[derive(Debug)]
pub(crate) struct OpenKey {
    claims: Arc<OpenClaims>,
    key: [u8; 32],
    check: watch::Sender<Check>,
}

/// What an open claim holds: its key's mark and its permit.
#[derive(Debug)]
pub(crate) struct Held {
    key: OpenKey,
    _permit: OwnedSemaphorePermit,
}

impl OpenKey {
    /// Tells the key's waiters how the check went.
    pub(crate) fn checked(&self, check: Check) {
        self.check.send_replace(check);
    }
}

impl Held {
    /// Tells the key's waiters how the check went.
    pub(crate) fn checked(&self, check: Check) {
        self.key.checked(check);
    }
}

impl OpenClaims {
    /// At most `max` claims open at once (at least one).
    pub(crate) fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            keys: Mutex::new(HashMap::new()),
            permits: Arc::new(Semaphore::new(max)),
            max,
            #[cfg(all(test, idem_loom))]
            bug: None,
        }
    }

    /// How many claims may be open at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Marks `key` open, unless this process already has it marked.
    pub(crate) fn mark(self: &Arc<Self>, key: [u8; 32]) -> Marked {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(check) = keys.get(&key) {
            return Marked::Theirs(check.clone());
        }
        #[cfg(all(test, idem_loom))]
        if self.bug == Some(Bug::MarksAfterLooking) {
            drop(keys);
            keys = self.keys.lock().unwrap();
        }
        let (check, watching) = watch::channel(Check::Running);
        keys.insert(key, watching);
        Marked::Mine(OpenKey {
            claims: Arc::clone(self),
            key,
            check,
        })
    }

    /// Waits for a permit, up to `timeout`; `None` if none came.
    pub(crate) async fn hold(&self, key: OpenKey, timeout: Duration) -> Option<Held> {
        let permit = tokio::time::timeout(timeout, Arc::clone(&self.permits).acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(Held {
            key,
            _permit: permit,
        })
    }
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        let mut keys = self
            .claims
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        keys.remove(&self.key);
    }
}

#[cfg(all(test, idem_loom))]
mod loom_checks {
    //! The table of open keys under loom (`.ci/loom`): every interleaving
    //! of requests marking one key, on this module's code with loom's mutex.
    //! Properties: a key is marked by at most one request of the process at
    //! a time; every other request gets its check to wait on; a mark let go
    //! leaves nothing behind, so the next request marks the key again.
    //! A seeded bug shows the first can fail.

    use std::panic::catch_unwind;

    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    use super::*;

    /// Three requests mark one key, on a table built with `bug`.
    fn three_requests_mark_one_key(bug: Option<Bug>) {
        loom::model(move || {
            let claims = Arc::new(OpenClaims {
                bug,
                ..OpenClaims::new(4)
            });
            let holding = Arc::new(AtomicUsize::new(0));
            let requests: Vec<_> = (0..3)
                .map(|_| {
                    let (claims, holding) = (Arc::clone(&claims), Arc::clone(&holding));
                    thread::spawn(move || match claims.mark([7; 32]) {
                        Marked::Mine(key) => {
                            let before = holding.fetch_add(1, Ordering::SeqCst);
                            assert_eq!(before, 0, "two requests marked the key at once");
                            holding.fetch_sub(1, Ordering::SeqCst);
                            drop(key);
                        }
                        Marked::Theirs(check) => {
                            // The marking request's check, or its end.
                            let _ = check.has_changed();
                        }
                    })
                })
                .collect();
            for request in requests {
                request.join().unwrap();
            }
            let keys = claims.keys.lock().unwrap();
            assert!(keys.is_empty(), "a mark outlived its request");
        });
    }

    #[test]
    fn one_request_of_the_process_marks_a_key_at_a_time() {
        three_requests_mark_one_key(None);
    }

    #[test]
    fn seeded_bug_a_mark_made_after_looking_is_caught() {
        let caught = catch_unwind(|| three_requests_mark_one_key(Some(Bug::MarksAfterLooking)));
        let panic = caught.expect_err("loom missed two marks of one key");
        let message = panic.downcast_ref::<String>().map_or("", String::as_str);
        assert!(
            message.contains("two requests marked the key at once"),
            "{message}"
        );
    }

    #[test]
    fn a_mark_let_go_is_taken_again() {
        loom::model(|| {
            let claims = Arc::new(OpenClaims::new(4));
            let Marked::Mine(first) = claims.mark([7; 32]) else {
                panic!("a fresh key is ours");
            };
            let next = {
                let claims = Arc::clone(&claims);
                thread::spawn(move || matches!(claims.mark([7; 32]), Marked::Mine(_)))
            };
            drop(first);
            let took_it = next.join().unwrap();
            // Before the drop it is theirs; after, it is the next request's.
            let again = matches!(claims.mark([7; 32]), Marked::Mine(_));
            assert!(again, "every mark was let go (took it: {took_it})");
        });
    }
}

#[cfg(all(test, not(idem_loom)))]
mod tests {
    use super::*;

    fn mine(marked: Marked) -> OpenKey {
        match marked {
            Marked::Mine(key) => key,
            Marked::Theirs(_) => panic!("marked by another"),
        }
    }

    #[test]
    fn a_key_is_open_once_until_its_mark_is_dropped() {
        let claims = Arc::new(OpenClaims::new(2));
        let first = mine(claims.mark([1; 32]));
        assert!(
            matches!(claims.mark([1; 32]), Marked::Theirs(_)),
            "open in this process"
        );
        let _other = mine(claims.mark([2; 32]));
        drop(first);
        let _again = mine(claims.mark([1; 32]));
    }

    #[tokio::test]
    async fn waiters_see_what_the_check_found() {
        let claims = Arc::new(OpenClaims::new(2));
        let first = mine(claims.mark([1; 32]));
        let Marked::Theirs(mut waiting) = claims.mark([1; 32]) else {
            panic!("marked already");
        };
        assert!(matches!(*waiting.borrow(), Check::Running));
        let held = claims.hold(first, Duration::from_secs(1)).await.unwrap();
        held.checked(Check::Open);
        let seen = waiting.wait_for(|c| !matches!(c, Check::Running)).await;
        assert!(matches!(*seen.unwrap(), Check::Open));
    }

    #[tokio::test]
    async fn permits_bound_the_claims_open_at_once() {
        let claims = Arc::new(OpenClaims::new(1));
        let wait = Duration::from_millis(50);
        let held = claims.hold(mine(claims.mark([1; 32])), wait).await;
        assert!(held.is_some());
        assert!(
            claims
                .hold(mine(claims.mark([2; 32])), wait)
                .await
                .is_none()
        );
        drop(held);
        assert!(
            claims
                .hold(mine(claims.mark([2; 32])), wait)
                .await
                .is_some()
        );
    }
}
