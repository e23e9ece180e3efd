//! How the handler reaches the transaction its claim lives in.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};

use idem_core::{Error, ErrorKind};

use crate::{ClaimTx, Dialect};

/// How long the layer waits for a handler to let go of the transaction
/// (a task it spawned may still hold it) before giving up on committing.
const TAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The open transaction of a transactional claim, shared between the
/// claim's owner (which commits or rolls it back) and the handler (which
/// borrows it to write in). Lent through a [`TxHandle`](idem_core::TxHandle)
/// (`handle.get::<TxSlot<DB>>()`); idem-tower puts the handle in the
/// request's extensions, where its `Tx` extractor finds it.
pub struct TxSlot<DB: Dialect> {
    tx: Arc<Mutex<Option<ClaimTx<DB>>>>,
}

impl<DB: Dialect> Clone for TxSlot<DB> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<DB: Dialect> std::fmt::Debug for TxSlot<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxSlot").finish_non_exhaustive()
    }
}

/// The slot's transaction, locked: held until dropped.
pub type TxGuard<DB> = OwnedMutexGuard<Option<ClaimTx<DB>>>;

impl<DB: Dialect> TxSlot<DB> {
    pub(crate) fn new(tx: ClaimTx<DB>) -> Self {
        Self {
            tx: Arc::new(Mutex::new(Some(tx))),
        }
    }

    /// Lends the transaction until the returned guard is dropped. `None`
    /// inside means the layer has already finished with it.
    pub async fn lock(&self) -> TxGuard<DB> {
        self.tx.clone().lock_owned().await
    }

    /// Takes the transaction back for commit or rollback.
    pub(crate) async fn take(&self) -> Result<ClaimTx<DB>, Error> {
        let mut guard = tokio::time::timeout(TAKE_TIMEOUT, self.tx.lock())
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Unavailable,
                    "the handler still holds the idempotency transaction",
                )
            })?;
        guard.take().ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "the idempotency transaction was already finished",
            )
        })
    }
}
