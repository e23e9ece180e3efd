//! What the guards' tests share: pools on each database, a connection to
//! Redis, tables of a test's own, tasks started all at once, and
//! `sql_cases!`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_sql::conformance::TestSql;
use idem_sql::sqlx::{self, Pool};
use idem_test_support::{mysql_url, postgres_url, server_missing};
use tokio::sync::Barrier;

pub(crate) fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

pub(crate) async fn postgres() -> Option<Pool<sqlx::Postgres>> {
    let url = postgres_url();
    match sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&url)
        .await
    {
        Ok(pool) => Some(pool),
        Err(err) => server_missing("PostgreSQL", &url, err),
    }
}

pub(crate) async fn mysql() -> Option<Pool<sqlx::MySql>> {
    let url = mysql_url();
    match sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&url)
        .await
    {
        Ok(pool) => Some(pool),
        Err(err) => server_missing("MySQL/MariaDB", &url, err),
    }
}

pub(crate) async fn sqlite() -> Option<Pool<sqlx::Sqlite>> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let path = std::env::temp_dir().join(format!("idem-guards-{}.db", nonce()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    Some(
        SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .expect("a SQLite file in the temp directory"),
    )
}

#[cfg(feature = "redis")]
pub(crate) async fn redis() -> Option<redis::aio::ConnectionManager> {
    let url = idem_test_support::redis_url();
    let client = match redis::Client::open(url.as_str()) {
        Ok(client) => client,
        Err(err) => return server_missing("Redis", &url, err),
    };
    match redis::aio::ConnectionManager::new(client).await {
        Ok(conn) => Some(conn),
        Err(err) => server_missing("Redis", &url, err),
    }
}

/// Runs `task(0)` to `task(n - 1)` on tasks of their own that start
/// together, once all have been spawned (a barrier); their results, in
/// that order.
pub(crate) async fn all_at_once<T, Fut>(n: usize, task: impl Fn(usize) -> Fut) -> Vec<T>
where
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, run) = (barrier.clone(), task(i));
            tokio::spawn(async move {
                barrier.wait().await;
                run.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(n);
    for task in tasks {
        results.push(task.await.expect("no task panics"));
    }
    results
}

/// A table of the test's own, dropped when the case ends (if it ends well).
pub(crate) struct Table<DB: TestSql> {
    pub(crate) pool: Pool<DB>,
    pub(crate) name: String,
}

impl<DB: TestSql> Table<DB> {
    pub(crate) async fn create(pool: &Pool<DB>, prefix: &str, columns: &str) -> Self {
        let name = format!("{prefix}_{}", nonce());
        DB::exec(pool, format!("CREATE TABLE {name} ({columns})")).await;
        Self {
            pool: pool.clone(),
            name,
        }
    }

    pub(crate) async fn count(&self, condition: &str) -> i64 {
        DB::count(
            &self.pool,
            format!("SELECT COUNT(*) FROM {} WHERE {condition}", self.name),
        )
        .await
    }

    pub(crate) async fn drop_table(self) {
        DB::exec(&self.pool, format!("DROP TABLE {}", self.name)).await;
    }
}

/// One test per case and database: `sql_cases!(case, ...)` makes modules
/// `postgres`, `mysql` and `sqlite`, each with a test per case that runs
/// `case(pool)` on that database (or says it skipped, without a server).
macro_rules! sql_cases {
    ($($case:ident),* $(,)?) => {
        sql_cases!(@db postgres; $($case),*);
        sql_cases!(@db mysql; $($case),*);
        sql_cases!(@db sqlite; $($case),*);
    };
    (@db $db:ident; $($case:ident),*) => {
        mod $db {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    if let Some(pool) = crate::support::$db().await {
                        super::$case(pool).await;
                    }
                }
            )*
        }
    };
}
