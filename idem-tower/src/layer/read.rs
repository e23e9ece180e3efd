//! Reading the request: whether it passes through, who is calling, and its
//! body, buffered up to the cap.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Method, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{BoxError, KeyScope, Placeholder};

use super::answer::Answer;
use super::encoding::{self, Undecodable};
use super::layer::Settings;
use crate::problem::Problem;
use crate::resolver::Unresolved;

/// Whether the request passes through untouched: a safe method (GET, HEAD,
/// OPTIONS, TRACE), unless the handle deduplicates those too.
pub(super) fn passes_through(settings: &Settings, method: &Method) -> bool {
    let safe = matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    settings.config().safe_methods_pass_through && safe
}

/// Whether the request's path is outside the paths the layer is limited
/// to ([`IdempotencyLayer::only`](super::IdempotencyLayer::only)).
pub(super) fn not_selected(settings: &Settings, path: &str) -> bool {
    settings
        .policy
        .only
        .as_ref()
        .is_some_and(|only| !only.iter().any(|p| &**p == path))
}

/// The request's tenant and user, as the handle's resolvers find them.
#[derive(Default)]
pub(super) struct Caller {
    pub(super) tenant: Option<String>,
    pub(super) user: Option<String>,
}

/// Runs the resolvers the route needs (after giving them the route's router
/// state, if it carries one): for the placeholders its template names, and
/// for the caller scope every record is bound to (ARCHITECTURE.md, "Keys
/// and callers"). A resolver that refuses the request is answered with its
/// rejection only where the key names it; for the scope alone, a caller
/// without identity is a scope of its own.
pub(super) async fn caller(settings: &Settings, parts: &mut Parts) -> Result<Caller, Answer> {
    let config = settings.config();
    let policy = &*settings.policy;
    if let Some(state) = &policy.state {
        (state.0)(&mut parts.extensions);
    }
    let scoped = policy.scope == KeyScope::Caller;
    let mut caller = Caller::default();
    for (resolver, placeholder, slot) in [
        (&config.tenant, Placeholder::Tenant, &mut caller.tenant),
        (&config.user, Placeholder::User, &mut caller.user),
    ] {
        let Some(resolver) = resolver else { continue };
        let named = policy.template.placeholders().any(|p| *p == placeholder);
        if !named && !scoped {
            continue;
        }
        *slot = match resolver.resolve(parts).await {
            Ok(value) => value,
            Err(Unresolved::Rejected(_)) if !named => None,
            Err(Unresolved::Rejected(rejection)) => {
                return Err(Answer::Refused(Box::new(rejection)));
            }
            Err(Unresolved::Misconfigured(why)) => return Err(Answer::Misconfigured(why)),
            Err(Unresolved::Invalid(why)) => {
                return Err(Answer::Rejected(Problem::KeyInvalid(why)));
            }
        };
    }
    Ok(caller)
}

/// Buffers the request body up to the handle's cap: 413 over it (as the
/// `Content-Length` declares, or as it turns out), nothing claimed.
pub(super) async fn body<B>(
    settings: &Settings,
    headers: &HeaderMap,
    body: B,
) -> Result<Bytes, Answer>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let limit = settings.config().max_body;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Answer::Rejected(Problem::BodyTooLarge { limit }));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(Answer::Rejected(Problem::BodyTooLarge { limit }))
        }
        Err(_) => Err(Answer::Rejected(Problem::BodyUnreadable)),
    }
}

/// The request's message as its key and fingerprint read it: decoded
/// from the encoding it was sent in (`encoding.rs`), so a compressed
/// first attempt and a plain retry are one request. Decoded past the body
/// cap is 413 (a small bomb is no way around the cap); bytes that are not
/// what their encoding says are 400; nothing claimed either way.
pub(super) fn message(
    settings: &Settings,
    grpc: bool,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Bytes, Answer> {
    let limit = settings.config().max_body;
    encoding::decoded_request(grpc, headers, body, limit).map_err(|why| {
        Answer::Rejected(match why {
            Undecodable::TooLarge => Problem::BodyTooLarge { limit },
            Undecodable::Corrupt(why) => Problem::BodyUndecodable(why),
        })
    })
}
