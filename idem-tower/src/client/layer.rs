//! `IdempotencyClientLayer`: the policy, the key kind and the inner
//! service's body type, fixed when the client is built.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use tower::Layer;

use super::key::{KeyForm, KeyKind, KeyStyle};
use super::policy::RetryPolicy;
use super::service::IdempotencyClient;

/// Puts [`IdempotencyClient`] around an HTTP client service.
///
/// `IB` is the request body type the wrapped service takes: `Full<Bytes>`
/// (hyper's and most tower HTTP clients) from [`new`](Self::new), tonic's
/// body for a tonic `Channel` from [`grpc`](Self::grpc) (feature `grpc`).
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
pub struct IdempotencyClientLayer<IB = Full<Bytes>> {
    policy: Arc<RetryPolicy>,
    keys: KeyStyle,
    body: PhantomData<fn() -> IB>,
}

impl IdempotencyClientLayer {
    /// A layer retrying under `policy`, generating UUID v4 keys, around a
    /// client that takes `Request<Full<Bytes>>`.
    pub fn new(policy: RetryPolicy) -> Self {
        Self::with_body(policy)
    }
}

#[cfg(feature = "grpc")]
impl IdempotencyClientLayer<tonic::body::Body> {
    /// A layer retrying under `policy` around a tonic `Channel`: each call
    /// gets one `idempotency-key` metadata entry (the caller's, or one made
    /// for it) kept across its retries. Retried: a failed connection,
    /// `UNAVAILABLE`, and `ABORTED` or `RESOURCE_EXHAUSTED` with
    /// `grpc-retry-pushback-ms` (idem's in-flight answer, a throttle);
    /// never another code ([`RetryPolicy::classify`]). For unary calls: the
    /// request message is buffered so it can be sent again.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_tower::client::{IdempotencyClientLayer, RetryPolicy};
    /// use tower::ServiceBuilder;
    ///
    /// let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051")
    ///     .connect()
    ///     .await?;
    /// let channel = ServiceBuilder::new()
    ///     .layer(IdempotencyClientLayer::grpc(RetryPolicy::default()))
    ///     .service(channel);
    /// // let mut payments = PaymentsClient::new(channel);
    /// # let _ = channel;
    /// # Ok(()) }
    /// ```
    pub fn grpc(policy: RetryPolicy) -> Self {
        Self::with_body(policy)
    }
}

impl<IB> IdempotencyClientLayer<IB> {
    fn with_body(policy: RetryPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
            keys: KeyStyle::default(),
            body: PhantomData,
        }
    }

    /// The kind of key generated for a request that carries none.
    pub fn key_kind(mut self, kind: KeyKind) -> Self {
        self.keys.kind = kind;
        self
    }

    /// How a generated key is written: bare (the default, what most
    /// servers read) or quoted as the IETF draft writes it ([`KeyForm`]).
    /// A key the caller sets is sent as the caller wrote it.
    pub fn key_form(mut self, form: KeyForm) -> Self {
        self.keys.form = form;
        self
    }
}

impl Default for IdempotencyClientLayer {
    fn default() -> Self {
        Self::new(RetryPolicy::default())
    }
}

impl<IB> Clone for IdempotencyClientLayer<IB> {
    fn clone(&self) -> Self {
        Self {
            policy: Arc::clone(&self.policy),
            keys: self.keys,
            body: PhantomData,
        }
    }
}

impl<IB> fmt::Debug for IdempotencyClientLayer<IB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyClientLayer")
            .field("policy", &self.policy)
            .field("keys", &self.keys)
            .finish()
    }
}

impl<S, IB> Layer<S> for IdempotencyClientLayer<IB> {
    type Service = IdempotencyClient<S, IB>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyClient::new(inner, Arc::clone(&self.policy), self.keys)
    }
}
