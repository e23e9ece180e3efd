//! The response body the layer returns.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of every response from an
    /// [`IdempotencyService`](crate::layer::IdempotencyService): a buffered
    /// one with its trailers (stored, replayed, or a problem), the service's own (passed
    /// through), or a buffered prefix followed by the rest of the service's
    /// (a response too large to store).
    pub struct ResponseBody<B: Body> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B: Body> {
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Inner { #[pin] inner: B },
        Prefixed { prefix: Option<Bytes>, inner: Pin<Box<B>> },
        Failed { prefix: Option<Bytes>, error: Option<B::Error> },
    }
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, None)
    }

    /// `data`, then `trailers` if there are any.
    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    pub(crate) fn inner(inner: B) -> Self {
        Self {
            kind: Kind::Inner { inner },
        }
    }

    /// Yields `prefix`, then `error`: what the client would have seen of a
    /// body that failed midway.
    pub(crate) fn failed(prefix: Bytes, error: B::Error) -> Self {
        Self {
            kind: Kind::Failed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                error: Some(error),
            },
        }
    }

    pub(crate) fn prefixed(prefix: Bytes, inner: Pin<Box<B>>) -> Self {
        Self {
            kind: Kind::Prefixed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                inner,
            },
        }
    }
}

impl<B: Body> From<Bytes> for ResponseBody<B> {
    fn from(data: Bytes) -> Self {
        Self::full(data)
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            KindProj::Inner { inner } => inner.poll_frame(cx),
            KindProj::Prefixed { prefix, inner } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => inner.as_mut().poll_frame(cx),
            },
            KindProj::Failed { prefix, error } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => Poll::Ready(error.take().map(Err)),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Inner { inner } => inner.is_end_stream(),
            Kind::Prefixed { prefix, inner } => prefix.is_none() && inner.is_end_stream(),
            Kind::Failed { prefix, error } => prefix.is_none() && error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { inner } => inner.size_hint(),
            Kind::Prefixed { prefix, inner } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let hint = inner.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(hint.lower() + extra);
                if let Some(upper) = hint.upper() {
                    out.set_upper(upper + extra);
                }
                out
            }
            Kind::Failed { .. } => SizeHint::new(),
        }
    }
}

impl<B: Body> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Full { .. } => "Full",
            Kind::Inner { .. } => "Inner",
            Kind::Prefixed { .. } => "Prefixed",
            Kind::Failed { .. } => "Failed",
        };
        f.debug_tuple("ResponseBody").field(&kind).finish()
    }
}
