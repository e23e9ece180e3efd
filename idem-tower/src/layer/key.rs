//! Resolving the key: the matched route and its parameters, then the key
//! and the fingerprint the request's claim lives under.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use idem_core::{Fingerprint, IdempotencyKey, KeyError, Placeholder, RequestView};

use super::Policy;
use super::answer::Answer;
use super::layer::Settings;
use super::read::Caller;
use super::route::RoutePattern;
use crate::problem::Problem;

/// Where one request's claim lives.
pub(super) struct Target {
    pub(super) key: IdempotencyKey,
    pub(super) fingerprint: Fingerprint,
}

/// The route pattern: as axum matched it, or as the layer was told
/// ([`IdempotencyLayer::route`](super::IdempotencyLayer::route)).
pub(super) fn matched_route(extensions: &http::Extensions, policy: &Policy) -> Option<Arc<str>> {
    #[cfg(feature = "axum")]
    if let Some(route) = extensions.get::<axum::extract::MatchedPath>() {
        return Some(Arc::from(route.as_str()));
    }
    #[cfg(not(feature = "axum"))]
    let _ = extensions;
    policy.route.as_ref().map(RoutePattern::shared)
}

/// Builds the key and fingerprint under `route` (the matched route, or the
/// request's path when nothing names one), the key's span field with it;
/// `None` when an optional key is absent. A key part the client should have
/// sent is its 400; one only the route supplies is the server's 500
/// (ARCHITECTURE.md, "Keys and callers").
pub(super) fn target(
    settings: &Settings,
    parts: &Parts,
    params: &[(String, String)],
    body: &Bytes,
    route: Option<Arc<str>>,
    caller: &Caller,
) -> Result<Option<Target>, Answer> {
    let policy = &*settings.policy;
    let route = route.unwrap_or_else(|| Arc::from(parts.uri.path()));
    let view = RequestView::new(&parts.method, &route, &parts.headers)
        .key_header(&settings.config().key_header)
        .path_params(params)
        .query(parts.uri.query())
        .body(body)
        .tenant(caller.tenant.as_deref())
        .user(caller.user.as_deref());
    let key =
        match policy
            .template
            .evaluate_scoped(&view, &settings.config().namespace, policy.scope)
        {
            Ok(key) => key,
            // Path parameters come from the route, never the client: one the
            // route lacks is a template written for another route.
            Err(KeyError::Missing(Placeholder::Path(_)))
                if params.is_empty()
                    && policy
                        .route
                        .as_ref()
                        .is_some_and(|pattern| pattern.captures(parts.uri.path()).is_none()) =>
            {
                return Err(Answer::Misconfigured(format!(
                    "the request path `{}` does not match the layer's route `{route}`, so the \
                     key template `{}` has no path parameters to read: put the layer on the \
                     service that serves that route only, or fix the pattern given to \
                     IdempotencyLayer::route",
                    parts.uri.path(),
                    policy.template
                )));
            }
            Err(KeyError::Missing(Placeholder::Path(name))) => {
                return Err(Answer::Misconfigured(format!(
                    "the key template `{}` reads {{path:{name}}}, and the route `{route}` has no \
                 such parameter: fix the template, or name the route's pattern with \
                 IdempotencyLayer::route when the service is not behind an axum router",
                    policy.template
                )));
            }
            // A body that is not JSON has no part a pointer reads: absent.
            Err(KeyError::Missing(_) | KeyError::BodyNotJson)
                if !policy.required && no_client_part(policy, &view) =>
            {
                return Ok(None);
            }
            Err(err) => return Err(key_problem(err)),
        };
    let fingerprint = Fingerprint::of(&view, &policy.fingerprint).map_err(key_problem)?;
    let span = tracing::Span::current();
    // The redacted key is a hash: only worth computing if someone listens.
    if !span.is_disabled() {
        span.record("key", key.redacted());
    }
    Ok(Some(Target { key, fingerprint }))
}

/// Whether an optional key is absent from the request's head, so that the
/// request passes through without its body being read: the route does not
/// require its key, the template reads nothing of the body, and the head
/// carries none of the key's client-supplied parts. (A key that reads the
/// body can only be found absent once the body is read, in [`target`].)
pub(super) fn absent_from_head(
    settings: &Settings,
    parts: &Parts,
    params: &[(String, String)],
) -> bool {
    let policy = &*settings.policy;
    if policy.required || policy.template.reads_body() {
        return false;
    }
    // Only whether parts are present is read: the route plays no part.
    let view = RequestView::new(&parts.method, parts.uri.path(), &parts.headers)
        .key_header(&settings.config().key_header)
        .path_params(params)
        .query(parts.uri.query());
    no_client_part(policy, &view)
}

/// Whether the key has client-supplied parts and the request carries none
/// of them: the only case an optional key lets through undeduplicated. A
/// key with none (a path parameter and resolvers, say) is never absent.
fn no_client_part(policy: &Policy, view: &RequestView<'_>) -> bool {
    let mut parts = policy
        .template
        .placeholders()
        .filter(|p| p.is_client_supplied())
        .peekable();
    parts.peek().is_some() && parts.all(|p| !view.is_present(p))
}

/// A key the client's request cannot make: 400.
fn key_problem(err: KeyError) -> Answer {
    Answer::Rejected(match err {
        KeyError::Missing(_) => Problem::KeyMissing(err.to_string()),
        _ => Problem::KeyInvalid(err.to_string()),
    })
}

/// The matched route's parameters: they name the resource, so they feed the
/// fingerprint even when the key does not read them. One that is not UTF-8
/// once percent-decoded (`/orders/%FF`) is the client's mistake: 400, as
/// axum's `Path` answers it.
pub(super) async fn path_params(
    parts: &mut Parts,
    policy: &Policy,
) -> Result<Vec<(String, String)>, Answer> {
    #[cfg(feature = "axum")]
    if let Some(params) = axum_path_params(parts).await? {
        return Ok(params);
    }
    Ok(policy
        .route
        .as_ref()
        .and_then(|pattern| pattern.captures(parts.uri.path()))
        .unwrap_or_default())
}

/// The parameters axum's router matched, if it routed the request.
#[cfg(feature = "axum")]
async fn axum_path_params(parts: &mut Parts) -> Result<Option<Vec<(String, String)>>, Answer> {
    use axum::extract::rejection::RawPathParamsRejection;
    use axum::extract::{FromRequestParts, RawPathParams};

    match RawPathParams::from_request_parts(parts, &()).await {
        Ok(params) => Ok(Some(
            params
                .iter()
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
                .collect(),
        )),
        Err(RawPathParamsRejection::InvalidUtf8InPathParam(rejection)) => {
            Err(Answer::Rejected(Problem::KeyInvalid(rejection.body_text())))
        }
        Err(_) => Ok(None),
    }
}
