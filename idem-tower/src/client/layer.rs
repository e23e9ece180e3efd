//! `IdempotencyClientLayer`: the policy and the key kind, fixed when the
//! client is built.

use std::sync::Arc;

use tower::Layer;

use super::key::KeyKind;
use super::policy::RetryPolicy;
use super::service::IdempotencyClient;

/// Puts [`IdempotencyClient`] around an HTTP client service.
///
/// ```
/// use std::time::Duration;
/// use idem_tower::client::{IdempotencyClientLayer, KeyKind, RetryPolicy};
///
/// let layer = IdempotencyClientLayer::new(
///     RetryPolicy::default().max_attempts(4).attempt_timeout(Duration::from_secs(2)),
/// )
/// .key_kind(KeyKind::V7);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Default)]
pub struct IdempotencyClientLayer {
    policy: Arc<RetryPolicy>,
    kind: KeyKind,
}

impl IdempotencyClientLayer {
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

impl<S> Layer<S> for IdempotencyClientLayer {
    type Service = IdempotencyClient<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyClient::new(inner, Arc::clone(&self.policy), self.kind)
    }
}
