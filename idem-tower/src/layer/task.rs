//! Where the layer runs what outlives its request: an attempt handed over
//! when its request is dropped (`future.rs`), a claim released when its
//! guard is dropped armed (`guard.rs`).
//!
//! A task on the tokio runtime; built with `--cfg idem_loom` (`.ci/loom`),
//! a loom thread driving it, so that loom runs the hand-over among the
//! interleavings it checks.

use std::future::Future;

/// Stacks deep enough for the layer's unoptimised futures under loom (its
/// own threads get a few kilobytes).
#[cfg(idem_loom)]
const STACK: usize = 8 << 20;

/// Runs `work`, which waits on tokio's timers, to its end on a tokio task;
/// `false` if there is no runtime (it is then dropped here). Not a loom
/// thread: loom runs no timers.
pub(super) fn spawn_tokio(work: impl Future<Output = ()> + Send + 'static) -> bool {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    runtime.spawn(work);
    true
}

/// Runs `work` to its end on a task of its own; `false` if there is no
/// runtime to run it on (it is then dropped here).
pub(super) fn spawn(work: impl Future<Output = ()> + Send + 'static) -> bool {
    #[cfg(not(idem_loom))]
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        runtime.spawn(work);
        true
    }
    #[cfg(idem_loom)]
    {
        loom::thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || loom::future::block_on(work))
            .expect("a loom thread");
        true
    }
}
