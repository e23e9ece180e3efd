//! The responses the layer gives itself instead of the service's, each
//! counted under its outcome: refusals, duplicates, a misconfigured route,
//! an unavailable store.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body::Body;
use idem_core::StoredResponse;

use super::layer::Settings;
use crate::REPLAYED_HEADER;
use crate::body::ResponseBody;
use crate::metrics::{self, RequestOutcome};
use crate::problem::Problem;

/// What the layer answers itself, at the step that found it.
pub(super) enum Answer {
    /// A resolver's extractor refused the request: its rejection (such as a
    /// 401), as the handler would have answered; nothing claimed.
    Refused(Response<Bytes>),
    /// The request cannot be keyed (400) or its body is over the cap (413);
    /// nothing claimed.
    Rejected(Problem),
    /// The route is wired so that no request can succeed: 500, logged with
    /// the fix.
    Misconfigured(String),
    /// The store failed: 503, and the service was not called, or its
    /// transaction did not commit.
    Unavailable(idem_core::Error),
    /// Another request already claimed the key.
    Duplicate(Duplicate),
}

/// What a duplicate gets, by what became of the first request with its key.
pub(super) enum Duplicate {
    /// It completed: its stored response.
    Replay(StoredResponse),
    /// It completed with a response too large to store: 409.
    NotReplayable,
    /// It still runs, for at most this long: 409 and `Retry-After`.
    InFlight { retry_after: Duration },
    /// It was another request: 422.
    Mismatch,
}

impl Answer {
    /// The response, counted on `route`.
    pub(super) fn respond<B: Body>(
        self,
        settings: &Settings,
        route: &str,
    ) -> Response<ResponseBody<B>> {
        match self {
            Self::Refused(rejection) => {
                tracing::debug!(
                    status = rejection.status().as_u16(),
                    "the caller's identity was refused; nothing claimed"
                );
                metrics::request(RequestOutcome::NotRun, route);
                rejection.map(ResponseBody::full)
            }
            Self::Rejected(problem) => {
                let outcome = match problem {
                    Problem::BodyTooLarge { .. } => RequestOutcome::BodyTooLarge,
                    Problem::KeyMissing(_) => RequestOutcome::MissingKey,
                    _ => RequestOutcome::InvalidKey,
                };
                metrics::request(outcome, route);
                problem.to_response()
            }
            Self::Misconfigured(why) => {
                metrics::request(RequestOutcome::Misconfigured, route);
                tracing::error!(route, "idempotency misconfigured: {why}");
                Problem::Misconfigured(why).to_response()
            }
            Self::Unavailable(err) => {
                metrics::request(RequestOutcome::StoreError, route);
                tracing::error!(
                    error = %err,
                    "idempotency store unavailable; handler not called or its writes not kept"
                );
                Problem::StoreUnavailable {
                    retry_after: settings.config().unavailable_retry_after,
                }
                .to_response()
            }
            Self::Duplicate(duplicate) => duplicate.respond(settings, route),
        }
    }
}

impl Duplicate {
    fn respond<B: Body>(self, settings: &Settings, route: &str) -> Response<ResponseBody<B>> {
        match self {
            Self::Replay(stored) => {
                metrics::request(RequestOutcome::Replayed, route);
                tracing::info!(
                    status = stored.status().as_u16(),
                    "replayed stored response"
                );
                replay(stored)
            }
            Self::NotReplayable => {
                metrics::request(RequestOutcome::NotReplayable, route);
                tracing::info!("completed without a replayable response");
                Problem::NotReplayable.to_response()
            }
            Self::InFlight {
                retry_after: lease_left,
            } => {
                metrics::request(RequestOutcome::InFlight, route);
                let retry_after = settings.config().in_flight_retry_after.min(lease_left);
                tracing::info!(?retry_after, "duplicate of a request in flight");
                Problem::InFlight { retry_after }.to_response()
            }
            Self::Mismatch => {
                metrics::request(RequestOutcome::Mismatch, route);
                tracing::warn!("idempotency key reused with a different request");
                Problem::FingerprintMismatch.to_response()
            }
        }
    }
}

/// The stored response as it was sent, marked `Idempotent-Replayed: true`.
fn replay<B: Body>(stored: StoredResponse) -> Response<ResponseBody<B>> {
    let (status, headers, body) = stored.into_parts();
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}
