//! The request body handed on to the service: the layer buffers a keyed
//! request's body to key and fingerprint it, then makes the service's body
//! type again from those bytes.

use std::convert::Infallible;

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Full};

/// A request body type the layer can make again from the bytes it buffered.
///
/// [`IdempotencyService`](super::IdempotencyService) reads a keyed request's
/// body whole (to build its key and fingerprint), then hands the service the
/// same bytes as its own body type. Implemented for axum's body (feature
/// `axum`), tonic's (feature `grpc`), [`Full<Bytes>`] and the boxed bodies of
/// `http-body-util`; implement it for a body type of your own.
///
/// ```
/// use bytes::Bytes;
/// use idem_tower::layer::RebuildBody;
///
/// let body = <http_body_util::Full<Bytes> as RebuildBody>::rebuild(Bytes::from_static(b"{}"));
/// # let _ = body;
/// ```
pub trait RebuildBody: Body + Sized {
    /// A body that yields `bytes`, then ends.
    fn rebuild(bytes: Bytes) -> Self;
}

impl RebuildBody for Full<Bytes> {
    fn rebuild(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl<E: 'static> RebuildBody for http_body_util::combinators::BoxBody<Bytes, E> {
    fn rebuild(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed()
    }
}

impl<E: 'static> RebuildBody for http_body_util::combinators::UnsyncBoxBody<Bytes, E> {
    fn rebuild(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed_unsync()
    }
}

#[cfg(feature = "axum")]
impl RebuildBody for axum::body::Body {
    fn rebuild(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }
}

#[cfg(feature = "grpc")]
impl RebuildBody for tonic::body::Body {
    fn rebuild(bytes: Bytes) -> Self {
        tonic::body::Body::new(Full::new(bytes))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use http_body_util::combinators::{BoxBody, UnsyncBoxBody};

    use super::*;

    async fn yields<B: RebuildBody<Data = Bytes>>() -> Bytes
    where
        B::Error: std::fmt::Debug,
    {
        B::rebuild(Bytes::from_static(b"charge 500"))
            .collect()
            .await
            .expect("a buffered body does not fail")
            .to_bytes()
    }

    #[tokio::test]
    async fn every_body_type_yields_the_buffered_bytes() {
        let expected = Bytes::from_static(b"charge 500");
        assert_eq!(yields::<Full<Bytes>>().await, expected);
        assert_eq!(yields::<BoxBody<Bytes, std::io::Error>>().await, expected);
        assert_eq!(
            yields::<UnsyncBoxBody<Bytes, std::io::Error>>().await,
            expected
        );
        #[cfg(feature = "axum")]
        assert_eq!(yields::<axum::body::Body>().await, expected);
        #[cfg(feature = "grpc")]
        assert_eq!(yields::<tonic::body::Body>().await, expected);
    }
}
