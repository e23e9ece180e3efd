//! Where the app keeps its data: in memory, or in one of the SQL databases
//! (which then also hold the idempotency records).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use idem_tower::Tx;
use idem_tower::core::sql::sqlx::{self, MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool};

use crate::sql_pool::SqlPool;

use super::db::{Db, Order, Payment, TransitionError};
use super::sql::{NewOrder, OrdersSql};
use super::{App, BoxError};

/// The app's data.
#[derive(Debug, Clone)]
pub enum Data {
    /// In this process; idempotency in a `MemoryStore`.
    Memory(Arc<Db>),
    /// PostgreSQL, idempotency in a `PgStore` in the same database.
    Postgres(PgPool),
    /// MySQL or MariaDB, idempotency in a `MySqlStore`.
    MySql(MySqlPool),
    /// A SQLite file, idempotency in a `SqliteStore`.
    Sqlite(SqlitePool),
}

/// Runs `$memory` with the memory database, or `$sql` with `$pool` bound to
/// the pool and `$db` to its database type.
macro_rules! on_data {
    ($data:expr, |$mem:ident| $memory:expr, |$pool:ident: $db:ident| $sql:expr) => {
        match $data {
            Data::Memory($mem) => $memory,
            Data::Postgres($pool) => {
                type $db = Postgres;
                $sql
            }
            Data::MySql($pool) => {
                type $db = MySql;
                $sql
            }
            Data::Sqlite($pool) => {
                type $db = Sqlite;
                $sql
            }
        }
    };
}

impl Data {
    /// Connects to `database`: `memory`, `sqlite://PATH` (created if
    /// missing), `postgres://...` or `mysql://...`, and creates the app's
    /// tables there.
    pub async fn connect(database: &str) -> Result<Self, sqlx::Error> {
        if database == "memory" {
            return Ok(Self::Memory(Arc::default()));
        }
        let data = match SqlPool::connect(database, 64).await? {
            SqlPool::Postgres(pool) => Self::Postgres(pool),
            SqlPool::MySql(pool) => Self::MySql(pool),
            SqlPool::Sqlite(pool) => Self::Sqlite(pool),
        };
        on_data!(&data, |_db| Ok(()), |pool: DB| DB::migrate(pool).await)?;
        Ok(data)
    }

    /// A user's orders and balance.
    pub async fn orders_of(
        &self,
        tenant: &str,
        user: &str,
    ) -> Result<(Vec<Order>, i64), sqlx::Error> {
        on_data!(self, |db| Ok(db.orders_of(tenant, user)), |pool: DB| {
            DB::orders_of(pool, tenant, user).await
        })
    }

    /// Creates a payment; `false` if the number is taken.
    pub async fn create_payment(
        &self,
        payment_no: &str,
        amount_cents: i64,
    ) -> Result<bool, sqlx::Error> {
        on_data!(
            self,
            |db| Ok(db.create_payment(payment_no, amount_cents)),
            |pool: DB| DB::create_payment(pool, payment_no, amount_cents).await
        )
    }

    /// `WAIT_PAY -> PAID` with one ledger credit; already paid is a success,
    /// refunded is [`TransitionError::Illegal`].
    pub async fn mark_paid(
        &self,
        payment_no: &str,
        amount_cents: i64,
    ) -> Result<Result<Payment, TransitionError>, BoxError> {
        on_data!(
            self,
            |db| Ok(db.mark_paid(payment_no, amount_cents)),
            |pool: DB| DB::mark_paid(pool, payment_no, amount_cents).await
        )
    }

    /// `PAID -> REFUNDED` with one ledger reversal; already refunded is a
    /// success, unpaid is [`TransitionError::Illegal`].
    pub async fn refund(
        &self,
        payment_no: &str,
    ) -> Result<Result<Payment, TransitionError>, BoxError> {
        on_data!(self, |db| Ok(db.refund(payment_no)), |pool: DB| {
            DB::refund(pool, payment_no).await
        })
    }

    /// A payment by number.
    pub async fn payment(&self, payment_no: &str) -> Result<Option<Payment>, sqlx::Error> {
        on_data!(self, |db| Ok(db.payment(payment_no)), |pool: DB| {
            DB::payment(pool, payment_no).await
        })
    }
}

/// Where `POST /orders` writes: the memory database, or the transaction its
/// idempotency claim was made in, so the order, the debit and the stored
/// response commit together.
pub enum Writer {
    /// In memory.
    Memory(Arc<Db>),
    /// The claim's PostgreSQL transaction.
    Postgres(Tx<Postgres>),
    /// The claim's MySQL transaction.
    MySql(Tx<MySql>),
    /// The claim's SQLite transaction.
    Sqlite(Tx<Sqlite>),
}

impl Writer {
    /// Debits the balance and inserts the order.
    pub async fn place_order(&mut self, order: &NewOrder<'_>) -> Result<Order, sqlx::Error> {
        match self {
            Self::Memory(db) => Ok(db.place_order(
                order.tenant,
                order.user,
                order.sku,
                order.qty,
                order.amount_cents,
            )),
            Self::Postgres(tx) => Postgres::place_order(tx, order).await,
            Self::MySql(tx) => MySql::place_order(tx, order).await,
            Self::Sqlite(tx) => Sqlite::place_order(tx, order).await,
        }
    }
}

impl FromRequestParts<App> for Writer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        let reject = IntoResponse::into_response;
        Ok(match &app.data {
            Data::Memory(db) => Self::Memory(db.clone()),
            Data::Postgres(_) => {
                Self::Postgres(Tx::from_request_parts(parts, app).await.map_err(reject)?)
            }
            Data::MySql(_) => {
                Self::MySql(Tx::from_request_parts(parts, app).await.map_err(reject)?)
            }
            Data::Sqlite(_) => {
                Self::Sqlite(Tx::from_request_parts(parts, app).await.map_err(reject)?)
            }
        })
    }
}
