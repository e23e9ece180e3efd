//! The servers under load: one axum app per scenario, each on a task of
//! the server runtime, bound to `127.0.0.1:0`.

mod handlers;
mod handwritten;
mod orders;
mod pools;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use axum_idempotent::{IdempotentLayer, IdempotentOptions};
use idem_tower::core::IdempotencyStore;
use idem_tower::sql::sqlx::{MySqlPool, PgPool, SqlitePool};
use idem_tower::{Idempotency, MemoryStore, RedisStore, SqliteStore, TieredStore};
use ruts::store::moka::MokaStore;
use ruts::{CookieOptions, SessionLayer};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tower_cookies::CookieManagerLayer;

use crate::stats::Counted;
use handlers::{create_order, create_order_after_get, login};
pub(crate) use orders::prepare_orders;
use pools::{pg_store, redis_connection, sqlite_pool};

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
    /// idem's layer on SQLite, in `path`, in WAL mode, syncing the disk at
    /// every commit (`full`) or at checkpoints only.
    Sqlite {
        path: PathBuf,
        pool: u32,
        full: bool,
    },
    /// idem's layer on PostgreSQL.
    Postgres { url: String, pool: u32 },
    /// idem's layer on Redis in front of PostgreSQL.
    Tiered { url: String, pool: u32 },
    /// axum-idempotent, set up as its README shows.
    Peer,
    /// The orders endpoint (an order row and a balance debit in one
    /// PostgreSQL transaction), without idempotency.
    OrdersBare { url: String, pool: u32 },
    /// The orders endpoint writing through idem's `Tx` on PostgreSQL, in
    /// transactional mode.
    OrdersPg { url: String, pool: u32 },
    /// The same behind the Redis gate (`TieredStore`), transactional.
    OrdersTiered { url: String, pool: u32 },
    /// The orders endpoint on SQLite (WAL, `synchronous = NORMAL`, as the
    /// orders app runs it), without idempotency.
    OrdersSqliteBare {
        path: PathBuf,
        pool: u32,
        accounts: u32,
    },
    /// The orders endpoint on SQLite writing through idem's `Tx`, in
    /// transactional mode: what the orders app runs by default; with
    /// `sole_writer`, the store built as the file's only writer.
    OrdersSqlite {
        path: PathBuf,
        pool: u32,
        accounts: u32,
        sole_writer: bool,
    },
    /// The orders endpoint on MySQL/MariaDB, without idempotency.
    OrdersMysqlBare {
        url: String,
        pool: u32,
        accounts: u32,
    },
    /// The orders endpoint on MySQL/MariaDB writing through idem's `Tx`,
    /// in transactional mode.
    OrdersMysql {
        url: String,
        pool: u32,
        accounts: u32,
    },
    /// The orders endpoint with deduplication written by hand, on
    /// PostgreSQL (`handwritten.rs`).
    OrdersPgHand { url: String, pool: u32 },
    /// The same on MySQL/MariaDB.
    OrdersMysqlHand {
        url: String,
        pool: u32,
        accounts: u32,
    },
    /// The same on SQLite (`synchronous = NORMAL`).
    OrdersSqliteHand {
        path: PathBuf,
        pool: u32,
        accounts: u32,
    },
}

impl Kind {
    /// Whether this is the orders endpoint, whose body names an account.
    pub(crate) fn orders(&self) -> bool {
        matches!(
            self,
            Self::OrdersBare { .. }
                | Self::OrdersPg { .. }
                | Self::OrdersTiered { .. }
                | Self::OrdersSqliteBare { .. }
                | Self::OrdersSqlite { .. }
                | Self::OrdersMysqlBare { .. }
                | Self::OrdersMysql { .. }
                | Self::OrdersPgHand { .. }
                | Self::OrdersMysqlHand { .. }
                | Self::OrdersSqliteHand { .. }
        )
    }
}

/// Connections the scenarios share.
#[derive(Clone)]
pub(crate) struct Env {
    /// The Redis server of the Redis scenarios.
    pub(crate) redis_url: Option<String>,
    /// Commands sent through [`Counted`] connections.
    pub(crate) redis_sent: Arc<AtomicU64>,
}

/// What the handlers share.
#[derive(Clone)]
struct AppState {
    /// Handler invocations.
    calls: Arc<AtomicUsize>,
    redis: Option<Counted>,
    /// The bare orders endpoint's pool.
    pg: Option<PgPool>,
    /// The bare orders endpoint's pool, on SQLite.
    sqlite: Option<SqlitePool>,
    /// The bare orders endpoint's pool, on MySQL/MariaDB.
    mysql: Option<MySqlPool>,
    /// Simulated work in the handler (zero under load).
    delay: Duration,
}

/// A running scenario server.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    /// Handler invocations.
    pub(crate) calls: Arc<AtomicUsize>,
    shutdown: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
    pools: Pools,
}

/// The database pools a scenario's app runs on, closed when it stops.
#[derive(Default)]
pub(crate) struct Pools {
    pg: Option<PgPool>,
    sqlite: Option<SqlitePool>,
    mysql: Option<MySqlPool>,
}

impl Pools {
    fn pg(pool: PgPool) -> Self {
        Self {
            pg: Some(pool),
            ..Self::default()
        }
    }

    fn sqlite(pool: SqlitePool) -> Self {
        Self {
            sqlite: Some(pool),
            ..Self::default()
        }
    }

    fn mysql(pool: MySqlPool) -> Self {
        Self {
            mysql: Some(pool),
            ..Self::default()
        }
    }

    /// Closes every pool (PostgreSQL then flushes their statistics).
    async fn close(self) {
        if let Some(pool) = self.pg {
            pool.close().await;
        }
        if let Some(pool) = self.sqlite {
            pool.close().await;
        }
        if let Some(pool) = self.mysql {
            pool.close().await;
        }
    }
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
            let (app, calls, pools) = match built {
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
            let _ = ready_tx.send(Ok((addr, calls, pools)));
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = shutdown_rx.await;
                })
                .await;
        });
        let (addr, calls, pools) = ready_rx
            .await
            .map_err(|_| "the server task ended before it was ready".to_owned())??;
        Ok(Self {
            addr,
            calls,
            shutdown,
            done,
            pools,
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
        self.pools.close().await;
    }
}

/// `kind`'s app without a server, its handler taking no time: for the
/// requests sent through it in process (`instructions.rs`). Redis
/// scenarios have no server here.
pub(crate) async fn router(kind: Kind) -> Result<Router, String> {
    let env = Env {
        redis_url: None,
        redis_sent: Arc::new(AtomicU64::new(0)),
    };
    let (app, _, _) = build(kind, env, Duration::ZERO).await?;
    Ok(app)
}

/// A scenario's app, its handler invocations and the database pools to
/// close when it stops.
type Built = (Router, Arc<AtomicUsize>, Pools);

/// A scenario's routes, and the database pools to close when it stops.
type Routes = (Router<AppState>, Pools);

/// Builds `kind`'s app, its handler taking `delay`.
async fn build(kind: Kind, env: Env, delay: Duration) -> Result<Built, String> {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut state = AppState {
        calls: Arc::clone(&calls),
        redis: None,
        pg: None,
        sqlite: None,
        mysql: None,
        delay,
    };
    let (app, pools) = match kind {
        Kind::Bare => (
            Router::new().route("/orders", post(create_order)),
            Pools::default(),
        ),
        Kind::BareRedisGet => {
            state.redis = Some(redis_connection(&env).await?);
            (
                Router::new().route("/orders", post(create_order_after_get)),
                Pools::default(),
            )
        }
        Kind::Memory => (idem_router(MemoryStore::new())?, Pools::default()),
        Kind::Sqlite { path, pool, full } => {
            let pool = sqlite_pool(&path, pool, full).await?;
            let store = SqliteStore::new(pool.clone());
            store.migrate().await.map_err(|e| e.to_string())?;
            (idem_router(store)?, Pools::sqlite(pool))
        }
        Kind::Postgres { url, pool } => {
            let store = pg_store(&url, pool).await?;
            let pool = store.pool().clone();
            (idem_router(store)?, Pools::pg(pool))
        }
        Kind::Tiered { url, pool } => {
            let truth = pg_store(&url, pool).await?;
            let pool = truth.pool().clone();
            let gate = RedisStore::new(redis_connection(&env).await?);
            (idem_router(TieredStore::new(gate, truth))?, Pools::pg(pool))
        }
        Kind::Peer => (peer_router(), Pools::default()),
        Kind::OrdersBare { url, pool } => orders::bare_on_postgres(&url, pool, &mut state).await?,
        Kind::OrdersPg { url, pool } => orders::idem_on_postgres(&url, pool).await?,
        Kind::OrdersTiered { url, pool } => orders::idem_behind_redis(&url, pool, &env).await?,
        Kind::OrdersSqliteBare {
            path,
            pool,
            accounts,
        } => orders::bare_on_sqlite(&path, pool, accounts, &mut state).await?,
        Kind::OrdersSqlite {
            path,
            pool,
            accounts,
            sole_writer,
        } => orders::idem_on_sqlite(&path, pool, accounts, sole_writer).await?,
        Kind::OrdersMysqlBare {
            url,
            pool,
            accounts,
        } => orders::bare_on_mysql(&url, pool, accounts, &mut state).await?,
        Kind::OrdersMysql {
            url,
            pool,
            accounts,
        } => orders::idem_on_mysql(&url, pool, accounts).await?,
        Kind::OrdersPgHand { url, pool } => {
            handwritten::on_postgres(&url, pool, &mut state).await?
        }
        Kind::OrdersMysqlHand {
            url,
            pool,
            accounts,
        } => handwritten::on_mysql(&url, pool, accounts, &mut state).await?,
        Kind::OrdersSqliteHand {
            path,
            pool,
            accounts,
        } => handwritten::on_sqlite(&path, pool, accounts, &mut state).await?,
    };
    Ok((app.with_state(state), calls, pools))
}

/// The peer's app, as axum-idempotent's README sets it up: the in-process
/// moka session store, the key from the Idempotency-Key header, responses
/// kept 5 minutes, layers in the documented order.
fn peer_router() -> Router<AppState> {
    let store = Arc::new(MokaStore::builder().build());
    let options = IdempotentOptions::default()
        .use_idempotency_key_header(Some("Idempotency-Key"), true)
        .expire_after(60 * 5);
    Router::new()
        .route("/orders", post(create_order))
        .route("/login", post(login))
        .layer(IdempotentLayer::<MokaStore>::new(options))
        .layer(SessionLayer::new(store).with_cookie_options(CookieOptions::build().name("session")))
        .layer(CookieManagerLayer::new())
}

/// `create_order` behind idem's layer on `store`.
fn idem_router(store: impl IdempotencyStore) -> Result<Router<AppState>, String> {
    let idem = Idempotency::builder(store).build();
    let layer = idem.layer_with_key(TEMPLATE).map_err(|e| e.to_string())?;
    Ok(Router::new().route("/orders", post(create_order).layer(layer)))
}
