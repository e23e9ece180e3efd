//! A claim's transaction while a handler has it, on SQLite: nothing
//! commits on its connection but the store's own commit.
//!
//! sqlx began the transaction, so a handler's nested `begin()` is a
//! savepoint already; but a raw `COMMIT` or `ROLLBACK` it sends would end
//! the claim's transaction, and every statement after it would commit on
//! its own, without the record. While the transaction is lent, SQLite's
//! commit hook (called before any transaction commits on the connection,
//! a statement's own included) refuses every commit, which SQLite turns
//! into a rollback, and the rollback hook (not called for a savepoint's)
//! notes one: the transaction ended, with nothing of it kept. The store
//! reads that when it settles ([`Lent::settle`]); the hooks stay on the
//! connection, allowing everything, until the next claim on it sets its
//! own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::sqlite::SqliteConnection;

/// The hooks' shared state.
#[derive(Debug)]
struct Watch {
    /// Lent to a handler: commits are refused.
    lent: AtomicBool,
    /// A commit was refused, or the transaction rolled back, while lent.
    ended: AtomicBool,
}

/// A transaction lent to a handler: held by its `ClaimTx`, and, when
/// dropped (the transaction with it), no longer lent.
#[derive(Debug)]
pub(crate) struct Lent(Arc<Watch>);

impl Lent {
    /// Sets the hooks on `conn`: one trip to sqlx's worker thread for the
    /// connection's handle.
    pub(crate) async fn hook(conn: &mut SqliteConnection) -> Result<Self, sqlx::Error> {
        let watch = Arc::new(Watch {
            lent: AtomicBool::new(true),
            ended: AtomicBool::new(false),
        });
        let mut handle = conn.lock_handle().await?;
        let on_commit = Arc::clone(&watch);
        handle.set_commit_hook(move || {
            let lent = on_commit.lent.load(Ordering::Acquire);
            if lent {
                on_commit.ended.store(true, Ordering::Release);
            }
            !lent
        });
        let on_rollback = Arc::clone(&watch);
        handle.set_rollback_hook(move || {
            if on_rollback.lent.load(Ordering::Acquire) {
                on_rollback.ended.store(true, Ordering::Release);
            }
        });
        Ok(Self(watch))
    }

    /// Takes the transaction back from the handler, so that the store's
    /// commit goes through: whether it ended while lent (then nothing of
    /// it, and nothing written after it, committed).
    pub(crate) fn settle(&self) -> bool {
        self.0.lent.store(false, Ordering::Release);
        self.0.ended.load(Ordering::Acquire)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.lent.store(false, Ordering::Release);
    }
}
