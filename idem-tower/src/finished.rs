//! A handler's whole response as the outcome policy sees it, for
//! [`IdempotencyBuilder::final_response`](crate::IdempotencyBuilder::final_response).

use http::{HeaderMap, StatusCode};

use crate::final_if_deterministic;
use crate::layer::grpc;

/// A handler's response once its body has been read: status, headers and
/// the trailers it ended with. What a
/// [`final_response`](crate::IdempotencyBuilder::final_response) policy
/// decides on.
#[derive(Debug, Clone, Copy)]
pub struct FinishedResponse<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    trailers: Option<&'a HeaderMap>,
}

impl<'a> FinishedResponse<'a> {
    /// A response with this head and these trailers.
    pub fn new(
        status: StatusCode,
        headers: &'a HeaderMap,
        trailers: Option<&'a HeaderMap>,
    ) -> Self {
        Self {
            status,
            headers,
            trailers,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The trailers, if the body ended with any. `None` too for a body too
    /// large to store, which is decided on before its end.
    pub fn trailers(&self) -> Option<&'a HeaderMap> {
        self.trailers
    }

    /// Whether it answers a gRPC call (`content-type: application/grpc*`).
    pub fn is_grpc(&self) -> bool {
        grpc::is_grpc(self.headers)
    }

    /// The `grpc-status` code, from the trailers or, for a trailers-only
    /// response, the headers.
    pub fn grpc_status(&self) -> Option<u32> {
        self.trailers
            .and_then(grpc::status)
            .or_else(|| grpc::status(self.headers))
    }
}

/// Decides whether a handler's whole response is final (stored and
/// replayed) or not (the key released): see
/// [`IdempotencyBuilder::final_response`](crate::IdempotencyBuilder::final_response).
pub type FinalResponseFn = fn(&FinishedResponse<'_>) -> bool;

/// The default policy, as a whole-response function to build on: a gRPC
/// response is final by its `grpc-status` (`OK`, `INVALID_ARGUMENT`,
/// `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`),
/// any other by [`final_if_deterministic`].
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use idem_tower::{FinishedResponse, final_by_default};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("content-type", "application/grpc".parse().unwrap());
/// let mut trailers = HeaderMap::new();
/// trailers.insert("grpc-status", "14".parse().unwrap()); // UNAVAILABLE
/// let reply = FinishedResponse::new(StatusCode::OK, &headers, Some(&trailers));
/// assert!(!final_by_default(&reply));
/// ```
pub fn final_by_default(response: &FinishedResponse<'_>) -> bool {
    if response.is_grpc() {
        response.grpc_status().is_some_and(grpc::is_final)
    } else {
        final_if_deterministic(response.status())
    }
}
