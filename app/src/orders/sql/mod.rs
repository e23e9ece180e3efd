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
//!
//! The queries are written once with `$1` parameters: `returning.rs` holds
//! PostgreSQL's and SQLite's writes (`RETURNING`, `ON CONFLICT`), `mysql.rs`
//! MySQL's, and the reads and payment steps below are shared.

use std::future::Future;
use std::sync::LazyLock;

use idem_tower::guards::{LifecycleState, StateMachine, Transition};
use idem_tower::sql::sqlx::{self, Pool, Transaction};

use super::BoxError;
use super::model::{NewOrder, Order, Payment, PaymentState, TransitionError};

/// The payments lifecycle: `orders_payments.state`, keyed by `payment_no`.
static PAYMENTS: LazyLock<StateMachine<PaymentState>> = LazyLock::new(|| {
    StateMachine::new("orders_payments", "payment_no", "state")
        .expect("constant identifiers are valid")
});

/// The app's queries for one database.
pub trait OrdersSql: sqlx::Database {
    /// Creates the app's tables if missing.
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Debits the balance of user `user` of `tenant` (a relative update) and
    /// inserts the order, on `conn`.
    fn place_order(
        conn: &mut Self::Connection,
        named: bool,
        tenant: &str,
        user: &str,
        order: &NewOrder,
    ) -> impl Future<Output = Result<Order, sqlx::Error>> + Send;
    /// A user's orders and balance.
    fn orders_of(
        pool: &Pool<Self>,
        named: bool,
        tenant: &str,
        user: &str,
    ) -> impl Future<Output = Result<(Vec<Order>, i64), sqlx::Error>> + Send;
    /// Creates a payment in `WAIT_PAY`; `false` if the number is taken.
    fn create_payment(
        pool: &Pool<Self>,
        named: bool,
        payment_no: &str,
        amount_cents: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// Transition `WAIT_PAY -> PAID` and one ledger credit, in one
    /// transaction; already `PAID` is a success that books nothing.
    fn mark_paid(
        pool: &Pool<Self>,
        named: bool,
        payment_no: &str,
        amount_cents: i64,
    ) -> impl Future<Output = Result<Result<Payment, TransitionError>, BoxError>> + Send;
    /// Transition `PAID -> REFUNDED` and one ledger reversal, in one
    /// transaction; already `REFUNDED` is a success that books nothing.
    fn refund(
        pool: &Pool<Self>,
        named: bool,
        payment_no: &str,
    ) -> impl Future<Output = Result<Result<Payment, TransitionError>, BoxError>> + Send;
    /// Moves a payment `from -> to` in `tx` and, if it moved, books its
    /// ledger `entry` (bound to the payment number, then `amount_cents` if
    /// given); commits, and reads the payment back. Already in `to` is a
    /// success that books nothing.
    fn move_payment(
        pool: &Pool<Self>,
        named: bool,
        tx: Transaction<'static, Self>,
        payment_no: &str,
        from_to: (PaymentState, PaymentState),
        entry: &'static str,
        amount_cents: Option<i64>,
    ) -> impl Future<Output = Result<Result<Payment, TransitionError>, BoxError>> + Send;
    /// A transaction that reads, then writes after what it read (the
    /// payment steps). On SQLite it takes the write lock at its start
    /// (`BEGIN IMMEDIATE`, waiting on the pool's `busy_timeout`): a deferred
    /// one that read first fails at its first write, without waiting, if
    /// another connection committed since its read (`SQLITE_BUSY_SNAPSHOT`).
    fn begin_read_write(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send {
        pool.begin()
    }
    /// A payment with its ledger credit count.
    fn payment(
        pool: &Pool<Self>,
        named: bool,
        payment_no: &str,
    ) -> impl Future<Output = Result<Option<Payment>, sqlx::Error>> + Send;
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
/// parameters are spelled: `$params` turns `$1` into the dialect's form. The
/// dialect modules expand it inside their `impl OrdersSql`, with `sqlx`,
/// `AssertSqlSafe`, `Row` and the model types in scope.
macro_rules! shared_queries {
    ($params:expr) => {
        async fn orders_of(
            pool: &Pool<Self>,
            named: bool,
            tenant: &str,
            user: &str,
        ) -> Result<(Vec<Order>, i64), sqlx::Error> {
            // In a transaction of its own, as `payment`.
            let mut tx = pool.begin().await?;
            let rows = sqlx::query(AssertSqlSafe($params(
                "SELECT order_id, sku, qty, amount_cents, balance_cents FROM orders_orders \
                 WHERE tenant = $1 AND user_id = $2 ORDER BY order_id",
            )))
            .persistent(named)
            .bind(tenant)
            .bind(user)
            .fetch_all(&mut *tx)
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
            .persistent(named)
            .bind(tenant)
            .bind(user)
            .fetch_optional(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok((orders, balance.unwrap_or(STARTING_BALANCE_CENTS)))
        }

        async fn mark_paid(
            pool: &Pool<Self>,
            named: bool,
            payment_no: &str,
            amount_cents: i64,
        ) -> Result<Result<Payment, TransitionError>, BoxError> {
            let mut tx = Self::begin_read_write(pool).await?;
            // The amount never changes, so reading it first races nothing.
            let expected: Option<i64> = sqlx::query_scalar(AssertSqlSafe($params(
                "SELECT amount_cents FROM orders_payments WHERE payment_no = $1",
            )))
            .persistent(named)
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
            Self::move_payment(
                pool,
                named,
                tx,
                payment_no,
                (PaymentState::WaitPay, PaymentState::Paid),
                "INSERT INTO orders_ledger (payment_no, amount_cents) VALUES ($1, $2)",
                Some(amount_cents),
            )
            .await
        }

        async fn refund(
            pool: &Pool<Self>,
            named: bool,
            payment_no: &str,
        ) -> Result<Result<Payment, TransitionError>, BoxError> {
            Self::move_payment(
                pool,
                named,
                Self::begin_read_write(pool).await?,
                payment_no,
                (PaymentState::Paid, PaymentState::Refunded),
                "INSERT INTO orders_ledger (payment_no, amount_cents) \
                 SELECT payment_no, -amount_cents FROM orders_payments WHERE payment_no = $1",
                None,
            )
            .await
        }

        async fn move_payment(
            pool: &Pool<Self>,
            named: bool,
            mut tx: sqlx::Transaction<'static, Self>,
            payment_no: &str,
            (from, to): (PaymentState, PaymentState),
            entry: &'static str,
            amount_cents: Option<i64>,
        ) -> Result<Result<Payment, TransitionError>, BoxError> {
            let moved = PAYMENTS.transition(&mut *tx, payment_no, &[from], to).await?;
            if let Some(refused) = refused(moved) {
                return Ok(Err(refused));
            }
            if moved == Transition::Applied {
                let mut entry = sqlx::query(AssertSqlSafe($params(entry))).persistent(named).bind(payment_no);
                if let Some(amount_cents) = amount_cents {
                    entry = entry.bind(amount_cents);
                }
                entry.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(Self::payment(pool, named, payment_no)
                .await?
                .ok_or(TransitionError::NotFound))
        }

        async fn payment(
            pool: &Pool<Self>,
            named: bool,
            payment_no: &str,
        ) -> Result<Option<Payment>, sqlx::Error> {
            // In a transaction of its own: its statements unnamed, parsed
            // and run on one server session, when a pooler shares them
            // (docs/poolers.md).
            let mut tx = pool.begin().await?;
            let row = sqlx::query(AssertSqlSafe($params(
                "SELECT p.state, p.amount_cents, \
                   (SELECT COUNT(*) FROM orders_ledger l \
                     WHERE l.payment_no = p.payment_no AND l.amount_cents >= 0), \
                   (SELECT COUNT(*) FROM orders_ledger l \
                     WHERE l.payment_no = p.payment_no AND l.amount_cents < 0) \
                 FROM orders_payments p WHERE p.payment_no = $1",
            )))
            .persistent(named)
            .bind(payment_no)
            .fetch_optional(&mut *tx)
            .await?;
            tx.commit().await?;
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

mod mysql;
mod returning;
