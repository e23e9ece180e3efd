//! `IdempotentClientLayer`: the policy and the key kind, fixed when the
//! client is built.

use std::sync::Arc;

use tower::Layer;

use super::key::KeyKind;
use super::policy::RetryPolicy;
use super::service::IdempotentClient;

/// Puts [`IdempotentClient`] around an HTTP client service.
///
/// ```
/// use std::time::Duration;
/// use idem_tower::client::{IdempotentClientLayer, KeyKind, RetryPolicy};
///
/// let layer = IdempotentClientLayer::new(
///     RetryPolicy::default().max_attempts(4).attempt_timeout(Duration::from_secs(2)),
/// )
/// .key_kind(KeyKind::V7);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Default)]
pub struct IdempotentClientLayer {
    policy: Arc<RetryPolicy>,
    kind: KeyKind,
}

impl IdempotentClientLayer {
    /// A layer retrying under `policy`, generating UUID v4 keys.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
            kind: KeyKind::default(),
        }
    }

    /// The kind of key generated for a request that carries none.
    pub fn key_kind(mut self, kind: KeyKind) -> Self {
        self.kind = kind;
        self
    }
}

impl<S> Layer<S> for IdempotentClientLayer {
    type Service = IdempotentClient<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotentClient::new(inner, Arc::clone(&self.policy), self.kind)
    }
}
