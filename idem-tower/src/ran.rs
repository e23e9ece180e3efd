//! The signal that a handler ran, as opposed to a request refused before it
//! started.

/// Marks a response as the outcome of a handler that ran.
///
/// A request refused before its handler started (an extractor's 400, 401,
/// 415 or 422) changed nothing, so it must not burn its key: the client
/// fixes the request and retries with the same key. `#[idempotent]`
/// handlers need nothing more: the attribute marks every response their
/// function returns, so any response without the mark (an extractor's
/// error, or its redirect to a login page) is released. A layer added by
/// hand learns it from this marker once it is told to with
/// [`IdempotencyLayer::require_handler_ran`](crate::IdempotencyLayer::require_handler_ran):
/// a response that carries `HandlerRan` in its extensions goes through the
/// outcome policy (stored if final); an error response that does not is
/// sent as it is and its key released. (A success or a redirect without
/// the mark may come from a handler that forgot it: it is kept, with a
/// warning.)
///
/// With axum, a handler marks its response by putting `HandlerRan` in the
/// tuple it returns, after the status if there is one:
///
/// ```
/// # #[cfg(feature = "axum")] mod example {
/// use axum::{Json, http::StatusCode, routing::post, Router};
/// use idem_tower::{HandlerRan, Idempotency, MemoryStore};
///
/// async fn create_order(Json(order): Json<serde_json::Value>) -> (StatusCode, HandlerRan, Json<serde_json::Value>) {
///     (StatusCode::CREATED, HandlerRan, Json(order))
/// }
///
/// pub fn app() -> Result<Router, idem_tower::Error> {
///     let idem = Idempotency::new(MemoryStore::new());
///     let layer = idem.layer_with_key("order:{header:idempotency-key}")?.require_handler_ran();
///     Ok(Router::new().route("/orders", post(create_order).layer(layer)))
/// }
/// # }
/// ```
///
/// Alone, or after a status, it is an empty response (`(StatusCode::NO_CONTENT,
/// HandlerRan)`).
///
/// Any other service inserts it with
/// `response.extensions_mut().insert(HandlerRan)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandlerRan;

#[cfg(feature = "axum")]
impl axum::response::IntoResponseParts for HandlerRan {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut res: axum::response::ResponseParts,
    ) -> Result<axum::response::ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

/// An empty `200 OK` marked as the outcome of a handler that ran, so that
/// `(StatusCode, HandlerRan)` is a response of its own.
#[cfg(feature = "axum")]
impl axum::response::IntoResponse for HandlerRan {
    fn into_response(self) -> axum::response::Response {
        let mut response = axum::response::Response::default();
        response.extensions_mut().insert(self);
        response
    }
}
