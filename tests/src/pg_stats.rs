//! Counting database transactions from PostgreSQL's own statistics.

use std::time::{Duration, Instant};

use idem_tower::sql::sqlx::{self, PgPool};

use crate::Backend;

/// Transactions of one database, as `pg_stat_database` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transactions {
    /// `xact_commit`.
    pub commits: i64,
    /// `xact_rollback`.
    pub rollbacks: i64,
}

/// A database of a measurement's own, and a connection to another one
/// to read its statistics from (reading commits nothing there).
pub struct PgStats {
    server: String,
    database: String,
    observer: PgPool,
}

impl PgStats {
    /// Creates `database` if missing; `None` if PostgreSQL is not there
    /// (a failure under `CI=true`).
    pub async fn for_database(database: &str) -> Option<Self> {
        let url = Backend::Postgres.database_url().await?;
        let server = url
            .rsplit_once('/')
            .expect("a URL with a database")
            .0
            .to_owned();
        let observer = PgPool::connect(&format!("{server}/postgres"))
            .await
            .expect("an observer connection");
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(database)
                .fetch_one(&observer)
                .await
                .expect("pg_database");
        if !exists {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
                .execute(&observer)
                .await
                .expect("create the measurement database");
        }
        Some(Self {
            server,
            database: database.to_owned(),
            observer,
        })
    }

    /// The URL of the measured database.
    pub fn url(&self) -> String {
        format!("{}/{}", self.server, self.database)
    }

    /// The counts once they stop moving. PostgreSQL 15 flushes a
    /// backend's statistics lazily, up to 10 s late
    /// (`PGSTAT_IDLE_INTERVAL`), so a reading waits until nothing has
    /// changed for longer than that.
    pub async fn settled(&self) -> Transactions {
        let read = || async {
            let (commits, rollbacks): (i64, i64) = sqlx::query_as(
                "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1",
            )
            .bind(&self.database)
            .fetch_one(&self.observer)
            .await
            .expect("pg_stat_database");
            Transactions { commits, rollbacks }
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = read().await;
        let mut stable_since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = read().await;
            if now != last {
                last = now;
                stable_since = Instant::now();
            } else if stable_since.elapsed() >= Duration::from_millis(10_500) {
                return now;
            }
            assert!(Instant::now() < deadline, "pg_stat_database never settled");
        }
    }
}
