//! The backends the orders app runs on, and reaching their servers: URLs
//! from `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL` and
//! `IDEM_TEST_REDIS_URL` (defaults: the local services); a server that is
//! not there skips the test, or fails it under `CI=true`.

use idem_test_support::{mysql_url, pgbouncer_url, postgres_url, redis_url, server_missing};

use crate::nonce;

/// Where the app keeps its data and idempotency records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `MemoryStore` and the in-memory database.
    Memory,
    /// A fresh SQLite file.
    Sqlite,
    /// PostgreSQL at `IDEM_TEST_POSTGRES_URL`.
    Postgres,
    /// MariaDB / MySQL at `IDEM_TEST_MYSQL_URL`.
    MySql,
    /// The in-memory database with Redis (`IDEM_TEST_REDIS_URL`) alone
    /// keeping the records.
    Redis,
    /// PostgreSQL behind the Redis gate: the tiered store.
    PostgresWithRedis,
    /// PostgreSQL through PgBouncer in transaction pooling
    /// (`IDEM_TEST_PGBOUNCER_URL`), the app told so (`?pooler=transaction`:
    /// its own statements unnamed, in transactions).
    PgBouncer,
}

impl Backend {
    /// The `--database` value for this backend, or `None` (after saying why,
    /// or failing under `CI=true`) if its server cannot be reached.
    pub async fn database_url(self) -> Option<String> {
        let url = match self {
            Self::Memory | Self::Redis => return Some("memory".into()),
            Self::Sqlite => {
                let path = std::env::temp_dir().join(format!("idem-orders-{}.db", nonce()));
                return Some(format!("sqlite://{}", path.display()));
            }
            Self::Postgres | Self::PostgresWithRedis => postgres_url(),
            Self::MySql => mysql_url(),
            Self::PgBouncer => {
                let url = pgbouncer_url();
                let joint = if url.contains('?') { '&' } else { '?' };
                format!("{url}{joint}pooler=transaction")
            }
        };
        let addr = url
            .split('@')
            .nth(1)
            .and_then(|rest| rest.split(['/', '?']).next())
            .unwrap_or("127.0.0.1");
        reachable(&format!("{self:?}"), &url, addr)
            .await
            .then_some(url)
    }

    /// The `--redis` value for this backend, if it has one, or `None` (after
    /// saying why, or failing under `CI=true`) if Redis cannot be reached.
    pub async fn redis_url(self) -> Option<Option<String>> {
        match self {
            Self::Redis | Self::PostgresWithRedis => {
                let url = redis_url();
                let addr = url.trim_start_matches("redis://").to_owned();
                reachable("Redis", &url, &addr).await.then_some(Some(url))
            }
            _ => Some(None),
        }
    }
}

async fn reachable(what: &str, url: &str, addr: &str) -> bool {
    match tokio::net::TcpStream::connect(addr).await {
        Ok(_) => true,
        Err(err) => server_missing::<()>(what, url, err).is_some(),
    }
}
