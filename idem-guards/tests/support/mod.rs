//! What the guard and outbox tests share: pools on each database and
//! tables of a test's own.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use idem_sql::conformance::TestSql;
use idem_sql::sqlx::{self, Pool};
use idem_test_support::{mysql_url, postgres_url, server_missing};

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
                    if let Some(pool) = super::$db().await {
                        super::$case(pool).await;
                    }
                }
            )*
        }
    };
}
