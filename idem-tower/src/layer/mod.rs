//! The idempotency middleware.
//!
//! For each request: buffer the body (413 over the cap, nothing claimed),
//! build the key and fingerprint (400 naming any missing part), claim the key
//! in the store, then either answer a duplicate or call the service:
//!
//! | situation | response |
//! |---|---|
//! | first request | the service's response, stored if final (see [`final_if_deterministic`](crate::final_if_deterministic)) |
//! | duplicate of a completed request | the stored status, body and allow-listed headers, plus `Idempotent-Replayed: true` |
//! | same key, different request | 422 |
//! | duplicate while the first runs | 409 + `Retry-After`, or wait and replay ([`InFlightPolicy::Wait`](crate::InFlightPolicy::Wait)) |
//! | key missing / malformed / repeated | 400 |
//! | body over the cap | 413 |
//! | store unavailable | 503 + `Retry-After`; the service is not called |
//!
//! Every response the layer writes itself is `application/problem+json`
//! with a [`Problem`](crate::Problem) type of its own.
//!
//! A stored response keeps its trailers, sent after its body on the first
//! response and on every replay: gRPC's `grpc-status`, `grpc-message` and
//! `grpc-status-details-bin` always, others under the headers' allow-list.
//! The stored body's encodings, `content-encoding` and `grpc-encoding`, are
//! always replayed with it, whatever the allow-list.
//! A gRPC response (`content-type: application/grpc*`) is final by its
//! `grpc-status`, in its trailers or, trailers-only, in its headers: `OK`,
//! `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`
//! and `OUT_OF_RANGE` are kept and replayed; any other code (`UNAVAILABLE`,
//! `INTERNAL`, ...) or none releases the key, so a retry runs; except on a
//! reply over [`max_stored_response`](crate::IdempotencyBuilder::max_stored_response),
//! settled before its trailers are read.
//! [`IdempotencyBuilder::final_response`](crate::IdempotencyBuilder::final_response)
//! puts a policy of your own, on the whole response, in place of both rules.
//!
//! On a route whose key is optional ([`IdempotencyLayer::required`]`(false)`)
//! and does not read the body, a request whose head carries none of the
//! key's parts passes through with its body unread, streaming.
//!
//! A claim whose service fails (5xx or another non-final status), returns
//! an error or panics is released, so the client can retry with the same key
//! at once. A client that disconnects does not cancel a service that has
//! started: it runs to its end on a task of its own, and its outcome is
//! settled as if the client were still there, so the retry gets the replay
//! instead of making a half-made effect a second time. Bound a handler that
//! may hang with a timeout *inside* the layer (its error releases the key).
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use idem_tower::{Idempotency, MemoryStore};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let idem = Idempotency::new(MemoryStore::new());
//! let service = ServiceBuilder::new()
//!     .layer(idem.layer_with_key("charge:{header:idempotency-key}")?)
//!     .service(service_fn(|_req: Request<Full<Bytes>>| async {
//!         Ok::<_, Infallible>(Response::builder().status(StatusCode::CREATED).body(Full::new(Bytes::from("charged"))).unwrap())
//!     }));
//!
//! let request = || Request::post("/charges").header("idempotency-key", "k-1").body(Full::default()).unwrap();
//! let first = service.clone().oneshot(request()).await?;
//! let again = service.oneshot(request()).await?;
//! assert_eq!(first.status(), StatusCode::CREATED);
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

// One request takes one path (ARCHITECTURE.md, "Bird's-eye view"), told in
// `service.rs`; each step has a module of its own: `read` (safe methods, the
// caller, the body), `key` (the matched route, its parameters, the key and
// the fingerprint), `claim` (the key claimed in the store or in a
// transaction, and held as one value either way), `lease` (a plain claim
// renewed while the service runs, and completed), `settle` (the outcome kept
// or the key let go; `grpc` reads a gRPC call's outcome). `answer` writes the responses the layer gives itself;
// `layer` holds the route's settings.

mod answer;
mod body;
mod claim;
mod encoding;
mod future;
pub(crate) mod grpc;
mod guard;
mod key;
#[allow(clippy::module_inception)]
mod layer;
mod lease;
mod read;
mod rebuild;
mod route;
mod service;
mod settle;
mod task;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
#[cfg(feature = "macros")]
pub(crate) use layer::Marking;
pub(crate) use layer::Policy;
pub use rebuild::RebuildBody;
pub use service::IdempotencyService;
