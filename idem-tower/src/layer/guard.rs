//! Releasing a claim whatever way the attempt ends.

use std::sync::Arc;

use idem_core::DynStore;
use idem_core::{ErrorKind, IdempotencyKey, OwnerToken};

use super::task;

/// Owns a claim until it is completed or released. Dropped while still armed
/// (a panic unwound through it, or its attempt was dropped unfinished, as
/// when the runtime shuts down), it releases the claim on a spawned task, so the key is
/// free for a retry at once instead of when the lease runs out.
pub(crate) struct ClaimGuard {
    store: Arc<dyn DynStore>,
    key: IdempotencyKey,
    owner: OwnerToken,
    armed: bool,
    /// The bug this guard is built with, for its loom check to catch.
    #[cfg(all(test, idem_loom))]
    bug: Option<Bug>,
}

/// A known bug seeded into the guard under loom, that the layer's loom
/// check (`service.rs`, `loom_checks`) must catch.
#[cfg(all(test, idem_loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bug {
    /// Letting the claim go disarms the guard without releasing the claim:
    /// a request whose client left while its claim was on its way holds
    /// the key, for nobody, until the lease ends.
    ReleaseSkipped,
}

impl ClaimGuard {
    pub(crate) fn new(store: Arc<dyn DynStore>, key: IdempotencyKey, owner: OwnerToken) -> Self {
        Self {
            store,
            key,
            owner,
            armed: true,
            #[cfg(all(test, idem_loom))]
            bug: None,
        }
    }

    /// This guard, with `bug` seeded.
    #[cfg(all(test, idem_loom))]
    pub(crate) fn with_bug(mut self, bug: Option<Bug>) -> Self {
        self.bug = bug;
        self
    }

    pub(crate) fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    pub(crate) fn owner(&self) -> &OwnerToken {
        &self.owner
    }

    pub(crate) fn store(&self) -> &dyn DynStore {
        &*self.store
    }

    /// The claim was completed: nothing to release.
    pub(crate) fn defuse(mut self) {
        self.armed = false;
    }

    /// Releases the claim now, so the client may retry.
    pub(crate) async fn release(mut self, reason: &'static str) {
        self.armed = false;
        #[cfg(all(test, idem_loom))]
        if self.bug == Some(Bug::ReleaseSkipped) {
            return;
        }
        release(&*self.store, &self.key, &self.owner, reason).await;
    }
}

async fn release(store: &dyn DynStore, key: &IdempotencyKey, owner: &OwnerToken, reason: &str) {
    match store.release(key, owner).await {
        Ok(()) => tracing::info!(key = %key.redacted(), reason, "idempotency claim released"),
        Err(err) if err.kind() == ErrorKind::LeaseLost => tracing::warn!(
            key = %key.redacted(),
            reason,
            "idempotency claim already taken over; nothing to release"
        ),
        Err(err) => tracing::error!(
            key = %key.redacted(),
            reason,
            error = %err,
            "idempotency claim could not be released; the key stays blocked until its lease ends"
        ),
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, key, owner) = (self.store.clone(), self.key.clone(), self.owner);
        let reason = if std::thread::panicking() {
            "panicked"
        } else {
            "cancelled"
        };
        let released = task::spawn(async move { release(&*store, &key, &owner, reason).await });
        if !released {
            tracing::error!(
                key = %self.key.redacted(),
                reason,
                "no tokio runtime to release the idempotency claim; it ends with its lease"
            );
        }
    }
}
