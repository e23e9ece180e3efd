//! The servers under load: one axum app per scenario, each on a task of
//! the server runtime, bound to `127.0.0.1:0`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotent::{IdempotentLayer, IdempotentOptions};
use idem_tower::core::redis::redis;
use idem_tower::core::sql::sqlx::postgres::PgPoolOptions;
use idem_tower::core::sql::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions,
};
use idem_tower::core::sql::sqlx::{PgPool, SqlitePool};
use idem_tower::store::IdempotencyStore;
use idem_tower::{Idempotency, MemoryStore, PgStore, RedisStore, SqliteStore, TieredStore};
use ruts::store::Ttl;
use ruts::store::moka::MokaStore;
use ruts::{CookieOptions, Session, SessionLayer};
use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tower_cookies::CookieManagerLayer;

use crate::stats::Counted;

/// The key template of every idem scenario.
pub(crate) const TEMPLATE: &str = "order-create:{header:idempotency-key}";
/// The key the Redis baseline reads on every request.
pub(crate) const PROBE_KEY: &str = "bench:probe";

/// What a scenario's app is built on.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// A bare handler.
    Bare,
    /// A bare handler that performs one Redis `GET` per request.
    BareRedisGet,
    /// idem's layer on the memory store.
    Memory,
    /// idem's layer on SQLite, in `path`.
    Sqlite { path: PathBuf, pool: u32 },
    /// idem's layer on PostgreSQL.
    Postgres { url: String, pool: u32 },
    /// idem's layer on Redis in front of PostgreSQL.
    Tiered { url: String, pool: u32 },
    /// axum-idempotent, set up as its README shows.
    Peer,
}

/// Connections the scenarios share.
#[derive(Clone)]
pub(crate) struct Env {
    /// The Redis server of the Redis scenarios.
    pub(crate) redis_url: Option<String>,
    /// Commands sent through [`Counted`] connections.
    pub(crate) redis_sent: Arc<AtomicU64>,
}

#[derive(Clone)]
struct AppState {
    calls: Arc<AtomicUsize>,
    redis: Option<Counted>,
    /// Simulated work in the handler (zero under load).
    delay: Duration,
}

#[derive(Deserialize)]
struct Order {
    sku: String,
    qty: u32,
    amount_cents: i64,
}

#[derive(Serialize)]
struct Created {
    order_id: usize,
    sku: String,
    qty: u32,
    amount_cents: i64,
}

/// The handler of every scenario: parses the order, counts the call and
/// answers a small JSON `201` with a `Location` (after the simulated work,
/// if the server has any).
async fn create_order(
    State(state): State<AppState>,
    Json(order): Json<Order>,
) -> impl IntoResponse {
    let order_id = state.calls.fetch_add(1, Ordering::Relaxed) + 1;
    if !state.delay.is_zero() {
        tokio::time::sleep(state.delay).await;
    }
    created(order_id, order)
}

/// The same handler, plus one Redis `GET`.
async fn create_order_after_get(
    State(state): State<AppState>,
    Json(order): Json<Order>,
) -> axum::response::Response {
    let mut conn = state.redis.clone().expect("a Redis connection");
    let probe: Result<Option<Vec<u8>>, _> = redis::cmd("GET")
        .arg(PROBE_KEY)
        .query_async(&mut conn)
        .await;
    if probe.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let order_id = state.calls.fetch_add(1, Ordering::Relaxed) + 1;
    created(order_id, order).into_response()
}

fn created(order_id: usize, order: Order) -> impl IntoResponse {
    let location = HeaderValue::try_from(format!("/orders/{order_id}")).expect("a valid header");
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(Created {
            order_id,
            sku: order.sku,
            qty: order.qty,
            amount_cents: order.amount_cents,
        }),
    )
}

/// axum-idempotent only caches for a request that already has a session;
/// this route starts one, the way its own tests do.
async fn login(session: Session<MokaStore>) -> StatusCode {
    let hour = Ttl::new(3600).expect("a valid TTL");
    match session.set("user", &"bench", hour, None).await {
        Ok(()) => StatusCode::OK,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A running scenario server.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    /// Handler invocations.
    pub(crate) calls: Arc<AtomicUsize>,
    shutdown: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
    pg: Option<PgPool>,
    sqlite: Option<SqlitePool>,
}

impl Server {
    /// Builds `kind`'s app on the server runtime, its handler taking
    /// `delay`, and serves it on `127.0.0.1:0`.
    pub(crate) async fn start(
        runtime: &Handle,
        kind: Kind,
        env: Env,
        delay: Duration,
    ) -> Result<Self, String> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let done = runtime.spawn(async move {
            let built = build(kind, env, delay).await;
            let (app, calls, pg, sqlite) = match built {
                Ok(built) => built,
                Err(err) => {
                    let _ = ready_tx.send(Err(err));
                    return;
                }
            };
            let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                Ok(listener) => listener,
                Err(err) => {
                    let _ = ready_tx.send(Err(format!("bind 127.0.0.1:0: {err}")));
                    return;
                }
            };
            let addr = listener.local_addr().expect("a bound address");
            let _ = ready_tx.send(Ok((addr, calls, pg, sqlite)));
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = shutdown_rx.await;
                })
                .await;
        });
        let (addr, calls, pg, sqlite) = ready_rx
            .await
            .map_err(|_| "the server task ended before it was ready".to_owned())??;
        Ok(Self {
            addr,
            calls,
            shutdown,
            done,
            pg,
            sqlite,
        })
    }

    /// Stops serving and closes the server's database pools (so that
    /// PostgreSQL flushes their statistics).
    pub(crate) async fn stop(self) {
        let _ = self.shutdown.send(());
        let mut done = self.done;
        if tokio::time::timeout(Duration::from_secs(5), &mut done)
            .await
            .is_err()
        {
            done.abort();
        }
        if let Some(pool) = self.pg {
            pool.close().await;
        }
        if let Some(pool) = self.sqlite {
            pool.close().await;
        }
    }
}

type Built = (Router, Arc<AtomicUsize>, Option<PgPool>, Option<SqlitePool>);

async fn build(kind: Kind, env: Env, delay: Duration) -> Result<Built, String> {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut state = AppState {
        calls: Arc::clone(&calls),
        redis: None,
        delay,
    };
    let (app, pg, sqlite) = match kind {
        Kind::Bare => (
            Router::new().route("/orders", post(create_order)),
            None,
            None,
        ),
        Kind::BareRedisGet => {
            state.redis = Some(redis_connection(&env).await?);
            (
                Router::new().route("/orders", post(create_order_after_get)),
                None,
                None,
            )
        }
        Kind::Memory => (idem_router(MemoryStore::new())?, None, None),
        Kind::Sqlite { path, pool } => {
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(pool)
                .connect_with(options)
                .await
                .map_err(|e| format!("SQLite at {}: {e}", path.display()))?;
            let store = SqliteStore::new(pool.clone());
            store.migrate().await.map_err(|e| e.to_string())?;
            (idem_router(store)?, None, Some(pool))
        }
        Kind::Postgres { url, pool } => {
            let store = pg_store(&url, pool).await?;
            let pool = store.pool().clone();
            (idem_router(store)?, Some(pool), None)
        }
        Kind::Tiered { url, pool } => {
            let truth = pg_store(&url, pool).await?;
            let pool = truth.pool().clone();
            let gate = RedisStore::new(redis_connection(&env).await?);
            (
                idem_router(TieredStore::new(gate, truth))?,
                Some(pool),
                None,
            )
        }
        Kind::Peer => {
            // As axum-idempotent's README sets it up: the in-process moka
            // session store, the key from the Idempotency-Key header,
            // responses kept 5 minutes, layers in the documented order.
            let store = Arc::new(MokaStore::builder().build());
            let options = IdempotentOptions::default()
                .use_idempotency_key_header(Some("Idempotency-Key"), true)
                .expire_after(60 * 5);
            let app = Router::new()
                .route("/orders", post(create_order))
                .route("/login", post(login))
                .layer(IdempotentLayer::<MokaStore>::new(options))
                .layer(
                    SessionLayer::new(store)
                        .with_cookie_options(CookieOptions::build().name("session")),
                )
                .layer(CookieManagerLayer::new());
            (app, None, None)
        }
    };
    Ok((app.with_state(state), calls, pg, sqlite))
}

fn idem_router(store: impl IdempotencyStore) -> Result<Router<AppState>, String> {
    let idem = Idempotency::builder(store).build();
    let layer = idem.layer_with_key(TEMPLATE).map_err(|e| e.to_string())?;
    Ok(Router::new().route("/orders", post(create_order).layer(layer)))
}

async fn pg_store(url: &str, pool: u32) -> Result<PgStore, String> {
    let pool = PgPoolOptions::new()
        .max_connections(pool)
        .connect(url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
    Ok(PgStore::new(pool))
}

async fn redis_connection(env: &Env) -> Result<Counted, String> {
    let url = env
        .redis_url
        .as_deref()
        .ok_or_else(|| "no Redis server".to_owned())?;
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let conn = client
        .get_connection_manager()
        .await
        .map_err(|e| format!("Redis at {url}: {e}"))?;
    Ok(Counted::new(conn, Arc::clone(&env.redis_sent)))
}
