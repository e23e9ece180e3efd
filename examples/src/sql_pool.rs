//! Opening a sqlx pool from a database URL, for the example binaries.

use std::str::FromStr;
use std::time::Duration;

use idem_tower::core::sql::sqlx::{
    self, MySqlPool, PgPool, SqlitePool,
    mysql::MySqlPoolOptions,
    postgres::PgPoolOptions,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
};

/// A pool on one of the three databases.
#[derive(Debug, Clone)]
pub enum SqlPool {
    /// `postgres://...` or `postgresql://...`.
    Postgres(PgPool),
    /// `mysql://...` or `mariadb://...`.
    MySql(MySqlPool),
    /// `sqlite://PATH`, created if missing, in WAL mode.
    Sqlite(SqlitePool),
}

impl SqlPool {
    /// Connects to `url` with up to `max_connections` (SQLite, one writer at
    /// a time, gets at most 8).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, sqlx::Error> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new().max_connections(max_connections);
            Ok(Self::Postgres(pool.connect(url).await?))
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let pool = MySqlPoolOptions::new().max_connections(max_connections);
            Ok(Self::MySql(
                pool.connect(&url.replacen("mariadb://", "mysql://", 1))
                    .await?,
            ))
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10));
            let pool = SqlitePoolOptions::new().max_connections(max_connections.min(8));
            Ok(Self::Sqlite(pool.connect_with(options).await?))
        } else {
            Err(sqlx::Error::Configuration(
                format!(
                    "unsupported database {url:?}: use sqlite://PATH, postgres://... or mysql://..."
                )
                .into(),
            ))
        }
    }
}
