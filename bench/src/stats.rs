//! Counting what a scenario asks of its stores: Redis commands (sent by
//! the client, and as the server's `INFO` sees them) and PostgreSQL
//! transactions (`pg_stat_database` of a database of the benchmark's own).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_tower::redis::redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use idem_tower::redis::redis::{self, Cmd, Pipeline, RedisFuture, Value};
use idem_tower::sql::sqlx::{self, PgPool};

/// A `ConnectionManager` that counts the commands sent through it: one
/// relaxed atomic add per command, the same in every scenario that uses it.
#[derive(Clone)]
pub(crate) struct Counted {
    conn: ConnectionManager,
    sent: Arc<AtomicU64>,
}

impl Counted {
    pub(crate) fn new(conn: ConnectionManager, sent: Arc<AtomicU64>) -> Self {
        Self { conn, sent }
    }
}

impl ConnectionLike for Counted {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.sent
            .fetch_add(pipeline.len() as u64, Ordering::Relaxed);
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// The server's own counts: `total_commands_processed` and the calls of
/// each command (`INFO commandstats`). Both include the commands a Lua
/// script runs with `redis.call`.
#[derive(Debug, Clone, Default)]
pub(crate) struct RedisInfo {
    pub(crate) total: u64,
    pub(crate) calls: BTreeMap<String, u64>,
}

impl RedisInfo {
    /// One `INFO stats commandstats` (itself one command, not counted in
    /// its own answer).
    pub(crate) async fn read(conn: &mut MultiplexedConnection) -> Result<Self, String> {
        let text: String = redis::cmd("INFO")
            .arg("stats")
            .arg("commandstats")
            .query_async(conn)
            .await
            .map_err(|e| format!("INFO: {e}"))?;
        let mut info = Self::default();
        for line in text.lines() {
            if let Some(total) = line.strip_prefix("total_commands_processed:") {
                info.total = total.trim().parse().unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                let calls = fields
                    .split(',')
                    .find_map(|f| f.strip_prefix("calls="))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                info.calls.insert(name.to_owned(), calls);
            }
        }
        Ok(info)
    }

    /// What happened between `before` and `self`, without the one `INFO`
    /// that read `before`: (total commands, calls per command).
    pub(crate) fn since(&self, before: &Self) -> (u64, BTreeMap<String, u64>) {
        let total = self.total.saturating_sub(before.total).saturating_sub(1);
        let calls = self
            .calls
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .filter_map(|(name, &n)| {
                let delta = n.saturating_sub(before.calls.get(name).copied().unwrap_or(0));
                (delta > 0).then(|| (name.clone(), delta))
            })
            .collect();
        (total, calls)
    }
}

/// Transactions of the benchmark's database, read from another database so
/// that reading commits nothing there.
pub(crate) struct PgStats {
    observer: PgPool,
    database: String,
    settle: Duration,
}

/// `xact_commit`, `xact_rollback`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Transactions {
    pub(crate) commits: i64,
    pub(crate) rollbacks: i64,
}

impl PgStats {
    /// Connects to `{server}/postgres` and creates `database` if missing.
    pub(crate) async fn connect(
        server: &str,
        database: &str,
        settle: Duration,
    ) -> Result<Self, String> {
        let observer = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&format!("{server}/postgres"))
            .await
            .map_err(|e| format!("PostgreSQL at {server}: {e}"))?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(database)
                .fetch_one(&observer)
                .await
                .map_err(|e| e.to_string())?;
        if !exists {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
                .execute(&observer)
                .await
                .map_err(|e| format!("CREATE DATABASE {database}: {e}"))?;
        }
        Ok(Self {
            observer,
            database: database.to_owned(),
            settle,
        })
    }

    async fn read(&self) -> Transactions {
        let row: Result<(i64, i64), _> = sqlx::query_as(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1",
        )
        .bind(&self.database)
        .fetch_one(&self.observer)
        .await;
        let (commits, rollbacks) = row.unwrap_or_default();
        Transactions { commits, rollbacks }
    }

    /// The counts once they have not moved for the settle time.
    /// PostgreSQL flushes a backend's counts lazily (up to 10 s late) but
    /// always when the backend exits: close the measured pool first, and
    /// a short settle time is enough.
    pub(crate) async fn settled(&self) -> Transactions {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = self.read().await;
        let mut stable_since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = self.read().await;
            if now != last {
                last = now;
                stable_since = Instant::now();
            } else if stable_since.elapsed() >= self.settle || Instant::now() > deadline {
                return now;
            }
        }
    }
}
