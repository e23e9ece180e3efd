//! The orders endpoint: an order row and a balance debit in one
//! transaction, on PostgreSQL, MySQL/MariaDB or SQLite, bare or behind idem
//! in transactional mode (with deduplication written by hand beside it:
//! `handwritten.rs`).

use std::path::Path;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use idem_tower::core::IdempotencyStore;
use idem_tower::sql::Dialect;
use idem_tower::sql::sqlx::{self, MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool};
use idem_tower::{
    HandlerRan, Idempotency, MySqlStore, PgStore, RedisStore, SqliteStore, TieredStore, Tx,
};
use serde::{Deserialize, Serialize};

use super::pools::{mysql_pool, pg_pool, redis_connection, sqlite_pool};
use super::{AppState, Env, Pools, Routes, TEMPLATE};

/// The orders endpoint's accounts; seeded by [`prepare_orders`].
const ACCOUNTS_TABLE: &str = "bench_accounts";
/// The orders endpoint's orders; emptied by [`prepare_orders`].
const ORDERS_TABLE: &str = "bench_orders";
/// The hand-written deduplication's table (`handwritten.rs`); emptied by
/// [`prepare_orders`].
pub(super) const DEDUP_TABLE: &str = "bench_dedup";
/// Every account's balance at the start (orders may overdraw it: the
/// debit is a plain relative update, with no check).
const STARTING_BALANCE_CENTS: i64 = 1_000_000_000;

/// The orders endpoint's body: [`Order`](super::handlers::Order) for one account.
#[derive(Deserialize)]
pub(super) struct AccountOrder {
    account: i32,
    sku: String,
    qty: i32,
    amount_cents: i64,
}

/// The answer to an [`AccountOrder`], with the account's new balance.
#[derive(Serialize)]
pub(super) struct Placed {
    pub(super) order_id: i64,
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
         CREATE TABLE IF NOT EXISTS {DEDUP_TABLE} (
             tenant TEXT NOT NULL, idem_key TEXT NOT NULL, fingerprint BIGINT NOT NULL,
             status INTEGER, location TEXT, body BYTEA,
             created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             PRIMARY KEY (tenant, idem_key));
         TRUNCATE {ACCOUNTS_TABLE}, {ORDERS_TABLE}, {DEDUP_TABLE} RESTART IDENTITY;"
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
pub(super) trait OrdersDb: PlaceOrder {
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

impl OrdersDb for MySql {
    fn bare_pool(state: &AppState) -> &MySqlPool {
        state.mysql.as_ref().expect("the orders endpoint's pool")
    }
}

/// The orders endpoint's writes on one database.
pub(super) trait PlaceOrder: Dialect {
    /// Debits the account (a relative update) and inserts the order, on
    /// `conn` (inside a transaction).
    fn place_order(
        conn: &mut Self::Connection,
        order: AccountOrder,
    ) -> impl Future<Output = Result<Placed, sqlx::Error>> + Send;
}

impl PlaceOrder for Postgres {
    async fn place_order(
        conn: &mut Self::Connection,
        order: AccountOrder,
    ) -> Result<Placed, sqlx::Error> {
        place_order_returning::<Self>(conn, order).await
    }
}

impl PlaceOrder for Sqlite {
    async fn place_order(
        conn: &mut Self::Connection,
        order: AccountOrder,
    ) -> Result<Placed, sqlx::Error> {
        place_order_returning::<Self>(conn, order).await
    }
}

impl PlaceOrder for MySql {
    /// MySQL has no `RETURNING` on `UPDATE`: the new balance is read back
    /// (the transaction sees its own write), the order's id is the insert's.
    async fn place_order(
        conn: &mut Self::Connection,
        order: AccountOrder,
    ) -> Result<Placed, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {ACCOUNTS_TABLE} SET balance_cents = balance_cents - ? WHERE account_id = ?"
        )))
        .bind(order.amount_cents)
        .bind(order.account)
        .execute(&mut *conn)
        .await?;
        let balance_cents: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT balance_cents FROM {ACCOUNTS_TABLE} WHERE account_id = ?"
        )))
        .bind(order.account)
        .fetch_one(&mut *conn)
        .await?;
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {ORDERS_TABLE} (account_id, sku, qty, amount_cents, balance_cents) \
             VALUES (?, ?, ?, ?, ?)"
        )))
        .bind(order.account)
        .bind(&order.sku)
        .bind(order.qty)
        .bind(order.amount_cents)
        .bind(balance_cents)
        .execute(&mut *conn)
        .await?;
        Ok(Placed {
            order_id: i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX),
            account: order.account,
            sku: order.sku,
            qty: order.qty,
            amount_cents: order.amount_cents,
            balance_cents,
        })
    }
}

/// The orders endpoint's writes with `UPDATE ... RETURNING`, on a database
/// that has it and reads `$n` parameters (PostgreSQL, SQLite).
async fn place_order_returning<DB>(
    conn: &mut DB::Connection,
    order: AccountOrder,
) -> Result<Placed, sqlx::Error>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB> + sqlx::Decode<'q, DB>,
    for<'q> i32: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
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

/// Creates the orders endpoint's tables in a SQLite database if missing,
/// empties the orders and gives `accounts` accounts their starting balance.
pub(super) async fn prepare_sqlite_orders(pool: &SqlitePool, accounts: u32) -> Result<(), String> {
    let schema = format!(
        "CREATE TABLE IF NOT EXISTS {ACCOUNTS_TABLE} (
             account_id INTEGER PRIMARY KEY, balance_cents INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (
             order_id INTEGER PRIMARY KEY AUTOINCREMENT, account_id INTEGER NOT NULL,
             sku TEXT NOT NULL, qty INTEGER NOT NULL, amount_cents INTEGER NOT NULL,
             balance_cents INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS {DEDUP_TABLE} (
             tenant TEXT NOT NULL, idem_key TEXT NOT NULL, fingerprint INTEGER NOT NULL,
             status INTEGER, location TEXT, body BLOB,
             created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
             PRIMARY KEY (tenant, idem_key));
         DELETE FROM {ORDERS_TABLE};
         DELETE FROM {ACCOUNTS_TABLE};
         DELETE FROM {DEDUP_TABLE};"
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

/// A `201` with the placed order and its `Location`.
pub(super) fn placed(
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

/// The bare endpoint on PostgreSQL, its pool in the app's state.
pub(super) async fn bare_on_postgres(
    url: &str,
    pool: u32,
    state: &mut AppState,
) -> Result<Routes, String> {
    let pool = pg_pool(url, pool).await?;
    state.pg = Some(pool.clone());
    Ok((
        Router::new().route("/orders", post(create_order_sql::<Postgres>)),
        Pools::pg(pool),
    ))
}

/// The endpoint behind idem on PostgreSQL.
pub(super) async fn idem_on_postgres(url: &str, pool: u32) -> Result<Routes, String> {
    let store = orders_store(url, pool).await?;
    let pool = store.pool().clone();
    Ok((orders_router::<Postgres>(store)?, Pools::pg(pool)))
}

/// The endpoint behind idem on Redis in front of PostgreSQL.
pub(super) async fn idem_behind_redis(url: &str, pool: u32, env: &Env) -> Result<Routes, String> {
    let truth = orders_store(url, pool).await?;
    let pool = truth.pool().clone();
    let gate = RedisStore::new(redis_connection(env).await?);
    Ok((
        orders_router::<Postgres>(TieredStore::new(gate, truth))?,
        Pools::pg(pool),
    ))
}

/// The bare endpoint on SQLite (`synchronous = NORMAL`), its pool in the
/// app's state.
pub(super) async fn bare_on_sqlite(
    path: &Path,
    pool: u32,
    accounts: u32,
    state: &mut AppState,
) -> Result<Routes, String> {
    let pool = sqlite_pool(path, pool, false).await?;
    prepare_sqlite_orders(&pool, accounts).await?;
    state.sqlite = Some(pool.clone());
    Ok((
        Router::new().route("/orders", post(create_order_sql::<Sqlite>)),
        Pools::sqlite(pool),
    ))
}

/// The endpoint behind idem on SQLite (`synchronous = NORMAL`); with
/// `sole_writer`, the store built as the file's only writer.
pub(super) async fn idem_on_sqlite(
    path: &Path,
    pool: u32,
    accounts: u32,
    sole_writer: bool,
) -> Result<Routes, String> {
    let pool = sqlite_pool(path, pool, false).await?;
    prepare_sqlite_orders(&pool, accounts).await?;
    let store = SqliteStore::builder(pool.clone())
        .sole_writer(sole_writer)
        .build()
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    Ok((orders_router::<Sqlite>(store)?, Pools::sqlite(pool)))
}

/// The bare endpoint on MySQL/MariaDB, its pool in the app's state.
pub(super) async fn bare_on_mysql(
    url: &str,
    pool: u32,
    accounts: u32,
    state: &mut AppState,
) -> Result<Routes, String> {
    let pool = mysql_pool(url, pool).await?;
    prepare_mysql_orders(&pool, accounts).await?;
    state.mysql = Some(pool.clone());
    Ok((
        Router::new().route("/orders", post(create_order_sql::<MySql>)),
        Pools::mysql(pool),
    ))
}

/// The endpoint behind idem on MySQL/MariaDB.
pub(super) async fn idem_on_mysql(url: &str, pool: u32, accounts: u32) -> Result<Routes, String> {
    let size = pool;
    let pool = mysql_pool(url, pool).await?;
    prepare_mysql_orders(&pool, accounts).await?;
    let store = MySqlStore::builder(pool.clone())
        .max_transactions(size as usize)
        .build()
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    Ok((orders_router::<MySql>(store)?, Pools::mysql(pool)))
}

/// Creates the orders endpoint's tables in a MySQL/MariaDB database if
/// missing, empties them and gives `accounts` accounts their starting
/// balance.
pub(super) async fn prepare_mysql_orders(pool: &MySqlPool, accounts: u32) -> Result<(), String> {
    let schema = format!(
        "CREATE TABLE IF NOT EXISTS {ACCOUNTS_TABLE} (
             account_id INT PRIMARY KEY, balance_cents BIGINT NOT NULL) ENGINE = InnoDB;
         CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (
             order_id BIGINT AUTO_INCREMENT PRIMARY KEY, account_id INT NOT NULL,
             sku VARCHAR(64) NOT NULL, qty INT NOT NULL, amount_cents BIGINT NOT NULL,
             balance_cents BIGINT NOT NULL) ENGINE = InnoDB;
         CREATE TABLE IF NOT EXISTS {DEDUP_TABLE} (
             tenant VARBINARY(255) NOT NULL, idem_key VARBINARY(255) NOT NULL,
             fingerprint BIGINT NOT NULL, status INT NULL, location VARCHAR(255) NULL,
             body LONGBLOB NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
             PRIMARY KEY (tenant, idem_key)) ENGINE = InnoDB;
         TRUNCATE {ACCOUNTS_TABLE};
         TRUNCATE {ORDERS_TABLE};
         TRUNCATE {DEDUP_TABLE};"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema))
        .execute(pool)
        .await
        .map_err(|e| format!("the orders tables: {e}"))?;
    let values: Vec<String> = (0..accounts.max(1))
        .map(|a| format!("({a}, {STARTING_BALANCE_CENTS})"))
        .collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {ACCOUNTS_TABLE} (account_id, balance_cents) VALUES {}",
        values.join(", ")
    )))
    .execute(pool)
    .await
    .map_err(|e| format!("the orders accounts: {e}"))?;
    Ok(())
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
