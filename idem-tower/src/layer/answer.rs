//! The responses the layer gives itself instead of the service's, each
//! counted under its outcome: refusals, duplicates, a misconfigured route,
//! an unavailable store.

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body::Body;
use idem_core::{Duplicate, Outcome, StoredResponse};

use super::encoding::{self, Accepts};
use super::grpc;
use super::layer::Settings;
use crate::Idempotency;
use crate::layer::ResponseBody;
use crate::metrics::{self, Handled, RouteLabel};
use crate::problem::Problem;

/// What the layer answers itself, at the step that found it.
pub(super) enum Answer {
    /// A resolver's extractor refused the request: its rejection (such as a
    /// 401), as the handler would have answered; nothing claimed.
    Refused(Box<Response<Bytes>>),
    /// The request cannot be keyed (400) or its body is over the cap (413);
    /// nothing claimed.
    Rejected(Problem),
    /// The route is wired so that no request can succeed: 500, logged with
    /// the fix.
    Misconfigured(String),
    /// The store failed: 503, and the service was not called, or its
    /// transaction did not commit.
    Unavailable(idem_core::Error),
    /// The handler ended the claim's transaction itself: 500, and the key
    /// kept from running again (the store logged which).
    TransactionEnded,
    /// Another request already claimed the key: its stored response, 409
    /// while it runs (or if its response was not kept), 422 if
    /// it was another request.
    Duplicate(Duplicate),
}

impl Answer {
    /// The response, counted on `route`, written for the `wire` the request
    /// came on: problem+json, or a gRPC status. A replay is the first
    /// response as it was, whatever the wire.
    pub(super) fn respond<B: Body>(
        self,
        settings: &Settings,
        route: &RouteLabel,
        wire: Wire,
    ) -> Response<ResponseBody<B>> {
        match self {
            Self::Refused(rejection) => {
                tracing::debug!(
                    status = rejection.status().as_u16(),
                    "the caller's identity was refused; nothing claimed"
                );
                metrics::request(Handled::NotRun, route);
                if wire.grpc {
                    grpc::refusal(rejection.status())
                } else {
                    rejection.map(ResponseBody::full)
                }
            }
            Self::Rejected(problem) => {
                let outcome = match problem {
                    Problem::BodyTooLarge { .. } => Handled::BodyTooLarge,
                    Problem::KeyMissing(_) => Handled::MissingKey,
                    _ => Handled::InvalidKey,
                };
                metrics::request(outcome, route);
                wire.problem(problem)
            }
            Self::Misconfigured(why) => {
                metrics::request(Handled::Misconfigured, route);
                tracing::error!(route = &**route, "idempotency misconfigured: {why}");
                wire.problem(Problem::Misconfigured(why))
            }
            Self::Unavailable(err) => {
                metrics::request(Handled::StoreError, route);
                tracing::error!(
                    error = %err,
                    "idempotency store unavailable; handler not called or its writes not kept"
                );
                wire.problem(Problem::StoreUnavailable {
                    retry_after: settings.config().unavailable_retry_after,
                })
            }
            Self::TransactionEnded => {
                metrics::request(Handled::TransactionEnded, route);
                wire.problem(Problem::TransactionEnded)
            }
            Self::Duplicate(dup) => duplicate(dup, settings, route, wire),
        }
    }
}

/// What a duplicate gets, by what became of the first request with its key.
fn duplicate<B: Body>(
    duplicate: Duplicate,
    settings: &Settings,
    route: &RouteLabel,
    wire: Wire,
) -> Response<ResponseBody<B>> {
    match duplicate {
        Duplicate::Replay(Outcome::Response(stored)) => {
            metrics::request(Handled::Replayed, route);
            tracing::info!(
                status = stored.status().as_u16(),
                "replayed stored response"
            );
            replay(stored, wire.accepts)
        }
        Duplicate::Replay(Outcome::NotReplayable) => {
            metrics::request(Handled::NotReplayable, route);
            tracing::info!("completed without a replayable response");
            wire.problem(Problem::NotReplayable)
        }
        Duplicate::InFlight {
            retry_after: lease_left,
        } => {
            metrics::request(Handled::InFlight, route);
            let retry_after = settings.config().in_flight_retry_after.min(lease_left);
            tracing::info!(?retry_after, "duplicate of a request in flight");
            wire.problem(Problem::InFlight { retry_after })
        }
        Duplicate::Mismatch => {
            metrics::request(Handled::Mismatch, route);
            tracing::warn!("idempotency key reused with a different request");
            wire.problem(Problem::FingerprintMismatch)
        }
    }
}

/// What a request's answers are written as, from its head: gRPC calls
/// (`content-type: application/grpc*`) read the layer's own answers as
/// trailers-only gRPC statuses, everything else as problem+json; and the
/// encodings it reads a replay in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Wire {
    pub(super) grpc: bool,
    accepts: Accepts,
}

impl Wire {
    /// The wire of a request with these headers.
    pub(super) fn of(headers: &http::HeaderMap) -> Self {
        Self {
            grpc: grpc::is_grpc(headers),
            accepts: Accepts::of(headers),
        }
    }

    /// `problem` as the layer's own answer on this wire.
    fn problem<B: Body>(self, problem: Problem) -> Response<ResponseBody<B>> {
        if self.grpc {
            grpc::trailers_only(
                problem.grpc_code(),
                &problem.message(),
                problem.retry_after(),
            )
        } else {
            problem.to_response()
        }
    }
}

/// The stored response as it was sent, its trailers too, marked
/// `Idempotent-Replayed: true`; decoded if its requester does not read
/// its encoding (`encoding.rs`).
fn replay<B: Body>(stored: StoredResponse, accepts: Accepts) -> Response<ResponseBody<B>> {
    let trailers = stored.trailers().cloned();
    let (status, mut headers, body) = stored.into_parts();
    let body = encoding::for_requester(&mut headers, body, accepts);
    let mut response = Response::new(ResponseBody::full_with_trailers(body, trailers));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        Idempotency::REPLAYED_HEADER,
        HeaderValue::from_static("true"),
    );
    response
}
