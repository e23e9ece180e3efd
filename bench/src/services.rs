//! The services the Redis and SQL scenarios run on: a private
//! `redis-server` (or `--redis`), and PostgreSQL and MySQL/MariaDB
//! databases of the benchmark's own.

use idem_test_support::redis::RedisServer;
use idem_tower::redis::redis;
use idem_tower::redis::redis::aio::MultiplexedConnection;
use idem_tower::sql::sqlx;

use crate::Outcome;
use crate::apps;
use crate::cli::{
    Args, ORDERS_BARE, ORDERS_MYSQL, ORDERS_MYSQL_BARE, ORDERS_MYSQL_HAND, ORDERS_PG,
    ORDERS_PG_HAND, ORDERS_TIERED,
};
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
        ORDERS_PG_HAND,
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
    if [ORDERS_BARE, ORDERS_PG, ORDERS_PG_HAND, ORDERS_TIERED]
        .iter()
        .any(|name| args.wants(name))
    {
        apps::prepare_orders(&pool, args.orders_accounts).await?;
    }
    pool.close().await;
    Ok(stats)
}

/// Creates the benchmark's MySQL/MariaDB database if a selected scenario
/// needs it; its URL, or `None` (with a note) if the server is not up.
/// Each MySQL row empties and seeds the orders endpoint's tables itself.
pub(crate) async fn mysql(args: &Args, outcome: &mut Outcome) -> Option<String> {
    let needed = [ORDERS_MYSQL_BARE, ORDERS_MYSQL, ORDERS_MYSQL_HAND]
        .iter()
        .any(|name| args.wants(name));
    if !needed {
        return None;
    }
    let created = async {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&args.mysql)
            .await
            .map_err(|e| format!("MySQL at {}: {e}", args.mysql))?;
        idem_tower::sql::__guards::validate_identifier(&args.mysql_database)
            .map_err(|e| e.to_string())?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE IF NOT EXISTS {}",
            args.mysql_database
        )))
        .execute(&pool)
        .await
        .map_err(|e| format!("CREATE DATABASE: {e}"))?;
        pool.close().await;
        Ok::<_, String>(format!("{}/{}", args.mysql, args.mysql_database))
    };
    match created.await {
        Ok(url) => Some(url),
        Err(err) => {
            outcome.note(format!("MySQL scenarios skipped: {err}"));
            None
        }
    }
}
