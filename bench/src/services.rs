//! The services the Redis and PostgreSQL scenarios run on: a private
//! `redis-server` (or `--redis`), and a PostgreSQL database of the
//! benchmark's own.

use idem_test_support::redis::RedisServer;
use idem_tower::redis::redis;
use idem_tower::redis::redis::aio::MultiplexedConnection;
use idem_tower::sql::sqlx;

use crate::Outcome;
use crate::apps;
use crate::cli::{Args, ORDERS_BARE, ORDERS_PG, ORDERS_TIERED};
use crate::stats::PgStats;

/// The Redis of the Redis scenarios.
pub(crate) struct Redis {
    /// The private server, if one started; it stops when dropped.
    pub(crate) server: Option<RedisServer>,
    /// Where the scenarios reach it; `None` if none is needed or it did
    /// not answer.
    pub(crate) url: Option<String>,
    /// The connection that reads its `INFO`.
    pub(crate) info: Option<MultiplexedConnection>,
}

/// Starts a private `redis-server` if a selected scenario needs Redis, so
/// that its counts are ours alone; falls back on `--redis`, with a note.
pub(crate) async fn redis(args: &Args, outcome: &mut Outcome) -> Redis {
    let needs_redis =
        args.wants("bare-redis") || args.wants("tiered") || args.wants("orders-tiered");
    let server = if needs_redis {
        RedisServer::start(&[])
    } else {
        None
    };
    let url = match &server {
        Some(server) => Some(server.url()),
        None if needs_redis => {
            outcome.note(format!(
                "no private redis-server could be started; used {} (its command counts may include other clients)",
                args.redis
            ));
            Some(args.redis.clone())
        }
        None => None,
    };
    let info = match &url {
        Some(url) => match info_connection(url).await {
            Ok(conn) => Some(conn),
            Err(err) => {
                outcome.note(format!("Redis scenarios skipped: {err}"));
                None
            }
        },
        None => None,
    };
    let url = info.as_ref().and(url);
    Redis { server, url, info }
}

/// The connection that reads the server's `INFO`.
async fn info_connection(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("Redis at {url}: {e}"))
}

/// Prepares the benchmark's database if a selected scenario needs
/// PostgreSQL; its statistics, or `None` (with a note) if it is not up.
pub(crate) async fn postgres(args: &Args, outcome: &mut Outcome) -> Option<PgStats> {
    let needed = [
        "postgres",
        "tiered",
        "storm",
        ORDERS_BARE,
        ORDERS_PG,
        ORDERS_TIERED,
    ]
    .iter()
    .any(|name| args.wants(name));
    if !needed {
        return None;
    }
    match prepare_postgres(args).await {
        Ok(stats) => Some(stats),
        Err(err) => {
            outcome.note(format!("PostgreSQL scenarios skipped: {err}"));
            None
        }
    }
}

/// Creates the benchmark's database if missing, empties its records table
/// and, for the orders endpoint, seeds its accounts.
async fn prepare_postgres(args: &Args) -> Result<PgStats, String> {
    let stats = PgStats::connect(&args.postgres, &args.pg_database, args.pg_settle).await?;
    let url = format!("{}/{}", args.postgres, args.pg_database);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
    let store = idem_tower::PgStore::new(pool.clone());
    store.migrate().await.map_err(|e| e.to_string())?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("TRUNCATE {}", store.table())))
        .execute(&pool)
        .await
        .map_err(|e| format!("TRUNCATE: {e}"))?;
    if [ORDERS_BARE, ORDERS_PG, ORDERS_TIERED]
        .iter()
        .any(|name| args.wants(name))
    {
        apps::prepare_orders(&pool, args.orders_accounts).await?;
    }
    pool.close().await;
    Ok(stats)
}
