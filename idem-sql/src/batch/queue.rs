//! The hand-off between a batch's writers and its runner: the writes
//! waiting for their batch, whether a runner runs them, and each write's
//! answer on its way back to its caller. Nothing of the database is in it,
//! so that loom runs this very code (`loom_checks`, `.ci/loom`: built with
//! `--cfg idem_loom`, loom's mutex stands in for the standard one).

use std::mem;
use std::sync::PoisonError;
#[cfg(not(idem_loom))]
use std::sync::{Mutex, MutexGuard};

#[cfg(idem_loom)]
use loom::sync::{Mutex, MutexGuard};
use tokio::sync::oneshot;

use idem_core::{Claim, Error, ErrorKind};

use super::{Write, Written};

/// At most this many writes in one batch; the rest wait for the next.
const MAX_BATCH: usize = 256;

/// The store that queued the writes, which releases a claim acquired for a
/// caller that never read its answer.
pub(in crate::batch) trait Releases: Clone {
    /// Queues `release`, a claim's release nobody waits for.
    fn release_unread(&self, release: Queued<Self>);
}

/// A write's answer, as its caller waits for it.
pub(in crate::batch) type Answered<R> = oneshot::Receiver<Delivery<R>>;

/// A write waiting for its batch, and where its answer goes (`None`: a
/// release queued for a claim nobody read, which nobody waits for).
pub(in crate::batch) struct Queued<R: Releases> {
    write: Write,
    answer: Option<oneshot::Sender<Delivery<R>>>,
}

impl<R: Releases> Queued<R> {
    /// `write`, and its answer to wait for.
    pub(in crate::batch) fn answered(write: Write) -> (Self, Answered<R>) {
        let (answer, answered) = oneshot::channel();
        let queued = Self {
            write,
            answer: Some(answer),
        };
        (queued, answered)
    }

    /// `write`, whose answer nobody waits for.
    fn unanswered(write: Write) -> Self {
        Self {
            write,
            answer: None,
        }
    }

    /// Whether the write's caller stopped waiting for it.
    fn abandoned(&self) -> bool {
        self.answer.as_ref().is_some_and(oneshot::Sender::is_closed)
    }
}

/// A write's answer on its way to its caller. A claim acquired for a
/// caller that never reads it (gone before it was sent, or after, with the
/// answer unread in the channel) is released when the answer is dropped, so
/// no key is held for nobody.
pub(in crate::batch) struct Delivery<R: Releases> {
    written: Result<Written, Error>,
    /// The store and the key of a claim, to release it if unread.
    claim: Option<(R, [u8; 32])>,
    /// The bug its queue is built with.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

impl<R: Releases> Delivery<R> {
    /// The answer, read: nothing is released any more.
    pub(in crate::batch) fn read(mut self) -> Result<Written, Error> {
        self.claim = None;
        // What is left behind is dropped unread, and releases nothing.
        mem::replace(
            &mut self.written,
            Err(Error::from_kind(ErrorKind::Unavailable)),
        )
    }
}

impl<R: Releases> Drop for Delivery<R> {
    fn drop(&mut self) {
        #[cfg(all(test, idem_loom))]
        if self.bug == Some(Bug::UnreadKept) {
            return;
        }
        if let Some((store, key_hash)) = self.claim.take()
            && let Ok(Written::Claim(Claim::Acquired(owner))) = self.written
        {
            store.release_unread(Queued::unanswered(Write::Release { key_hash, owner }));
        }
    }
}

/// The writes a runner took together.
pub(in crate::batch) struct Batch<R: Releases> {
    queued: Vec<Queued<R>>,
    /// The bug its queue is built with.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

impl<R: Releases> Batch<R> {
    /// Drops the writes whose callers stopped waiting: they hold nothing.
    pub(in crate::batch) fn skip_abandoned(&mut self) {
        self.queued.retain(|queued| !queued.abandoned());
    }

    /// The writes, in order.
    pub(in crate::batch) fn writes(&self) -> Vec<&Write> {
        self.queued.iter().map(|queued| &queued.write).collect()
    }

    /// Answers each write with what it did (`written`, in the order of
    /// [`writes`](Self::writes)). A claim's answer carries `store`, which
    /// releases the claim if its caller never reads it: if the caller is
    /// gone, the answer comes back at once and is dropped here.
    pub(in crate::batch) fn answer(self, written: Vec<Result<Written, Error>>, store: &R) {
        for (queued, written) in self.queued.into_iter().zip(written) {
            let Some(answer) = queued.answer else {
                continue;
            };
            let claim = match queued.write {
                Write::Claim { key_hash, .. } => Some((store.clone(), key_hash)),
                _ => None,
            };
            let delivery = Delivery {
                written,
                claim,
                #[cfg(all(test, idem_loom))]
                bug: self.bug,
            };
            let _ = answer.send(delivery);
        }
    }
}

/// The writes waiting for the next batch, and whether a runner runs them.
pub(in crate::batch) struct Queue<R: Releases> {
    state: Mutex<State<R>>,
    /// The bug this queue is built with, for its loom check to catch.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

struct State<R: Releases> {
    waiting: Vec<Queued<R>>,
    running: bool,
}

/// A known bug seeded into the queue under loom, that `loom_checks` must
/// catch.
#[cfg(all(test, idem_loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// The runner finds the queue empty, lets the lock go, and only then
    /// says it stopped: a write queued in between finds a runner still
    /// running, starts none, and is left in the queue with no runner.
    StopsAfterLooking,
    /// An answer dropped unread releases nothing: a claim acquired for a
    /// caller that left stays held, for nobody, until its lease ends.
    UnreadKept,
}

impl<R: Releases> Queue<R> {
    pub(in crate::batch) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                waiting: Vec::new(),
                running: false,
            }),
            #[cfg(all(test, idem_loom))]
            bug: None,
        }
    }

    fn state(&self) -> MutexGuard<'_, State<R>> {
        // Nothing is left half-done under the lock: a poisoned one is fine.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `queued`; `true` if no runner runs the batches and the caller
    /// must start one.
    pub(in crate::batch) fn push(&self, queued: Queued<R>) -> bool {
        let mut state = self.state();
        state.waiting.push(queued);
        !mem::replace(&mut state.running, true)
    }

    /// The next batch; `None`, and no runner running any more, if the queue
    /// is empty.
    pub(in crate::batch) fn next(&self) -> Option<Batch<R>> {
        let mut state = self.state();
        if state.waiting.is_empty() {
            #[cfg(all(test, idem_loom))]
            if self.bug == Some(Bug::StopsAfterLooking) {
                drop(state);
                self.state().running = false;
                return None;
            }
            state.running = false;
            return None;
        }
        let len = state.waiting.len().min(MAX_BATCH);
        Some(Batch {
            queued: state.waiting.drain(..len).collect(),
            #[cfg(all(test, idem_loom))]
            bug: self.bug,
        })
    }

    /// No runner could be started for what was just queued (no runtime):
    /// the next write's runner runs it.
    pub(in crate::batch) fn stopped(&self) {
        self.state().running = false;
    }

    /// The runner was dropped: the queue's writes go unanswered (their
    /// callers are told "unavailable") and the next write starts a runner.
    pub(in crate::batch) fn abandon(&self) -> Vec<Queued<R>> {
        let mut state = self.state();
        state.running = false;
        mem::take(&mut state.waiting)
    }
}

#[cfg(all(test, idem_loom))]
mod loom_checks {
    //! The hand-off under loom (`.ci/loom`): every interleaving of a caller
    //! that waits for its write, a caller that leaves once it has queued
    //! its own, and the runners the queue asks for, on this module's code
    //! with loom's mutex and a table of one key for the database. Both
    //! writes claim the key; the runner is `Runner::run` and
    //! `SqlStore::commit_batch` with the table in place of the database.
    //! Properties: a write whose caller left is skipped or, if it acquired
    //! the key, released; no write is applied twice; a write whose caller
    //! waits is answered; no write is left in the queue with no runner.

    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::Arc;
    use std::time::Duration;

    use idem_core::{Fingerprint, IdempotencyKey, OwnerToken};
    use loom::thread;

    use super::*;

    const LEASE: Duration = Duration::from_secs(60);
    /// Stacks deep enough for unoptimised code (loom's own are a few
    /// kilobytes).
    const STACK: usize = 1 << 20;

    /// A store with the database left out: the queue, a table of one key,
    /// and the runners it started.
    #[derive(Clone)]
    struct Store(Arc<Shared>);

    struct Shared {
        queue: Queue<Store>,
        table: Mutex<Table>,
        runners: Mutex<Vec<thread::JoinHandle<()>>>,
    }

    /// The one key's row, and every claim applied to it.
    #[derive(Default)]
    struct Table {
        holder: Option<OwnerToken>,
        claimed: Vec<OwnerToken>,
    }

    impl Releases for Store {
        fn release_unread(&self, release: Queued<Self>) {
            self.queue(release);
        }
    }

    impl Store {
        fn new(bug: Option<Bug>) -> Self {
            Self(Arc::new(Shared {
                queue: Queue {
                    bug,
                    ..Queue::new()
                },
                table: Mutex::default(),
                runners: Mutex::default(),
            }))
        }

        /// Queues `queued`, and starts a runner if the queue says none
        /// runs, as `SqlStore::queue` does on a runtime.
        fn queue(&self, queued: Queued<Self>) {
            if self.0.queue.push(queued) {
                let store = self.clone();
                let runner = thread::Builder::new()
                    .stack_size(STACK)
                    .spawn(move || store.run())
                    .expect("a loom thread");
                self.0.runners.lock().unwrap().push(runner);
            }
        }

        /// A runner: batches until the queue is empty.
        fn run(&self) {
            while let Some(mut batch) = self.0.queue.next() {
                batch.skip_abandoned();
                let written = self.apply(&batch.writes());
                batch.answer(written, self);
            }
        }

        /// The writes of one batch, applied to the table.
        fn apply(&self, writes: &[&Write]) -> Vec<Result<Written, Error>> {
            let mut table = self.0.table.lock().unwrap();
            let mut apply = |write: &Write| match *write {
                Write::Claim { owner, .. } => {
                    table.claimed.push(owner);
                    if table.holder.is_some() {
                        return Written::Claim(Claim::InFlight { retry_after: LEASE });
                    }
                    table.holder = Some(owner);
                    Written::Claim(Claim::Acquired(owner))
                }
                Write::Release { owner, .. } => {
                    let held = table.holder == Some(owner);
                    if held {
                        table.holder = None;
                    }
                    Written::Fenced(held)
                }
                _ => unreachable!("only claims and releases here"),
            };
            writes.iter().map(|write| Ok(apply(write))).collect()
        }

        /// Waits for every runner started, those started meanwhile too.
        fn join_runners(&self) {
            loop {
                let next = self.0.runners.lock().unwrap().pop();
                let Some(runner) = next else { break };
                runner.join().unwrap();
            }
        }
    }

    fn claim(owner: OwnerToken) -> Write {
        Write::Claim {
            key: IdempotencyKey::new("idem:", "order:42"),
            key_hash: [7; 32],
            fingerprint: Fingerprint::from_bytes([1; 32]),
            lease: LEASE,
            owner,
        }
    }

    /// One caller waits for its claim, another leaves, on a queue built
    /// with `bug`.
    fn callers_come_and_go(bug: Option<Bug>) {
        loom::model(move || {
            let store = Store::new(bug);
            let (stays, leaves) = (
                OwnerToken::from_bytes([1; 16]),
                OwnerToken::from_bytes([2; 16]),
            );
            let leaving = {
                let store = store.clone();
                thread::Builder::new()
                    .stack_size(STACK)
                    .spawn(move || {
                        let (queued, answered) = Queued::answered(claim(leaves));
                        store.queue(queued);
                        drop(answered);
                    })
                    .expect("a loom thread")
            };
            let (queued, mut answered) = Queued::answered(claim(stays));
            store.queue(queued);
            leaving.join().unwrap();
            store.join_runners();

            // Read before anything can fail: an answer dropped unread while
            // a check unwinds would queue its release.
            let answer = answered.try_recv().map(|delivery| delivery.read());
            let stranded = {
                let state = store.0.queue.state();
                !state.waiting.is_empty() || state.running
            };
            assert!(!stranded, "a write left in the queue with no runner");
            let answer = answer.expect("a waiting caller is answered");
            let claim = answer.expect("the table never fails").claim();
            let table = store.0.table.lock().unwrap();
            for owner in [stays, leaves] {
                let applied = table.claimed.iter().filter(|o| **o == owner).count();
                assert!(applied <= 1, "a write applied twice");
            }
            assert_ne!(table.holder, Some(leaves), "a claim held for a caller gone");
            let mine = matches!(claim, Claim::Acquired(_));
            assert_eq!(table.holder == Some(stays), mine, "{claim:?}");
        });
    }

    #[test]
    fn a_caller_gone_is_skipped_or_released_and_every_write_runs() {
        callers_come_and_go(None);
    }

    #[test]
    fn seeded_bug_a_runner_that_stops_after_looking_is_caught() {
        let caught = catch_unwind(AssertUnwindSafe(|| {
            callers_come_and_go(Some(Bug::StopsAfterLooking));
        }));
        let panic = caught.expect_err("loom missed a write left with no runner");
        let message = panic.downcast_ref::<&str>().copied().unwrap_or_default();
        assert_eq!(message, "a write left in the queue with no runner");
    }

    #[test]
    fn seeded_bug_an_unread_claim_kept_is_caught() {
        let caught = catch_unwind(AssertUnwindSafe(|| {
            callers_come_and_go(Some(Bug::UnreadKept));
        }));
        let panic = caught.expect_err("loom missed a claim held for a caller gone");
        let message = panic.downcast_ref::<String>().map_or("", String::as_str);
        assert!(
            message.contains("a claim held for a caller gone"),
            "{message}"
        );
    }
}
