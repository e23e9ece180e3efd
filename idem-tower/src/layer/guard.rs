//! Releasing a claim whatever way the attempt ends.

use std::sync::Arc;

use idem_core::DynStore;
use idem_core::{ErrorKind, IdempotencyKey, OwnerToken};

/// Owns a claim until it is completed or released. Dropped while still armed
/// (a panic unwound through it, or its attempt was dropped unfinished, as
/// when the runtime shuts down), it releases the claim on a spawned task, so the key is
/// free for a retry at once instead of when the lease runs out.
pub(crate) struct ClaimGuard {
    store: Arc<dyn DynStore>,
    key: IdempotencyKey,
    owner: OwnerToken,
    armed: bool,
}

impl ClaimGuard {
    pub(crate) fn new(store: Arc<dyn DynStore>, key: IdempotencyKey, owner: OwnerToken) -> Self {
        Self {
            store,
            key,
            owner,
            armed: true,
        }
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
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { release(&*store, &key, &owner, reason).await });
            }
            Err(_) => tracing::error!(
                key = %key.redacted(),
                reason,
                "no tokio runtime to release the idempotency claim; it ends with its lease"
            ),
        }
    }
}
