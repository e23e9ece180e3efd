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
use idem_tower::core::IdempotencyStore;
use idem_tower::redis::redis;
use idem_tower::sql::Dialect;
use idem_tower::sql::sqlx::postgres::PgPoolOptions;
use idem_tower::sql::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use idem_tower::sql::sqlx::{self, PgPool, Postgres, Sqlite, SqlitePool};
use idem_tower::{
    HandlerRan, Idempotency, MemoryStore, PgStore, RedisStore, SqliteStore, TieredStore, Tx,
};
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
    /// transactional mode: what the orders app runs by default.
    OrdersSqlite {
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
        )
    }
}

/// The orders endpoint's accounts; seeded by [`prepare_orders`].
const ACCOUNTS_TABLE: &str = "bench_accounts";
/// The orders endpoint's orders; emptied by [`prepare_orders`].
const ORDERS_TABLE: &str = "bench_orders";
/// Every account's balance at the start (orders may overdraw it: the
/// debit is a plain relative update, with no check).
const STARTING_BALANCE_CENTS: i64 = 1_000_000_000;

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
    /// The bare orders endpoint's pool.
    pg: Option<PgPool>,
    /// The bare orders endpoint's pool, on SQLite.
    sqlite: Option<SqlitePool>,
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

/// The orders endpoint's body: [`Order`] for one account.
#[derive(Deserialize)]
struct AccountOrder {
    account: i32,
    sku: String,
    qty: i32,
    amount_cents: i64,
}

#[derive(Serialize)]
struct Placed {
    order_id: i64,
    account: i32,
    sku: String,
    qty: i32,
    amount_cents: i64,
    balance_cents: i64,
}

/// Creates the orders endpoint's tables if missing, empties the orders and
/// gives `accounts` accounts their starting balance.
pub(crate) async fn prepare_orders(pool: &PgPool, accounts: u32) -> Result<(), String> {
    let schema = format!(
        "CREATE TABLE IF NOT EXISTS {ACCOUNTS_TABLE} (
             account_id INTEGER PRIMARY KEY, balance_cents BIGINT NOT NULL);
         CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (
             order_id BIGSERIAL PRIMARY KEY, account_id INTEGER NOT NULL,
             sku TEXT NOT NULL, qty INTEGER NOT NULL, amount_cents BIGINT NOT NULL,
             balance_cents BIGINT NOT NULL);
         TRUNCATE {ACCOUNTS_TABLE}, {ORDERS_TABLE} RESTART IDENTITY;"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema))
        .execute(pool)
        .await
        .map_err(|e| format!("the orders tables: {e}"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {ACCOUNTS_TABLE} (account_id, balance_cents) \
         SELECT a, $1 FROM generate_series(0, $2 - 1) AS a"
    )))
    .bind(STARTING_BALANCE_CENTS)
    .bind(i64::from(accounts.max(1)))
    .execute(pool)
    .await
    .map_err(|e| format!("the orders accounts: {e}"))?;
    Ok(())
}

/// A database the orders endpoint runs on: its writes, and the bare
/// endpoint's pool in the app's state.
trait OrdersDb: PlaceOrder {
    fn bare_pool(state: &AppState) -> &sqlx::Pool<Self>;
}

impl OrdersDb for Postgres {
    fn bare_pool(state: &AppState) -> &PgPool {
        state.pg.as_ref().expect("the orders endpoint's pool")
    }
}

impl OrdersDb for Sqlite {
    fn bare_pool(state: &AppState) -> &SqlitePool {
        state.sqlite.as_ref().expect("the orders endpoint's pool")
    }
}

/// The orders endpoint's writes, on any database whose sqlx types they
/// need (the `$n` parameters read the same on PostgreSQL and SQLite).
trait PlaceOrder: Dialect {
    /// Debits the account (a relative update) and inserts the order, on
    /// `conn` (inside a transaction).
    fn place_order(
        conn: &mut Self::Connection,
        order: AccountOrder,
    ) -> impl Future<Output = Result<Placed, sqlx::Error>> + Send;
}

impl<DB> PlaceOrder for DB
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB> + sqlx::Decode<'q, DB>,
    for<'q> i32: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    async fn place_order(
        conn: &mut DB::Connection,
        order: AccountOrder,
    ) -> Result<Placed, sqlx::Error> {
        let balance_cents: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "UPDATE {ACCOUNTS_TABLE} SET balance_cents = balance_cents - $1 \
             WHERE account_id = $2 RETURNING balance_cents"
        )))
        .bind(order.amount_cents)
        .bind(order.account)
        .fetch_one(&mut *conn)
        .await?;
        let order_id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {ORDERS_TABLE} (account_id, sku, qty, amount_cents, balance_cents) \
             VALUES ($1, $2, $3, $4, $5) RETURNING order_id"
        )))
        .bind(order.account)
        .bind(&order.sku)
        .bind(order.qty)
        .bind(order.amount_cents)
        .bind(balance_cents)
        .fetch_one(&mut *conn)
        .await?;
        Ok(Placed {
            order_id,
            account: order.account,
            sku: order.sku,
            qty: order.qty,
            amount_cents: order.amount_cents,
            balance_cents,
        })
    }
}

/// Creates the orders endpoint's tables in a SQLite database if missing,
/// empties the orders and gives `accounts` accounts their starting balance.
async fn prepare_sqlite_orders(pool: &SqlitePool, accounts: u32) -> Result<(), String> {
    let schema = format!(
        "CREATE TABLE IF NOT EXISTS {ACCOUNTS_TABLE} (
             account_id INTEGER PRIMARY KEY, balance_cents INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (
             order_id INTEGER PRIMARY KEY AUTOINCREMENT, account_id INTEGER NOT NULL,
             sku TEXT NOT NULL, qty INTEGER NOT NULL, amount_cents INTEGER NOT NULL,
             balance_cents INTEGER NOT NULL);
         DELETE FROM {ORDERS_TABLE};
         DELETE FROM {ACCOUNTS_TABLE};"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema))
        .execute(pool)
        .await
        .map_err(|e| format!("the orders tables: {e}"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH RECURSIVE a(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM a WHERE n + 1 < ?2) \
         INSERT INTO {ACCOUNTS_TABLE} (account_id, balance_cents) SELECT n, ?1 FROM a"
    )))
    .bind(STARTING_BALANCE_CENTS)
    .bind(i64::from(accounts.max(1)))
    .execute(pool)
    .await
    .map_err(|e| format!("the orders accounts: {e}"))?;
    Ok(())
}

fn placed(
    placed: Placed,
) -> (
    StatusCode,
    [(header::HeaderName, HeaderValue); 1],
    Json<Placed>,
) {
    let location =
        HeaderValue::try_from(format!("/orders/{}", placed.order_id)).expect("a valid header");
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(placed),
    )
}

/// The orders endpoint without idempotency: its writes in a transaction of
/// its own (the debit first, so that on SQLite it takes the write lock at
/// its first statement), committed before it answers.
async fn create_order_sql<DB: OrdersDb>(
    State(state): State<AppState>,
    Json(order): Json<AccountOrder>,
) -> axum::response::Response {
    state.calls.fetch_add(1, Ordering::Relaxed);
    let result = async {
        let mut tx = DB::bare_pool(&state).begin().await?;
        let done = DB::place_order(&mut tx, order).await?;
        if !state.delay.is_zero() {
            tokio::time::sleep(state.delay).await;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(done)
    }
    .await;
    match result {
        Ok(done) => placed(done).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The orders endpoint writing through the idempotency claim's own
/// transaction: the layer commits the writes with the stored response.
async fn create_order_tx<DB: OrdersDb>(
    State(state): State<AppState>,
    mut tx: Tx<DB>,
    Json(order): Json<AccountOrder>,
) -> Result<(HandlerRan, impl IntoResponse), StatusCode> {
    state.calls.fetch_add(1, Ordering::Relaxed);
    let done = DB::place_order(&mut tx, order)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    if !state.delay.is_zero() {
        tokio::time::sleep(state.delay).await;
    }
    Ok((HandlerRan, placed(done)))
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
        pg: None,
        sqlite: None,
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
        Kind::Sqlite { path, pool, full } => {
            let pool = sqlite_pool(&path, pool, full).await?;
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
        Kind::OrdersBare { url, pool } => {
            let pool = pg_pool(&url, pool).await?;
            state.pg = Some(pool.clone());
            (
                Router::new().route("/orders", post(create_order_sql::<Postgres>)),
                Some(pool),
                None,
            )
        }
        Kind::OrdersPg { url, pool } => {
            let store = orders_store(&url, pool).await?;
            let pool = store.pool().clone();
            (orders_router::<Postgres>(store)?, Some(pool), None)
        }
        Kind::OrdersTiered { url, pool } => {
            let truth = orders_store(&url, pool).await?;
            let pool = truth.pool().clone();
            let gate = RedisStore::new(redis_connection(&env).await?);
            (
                orders_router::<Postgres>(TieredStore::new(gate, truth))?,
                Some(pool),
                None,
            )
        }
        Kind::OrdersSqliteBare {
            path,
            pool,
            accounts,
        } => {
            let pool = sqlite_pool(&path, pool, false).await?;
            prepare_sqlite_orders(&pool, accounts).await?;
            state.sqlite = Some(pool.clone());
            (
                Router::new().route("/orders", post(create_order_sql::<Sqlite>)),
                None,
                Some(pool),
            )
        }
        Kind::OrdersSqlite {
            path,
            pool,
            accounts,
        } => {
            let pool = sqlite_pool(&path, pool, false).await?;
            prepare_sqlite_orders(&pool, accounts).await?;
            let store = SqliteStore::new(pool.clone());
            store.migrate().await.map_err(|e| e.to_string())?;
            (orders_router::<Sqlite>(store)?, None, Some(pool))
        }
    };
    Ok((app.with_state(state), calls, pg, sqlite))
}

fn idem_router(store: impl IdempotencyStore) -> Result<Router<AppState>, String> {
    let idem = Idempotency::builder(store).build();
    let layer = idem.layer_with_key(TEMPLATE).map_err(|e| e.to_string())?;
    Ok(Router::new().route("/orders", post(create_order).layer(layer)))
}

/// The orders endpoint behind idem in transactional mode, keyed as every
/// idem scenario, the handler marking its responses (`HandlerRan`).
fn orders_router<DB: OrdersDb>(store: impl IdempotencyStore) -> Result<Router<AppState>, String> {
    let idem = Idempotency::builder(store).build();
    let layer = idem
        .layer_with_key(TEMPLATE)
        .map_err(|e| e.to_string())?
        .require_handler_ran()
        .transactional()
        .map_err(|e| e.to_string())?;
    Ok(Router::new().route("/orders", post(create_order_tx::<DB>).layer(layer)))
}

/// A SQLite pool on `path` in WAL mode, syncing the disk at every commit
/// (`full`) or at checkpoints only, set up as the README advises.
async fn sqlite_pool(path: &std::path::Path, pool: u32, full: bool) -> Result<SqlitePool, String> {
    let synchronous = if full {
        SqliteSynchronous::Full
    } else {
        SqliteSynchronous::Normal
    };
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .max_connections(pool)
        // No ping per acquire: a file has no connection to go stale.
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .map_err(|e| format!("SQLite at {}: {e}", path.display()))
}

async fn pg_pool(url: &str, pool: u32) -> Result<PgPool, String> {
    PgPoolOptions::new()
        .max_connections(pool)
        .connect(url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))
}

async fn pg_store(url: &str, pool: u32) -> Result<PgStore, String> {
    Ok(PgStore::new(pg_pool(url, pool).await?))
}

/// A `PgStore` that may hold every connection of its pool in open claims,
/// as many transactions at once as the bare endpoint runs on the same pool
/// (by default it holds at most half, leaving the rest for reads through
/// the pool, which this handler does not make).
async fn orders_store(url: &str, pool: u32) -> Result<PgStore, String> {
    PgStore::builder(pg_pool(url, pool).await?)
        .max_transactions(pool as usize)
        .build()
        .map_err(|e| e.to_string())
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
