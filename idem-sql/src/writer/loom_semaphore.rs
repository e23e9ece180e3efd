//! tokio's `Semaphore` and `time::timeout`, as the turns to write use them,
//! on loom's primitives (`--cfg idem_loom`, `.ci/loom`): loom cannot see
//! inside tokio's, nor run its timer. The contract is tokio's: a permit is
//! taken only when one is free and given back when dropped; a waiter
//! dropped before its permit came takes none.
//!
//! A timeout has no clock under loom: a finite one may run out at any
//! moment, on a timer thread of its own that loom interleaves with the
//! rest, and `Duration::MAX` never does.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use loom::future::AtomicWaker;
use loom::sync::Mutex;
use loom::sync::atomic::{AtomicBool, Ordering};

/// Permits, and the tasks waiting for one.
#[derive(Debug)]
pub(crate) struct Semaphore {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    /// Woken, all of them, whenever a permit is given back: each looks
    /// again, and those that find none wait again.
    waiting: Vec<Waker>,
}

/// A permit, given back when dropped.
#[derive(Debug)]
pub(crate) struct OwnedSemaphorePermit {
    semaphore: Arc<Semaphore>,
}

impl Semaphore {
    /// `permits` free permits.
    pub(crate) fn new(permits: usize) -> Self {
        Self {
            state: Mutex::new(State {
                free: permits,
                waiting: Vec::new(),
            }),
        }
    }

    /// How many permits are free.
    #[cfg(test)]
    pub(crate) fn available_permits(&self) -> usize {
        self.state.lock().unwrap().free
    }

    /// Waits for a free permit and takes it. Never closed: never an error.
    pub(crate) async fn acquire_owned(self: Arc<Self>) -> Result<OwnedSemaphorePermit, Infallible> {
        poll_fn(|cx| {
            let mut state = self.state.lock().unwrap();
            if state.free == 0 {
                state.waiting.push(cx.waker().clone());
                return Poll::Pending;
            }
            state.free -= 1;
            Poll::Ready(())
        })
        .await;
        Ok(OwnedSemaphorePermit { semaphore: self })
    }
}

#[cfg(test)]
impl OwnedSemaphorePermit {
    /// Keeps the permit for good: it is never given back.
    pub(crate) fn forget(self) {
        std::mem::forget(self);
    }
}

impl Drop for OwnedSemaphorePermit {
    fn drop(&mut self) {
        let waiting = {
            let mut state = self.semaphore.state.lock().unwrap();
            state.free += 1;
            std::mem::take(&mut state.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }
}

/// The timeout ran out.
#[derive(Debug)]
pub(crate) struct Elapsed;

/// `future`, unless `after` runs out first (at any moment, if it is
/// finite: see the module docs).
pub(crate) async fn timeout<F: Future>(after: Duration, future: F) -> Result<F::Output, Elapsed> {
    if after == Duration::MAX {
        return Ok(future.await);
    }
    let timer = Arc::new(Timer {
        ran_out: AtomicBool::new(false),
        waker: AtomicWaker::new(),
    });
    let ticking = Arc::clone(&timer);
    loom::thread::spawn(move || {
        ticking.ran_out.store(true, Ordering::Release);
        ticking.waker.wake();
    });
    let mut future = pin!(future);
    poll_fn(|cx| {
        // As tokio's: the future first, then the deadline.
        if let Poll::Ready(out) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        timer.waker.register_by_ref(cx.waker());
        if timer.ran_out.load(Ordering::Acquire) {
            return Poll::Ready(Err(Elapsed));
        }
        Poll::Pending
    })
    .await
}

/// A timeout's deadline, as the timer thread passes it.
struct Timer {
    ran_out: AtomicBool,
    waker: AtomicWaker,
}
