//! The transactional claims a store has open in this process: which keys,
//! and how many at once.
//!
//! Both exist so that waiting never holds a pooled connection. A duplicate
//! of a key this process already has open is answered "in flight" from
//! memory, with no connection at all. And a new claim waits for a permit
//! before it takes a connection: each open claim holds one connection for
//! its whole handler, and a handler that also reads through the pool needs
//! a second, so with more claims open than half the pool, every connection
//! could be held by a claim waiting for another one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The open claims of one store.
#[derive(Debug)]
pub(crate) struct OpenClaims {
    keys: Mutex<HashSet<[u8; 32]>>,
    permits: Arc<Semaphore>,
    max: usize,
}

/// A key marked open until this is dropped.
#[derive(Debug)]
pub(crate) struct OpenKey {
    claims: Arc<OpenClaims>,
    key: [u8; 32],
}

/// What an open claim holds: its key's mark and its permit.
#[derive(Debug)]
pub(crate) struct Held {
    _key: OpenKey,
    _permit: OwnedSemaphorePermit,
}

impl OpenClaims {
    /// At most `max` claims open at once (at least one).
    pub(crate) fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            keys: Mutex::new(HashSet::new()),
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// How many claims may be open at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Marks `key` open, or `None` if this process already has it open.
    pub(crate) fn mark(self: &Arc<Self>, key: [u8; 32]) -> Option<OpenKey> {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        keys.insert(key).then(|| OpenKey {
            claims: Arc::clone(self),
            key,
        })
    }

    /// Waits for a permit, up to `timeout`; `None` if none came.
    pub(crate) async fn hold(&self, key: OpenKey, timeout: Duration) -> Option<Held> {
        let permit = tokio::time::timeout(timeout, Arc::clone(&self.permits).acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(Held {
            _key: key,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_open_once_until_its_mark_is_dropped() {
        let claims = Arc::new(OpenClaims::new(2));
        let first = claims.mark([1; 32]).expect("free");
        assert!(claims.mark([1; 32]).is_none(), "open in this process");
        assert!(claims.mark([2; 32]).is_some(), "another key");
        drop(first);
        assert!(claims.mark([1; 32]).is_some(), "free again");
    }

    #[tokio::test]
    async fn permits_bound_the_claims_open_at_once() {
        let claims = Arc::new(OpenClaims::new(1));
        let wait = Duration::from_millis(50);
        let held = claims.hold(claims.mark([1; 32]).unwrap(), wait).await;
        assert!(held.is_some());
        assert!(
            claims
                .hold(claims.mark([2; 32]).unwrap(), wait)
                .await
                .is_none()
        );
        drop(held);
        assert!(
            claims
                .hold(claims.mark([2; 32]).unwrap(), wait)
                .await
                .is_some()
        );
    }
}
