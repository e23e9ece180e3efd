//! PostgreSQL's and SQLite's writes: the same SQL (`RETURNING`, `ON
//! CONFLICT`), SQLite spelling parameters `?1` where PostgreSQL writes `$1`.

use idem_tower::sql::sqlx::{
    self, AssertSqlSafe, Pool, Postgres, Row, Sqlite, postgres::PgConnection,
    sqlite::SqliteConnection,
};

use super::{OrdersSql, PAYMENTS, payment_state, refused};
use crate::orders::BoxError;
use crate::orders::model::{
    NewOrder, Order, Payment, PaymentState, STARTING_BALANCE_CENTS, TransitionError,
};
use idem_tower::guards::Transition;

/// The impl for one of the two databases.
macro_rules! returning_dialect {
    ($db:ty, $conn:ty, $schema:expr, $params:expr, $begin_read_write:expr) => {
        impl OrdersSql for $db {
            async fn begin_read_write(
                pool: &Pool<Self>,
            ) -> Result<sqlx::Transaction<'static, Self>, sqlx::Error> {
                pool.begin_with($begin_read_write).await
            }

            async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(AssertSqlSafe($schema))
                    .execute(pool)
                    .await
                    .map(drop)
            }

            async fn place_order(
                conn: &mut $conn,
                named: bool,
                tenant: &str,
                user: &str,
                order: &NewOrder,
            ) -> Result<Order, sqlx::Error> {
                let balance: i64 = sqlx::query_scalar(AssertSqlSafe($params(
                    "INSERT INTO orders_balances (tenant, user_id, balance_cents) \
                     VALUES ($1, $2, $3 - $4) \
                     ON CONFLICT (tenant, user_id) \
                     DO UPDATE SET balance_cents = orders_balances.balance_cents - $4 \
                     RETURNING balance_cents",
                )))
                .persistent(named)
                .bind(tenant)
                .bind(user)
                .bind(STARTING_BALANCE_CENTS)
                .bind(order.amount_cents)
                .fetch_one(&mut *conn)
                .await?;
                let id: i64 = sqlx::query_scalar(AssertSqlSafe($params(
                    "INSERT INTO orders_orders \
                     (tenant, user_id, sku, qty, amount_cents, balance_cents) \
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING order_id",
                )))
                .persistent(named)
                .bind(tenant)
                .bind(user)
                .bind(&order.sku)
                .bind(order.qty)
                .bind(order.amount_cents)
                .bind(balance)
                .fetch_one(&mut *conn)
                .await?;
                Ok(Order::placed(id as u64, tenant, user, order, balance))
            }

            async fn create_payment(
                pool: &Pool<Self>,
                named: bool,
                payment_no: &str,
                amount_cents: i64,
            ) -> Result<bool, sqlx::Error> {
                // In a transaction of its own, as `payment`.
                let mut tx = pool.begin().await?;
                let done = sqlx::query(AssertSqlSafe($params(
                    "INSERT INTO orders_payments (payment_no, state, amount_cents) \
                     VALUES ($1, 'WAIT_PAY', $2) ON CONFLICT (payment_no) DO NOTHING",
                )))
                .persistent(named)
                .bind(payment_no)
                .bind(amount_cents)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(done.rows_affected() == 1)
            }

            shared_queries!($params);
        }
    };
}

/// Run as one simple query, so in one implicit transaction: the advisory
/// lock keeps processes that start together from racing in the catalog
/// (concurrent `CREATE TABLE IF NOT EXISTS` can collide in `pg_type`).
const POSTGRES_SCHEMA: &str = "
SELECT pg_advisory_xact_lock(hashtext('idem-orders-schema'));
CREATE TABLE IF NOT EXISTS orders_balances (
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, balance_cents BIGINT NOT NULL,
    PRIMARY KEY (tenant, user_id));
CREATE TABLE IF NOT EXISTS orders_orders (
    order_id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL, user_id TEXT NOT NULL,
    sku TEXT NOT NULL, qty BIGINT NOT NULL, amount_cents BIGINT NOT NULL,
    balance_cents BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS orders_payments (
    payment_no TEXT PRIMARY KEY, state TEXT NOT NULL, amount_cents BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS orders_ledger (
    entry_id BIGSERIAL PRIMARY KEY, payment_no TEXT NOT NULL, amount_cents BIGINT NOT NULL);
";

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS orders_balances (
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, balance_cents INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id));
CREATE TABLE IF NOT EXISTS orders_orders (
    order_id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, user_id TEXT NOT NULL,
    sku TEXT NOT NULL, qty INTEGER NOT NULL, amount_cents INTEGER NOT NULL,
    balance_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS orders_payments (
    payment_no TEXT PRIMARY KEY, state TEXT NOT NULL, amount_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS orders_ledger (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT, payment_no TEXT NOT NULL,
    amount_cents INTEGER NOT NULL);
";

returning_dialect!(
    Postgres,
    PgConnection,
    POSTGRES_SCHEMA,
    |sql: &'static str| sql,
    "BEGIN"
);
returning_dialect!(
    Sqlite,
    SqliteConnection,
    SQLITE_SCHEMA,
    |sql: &str| sql.replace('$', "?"),
    "BEGIN IMMEDIATE"
);
