//! MySQL's and MariaDB's writes: `ON DUPLICATE KEY UPDATE` and
//! `INSERT IGNORE`, and no `RETURNING`, so the new balance is read back.

use idem_tower::guards::Transition;
use idem_tower::sql::sqlx::{self, AssertSqlSafe, MySql, Pool, Row, mysql::MySqlConnection};

use super::{OrdersSql, PAYMENTS, payment_state, refused};
use crate::orders::BoxError;
use crate::orders::model::{
    NewOrder, Order, Payment, PaymentState, STARTING_BALANCE_CENTS, TransitionError,
};
use crate::placeholders::positional;

const MYSQL_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS orders_balances (
    tenant VARCHAR(255) NOT NULL, user_id VARCHAR(255) NOT NULL, balance_cents BIGINT NOT NULL,
    PRIMARY KEY (tenant, user_id)) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS orders_orders (
    order_id BIGINT AUTO_INCREMENT PRIMARY KEY, tenant VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL, sku VARCHAR(255) NOT NULL, qty BIGINT NOT NULL,
    amount_cents BIGINT NOT NULL, balance_cents BIGINT NOT NULL,
    INDEX orders_orders_owner (tenant, user_id)) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS orders_payments (
    payment_no VARCHAR(255) PRIMARY KEY, state VARCHAR(16) NOT NULL,
    amount_cents BIGINT NOT NULL) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS orders_ledger (
    entry_id BIGINT AUTO_INCREMENT PRIMARY KEY, payment_no VARCHAR(255) NOT NULL,
    amount_cents BIGINT NOT NULL, INDEX orders_ledger_payment (payment_no)) ENGINE = InnoDB;
";

impl OrdersSql for MySql {
    shared_queries!(positional);

    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(MYSQL_SCHEMA).execute(pool).await.map(drop)
    }

    async fn place_order(
        conn: &mut MySqlConnection,
        named: bool,
        tenant: &str,
        user: &str,
        order: &NewOrder,
    ) -> Result<Order, sqlx::Error> {
        sqlx::query(
            "INSERT INTO orders_balances (tenant, user_id, balance_cents) VALUES (?, ?, ? - ?) \
             ON DUPLICATE KEY UPDATE balance_cents = balance_cents - ?",
        )
        .persistent(named)
        .bind(tenant)
        .bind(user)
        .bind(STARTING_BALANCE_CENTS)
        .bind(order.amount_cents)
        .bind(order.amount_cents)
        .execute(&mut *conn)
        .await?;
        let balance: i64 = sqlx::query_scalar(
            "SELECT balance_cents FROM orders_balances WHERE tenant = ? AND user_id = ?",
        )
        .persistent(named)
        .bind(tenant)
        .bind(user)
        .fetch_one(&mut *conn)
        .await?;
        let inserted = sqlx::query(
            "INSERT INTO orders_orders (tenant, user_id, sku, qty, amount_cents, balance_cents) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .persistent(named)
        .bind(tenant)
        .bind(user)
        .bind(&order.sku)
        .bind(order.qty)
        .bind(order.amount_cents)
        .bind(balance)
        .execute(&mut *conn)
        .await?;
        Ok(Order::placed(
            inserted.last_insert_id(),
            tenant,
            user,
            order,
            balance,
        ))
    }

    async fn create_payment(
        pool: &Pool<Self>,
        named: bool,
        payment_no: &str,
        amount_cents: i64,
    ) -> Result<bool, sqlx::Error> {
        // In a transaction of its own, as `payment`.
        let mut tx = pool.begin().await?;
        let done = sqlx::query(
            "INSERT IGNORE INTO orders_payments (payment_no, state, amount_cents) \
             VALUES (?, 'WAIT_PAY', ?)",
        )
        .persistent(named)
        .bind(payment_no)
        .bind(amount_cents)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }
}
