//! The reference app (docs/reference-app.md): orders that debit a
//! balance, and payments whose provider callbacks credit a ledger, made
//! idempotent with idem, on any store. The contract tests (`tests/`), the
//! process tests (`app/tests/`) and the benchmark drive it; for one
//! concept at a time, see the small examples (`examples/README.md`).
//!
//! Where to look:
//!
//! | module | what |
//! |---|---|
//! | this one | [`App`]: the idempotency handle on each store, with the Redis gate, and the SQL store's background purge ([`App::purge_in_background`]) |
//! | `routes.rs` | the routes and their keys, with `#[idempotent]` or hand-built layers ([`Wiring`]) |
//! | `handlers.rs` | the handlers, plain axum |
//! | `auth.rs` | the user the handle's user resolver reads |
//! | `data.rs`, `memory.rs`, `sql/`, `model.rs` | the tables, in memory or on SQL; payments through the state-machine guard |
//! | `events.rs` | the `order.created` event `POST /orders` enqueues in the outbox (SQL only), for the `relay` binary to publish |
//! | `prometheus.rs` | `GET /metrics` (the app's, and the relay's with `--metrics-listen`) |
//! | `chaos.rs` | test fixture only: handler call counts and `X-Chaos-*` headers |
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! let app = idem_app::orders::App::in_memory(false);
//! axum::serve(listener, app.router()).await
//! # }
//! ```

mod auth;
mod chaos;
mod data;
mod events;
mod handlers;
mod memory;
mod model;
mod prometheus;
mod routes;
mod sql;

use std::sync::Arc;

use axum::extract::FromRef;
use idem_tower::core::IdempotencyStore;
use idem_tower::redis::SentinelConnection;
use idem_tower::redis::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use idem_tower::redis::redis::cluster::{ClusterClient, ClusterConfig};
use idem_tower::redis::redis::cluster_async::ClusterConnection;
use idem_tower::redis::redis::{self, IntoConnectionInfo, io::tcp::TcpSettings};
use idem_tower::redis::tiered::TierCounters;
use idem_tower::sql::{PurgeOptions, PurgeTask};
use idem_tower::{
    Idempotency, IdempotencyBuilder, MemoryStore, MySqlStore, PgStore, RedisStore, Resolver,
    SqliteStore, TieredStore,
};
use metrics_exporter_prometheus::PrometheusHandle;

pub use auth::{UserId, demo_auth};
pub use chaos::Calls;
pub use data::{Data, Writer};
pub use events::{ORDER_CREATED_SUBJECT, ORDERS_STREAM, OrderCreated, event_id, order_created};
pub use memory::Db;
pub use model::{NewOrder, Order, Payment, PaymentState, STARTING_BALANCE_CENTS, TransitionError};
pub use prometheus::{
    CLAIM_SECONDS_BUCKETS, TIER_COUNTERS, install_prometheus, metrics_router, prometheus_recorder,
    register_outbox_metrics, register_purge_counter, register_tier_counters,
};
pub use routes::{CALLBACK_KEY, ORDER_KEY, Wiring};
pub use sql::OrdersSql;

/// Anything that went wrong starting the app.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The app: its data, its idempotency handle and its counters.
#[derive(Clone)]
pub struct App {
    /// The data, and on SQL the idempotency records too.
    pub data: Data,
    /// Idempotency for the write routes.
    pub idem: Idempotency,
    /// Handler invocation counts (test fixture: chaos.rs).
    pub calls: Arc<Calls>,
    /// Whether the `X-Chaos-*` headers are honoured (test fixture:
    /// chaos.rs; `--chaos`).
    pub chaos: bool,
    /// With `--redis`: the tiered store's counters (answered by Redis,
    /// degraded, fallback caught, breaker transitions).
    pub tier: Option<Arc<TierCounters>>,
    /// The Prometheus recorder's handle, when one is installed (the binary
    /// installs it): `GET /metrics` renders idem's metrics from it.
    pub prometheus: Option<PrometheusHandle>,
    /// On SQL, the store of record (behind the gate, with `--redis`), for
    /// [`App::purge_in_background`].
    records: Option<SqlRecords>,
}

/// The SQL store the app's records are in.
#[derive(Clone)]
enum SqlRecords {
    Postgres(PgStore),
    MySql(MySqlStore),
    Sqlite(SqliteStore),
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

    /// [`App::connect_with`], and with `redis` the Redis gate in front of
    /// the SQL store: a `redis://` URL for one server (reconnecting to that
    /// address), a `redis+sentinel://` URL for the primary that Redis
    /// Sentinel names (following a failover), a `redis+cluster://` URL
    /// (`HOST:PORT,HOST:PORT...`, any nodes) for a Redis Cluster. On the `memory` database,
    /// Redis alone keeps the idempotency records.
    pub async fn connect_tiered(
        database: &str,
        redis: Option<&str>,
        chaos: bool,
        configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
    ) -> Result<Self, BoxError> {
        let data = Data::connect(database).await?;
        let records = sql_records(&data).await?;
        let (builder, tier) = match redis {
            None => handle_on::<ConnectionManager>(records.as_ref(), None),
            // Lazy connections: Redis is the gate, not the truth, so an
            // instance (re)started while Redis is down or mid-failover
            // starts, serving from SQL alone until the gate answers.
            Some(url) if url.starts_with("redis+sentinel://") => {
                let gate = RedisStore::new(SentinelConnection::open_lazy(url)?);
                warn_if_unreachable(&gate).await;
                handle_on(records.as_ref(), Some(gate))
            }
            Some(url) if url.starts_with("redis+cluster://") => {
                let gate = RedisStore::new(cluster_connection(url)?);
                warn_if_unreachable(&gate).await;
                handle_on(records.as_ref(), Some(gate))
            }
            Some(url) => {
                // TCP_NODELAY on, which redis-rs leaves off
                // (docs/redis-gate.md, "Turn Nagle off").
                let info = url
                    .into_connection_info()?
                    .set_tcp_settings(TcpSettings::default().set_nodelay(true));
                let client = redis::Client::open(info)?;
                let lazy = client.get_connection_manager_lazy(ConnectionManagerConfig::new())?;
                let gate = RedisStore::new(lazy);
                warn_if_unreachable(&gate).await;
                handle_on(records.as_ref(), Some(gate))
            }
        };
        let mut app = Self::assemble(data, configure(builder), chaos);
        app.tier = tier;
        app.records = records;
        Ok(app)
    }

    /// Starts deleting the expired idempotency records of the app's SQL
    /// store with `options` (idem's background purge, counted in
    /// `idem_records_purged_total`); `None` on the `memory` database. The
    /// purge runs until the task is stopped or dropped. The `orders`
    /// binary starts it (`--purge-every-ms`); the tests that count every
    /// statement the app runs leave it off.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idem_app::orders::BoxError> {
    /// use idem_tower::sql::PurgeOptions;
    ///
    /// let app = idem_app::orders::App::connect("sqlite://orders.db", false).await?;
    /// let purge = app.purge_in_background(PurgeOptions::default());
    /// // ... serve `app.router()` ...
    /// if let Some(purge) = purge {
    ///     purge.stop().await;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn purge_in_background(&self, options: PurgeOptions) -> Option<PurgeTask> {
        Some(match self.records.as_ref()? {
            SqlRecords::Postgres(store) => store.purge_in_background(options),
            SqlRecords::MySql(store) => store.purge_in_background(options),
            SqlRecords::Sqlite(store) => store.purge_in_background(options),
        })
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
            records: None,
        }
    }
}

/// Says so if the gate does not answer a `PING` at startup.
/// A Redis Cluster connection for a `redis+cluster://HOST:PORT[,HOST:PORT...]`
/// URL (any nodes of the cluster: it learns the rest from them), opened
/// lazily like the other gates. redis-rs retries a command 16 times, backing
/// off for minutes, by default; the gate gives up after its own timeout
/// anyway, so a command is retried at most twice, 100 ms apart at most,
/// enough to follow a `MOVED` after a failover.
fn cluster_connection(url: &str) -> Result<ClusterConnection, BoxError> {
    let nodes: Vec<String> = url
        .trim_start_matches("redis+cluster://")
        .trim_end_matches('/')
        .split(',')
        .map(|node| format!("redis://{node}"))
        .collect();
    let client = ClusterClient::builder(nodes)
        .retries(2)
        .min_retry_wait(20)
        .max_retry_wait(100)
        .connection_timeout(std::time::Duration::from_millis(500))
        .response_timeout(std::time::Duration::from_millis(500))
        // TCP_NODELAY on, as for one server.
        .tcp_settings(TcpSettings::default().set_nodelay(true))
        .build()?;
    Ok(client.get_pending_async_connection_with_config(ClusterConfig::new()))
}

async fn warn_if_unreachable<C: ConnectionLike + Clone + Send + Sync + 'static>(
    gate: &RedisStore<C>,
) {
    let mut conn = gate.connection().clone();
    let ping = redis::cmd("PING");
    let answer = ping.query_async::<()>(&mut conn);
    match tokio::time::timeout(std::time::Duration::from_secs(2), answer).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            tracing::warn!(%err, "the Redis gate does not answer; serving from SQL alone until it does");
        }
        Err(_) => tracing::warn!(
            "the Redis gate did not answer within 2 s; serving from SQL alone until it does"
        ),
    }
}

/// The SQL store of `data`'s database, its table created if missing;
/// `None` on the `memory` database.
async fn sql_records(data: &Data) -> Result<Option<SqlRecords>, BoxError> {
    Ok(Some(match data {
        Data::Memory(_) => return Ok(None),
        Data::Postgres { pool, .. } => {
            let store = PgStore::new(pool.clone());
            store.migrate().await?;
            SqlRecords::Postgres(store)
        }
        Data::MySql { pool, .. } => {
            let store = MySqlStore::new(pool.clone());
            store.migrate().await?;
            SqlRecords::MySql(store)
        }
        Data::Sqlite { pool, .. } => {
            let store = SqliteStore::new(pool.clone());
            store.migrate().await?;
            SqlRecords::Sqlite(store)
        }
    }))
}

/// The handle's builder on the SQL store `records` (on the `memory`
/// database, none), behind `gate` if there is one.
fn handle_on<C: ConnectionLike + Clone + Send + Sync + 'static>(
    records: Option<&SqlRecords>,
    gate: Option<RedisStore<C>>,
) -> (IdempotencyBuilder, Option<Arc<TierCounters>>) {
    match records {
        // Redis alone, no SQL behind it: for trying things out, not for
        // money (an eviction or a failover forgets keys).
        None => match gate {
            Some(gate) => (Idempotency::builder(gate), None),
            None => (Idempotency::builder(MemoryStore::new()), None),
        },
        Some(SqlRecords::Postgres(store)) => with_gate(store.clone(), gate),
        Some(SqlRecords::MySql(store)) => with_gate(store.clone(), gate),
        Some(SqlRecords::Sqlite(store)) => with_gate(store.clone(), gate),
    }
}

/// The handle's builder on `truth`, behind `gate` if there is one.
fn with_gate<T: IdempotencyStore, C: ConnectionLike + Clone + Send + Sync + 'static>(
    truth: T,
    gate: Option<RedisStore<C>>,
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
