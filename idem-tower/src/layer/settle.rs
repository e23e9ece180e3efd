//! Settling a claim once the service has answered: the response sorted by
//! the outcome policy, a final one buffered and kept, anything else letting
//! the key go (ARCHITECTURE.md, "Records").

use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response};
use http_body::Body;
use http_body_util::BodyExt;
use idem_core::{ErrorKind, Outcome, StoredResponse};

use super::answer::{Answer, Wire};
use super::claim::Claimed;
use super::grpc;
use super::layer::{Marking, Settings};
use crate::layer::ResponseBody;
use crate::metrics::{self, Handled, RouteLabel};
use crate::{FinishedResponse, HandlerRan};

/// Keeps a final response (stored, or committed with the handler's
/// writes), or lets the key go for anything else.
pub(super) async fn settle<B>(
    settings: Settings,
    claimed: Claimed,
    response: Response<B>,
    route: RouteLabel,
    wire: Wire,
) -> Response<ResponseBody<B>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
{
    match classify(&settings, response).await {
        Classified::Final(outcome, response) => {
            match claimed.finish(&outcome, settings.ttl, &route).await {
                Ok(()) => {
                    metrics::request(Handled::First, &route);
                    response
                }
                // The handler ended the transaction: what it wrote may
                // have committed, and its key will not run again.
                Err(err) if err.kind() == ErrorKind::TransactionEnded => {
                    Answer::TransactionEnded.respond(&settings, &route, wire)
                }
                // Nothing committed: the handler's writes are gone too, so
                // the client must not see its success.
                Err(err) => Answer::Unavailable(err).respond(&settings, &route, wire),
            }
        }
        Classified::NotFinal(response) => {
            metrics::request(Handled::Released, &route);
            claimed.abort("response not final").await;
            response
        }
        Classified::NotRun(response) => {
            metrics::request(Handled::NotRun, &route);
            claimed.abort("refused before the handler ran").await;
            response
        }
    }
}

/// A handler's response, sorted by the outcome policy.
enum Classified<B: Body> {
    /// Final: keep this outcome; send this response.
    Final(Outcome, Response<ResponseBody<B>>),
    /// Not final (5xx, 429, ...): let the key go; send this response.
    NotFinal(Response<ResponseBody<B>>),
    /// Not the handler's: a rejection from before it ran, on a route that
    /// requires [`HandlerRan`]. Let the key go; send this response.
    NotRun(Response<ResponseBody<B>>),
}

/// Applies the outcome policy, buffering a final response for storage.
async fn classify<B>(settings: &Settings, response: Response<B>) -> Classified<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let config = settings.config();
    let status = response.status();
    if refused_before_the_handler(settings, &response) {
        return Classified::NotRun(response.map(ResponseBody::inner));
    }
    // A policy on the whole response decides once the body is read;
    // otherwise the status (and a trailers-only gRPC status) decides now.
    let whole = config.final_response;
    let grpc = grpc::is_grpc(response.headers());
    if whole.is_none() {
        if !(config.final_status)(status) {
            return Classified::NotFinal(response.map(ResponseBody::inner));
        }
        if grpc && grpc::status(response.headers()).is_some_and(|code| !grpc::is_final(code)) {
            return Classified::NotFinal(response.map(ResponseBody::inner));
        }
    }
    let (parts, body) = response.into_parts();
    let (outcome, body) = match buffer_response(body, config.max_stored_response).await {
        Buffered::Whole(bytes, trailers) => {
            let finished = FinishedResponse::new(status, &parts.headers, trailers.as_ref());
            let is_final = match whole {
                Some(is_final) => is_final(&finished),
                None => !grpc || finished.grpc_status().is_some_and(grpc::is_final),
            };
            if !is_final {
                let body = ResponseBody::full_with_trailers(bytes, trailers);
                return Classified::NotFinal(Response::from_parts(parts, body));
            }
            let headers = replay_fields(settings, &parts.headers);
            let kept = trailers
                .as_ref()
                .map(|t| replay_fields(settings, t))
                .unwrap_or_default();
            let stored = StoredResponse::new(status, headers, bytes.clone()).with_trailers(kept);
            let body = ResponseBody::full_with_trailers(bytes, trailers);
            (Outcome::Response(stored), body)
        }
        Buffered::Partial(prefix, rest)
            if whole.is_some_and(|is_final| {
                !is_final(&FinishedResponse::new(status, &parts.headers, None))
            }) =>
        {
            let body = ResponseBody::prefixed(prefix, rest);
            return Classified::NotFinal(Response::from_parts(parts, body));
        }
        Buffered::Partial(prefix, rest) => {
            tracing::warn!(
                limit = config.max_stored_response,
                "response too large to store; duplicates will get 409"
            );
            (Outcome::NotReplayable, ResponseBody::prefixed(prefix, rest))
        }
        Buffered::Failed(prefix, err) => {
            // The handler ran; its effect must not run again.
            tracing::warn!("response body failed; completing as not replayable");
            (Outcome::NotReplayable, ResponseBody::failed(prefix, err))
        }
    };
    Classified::Final(outcome, Response::from_parts(parts, body))
}

/// Whether a response on a route whose handler marks its outcomes with
/// [`HandlerRan`] is a refusal from before the handler ran: any response
/// without the mark under `#[idempotent]`; an error without it on a layer
/// told to [`require_handler_ran`](crate::IdempotencyLayer::require_handler_ran).
/// There, a success or redirect without it may be a handler that forgot
/// the mark, and releasing it could run its effect again: it is kept, and
/// said.
fn refused_before_the_handler<B>(settings: &Settings, response: &Response<B>) -> bool {
    let marking = settings.policy.marking;
    if marking == Marking::None || response.extensions().get::<HandlerRan>().is_some() {
        return false;
    }
    let status = response.status();
    if marking == Marking::ByAttribute || status.is_client_error() || status.is_server_error() {
        tracing::debug!(
            status = status.as_u16(),
            "refused before the handler ran; nothing kept"
        );
        return true;
    }
    tracing::warn!(
        status = status.as_u16(),
        "a response without HandlerRan on a route that requires it: kept as the \
         handler's; mark the handler's responses with HandlerRan"
    );
    false
}

/// What became of a response body read for storage.
enum Buffered<B: Body> {
    /// The whole body, and the trailers it ended with.
    Whole(Bytes, Option<HeaderMap>),
    /// Over the cap: the part read, and the rest still to stream.
    Partial(Bytes, Pin<Box<B>>),
    /// The body failed after this much.
    Failed(Bytes, B::Error),
}

/// Reads a response body for storage, up to `cap` bytes.
async fn buffer_response<B: Body<Data = Bytes>>(body: B, cap: usize) -> Buffered<B> {
    let mut body = Box::pin(body);
    let mut read = Read::Nothing;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => {
                    read.push(data);
                    if read.len() > cap {
                        return Buffered::Partial(read.into_bytes(), body);
                    }
                }
                Err(frame) => {
                    if let Ok(more) = frame.into_trailers() {
                        trailers.get_or_insert_with(HeaderMap::new).extend(more);
                    }
                }
            },
            Err(err) => return Buffered::Failed(read.into_bytes(), err),
        }
    }
    Buffered::Whole(read.into_bytes(), trailers)
}

/// What [`buffer_response`] has read so far. A body of one data frame (a
/// handler's usual `Full` or `Json` body) is kept as it came, not copied.
enum Read {
    Nothing,
    One(Bytes),
    Many(BytesMut),
}

impl Read {
    fn push(&mut self, data: Bytes) {
        *self = match std::mem::replace(self, Self::Nothing) {
            Self::Nothing => Self::One(data),
            Self::One(first) => {
                let mut buf = BytesMut::with_capacity(first.len() + data.len());
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&data);
                Self::Many(buf)
            }
            Self::Many(mut buf) => {
                buf.extend_from_slice(&data);
                Self::Many(buf)
            }
        };
    }

    fn len(&self) -> usize {
        match self {
            Self::Nothing => 0,
            Self::One(data) => data.len(),
            Self::Many(buf) => buf.len(),
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Self::Nothing => Bytes::new(),
            Self::One(data) => data,
            Self::Many(buf) => buf.freeze(),
        }
    }
}

/// The headers, or trailers, a replay repeats: those the handle's
/// allow-list keeps (less those never replayed), and always those in
/// [`ALWAYS_REPLAYED`].
fn replay_fields(settings: &Settings, fields: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for (name, value) in fields {
        if ALWAYS_REPLAYED.contains(&name.as_str()) || settings.idem.replays(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

/// The fields a replay cannot do without, whatever the allow-list: gRPC's
/// status, message and details, which are a gRPC call's outcome (in the
/// trailers, or in the headers of a trailers-only response), and the
/// encodings of the stored body's bytes (a compressed gRPC message is
/// flagged compressed and unreadable without `grpc-encoding`; a body
/// compressed inside the layer is gzip bytes without `content-encoding`).
const ALWAYS_REPLAYED: [&str; 5] = [
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
    "grpc-encoding",
    "content-encoding",
];
