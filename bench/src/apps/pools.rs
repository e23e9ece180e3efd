//! The connections the apps and their stores run on.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_tower::PgStore;
use idem_tower::redis::redis;
use idem_tower::sql::sqlx::mysql::MySqlPoolOptions;
use idem_tower::sql::sqlx::postgres::PgPoolOptions;
use idem_tower::sql::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use idem_tower::sql::sqlx::{MySqlPool, PgPool, SqlitePool};

use super::Env;
use crate::stats::Counted;

/// A SQLite pool on `path` in WAL mode, syncing the disk at every commit
/// (`full`) or at checkpoints only, set up as docs/operations.md advises.
pub(super) async fn sqlite_pool(path: &Path, pool: u32, full: bool) -> Result<SqlitePool, String> {
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

/// A PostgreSQL pool of `pool` connections on `url`.
pub(super) async fn pg_pool(url: &str, pool: u32) -> Result<PgPool, String> {
    PgPoolOptions::new()
        .max_connections(pool)
        .connect(url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))
}

/// A MySQL/MariaDB pool of `pool` connections on `url`.
pub(super) async fn mysql_pool(url: &str, pool: u32) -> Result<MySqlPool, String> {
    MySqlPoolOptions::new()
        .max_connections(pool)
        .connect(url)
        .await
        .map_err(|e| format!("MySQL at {url}: {e}"))
}

/// A `PgStore` on a pool of `pool` connections on `url`.
pub(super) async fn pg_store(url: &str, pool: u32) -> Result<PgStore, String> {
    Ok(PgStore::new(pg_pool(url, pool).await?))
}

/// A counted connection to the Redis scenarios' server.
pub(super) async fn redis_connection(env: &Env) -> Result<Counted, String> {
    let url = env
        .redis_url
        .as_deref()
        .ok_or_else(|| "no Redis server".to_owned())?;
    let client = redis::Client::open(nodelay(url)?).map_err(|e| e.to_string())?;
    let conn = client
        .get_connection_manager()
        .await
        .map_err(|e| format!("Redis at {url}: {e}"))?;
    Ok(Counted::new(conn, Arc::clone(&env.redis_sent)))
}

/// `url`'s connection settings with `TCP_NODELAY` on, which redis-rs leaves
/// off: with it off, a command written while the one before it awaits its
/// answer on the shared connection waits for that answer's ACK, a round
/// trip more over a network.
fn nodelay(url: &str) -> Result<redis::ConnectionInfo, String> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info().map_err(|e| e.to_string())?;
    Ok(info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true)))
}
