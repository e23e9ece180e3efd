//! The orders app's tables on PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! The order insert and the balance debit take a connection, so they run in
//! whatever transaction they are given: on `POST /orders`, the idempotency
//! claim's own (`Tx`), which commits them with the stored response.
//!
//! Payments move through their lifecycle with idem's state-machine guard
//! ([`StateMachine`]): `WAIT_PAY -> PAID` on the provider's callback,
//! `PAID -> REFUNDED` on a refund, each a compare-and-set in the same
//! transaction as its ledger entry. That holds even when the callback's
//! idempotency record has expired: the transition finds the payment already
//! `PAID` and books nothing.

use std::future::Future;
use std::sync::LazyLock;

use idem_tower::core::guards::{LifecycleState, StateMachine, Transition};
use idem_tower::core::sql::sqlx::{
    self, AssertSqlSafe, MySql, Pool, Postgres, Row, Sqlite, mysql::MySqlConnection,
    postgres::PgConnection, sqlite::SqliteConnection,
};

use super::BoxError;
use super::db::{Order, Payment, PaymentState, STARTING_BALANCE_CENTS, TransitionError};
use crate::placeholders::positional;

/// The payments lifecycle: `orders_payments.state`, keyed by `payment_no`.
static PAYMENTS: LazyLock<StateMachine<PaymentState>> = LazyLock::new(|| {
    StateMachine::new("orders_payments", "payment_no", "state")
        .expect("constant identifiers are valid")
});

/// A new order, as the handler validated it.
#[derive(Debug, Clone)]
pub struct NewOrder<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The user.
    pub user: &'a str,
    /// What.
    pub sku: &'a str,
    /// How many.
    pub qty: i64,
    /// The price.
    pub amount_cents: i64,
}

/// The app's queries for one database.
pub trait OrdersSql: sqlx::Database {
    /// Creates the app's tables if missing.
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Debits the balance (a relative update) and inserts the order, on `conn`.
    fn place_order(
        conn: &mut Self::Connection,
        order: &NewOrder<'_>,
    ) -> impl Future<Output = Result<Order, sqlx::Error>> + Send;
    /// A user's orders and balance.
    fn orders_of(
        pool: &Pool<Self>,
        tenant: &str,
        user: &str,
    ) -> impl Future<Output = Result<(Vec<Order>, i64), sqlx::Error>> + Send;
    /// Creates a payment in `WAIT_PAY`; `false` if the number is taken.
    fn create_payment(
        pool: &Pool<Self>,
        payment_no: &str,
        amount_cents: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// Transition `WAIT_PAY -> PAID` and one ledger credit, in one
    /// transaction; already `PAID` is a success that books nothing.
    fn mark_paid(
        pool: &Pool<Self>,
        payment_no: &str,
        amount_cents: i64,
    ) -> impl Future<Output = Result<Result<Payment, TransitionError>, BoxError>> + Send;
    /// Transition `PAID -> REFUNDED` and one ledger reversal, in one
    /// transaction; already `REFUNDED` is a success that books nothing.
    fn refund(
        pool: &Pool<Self>,
        payment_no: &str,
    ) -> impl Future<Output = Result<Result<Payment, TransitionError>, BoxError>> + Send;
    /// A payment with its ledger credit count.
    fn payment(
        pool: &Pool<Self>,
        payment_no: &str,
    ) -> impl Future<Output = Result<Option<Payment>, sqlx::Error>> + Send;
}

fn order_from(
    order_id: u64,
    order: &NewOrder<'_>,
    balance_cents: i64,
) -> Result<Order, sqlx::Error> {
    Ok(Order {
        order_id,
        tenant: order.tenant.to_owned(),
        user: order.user.to_owned(),
        sku: order.sku.to_owned(),
        qty: order.qty,
        amount_cents: order.amount_cents,
        balance_cents,
    })
}

fn payment_state(state: &str) -> Result<PaymentState, sqlx::Error> {
    PaymentState::from_stored(state)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown payment state {state:?}").into()))
}

/// What a transition that did not apply means for the caller.
fn refused(moved: Transition<PaymentState>) -> Option<TransitionError> {
    match moved {
        Transition::Applied | Transition::AlreadyInTarget => None,
        Transition::Illegal { current } => Some(TransitionError::Illegal(current)),
        Transition::NotFound => Some(TransitionError::NotFound),
    }
}

/// The queries whose SQL is the same on every database but for how
/// parameters are spelled: `$params` turns `$1` into the dialect's form.
macro_rules! shared_queries {
    ($params:expr) => {
        async fn orders_of(
            pool: &Pool<Self>,
            tenant: &str,
            user: &str,
        ) -> Result<(Vec<Order>, i64), sqlx::Error> {
            let rows = sqlx::query(AssertSqlSafe($params(
                "SELECT order_id, sku, qty, amount_cents, balance_cents FROM orders_orders \
                 WHERE tenant = $1 AND user_id = $2 ORDER BY order_id",
            )))
            .bind(tenant)
            .bind(user)
            .fetch_all(pool)
            .await?;
            let orders = rows
                .iter()
                .map(|r| {
                    Ok(Order {
                        order_id: r.try_get::<i64, _>(0)? as u64,
                        tenant: tenant.to_owned(),
                        user: user.to_owned(),
                        sku: r.try_get(1)?,
                        qty: r.try_get(2)?,
                        amount_cents: r.try_get(3)?,
                        balance_cents: r.try_get(4)?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            let balance: Option<i64> = sqlx::query_scalar(AssertSqlSafe($params(
                "SELECT balance_cents FROM orders_balances WHERE tenant = $1 AND user_id = $2",
            )))
            .bind(tenant)
            .bind(user)
            .fetch_optional(pool)
            .await?;
            Ok((orders, balance.unwrap_or(STARTING_BALANCE_CENTS)))
        }

        async fn mark_paid(
            pool: &Pool<Self>,
            payment_no: &str,
            amount_cents: i64,
        ) -> Result<Result<Payment, TransitionError>, BoxError> {
            let mut tx = pool.begin().await?;
            // The amount never changes, so reading it first races nothing.
            let expected: Option<i64> = sqlx::query_scalar(AssertSqlSafe($params(
                "SELECT amount_cents FROM orders_payments WHERE payment_no = $1",
            )))
            .bind(payment_no)
            .fetch_optional(&mut *tx)
            .await?;
            match expected {
                None => return Ok(Err(TransitionError::NotFound)),
                Some(expected) if expected != amount_cents => {
                    return Ok(Err(TransitionError::AmountMismatch));
                }
                Some(_) => {}
            }
            let moved = PAYMENTS
                .transition(&mut *tx, payment_no, &[PaymentState::WaitPay], PaymentState::Paid)
                .await?;
            if let Some(refused) = refused(moved) {
                return Ok(Err(refused));
            }
            if moved == Transition::Applied {
                sqlx::query(AssertSqlSafe($params(
                    "INSERT INTO orders_ledger (payment_no, amount_cents) VALUES ($1, $2)",
                )))
                .bind(payment_no)
                .bind(amount_cents)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(Self::payment(pool, payment_no)
                .await?
                .ok_or(TransitionError::NotFound))
        }

        async fn refund(
            pool: &Pool<Self>,
            payment_no: &str,
        ) -> Result<Result<Payment, TransitionError>, BoxError> {
            let mut tx = pool.begin().await?;
            let moved = PAYMENTS
                .transition(&mut *tx, payment_no, &[PaymentState::Paid], PaymentState::Refunded)
                .await?;
            if let Some(refused) = refused(moved) {
                return Ok(Err(refused));
            }
            if moved == Transition::Applied {
                sqlx::query(AssertSqlSafe($params(
                    "INSERT INTO orders_ledger (payment_no, amount_cents) \
                     SELECT payment_no, -amount_cents FROM orders_payments WHERE payment_no = $1",
                )))
                .bind(payment_no)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(Self::payment(pool, payment_no)
                .await?
                .ok_or(TransitionError::NotFound))
        }

        async fn payment(pool: &Pool<Self>, payment_no: &str) -> Result<Option<Payment>, sqlx::Error> {
            let row = sqlx::query(AssertSqlSafe($params(
                "SELECT p.state, p.amount_cents, \
                   (SELECT COUNT(*) FROM orders_ledger l \
                     WHERE l.payment_no = p.payment_no AND l.amount_cents >= 0), \
                   (SELECT COUNT(*) FROM orders_ledger l \
                     WHERE l.payment_no = p.payment_no AND l.amount_cents < 0) \
                 FROM orders_payments p WHERE p.payment_no = $1",
            )))
            .bind(payment_no)
            .fetch_optional(pool)
            .await?;
            row.map(|r| {
                Ok(Payment {
                    payment_no: payment_no.to_owned(),
                    state: payment_state(r.try_get::<String, _>(0)?.as_str())?,
                    amount_cents: r.try_get(1)?,
                    credits: r.try_get::<i64, _>(2)? as u64,
                    refunds: r.try_get::<i64, _>(3)? as u64,
                })
            })
            .transpose()
        }
    };
}

/// PostgreSQL and SQLite share their writes too (`RETURNING`, `ON
/// CONFLICT`); SQLite only spells parameters `?1` where PostgreSQL writes
/// `$1`.
macro_rules! returning_dialect {
    ($db:ty, $conn:ty, $schema:expr, $params:expr) => {
        impl OrdersSql for $db {
            async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(AssertSqlSafe($schema))
                    .execute(pool)
                    .await
                    .map(drop)
            }

            async fn place_order(conn: &mut $conn, o: &NewOrder<'_>) -> Result<Order, sqlx::Error> {
                let balance: i64 = sqlx::query_scalar(AssertSqlSafe($params(
                    "INSERT INTO orders_balances (tenant, user_id, balance_cents) \
                     VALUES ($1, $2, $3 - $4) \
                     ON CONFLICT (tenant, user_id) \
                     DO UPDATE SET balance_cents = orders_balances.balance_cents - $4 \
                     RETURNING balance_cents",
                )))
                .bind(o.tenant)
                .bind(o.user)
                .bind(STARTING_BALANCE_CENTS)
                .bind(o.amount_cents)
                .fetch_one(&mut *conn)
                .await?;
                let id: i64 = sqlx::query_scalar(AssertSqlSafe($params(
                    "INSERT INTO orders_orders \
                     (tenant, user_id, sku, qty, amount_cents, balance_cents) \
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING order_id",
                )))
                .bind(o.tenant)
                .bind(o.user)
                .bind(o.sku)
                .bind(o.qty)
                .bind(o.amount_cents)
                .bind(balance)
                .fetch_one(&mut *conn)
                .await?;
                order_from(id as u64, o, balance)
            }

            async fn create_payment(
                pool: &Pool<Self>,
                payment_no: &str,
                amount_cents: i64,
            ) -> Result<bool, sqlx::Error> {
                let done = sqlx::query(AssertSqlSafe($params(
                    "INSERT INTO orders_payments (payment_no, state, amount_cents) \
                     VALUES ($1, 'WAIT_PAY', $2) ON CONFLICT (payment_no) DO NOTHING",
                )))
                .bind(payment_no)
                .bind(amount_cents)
                .execute(pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            shared_queries!($params);
        }
    };
}

const POSTGRES_SCHEMA: &str = "
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
    |sql: &'static str| sql
);
returning_dialect!(Sqlite, SqliteConnection, SQLITE_SCHEMA, |sql: &str| sql
    .replace('$', "?"));

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
        o: &NewOrder<'_>,
    ) -> Result<Order, sqlx::Error> {
        sqlx::query(
            "INSERT INTO orders_balances (tenant, user_id, balance_cents) VALUES (?, ?, ? - ?) \
             ON DUPLICATE KEY UPDATE balance_cents = balance_cents - ?",
        )
        .bind(o.tenant)
        .bind(o.user)
        .bind(STARTING_BALANCE_CENTS)
        .bind(o.amount_cents)
        .bind(o.amount_cents)
        .execute(&mut *conn)
        .await?;
        let balance: i64 = sqlx::query_scalar(
            "SELECT balance_cents FROM orders_balances WHERE tenant = ? AND user_id = ?",
        )
        .bind(o.tenant)
        .bind(o.user)
        .fetch_one(&mut *conn)
        .await?;
        let inserted = sqlx::query(
            "INSERT INTO orders_orders (tenant, user_id, sku, qty, amount_cents, balance_cents) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(o.tenant)
        .bind(o.user)
        .bind(o.sku)
        .bind(o.qty)
        .bind(o.amount_cents)
        .bind(balance)
        .execute(&mut *conn)
        .await?;
        order_from(inserted.last_insert_id(), o, balance)
    }

    async fn create_payment(
        pool: &Pool<Self>,
        payment_no: &str,
        amount_cents: i64,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT IGNORE INTO orders_payments (payment_no, state, amount_cents) \
             VALUES (?, 'WAIT_PAY', ?)",
        )
        .bind(payment_no)
        .bind(amount_cents)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
