//! The response future the layer's service returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The response future of [`IdempotencyService`](super::IdempotencyService).
///
/// Its work (buffer, claim, call, store) takes several awaits on the store,
/// so it is one boxed future. Dropped before the key is claimed (a client
/// that disconnected), it simply ends; dropped after, the attempt goes on
/// to its end on a task of its own (the service runs to completion, its
/// outcome is stored or its key released): an effect that has started must
/// be replayed or cleanly let go, never cut in half and repeated.
pub struct ResponseFuture<T> {
    inner: BoxFuture<T>,
}

impl<T> ResponseFuture<T> {
    pub(crate) fn new(inner: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(inner),
        }
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
