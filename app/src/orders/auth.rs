//! Demo authentication: `Authorization: Bearer <user-id>`, the token being
//! the user id. A real app verifies a token here; the idempotency layer only
//! needs the [`UserId`] it leaves in the request, which the handle's user
//! resolver reads (`Resolver::extension::<UserId>()`).

use std::fmt;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The authenticated user, put in request extensions by [`demo_auth`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserId(pub String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The middleware: a request without a bearer token is answered 401 and
/// never reaches the idempotency layer behind it.
pub async fn demo_auth(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
    match user {
        Some(user) => {
            request.extensions_mut().insert(UserId(user));
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "send Authorization: Bearer <user-id>",
        )
            .into_response(),
    }
}
