//! The caller's half (feature `client`): a tower layer for HTTP clients
//! that sends every non-safe request with an `Idempotency-Key` and retries
//! it, with that same key, until an answer is final.
//!
//! At-least-once delivery by the client plus idempotent processing by the
//! server (the [`IdempotencyLayer`](crate::IdempotencyLayer)) is one effect
//! per operation: a retry either runs the operation for the first time or
//! gets the stored answer replayed. The key is made once per logical
//! request (or given by the caller, once per business operation) and kept
//! across its retries; a key per attempt would make every retry a new
//! operation.
//!
//! The key is, in this order: the `Idempotency-Key` header the caller
//! wrote; an [`OperationKey`] the caller put in the request's extensions
//! (a tonic request's extensions for a gRPC call, reqwest-middleware's
//! `with_extension` for reqwest), such as the key a handler derived for
//! one of its calls out with [`Operation::key_for`](crate::Operation::key_for)
//! (docs/outbound.md); else one made here.
//!
//! Retried, same key, same body: connection errors and timeouts, 5xx other
//! than 501 and 505, 409 with `Retry-After` (the first attempt still runs),
//! 429 with `Retry-After`. Never other 4xx: a 422 (the key reused for a
//! different request), 400 or 413 goes straight back. See [`RetryPolicy`].
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use idem_tower::client::{RetryReport, IdempotencyClientLayer, RetryPolicy};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let client = ServiceBuilder::new()
//!     .layer(IdempotencyClientLayer::new(RetryPolicy::default()))
//!     .service(http);
//! let request = http::Request::post("http://127.0.0.1:3000/orders")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from_static(br#"{"sku":"A-1"}"#)))?;
//! let response = client.oneshot(request).await?;
//! let delivery = response.extensions().get::<RetryReport>().unwrap();
//! println!("{} after {} attempt(s), replayed: {}", response.status(), delivery.attempts, delivery.replayed);
//! # Ok(()) }
//! ```
//!
//! With the feature `reqwest`, `IdempotencyMiddleware` is the same
//! policy for reqwest, as a `reqwest_middleware::Middleware`. With the
//! feature `grpc`, `IdempotencyClientLayer::grpc` puts it on a tonic
//! `Channel`: one `idempotency-key` metadata entry per call, and gRPC
//! answers read by their `grpc-status` ([`RetryPolicy::classify`]).
//!
//! Each attempt runs in a `idem.client.attempt` span (attempt number,
//! method, path, status); retries are counted by cause in
//! `idem_client_retries_total{cause}`.

mod attempt;
mod key;
mod layer;
mod policy;
mod report;
#[cfg(feature = "reqwest")]
mod reqwest;
mod service;

pub use key::{KEY_HEADER, KeyForm, KeyKind, KeyOrigin, OperationKey};
pub use layer::IdempotencyClientLayer;
pub use policy::{Cause, RetryPolicy, Verdict, retry_after};
pub use report::{ClientError, ClientErrorKind, RetryReport};
#[cfg(feature = "reqwest")]
pub use reqwest::IdempotencyMiddleware;
pub use service::IdempotencyClient;
