//! The response future the layer's service returns, and what becomes of it
//! when it is dropped unfinished.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
#[cfg(not(idem_loom))]
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

#[cfg(idem_loom)]
use loom::sync::atomic::{AtomicU8, Ordering};

use idem_core::BoxFuture;

use super::task;

/// The response future of [`IdempotencyService`](super::IdempotencyService).
///
/// Its work (buffer, claim, call, store) takes several awaits on the store,
/// so it is one boxed future. Dropped before its claim is sent to the store
/// (a client that disconnected while its body arrived), it simply ends.
/// Dropped after, the attempt goes on to its end on a task of its own: a
/// claim on its way to the store is waited for and let go at once (the
/// client is gone: the service is not called), and a service that has
/// started runs to completion, its outcome stored or its key released. An
/// effect that has started must be replayed or cleanly let go, never cut in
/// half and repeated; a claim must not outlive its client by a lease.
pub struct ResponseFuture<T: Send + 'static> {
    /// `None` while it is being polled, and once it is done.
    inner: Option<BoxFuture<'static, T>>,
    flags: MustFinish,
}

impl<T: Send + 'static> ResponseFuture<T> {
    /// Boxes the attempt that `attempt` builds around its [`MustFinish`],
    /// which it sets as it sends its claim.
    pub(crate) fn new<F>(attempt: impl FnOnce(MustFinish) -> F) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        let flags = MustFinish::new();
        Self {
            inner: Some(Box::pin(attempt(flags.clone()))),
            flags,
        }
    }
}

impl<T: Send + 'static> Future for ResponseFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Taken out while polled: if the poll panics, the drop below finds
        // nothing to hand on, and the half-run attempt is not resumed.
        let mut inner = self.inner.take().expect("polled after completion");
        match inner.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => {
                self.inner = Some(inner);
                Poll::Pending
            }
        }
    }
}

impl<T: Send + 'static> Drop for ResponseFuture<T> {
    fn drop(&mut self) {
        let Some(attempt) = self.inner.take() else {
            return;
        };
        if !self.flags.abandon() {
            return;
        }
        let handed_over = task::spawn(async move {
            attempt.await;
        });
        if handed_over {
            tracing::debug!("request dropped mid-attempt; finishing it on a task");
        } else {
            // Dropped there: its guard releases the claim, or the
            // transaction rolls back; the retry then runs the effect again.
            tracing::error!(
                "no tokio runtime to finish an attempt whose client is gone; its claim is abandoned"
            );
        }
    }
}

impl<T: Send + 'static> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// Set by an attempt as it sends its claim to the store: from then on, the
/// [`ResponseFuture`] it runs in is finished on a task of its own if it is
/// dropped, instead of being cut off (ARCHITECTURE.md, "Records"); and the
/// attempt can tell that its client is gone.
#[derive(Clone)]
pub(crate) struct MustFinish {
    flags: Arc<AtomicU8>,
    /// The bug these flags are built with, for their loom check to catch.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

/// A known bug seeded into the flags under loom, that `loom_checks` must
/// catch.
#[cfg(all(test, idem_loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// The drop reads the flags without marking the client gone: an
    /// attempt handed over while its claim was on its way calls the
    /// handler for nobody instead of letting the key go at once.
    GoneNotMarked,
}

/// The attempt may no longer be cancelled.
const MUST_FINISH: u8 = 1;
/// The response future was dropped: nobody waits for the response.
const GONE: u8 = 2;

impl MustFinish {
    /// Flags of an attempt whose claim is not sent yet.
    fn new() -> Self {
        Self {
            flags: Arc::new(AtomicU8::new(0)),
            #[cfg(all(test, idem_loom))]
            bug: None,
        }
    }

    /// The claim is on its way: the attempt may no longer be cancelled.
    pub(crate) fn set(&self) {
        self.flags.fetch_or(MUST_FINISH, Ordering::AcqRel);
    }

    /// Whether the client went away: the response future was dropped, and
    /// the attempt goes on on a task of its own.
    pub(crate) fn client_gone(&self) -> bool {
        self.flags.load(Ordering::Acquire) & GONE != 0
    }

    /// The response future is dropped: marks the client gone, and tells
    /// whether the attempt must still be finished (its claim was sent).
    fn abandon(&self) -> bool {
        #[cfg(all(test, idem_loom))]
        if self.bug == Some(Bug::GoneNotMarked) {
            return self.flags.load(Ordering::Acquire) & MUST_FINISH != 0;
        }
        self.flags.fetch_or(GONE, Ordering::AcqRel) & MUST_FINISH != 0
    }
}

#[cfg(all(test, idem_loom))]
mod loom_checks {
    //! The cancellation flags under loom (`.ci/loom`): every interleaving of
    //! an attempt and the drop of its response future, on [`MustFinish`]
    //! with loom's atomics. A poll and the drop never run at once (the drop
    //! needs the future a poll borrows): a mutex stands for that. A dropped
    //! future is never polled again, unless it must finish: then it runs on
    //! a task, out of the request's hands. Properties: a claim that was sent
    //! is always settled (the handler's outcome kept, or the key let go
    //! because its client is gone), never abandoned while held; it is let
    //! go, the handler not called, exactly when its client left before it
    //! landed. A seeded bug shows the check can fail.

    use std::panic::{AssertUnwindSafe, catch_unwind};

    use loom::sync::Mutex;
    use loom::thread;

    use super::*;

    /// What became of the attempt, as the request and the attempt see it.
    #[derive(Default)]
    struct Attempt {
        dropped: bool,
        handed_over: bool,
        claim_sent: bool,
        /// The client had left when the claim landed.
        gone_at_landing: bool,
        settled: Option<&'static str>,
    }

    /// An attempt and the drop of its request, on flags built with `bug`.
    fn an_attempt_and_its_drop(bug: Option<Bug>) {
        loom::model(move || {
            let flags = MustFinish {
                bug,
                ..MustFinish::new()
            };
            let attempt = Arc::new(Mutex::new(Attempt::default()));
            let run = {
                let (flags, attempt) = (flags.clone(), Arc::clone(&attempt));
                thread::spawn(move || {
                    // One poll: the flag set as the claim is sent.
                    {
                        let mut a = attempt.lock().unwrap();
                        if a.dropped {
                            return; // dropped before: nothing was sent
                        }
                        flags.set();
                        a.claim_sent = true;
                    }
                    // The next poll, or the task it was handed to: the
                    // claim has landed; a client gone lets it go at once.
                    let mut a = attempt.lock().unwrap();
                    if a.dropped && !a.handed_over {
                        return; // cut off mid-attempt: what must not happen
                    }
                    a.gone_at_landing = a.dropped;
                    a.settled = Some(if flags.client_gone() {
                        "released"
                    } else {
                        "completed"
                    });
                })
            };
            {
                let mut a = attempt.lock().unwrap();
                a.dropped = true;
                a.handed_over = flags.abandon();
            }
            run.join().unwrap();
            let a = attempt.lock().unwrap();
            if a.claim_sent {
                assert!(a.settled.is_some(), "a sent claim was abandoned");
            }
            if a.settled == Some("released") {
                assert!(a.dropped && a.handed_over, "let go with its client there");
            }
            if a.settled == Some("completed") {
                assert!(!a.gone_at_landing, "the handler called for a client gone");
            }
        });
    }

    #[test]
    fn a_sent_claim_is_always_settled_whenever_its_request_is_dropped() {
        an_attempt_and_its_drop(None);
    }

    #[test]
    fn seeded_bug_a_drop_that_does_not_mark_the_client_gone_is_caught() {
        let caught = catch_unwind(AssertUnwindSafe(|| {
            an_attempt_and_its_drop(Some(Bug::GoneNotMarked));
        }));
        let panic = caught.expect_err("loom missed a handler called for nobody");
        let message = panic.downcast_ref::<&str>().copied().unwrap_or_default();
        assert_eq!(message, "the handler called for a client gone");
    }
}
