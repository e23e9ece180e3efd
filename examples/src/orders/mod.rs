//! The reference app (README.md, "The reference app"): orders that debit a balance, and
//! payments whose provider callbacks credit a ledger, made idempotent with
//! idem.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! let app = idem_examples::orders::App::in_memory(false);
//! axum::serve(listener, app.router()).await
//! # }
//! ```

mod annotated;
mod data;
mod db;
mod handlers;
mod prometheus;
mod sql;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::{FromRef, Request};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_tower::core::redis::redis::aio::ConnectionManager;
use idem_tower::core::tiered::TierCounters;
use idem_tower::store::IdempotencyStore;
use idem_tower::{
    Idempotency, IdempotencyBuilder, MemoryStore, MySqlStore, PgStore, RedisStore, Resolver,
    SqliteStore, TieredStore,
};
use metrics_exporter_prometheus::PrometheusHandle;

pub use data::{Data, Writer};
pub use db::{Db, Order, Payment, PaymentState, STARTING_BALANCE_CENTS};
pub use prometheus::{
    CLAIM_SECONDS_BUCKETS, TIER_COUNTERS, install_prometheus, prometheus_recorder,
    register_tier_counters,
};
pub use sql::{NewOrder, OrdersSql};

/// Anything that went wrong starting the app.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the idempotent routes are wired; both answer the same contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wiring {
    /// `#[idempotent]` handlers (the default).
    #[default]
    Attribute,
    /// Plain handlers behind `IdempotencyLayer`s built by hand.
    Layer,
}

/// The key of `POST /orders`: one order per client key, per user, per tenant.
pub const ORDER_KEY: &str = "order-create:{tenant}:{user}:{header:idempotency-key}";
/// The key of a payment callback: the provider re-pushes the same callback.
pub const CALLBACK_KEY: &str = "pay-callback:{path:payment_no}";

/// The authenticated user, put in request extensions by [`demo_auth`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserId(pub String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How many times each handler ran: the effect counters tests read.
#[derive(Debug, Default)]
pub struct Calls {
    /// `POST /orders` handler invocations.
    pub orders: AtomicU64,
    /// `POST /payments/{payment_no}/callback` handler invocations.
    pub callbacks: AtomicU64,
}

impl Calls {
    /// `POST /orders` invocations so far.
    pub fn orders(&self) -> u64 {
        self.orders.load(Ordering::SeqCst)
    }

    /// Callback invocations so far.
    pub fn callbacks(&self) -> u64 {
        self.callbacks.load(Ordering::SeqCst)
    }
}

/// The app: its data, its idempotency handle and its counters.
#[derive(Clone)]
pub struct App {
    /// The data, and on SQL the idempotency records too.
    pub data: Data,
    /// Idempotency for the write routes.
    pub idem: Idempotency,
    /// Handler invocation counts.
    pub calls: Arc<Calls>,
    /// Whether the `X-Chaos-*` headers are honoured.
    pub chaos: bool,
    /// With `--redis`: the tiered store's counters (answered by Redis,
    /// degraded, fallback caught, breaker transitions).
    pub tier: Option<Arc<TierCounters>>,
    /// The Prometheus recorder's handle, when one is installed (the binary
    /// installs it): `GET /metrics` renders idem's metrics from it.
    pub prometheus: Option<PrometheusHandle>,
}

impl App {
    /// The app on the in-memory database and store.
    pub fn in_memory(chaos: bool) -> Self {
        let data = Data::Memory(Arc::default());
        Self::assemble(data, Idempotency::builder(MemoryStore::new()), chaos)
    }

    /// The app on `database` (`memory`, `sqlite://PATH`, `postgres://...` or
    /// `mysql://...`), its tables and the idempotency records created there
    /// if missing.
    pub async fn connect(database: &str, chaos: bool) -> Result<Self, BoxError> {
        Self::connect_with(database, chaos, |builder| builder).await
    }

    /// [`App::connect`], with the idempotency handle's settings adjusted by
    /// `configure` (tests shorten the lease, cap the body, ...).
    pub async fn connect_with(
        database: &str,
        chaos: bool,
        configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
    ) -> Result<Self, BoxError> {
        Self::connect_tiered(database, None, chaos, configure).await
    }

    /// [`App::connect_with`], and with `redis` (a `redis://` URL) the Redis
    /// gate in front of the SQL store; on the `memory` database, Redis alone
    /// keeps the idempotency records.
    pub async fn connect_tiered(
        database: &str,
        redis: Option<&str>,
        chaos: bool,
        configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
    ) -> Result<Self, BoxError> {
        let data = Data::connect(database).await?;
        let gate = match redis {
            None => None,
            Some(url) => {
                let client = idem_tower::core::redis::redis::Client::open(url)?;
                Some(RedisStore::new(client.get_connection_manager().await?))
            }
        };
        let (builder, tier) = match &data {
            // Redis alone, no SQL behind it: for trying things out, not for
            // money (an eviction or a failover forgets keys).
            Data::Memory(_) => match gate {
                Some(gate) => (Idempotency::builder(gate), None),
                None => (Idempotency::builder(MemoryStore::new()), None),
            },
            Data::Postgres(pool) => {
                let store = PgStore::new(pool.clone());
                store.migrate().await?;
                with_gate(store, gate)
            }
            Data::MySql(pool) => {
                let store = MySqlStore::new(pool.clone());
                store.migrate().await?;
                with_gate(store, gate)
            }
            Data::Sqlite(pool) => {
                let store = SqliteStore::new(pool.clone());
                store.migrate().await?;
                with_gate(store, gate)
            }
        };
        let mut app = Self::assemble(data, configure(builder), chaos);
        app.tier = tier;
        Ok(app)
    }

    fn assemble(data: Data, builder: IdempotencyBuilder, chaos: bool) -> Self {
        let idem = builder
            .tenant(Resolver::header("x-tenant-id"))
            .user(Resolver::extension::<UserId>())
            .build();
        Self {
            data,
            idem,
            calls: Arc::default(),
            chaos,
            tier: None,
            prometheus: None,
        }
    }

    /// The routes, with `#[idempotent]` handlers.
    pub fn router(&self) -> Router {
        self.router_with(Wiring::Attribute)
    }

    /// The routes, wired as asked.
    pub fn router_with(&self, wiring: Wiring) -> Router {
        let (create_order, callback) = match wiring {
            Wiring::Attribute => {
                let create_order = match self.data {
                    Data::Memory(_) => post(annotated::create_order_in_memory),
                    _ => post(annotated::create_order),
                };
                (create_order, post(annotated::payment_callback))
            }
            Wiring::Layer => (
                post(handlers::create_order).layer(self.order_layer()),
                post(handlers::payment_callback).layer(
                    self.idem
                        .layer_with_key(CALLBACK_KEY)
                        .expect("CALLBACK_KEY is a valid template"),
                ),
            ),
        };
        Router::new()
            .route(
                "/orders",
                create_order
                    .layer(middleware::from_fn(demo_auth))
                    .get(handlers::list_orders),
            )
            .route("/payments", post(handlers::create_payment))
            .route("/payments/{payment_no}/callback", callback)
            .route(
                "/payments/{payment_no}/refund",
                post(handlers::refund_payment),
            )
            .route("/payments/{payment_no}", get(handlers::get_payment))
            .route("/metrics", get(handlers::metrics))
            .with_state(self.clone())
    }

    /// `POST /orders`'s layer: on SQL the order, the debit and the stored
    /// response commit in one transaction; the memory database has none.
    fn order_layer(&self) -> idem_tower::IdempotencyLayer {
        let layer = self
            .idem
            .layer_with_key(ORDER_KEY)
            .expect("ORDER_KEY is a valid template");
        match self.data {
            Data::Memory(_) => layer,
            _ => layer
                .transactional()
                .expect("the SQL stores are transactional"),
        }
    }
}

/// The handle's builder on `truth`, behind `gate` if there is one.
fn with_gate<T: IdempotencyStore>(
    truth: T,
    gate: Option<RedisStore<ConnectionManager>>,
) -> (IdempotencyBuilder, Option<Arc<TierCounters>>) {
    match gate {
        None => (Idempotency::builder(truth), None),
        Some(gate) => {
            let tiered = TieredStore::new(gate, truth);
            let counters = tiered.counters();
            (Idempotency::builder(tiered), Some(counters))
        }
    }
}

impl FromRef<App> for Idempotency {
    fn from_ref(app: &App) -> Self {
        app.idem.clone()
    }
}

/// Demo authentication: `Authorization: Bearer <user-id>`, the token being
/// the user id. A real app verifies a token here; the idempotency layer only
/// needs the [`UserId`] it leaves in the request.
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
