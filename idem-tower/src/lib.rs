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
//! # fn main() -> Result<(), idem_tower::Error> {
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
//! `{method}`, `{route}`. A part the client should have sent and did not is
//! a 400 naming it, never a shorter key; a part only the server supplies
//! (`{user}` without a user resolver, a `{path:NAME}` the route lacks) is
//! refused when the layer is built ([`ErrorKind::Config`]) or, where only a
//! request can tell, answered 500 with an error log.
//!
//! # Whose record
//!
//! A record is bound to the caller who created it: the tenant and user the
//! handle's [`Resolver`]s find are part of the stored key whether or not the
//! template names them, so one caller is never replayed another's response.
//! Resolve them from what your application already trusts:
//! `Resolver::from_extractor` (feature `axum`) runs the extractor your handlers
//! authenticate with (its rejection, such as a 401, is the answer, and
//! nothing is claimed). A key every caller shares is an explicit opt-in:
//! [`IdempotencyLayer::shared_across_callers`].
//!
//! # What runs when
//!
//! Safe methods (GET, HEAD, OPTIONS, TRACE) pass through untouched, so one
//! layer can sit on a whole router. For the others: the resolvers, then the
//! body (buffered up to a cap), the key and the fingerprint, then the claim
//! and the replay decision; only then the inner service, where an axum
//! handler's own extractors run. A request they refuse changed nothing and
//! must not burn its key: `#[idempotent]` handlers keep only what their
//! function returned, and a layer added by hand does the same with
//! [`IdempotencyLayer::require_handler_ran`] and handlers that mark their
//! responses with [`HandlerRan`].
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
//! # Stores
//!
//! | store | feature | use |
//! |---|---|---|
//! | [`MemoryStore`] | `memory` (default) | one process, tests, development |
//! | `PgStore`, `MySqlStore`, `SqliteStore` | `postgres`, `mysql`, `sqlite` | the source of truth: one row per key under a unique index, on your own sqlx pool; `store.migrate().await?` creates the table; `PgStore::builder(pool)` sets the table, the lock timeout and the open transaction limit; `store.purge_in_background(...)` deletes expired records (below) |
//! | `RedisStore` | `redis` | the fast gate: one round trip per claim; alone only where losing a key is acceptable |
//! | `TieredStore::new(gate, truth)` | `redis` + a SQL feature | Redis in front of a SQL store: duplicates answered by Redis, SQL's unique index the bottom line; Redis failures degrade to SQL alone; `TieredStore::builder(gate, truth)` sets the gate timeout, the breaker and an in-process cache |
//!
//! idem-core's docs for each store (`idem_tower::sql`,
//! `idem_tower::redis`, `idem_tower::redis::tiered`) give the details:
//! tables, scripts, the circuit breaker.
//!
//! A SQL store deletes its expired records with a background purge,
//! started once and stopped with its handle (dropping it stops it too);
//! every instance may run one:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(pool: idem_tower::sql::sqlx::PgPool) -> Result<(), idem_tower::Error> {
//! use idem_tower::PgStore;
//! use idem_tower::sql::PurgeOptions;
//!
//! let store = PgStore::new(pool);
//! store.migrate().await?;
//! let purge = store.purge_in_background(PurgeOptions::default()); // every minute
//! // ... build the router on `store` and serve; at shutdown:
//! purge.stop().await;
//! # Ok(()) }
//! ```
//!
//! # Leases
//!
//! Without transactional mode a claim lives by its lease (10 s by default,
//! [`IdempotencyBuilder::lease`]), which the layer renews every third of a
//! lease while the handler runs: a handler may run for many leases and keep
//! its key, and the key of a crashed process frees within about one lease.
//! A handler that outlives a lost lease (renewals failing for a whole
//! lease, or starved by a handler blocking its thread) may see a retry take
//! its key over and run the effect again; its own completion is then
//! refused. [`IdempotencyBuilder::lease`] says more.
//!
//! # Transactional mode
//!
//! On a SQL store, or a `TieredStore` in front of one, [`IdempotencyLayer::transactional`] (or the attribute's
//! `transactional`) makes the claim, the handler's writes and the stored
//! response one database transaction, which the handler reaches through
//! the `Tx` extractor: write through `&mut *tx`, never through the pool
//! (another pooled connection is outside the transaction, and a second
//! connection held at once). What follows from it:
//!
//! - A first request holds one pooled connection for the whole handler,
//!   and costs exactly one commit.
//! - A duplicate never holds a connection while the first runs: it learns
//!   "in flight" from memory (same process) or from one non-blocking
//!   statement (another process), and answers 409, or under
//!   [`InFlightPolicy::Wait`] waits outside the pool and replays once the first
//!   has committed.
//! - At most half the pool is held by open claims
//!   (`SqlStoreBuilder::max_transactions`); a first request past that waits for
//!   its turn without a connection, so reads through the pool always find
//!   one. Size the pool for twice the first requests you want running at
//!   once.
//! - A crash rolls the transaction back, writes and claim together, and
//!   frees the key at once, behind the Redis gate too.
//! - SQLite has one writer at a time: an open claim holds the write lock for
//!   its whole handler, and other transactional claims wait for it (in this
//!   process in order, for their turn).
//!
//! # Observability
//!
//! Requests are counted by outcome and route pattern
//! (`idem_requests_total{outcome, route}`), claims timed
//! (`idem_claim_seconds{route}`) and lease renewals counted
//! (`idem_lease_renewals_total{result, route}`: `ok`, `failed`, `lost`),
//! plain claims' completions counted (`idem_completions_total{result,
//! route}`: `ok`, `retried`, `lost`, `failed`), and the SQL stores' purges count the expired records they delete
//! (`idem_records_purged_total`), through the [metrics] facade: install
//! any recorder, such as `metrics-exporter-prometheus`. The stores count
//! their own events too (the tiered store's `idem_tier_*`, SQLite's
//! `idem_sqlite_claims_relayed_total`): `docs/metrics.md` lists them all. The keys duplicates
//! hit most come from [`Idempotency::top_duplicated_keys`]. Spans and events go
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
//! - `postgres`, `mysql`, `sqlite`: the SQL stores (`PgStore`,
//!   `MySqlStore`, `SqliteStore`) and, with `axum`, the `Tx` extractor
//!   for transactional mode.
//! - `redis`: `RedisStore`, and `TieredStore` to put it in front of a
//!   SQL store as the fast gate; `SentinelConnection`, the gate's
//!   connection behind Redis Sentinel (no other feature needed).
//! - `guards`: the business-side guards in `idem_tower::guards`
//!   (state-machine compare-and-set, counters, one-time tokens, the inbox,
//!   a lock), on the SQL and Redis features enabled.
//! - `nats`: the outbox relay's NATS JetStream publisher
//!   (`idem_tower::guards::JetStreamPublisher`; implies `guards`).
//! - `grpc`: tonic servers: the layer takes tonic's request body and
//!   forwards `NamedService`; gRPC calls are settled by their
//!   `grpc-status` and answered with gRPC statuses (see [`layer`]).
//! - `test-util`: the store conformance suite.
//! - `client`: the caller's half, `client::IdempotencyClientLayer` for
//!   tower HTTP clients: one `Idempotency-Key` per logical request, retried
//!   (with `grpc` too, `IdempotencyClientLayer::grpc` on a tonic `Channel`);
//!   `reqwest`: the same as a reqwest-middleware middleware.
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
mod axum;
mod builder;
#[cfg(feature = "client")]
pub mod client;
mod duplicated;
mod finished;
mod idempotency;
pub mod layer;
mod metrics;
mod operation;
mod problem;
mod ran;
mod resolver;
#[cfg(all(
    feature = "axum",
    any(feature = "postgres", feature = "mysql", feature = "sqlite")
))]
mod tx;

pub use builder::{FinalStatusFn, IdempotencyBuilder, InFlightPolicy, final_if_deterministic};
pub use duplicated::DuplicatedKey;
pub use finished::{FinalResponseFn, FinishedResponse, final_by_default};
pub use idempotency::Idempotency;
pub use layer::{IdempotencyLayer, IdempotencyService};
#[cfg(feature = "axum")]
pub use operation::OperationRejection;
pub use operation::{KeyForm, Operation, OperationKey};
pub use problem::Problem;
pub use ran::HandlerRan;
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
pub use idem_core::{MemoryPoints, MemoryStore};
#[cfg(feature = "mysql")]
pub use idem_sql::MySqlStore;
#[cfg(feature = "postgres")]
pub use idem_sql::PgStore;
#[cfg(feature = "sqlite")]
pub use idem_sql::SqliteStore;

/// The SQL stores' crate (features `postgres`, `mysql`, `sqlite`):
/// `sql::sqlx` is the sqlx they are built on, so your pool is the very type
/// the stores take; `sql::conformance` their suite (feature `test-util`).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use idem_sql as sql;

pub use idem_core::{Error, ErrorKind, FingerprintSpec, KeyTemplate, Phases, RecoveryPoints};
/// The business-side guards' crate (feature `guards`): state machine,
/// counters, one-time tokens, inbox, outbox and relay, lock.
#[cfg(feature = "guards")]
#[cfg_attr(docsrs, doc(cfg(feature = "guards")))]
pub use idem_guards as guards;
#[cfg(feature = "redis")]
pub use idem_redis::{RedisStore, SentinelConnection, TieredStore};

/// The Redis stores' crate (feature `redis`): `redis::redis` is the redis
/// crate they are built on, `redis::tiered` the tiered store's parts.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use idem_redis as redis;

/// The core crate, for store authors and lower-level use.
#[doc(inline)]
pub use idem_core as core;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use idem_macros::idempotent;

#[cfg(feature = "macros")]
#[doc(hidden)]
pub mod __private;
