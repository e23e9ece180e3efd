//! The consumer's ledger: accounts and ledger entries on PostgreSQL,
//! MySQL/MariaDB or SQLite, credited once per transfer through the inbox.

use idem_tower::core::guards::GuardDb;
use idem_tower::core::sql::sqlx::{
    self, AssertSqlSafe, MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool,
    mysql::MySqlConnection, postgres::PgConnection, sqlite::SqliteConnection,
};

use super::{BoxError, Transfer};
use crate::placeholders::positional;
use crate::sql_pool::SqlPool;

/// The ledger database: accounts, ledger entries and the inbox.
#[derive(Debug, Clone)]
pub enum Ledger {
    /// PostgreSQL.
    Postgres(PgPool),
    /// MySQL or MariaDB.
    MySql(MySqlPool),
    /// A SQLite file.
    Sqlite(SqlitePool),
}

/// What the ledger holds for a set of accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Ledger entries.
    pub entries: i64,
    /// Distinct transfers among them.
    pub transfers: i64,
    /// The sum of the entries.
    pub credited_cents: i64,
    /// The sum of the accounts' balances.
    pub balance_cents: i64,
}

/// The ledger's statements, once per database (concrete connection types,
/// no higher-ranked executor bounds).
pub trait LedgerSql: GuardDb {
    /// Creates the ledger tables if missing.
    fn migrate(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Books `transfer`: a ledger entry and a relative balance update (safe
    /// only because the inbox runs it once).
    fn credit(
        conn: &mut Self::Connection,
        transfer: &Transfer,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The ledger of accounts whose name starts with `prefix`.
    fn summary(
        pool: &sqlx::Pool<Self>,
        prefix: &str,
    ) -> impl Future<Output = Result<Summary, sqlx::Error>> + Send;
}

const SUMMARY: &str = "SELECT \
    (SELECT COUNT(*) FROM consumer_ledger WHERE account LIKE $1), \
    (SELECT COUNT(DISTINCT transfer_id) FROM consumer_ledger WHERE account LIKE $1), \
    (SELECT CAST(COALESCE(SUM(amount_cents), 0) AS BIGINT) FROM consumer_ledger WHERE account LIKE $1), \
    (SELECT CAST(COALESCE(SUM(balance_cents), 0) AS BIGINT) FROM consumer_accounts WHERE account LIKE $1)";

macro_rules! ledger_sql {
    ($db:ty, $conn:ty, $schema:expr, $params:expr, $upsert:expr) => {
        impl LedgerSql for $db {
            async fn migrate(pool: &sqlx::Pool<Self>) -> Result<(), sqlx::Error> {
                sqlx::raw_sql($schema).execute(pool).await.map(drop)
            }

            async fn credit(conn: &mut $conn, t: &Transfer) -> Result<(), sqlx::Error> {
                sqlx::query(AssertSqlSafe($params(
                    "INSERT INTO consumer_ledger (transfer_id, account, amount_cents) \
                     VALUES ($1, $2, $3)",
                )))
                .bind(&t.transfer_id)
                .bind(&t.account)
                .bind(t.amount_cents)
                .execute(&mut *conn)
                .await?;
                sqlx::query(AssertSqlSafe($params($upsert)))
                    .bind(&t.account)
                    .bind(t.amount_cents)
                    .execute(&mut *conn)
                    .await
                    .map(drop)
            }

            async fn summary(
                pool: &sqlx::Pool<Self>,
                prefix: &str,
            ) -> Result<Summary, sqlx::Error> {
                let pattern = format!("{prefix}%");
                let mut query =
                    sqlx::query_as::<_, (i64, i64, i64, i64)>(AssertSqlSafe($params(SUMMARY)));
                // MySQL's `?` takes one value per occurrence.
                for _ in 0..$params(SUMMARY).matches('?').count().max(1) {
                    query = query.bind(pattern.clone());
                }
                let (entries, transfers, credited_cents, balance_cents) =
                    query.fetch_one(pool).await?;
                Ok(Summary {
                    entries,
                    transfers,
                    credited_cents,
                    balance_cents,
                })
            }
        }
    };
}

const POSTGRES_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS consumer_accounts (
    account TEXT PRIMARY KEY, balance_cents BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS consumer_ledger (
    entry_id BIGSERIAL PRIMARY KEY, transfer_id TEXT NOT NULL, account TEXT NOT NULL,
    amount_cents BIGINT NOT NULL);
";

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS consumer_accounts (
    account TEXT PRIMARY KEY, balance_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS consumer_ledger (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT, transfer_id TEXT NOT NULL,
    account TEXT NOT NULL, amount_cents INTEGER NOT NULL);
";

const MYSQL_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS consumer_accounts (
    account VARCHAR(255) PRIMARY KEY, balance_cents BIGINT NOT NULL) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS consumer_ledger (
    entry_id BIGINT AUTO_INCREMENT PRIMARY KEY, transfer_id VARCHAR(255) NOT NULL,
    account VARCHAR(255) NOT NULL, amount_cents BIGINT NOT NULL,
    INDEX consumer_ledger_account (account)) ENGINE = InnoDB;
";

const RETURNING_UPSERT: &str = "INSERT INTO consumer_accounts (account, balance_cents) \
     VALUES ($1, $2) ON CONFLICT (account) \
     DO UPDATE SET balance_cents = consumer_accounts.balance_cents + excluded.balance_cents";

ledger_sql!(
    Postgres,
    PgConnection,
    POSTGRES_SCHEMA,
    |sql: &str| sql.to_owned(),
    RETURNING_UPSERT
);
ledger_sql!(
    Sqlite,
    SqliteConnection,
    SQLITE_SCHEMA,
    positional,
    RETURNING_UPSERT
);
ledger_sql!(
    MySql,
    MySqlConnection,
    MYSQL_SCHEMA,
    |sql: &str| positional(&sql.replace("AS BIGINT", "AS SIGNED")),
    "INSERT INTO consumer_accounts (account, balance_cents) VALUES ($1, $2) \
     ON DUPLICATE KEY UPDATE balance_cents = balance_cents + VALUES(balance_cents)"
);

impl Ledger {
    /// Connects to `database` (`sqlite://PATH`, `postgres://...` or
    /// `mysql://...`) and creates the ledger tables if missing.
    pub async fn connect(database: &str) -> Result<Self, BoxError> {
        Ok(match SqlPool::connect(database, 16).await? {
            SqlPool::Postgres(pool) => {
                Postgres::migrate(&pool).await?;
                Self::Postgres(pool)
            }
            SqlPool::MySql(pool) => {
                MySql::migrate(&pool).await?;
                Self::MySql(pool)
            }
            SqlPool::Sqlite(pool) => {
                Sqlite::migrate(&pool).await?;
                Self::Sqlite(pool)
            }
        })
    }

    /// The ledger of accounts whose name starts with `prefix`.
    pub async fn summary(&self, prefix: &str) -> Result<Summary, BoxError> {
        Ok(match self {
            Self::Postgres(pool) => Postgres::summary(pool, prefix).await?,
            Self::MySql(pool) => MySql::summary(pool, prefix).await?,
            Self::Sqlite(pool) => Sqlite::summary(pool, prefix).await?,
        })
    }
}
