//! Idempotent write endpoints for [tower] and [axum]: "charge, grant, ship"
//! give the same result whether a request arrives once or fifteen times.
//!
//! Build an [`Idempotency`] handle on a store, then put an
//! [`IdempotencyLayer`] on each write route with its key template. The first
//! request with a key runs; duplicates get its stored response replayed
//! (`Idempotent-Replayed: true`), a 409 while it is still running, or a 422
//! if the key is reused for a different request.
//!
//! ```
//! use axum::{Router, Json, routing::post, http::StatusCode};
//! use idem_tower::{Idempotency, MemoryStore, Resolver};
//!
//! async fn create_order(Json(order): Json<serde_json::Value>) -> (StatusCode, Json<serde_json::Value>) {
//!     (StatusCode::CREATED, Json(order))
//! }
//!
//! # fn main() -> Result<(), idem_tower::TemplateError> {
//! let idem = Idempotency::builder(MemoryStore::new())
//!     .tenant(Resolver::header("x-tenant-id"))
//!     .build();
//!
//! let app: Router = Router::new().route(
//!     "/orders",
//!     post(create_order).layer(idem.layer_with_key("order-create:{tenant}:{header:idempotency-key}")?),
//! );
//! # Ok(()) }
//! ```
//!
//! Keys are templates (see [`KeyTemplate`]): `{tenant}`, `{user}`,
//! `{header:NAME}`, `{path:NAME}`, `{query:NAME}`, `{body:/json/pointer}`,
//! `{method}`, `{route}`. A part that resolves to nothing is a 400 naming
//! it, never a shorter key.
//!
//! # The `#[idempotent]` attribute
//!
//! With the `macros` feature, an axum handler can carry its key instead of
//! its route carrying a layer. The route line stays `post(create_order)`;
//! the router state gives the handle through `FromRef` (or is one).
//!
//! ```
//! # #[cfg(feature = "macros")] mod example {
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use idem_tower::{Idempotency, MemoryStore, idempotent};
//!
//! #[idempotent(key = "order-create:{header:idempotency-key}", ttl = "24h")]
//! async fn create_order(Json(order): Json<serde_json::Value>) -> (StatusCode, Json<serde_json::Value>) {
//!     (StatusCode::CREATED, Json(order))
//! }
//!
//! pub fn app() -> Router {
//!     Router::new()
//!         .route("/orders", post(create_order))
//!         .with_state(Idempotency::new(MemoryStore::new()))
//! }
//! # }
//! ```
//!
//! It expands to the same [`IdempotencyLayer`] around the handler, built
//! once per handler; the key template and every other argument are checked
//! at compile time. The attribute's own docs list its arguments.
//!
//! # Observability
//!
//! Requests are counted by outcome (`idem_requests_total{outcome}`) and
//! claims timed (`idem_claim_seconds`) through the [metrics] facade: install
//! any recorder, such as `metrics-exporter-prometheus`. The keys duplicates
//! hit most come from [`Idempotency::top_collisions`]. Spans and events go
//! through `tracing`, with keys as short hashes, never request bodies.
//!
//! [metrics]: https://docs.rs/metrics
//!
//! # Features
//!
//! - `memory` (default): [`MemoryStore`].
//! - `axum`: matched routes and path parameters from axum, and the handle
//!   as an extractor.
//! - `macros`: the `#[idempotent]` attribute for axum handlers (implies
//!   `axum`).
//! - `postgres`, `mysql`, `sqlite`: the SQL stores ([`PgStore`],
//!   [`MySqlStore`], [`SqliteStore`]) and, with `axum`, the [`Tx`] extractor
//!   for transactional mode.
//! - `redis`: [`RedisStore`], and [`TieredStore`] to put it in front of a
//!   SQL store as the fast gate.
//! - `test-util`: the store conformance suite.
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
mod axum;
mod body;
mod collisions;
mod dyn_store;
mod guard;
mod idempotency;
pub mod layer;
mod metrics;
mod problem;
mod resolver;
mod route;
#[cfg(all(
    feature = "axum",
    any(feature = "postgres", feature = "mysql", feature = "sqlite")
))]
mod tx;

pub use body::ResponseBody;
pub use collisions::{Collision, TRACKED_KEYS};
pub use idempotency::{
    DEFAULT_LEASE, DEFAULT_MAX_BODY, DEFAULT_MAX_STORED_RESPONSE, DEFAULT_REPLAY_HEADERS,
    DEFAULT_RETENTION, Idempotency, IdempotencyBuilder, InFlight, KeepFn, keep_deterministic,
};
pub use layer::{IdempotencyLayer, IdempotencyService, NotTransactional};
pub use problem::Problem;
pub use resolver::Resolver;
#[cfg(all(
    feature = "axum",
    any(feature = "postgres", feature = "mysql", feature = "sqlite")
))]
#[cfg_attr(
    docsrs,
    doc(cfg(all(
        feature = "axum",
        any(feature = "postgres", feature = "mysql", feature = "sqlite")
    )))
)]
pub use tx::{Tx, TxRejection};

#[cfg(feature = "memory")]
pub use idem_core::MemoryStore;
#[cfg(feature = "mysql")]
pub use idem_core::sql::MySqlStore;
#[cfg(feature = "postgres")]
pub use idem_core::sql::PgStore;
#[cfg(feature = "sqlite")]
pub use idem_core::sql::SqliteStore;
pub use idem_core::{
    Error, ErrorKind, FingerprintSpec, IdempotencyStore, KeyError, KeyTemplate, Outcome,
    StoredResponse, TemplateError,
};
#[cfg(feature = "redis")]
pub use idem_core::{redis::RedisStore, tiered::TieredStore};

/// The core crate, for store authors and lower-level use.
pub use idem_core as core;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use idem_macros::idempotent;

#[cfg(feature = "macros")]
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

/// The header set on replayed responses.
pub const REPLAYED_HEADER: http::HeaderName = http::HeaderName::from_static("idempotent-replayed");
