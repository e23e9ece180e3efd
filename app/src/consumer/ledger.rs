//! The consumer's ledger on PostgreSQL, MySQL/MariaDB or SQLite: accounts
//! and ledger entries, credited once per transfer through the inbox, and
//! users' loyalty points, one rewards entry per order through the inbox.

use idem_tower::guards::GuardDb;
use idem_tower::sql::sqlx::{
    self, AssertSqlSafe, MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool,
    mysql::MySqlConnection, postgres::PgConnection, sqlite::SqliteConnection,
};

use super::{BoxError, Transfer};
use crate::orders::OrderCreated;
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

/// One rewards entry: the points an order earned its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reward {
    /// The user.
    pub user: String,
    /// The order.
    pub order_id: u64,
    /// The points booked.
    pub points: i64,
}

/// The points an order of `amount_cents` earns: one per whole unit.
pub fn points(amount_cents: i64) -> i64 {
    amount_cents / 100
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
    /// Books the points of `order`: a rewards entry and a relative points
    /// update (safe only because the inbox runs it once).
    fn reward(
        conn: &mut Self::Connection,
        order: &OrderCreated,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The rewards entries of `tenant`, in the order they were booked, and
    /// the sum of its users' points balances.
    fn rewards(
        pool: &sqlx::Pool<Self>,
        tenant: &str,
    ) -> impl Future<Output = Result<(Vec<Reward>, i64), sqlx::Error>> + Send;
}

const SUMMARY: &str = "SELECT \
    (SELECT COUNT(*) FROM consumer_ledger WHERE account LIKE $1), \
    (SELECT COUNT(DISTINCT transfer_id) FROM consumer_ledger WHERE account LIKE $1), \
    (SELECT CAST(COALESCE(SUM(amount_cents), 0) AS BIGINT) FROM consumer_ledger WHERE account LIKE $1), \
    (SELECT CAST(COALESCE(SUM(balance_cents), 0) AS BIGINT) FROM consumer_accounts WHERE account LIKE $1)";

macro_rules! ledger_sql {
    ($db:ty, $conn:ty, $schema:expr, $params:expr, $upsert:expr, $points_upsert:expr) => {
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

            async fn reward(conn: &mut $conn, order: &OrderCreated) -> Result<(), sqlx::Error> {
                let points = points(order.amount_cents);
                sqlx::query(AssertSqlSafe($params(
                    "INSERT INTO consumer_rewards (tenant, user_id, order_id, points) \
                     VALUES ($1, $2, $3, $4)",
                )))
                .bind(&order.tenant)
                .bind(&order.user)
                .bind(order.order_id as i64)
                .bind(points)
                .execute(&mut *conn)
                .await?;
                sqlx::query(AssertSqlSafe($params($points_upsert)))
                    .bind(&order.tenant)
                    .bind(&order.user)
                    .bind(points)
                    .execute(&mut *conn)
                    .await
                    .map(drop)
            }

            async fn rewards(
                pool: &sqlx::Pool<Self>,
                tenant: &str,
            ) -> Result<(Vec<Reward>, i64), sqlx::Error> {
                let rows = sqlx::query_as::<_, (String, i64, i64)>(AssertSqlSafe($params(
                    "SELECT user_id, order_id, points FROM consumer_rewards \
                     WHERE tenant = $1 ORDER BY entry_id",
                )))
                .bind(tenant)
                .fetch_all(pool)
                .await?;
                let balance: i64 = sqlx::query_scalar(AssertSqlSafe($params(
                    "SELECT CAST(COALESCE(SUM(points), 0) AS BIGINT) FROM consumer_points \
                     WHERE tenant = $1",
                )))
                .bind(tenant)
                .fetch_one(pool)
                .await?;
                let entries = rows
                    .into_iter()
                    .map(|(user, order_id, points)| Reward {
                        user,
                        order_id: order_id as u64,
                        points,
                    })
                    .collect();
                Ok((entries, balance))
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
CREATE TABLE IF NOT EXISTS consumer_points (
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, points BIGINT NOT NULL,
    PRIMARY KEY (tenant, user_id));
CREATE TABLE IF NOT EXISTS consumer_rewards (
    entry_id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL, user_id TEXT NOT NULL,
    order_id BIGINT NOT NULL, points BIGINT NOT NULL);
";

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS consumer_accounts (
    account TEXT PRIMARY KEY, balance_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS consumer_ledger (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT, transfer_id TEXT NOT NULL,
    account TEXT NOT NULL, amount_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS consumer_points (
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, points INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id));
CREATE TABLE IF NOT EXISTS consumer_rewards (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, user_id TEXT NOT NULL,
    order_id INTEGER NOT NULL, points INTEGER NOT NULL);
";

const MYSQL_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS consumer_accounts (
    account VARCHAR(255) PRIMARY KEY, balance_cents BIGINT NOT NULL) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS consumer_ledger (
    entry_id BIGINT AUTO_INCREMENT PRIMARY KEY, transfer_id VARCHAR(255) NOT NULL,
    account VARCHAR(255) NOT NULL, amount_cents BIGINT NOT NULL,
    INDEX consumer_ledger_account (account)) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS consumer_points (
    tenant VARCHAR(255) NOT NULL, user_id VARCHAR(255) NOT NULL, points BIGINT NOT NULL,
    PRIMARY KEY (tenant, user_id)) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS consumer_rewards (
    entry_id BIGINT AUTO_INCREMENT PRIMARY KEY, tenant VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL, order_id BIGINT NOT NULL, points BIGINT NOT NULL,
    INDEX consumer_rewards_tenant (tenant)) ENGINE = InnoDB;
";

const RETURNING_UPSERT: &str = "INSERT INTO consumer_accounts (account, balance_cents) \
     VALUES ($1, $2) ON CONFLICT (account) \
     DO UPDATE SET balance_cents = consumer_accounts.balance_cents + excluded.balance_cents";

const RETURNING_POINTS_UPSERT: &str = "INSERT INTO consumer_points (tenant, user_id, points) \
     VALUES ($1, $2, $3) ON CONFLICT (tenant, user_id) \
     DO UPDATE SET points = consumer_points.points + excluded.points";

ledger_sql!(
    Postgres,
    PgConnection,
    POSTGRES_SCHEMA,
    |sql: &str| sql.to_owned(),
    RETURNING_UPSERT,
    RETURNING_POINTS_UPSERT
);
ledger_sql!(
    Sqlite,
    SqliteConnection,
    SQLITE_SCHEMA,
    positional,
    RETURNING_UPSERT,
    RETURNING_POINTS_UPSERT
);
ledger_sql!(
    MySql,
    MySqlConnection,
    MYSQL_SCHEMA,
    |sql: &str| positional(&sql.replace("AS BIGINT", "AS SIGNED")),
    "INSERT INTO consumer_accounts (account, balance_cents) VALUES ($1, $2) \
     ON DUPLICATE KEY UPDATE balance_cents = balance_cents + VALUES(balance_cents)",
    "INSERT INTO consumer_points (tenant, user_id, points) VALUES ($1, $2, $3) \
     ON DUPLICATE KEY UPDATE points = points + VALUES(points)"
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

    /// The rewards entries of `tenant`, in the order they were booked, and
    /// the sum of its users' points balances.
    pub async fn rewards(&self, tenant: &str) -> Result<(Vec<Reward>, i64), BoxError> {
        Ok(match self {
            Self::Postgres(pool) => Postgres::rewards(pool, tenant).await?,
            Self::MySql(pool) => MySql::rewards(pool, tenant).await?,
            Self::Sqlite(pool) => Sqlite::rewards(pool, tenant).await?,
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
