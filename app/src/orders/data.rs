//! Where the app keeps its data: in memory, or in one of the SQL databases
//! (which then also hold the idempotency records and the outbox of
//! `order.created` events, events.rs), and the `Writer` `POST /orders`
//! writes through.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use idem_tower::Tx;
use idem_tower::guards::GuardDb;
use idem_tower::guards::Outbox;
use idem_tower::sql::sqlx::{self, MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool};

use super::events::order_created;
use super::memory::Db;
use super::model::{NewOrder, Order, Payment, TransitionError};
use super::sql::OrdersSql;
use super::{App, BoxError};
use crate::sql_pool::{SqlPool, behind_transaction_pooler};

/// The app's data.
#[derive(Debug, Clone)]
pub enum Data {
    /// In this process; idempotency in a `MemoryStore`; no outbox, so no
    /// events.
    Memory(Arc<Db>),
    /// PostgreSQL, idempotency in a `PgStore` in the same database.
    Postgres {
        /// The pool.
        pool: PgPool,
        /// Where `POST /orders` enqueues its `order.created` events.
        outbox: Outbox<Postgres>,
        /// Whether the app's statements are named, prepared once per
        /// connection (sqlx's default); not through a pooler in transaction
        /// pooling, which shares server sessions between transactions
        /// (`?pooler=transaction`, docs/poolers.md).
        named: bool,
    },
    /// MySQL or MariaDB, idempotency in a `MySqlStore`.
    MySql {
        /// The pool.
        pool: MySqlPool,
        /// Where `POST /orders` enqueues its `order.created` events.
        outbox: Outbox<MySql>,
    },
    /// A SQLite file, idempotency in a `SqliteStore`.
    Sqlite {
        /// The pool.
        pool: SqlitePool,
        /// Where `POST /orders` enqueues its `order.created` events.
        outbox: Outbox<Sqlite>,
    },
}

impl Data {
    /// Connects to `database`: `memory`, `sqlite://PATH` (created if
    /// missing), `postgres://...` or `mysql://...`, and creates the app's
    /// tables and the outbox's there.
    pub async fn connect(database: &str) -> Result<Self, BoxError> {
        if database == "memory" {
            return Ok(Self::Memory(Arc::default()));
        }
        Ok(match SqlPool::connect(database, 64).await? {
            SqlPool::Postgres(pool) => {
                let outbox = migrate(&pool).await?;
                let named = !behind_transaction_pooler(database);
                Self::Postgres {
                    pool,
                    outbox,
                    named,
                }
            }
            SqlPool::MySql(pool) => {
                let outbox = migrate(&pool).await?;
                Self::MySql { pool, outbox }
            }
            SqlPool::Sqlite(pool) => {
                let outbox = migrate(&pool).await?;
                Self::Sqlite { pool, outbox }
            }
        })
    }

    /// A user's orders and balance.
    pub async fn orders_of(
        &self,
        tenant: &str,
        user: &str,
    ) -> Result<(Vec<Order>, i64), sqlx::Error> {
        match self {
            Self::Memory(db) => Ok(db.orders_of(tenant, user)),
            Self::Postgres { pool, named, .. } => {
                Postgres::orders_of(pool, *named, tenant, user).await
            }
            Self::MySql { pool, .. } => MySql::orders_of(pool, true, tenant, user).await,
            Self::Sqlite { pool, .. } => Sqlite::orders_of(pool, true, tenant, user).await,
        }
    }

    /// Creates a payment; `false` if the number is taken.
    pub async fn create_payment(
        &self,
        payment_no: &str,
        amount_cents: i64,
    ) -> Result<bool, sqlx::Error> {
        match self {
            Self::Memory(db) => Ok(db.create_payment(payment_no, amount_cents)),
            Self::Postgres { pool, named, .. } => {
                Postgres::create_payment(pool, *named, payment_no, amount_cents).await
            }
            Self::MySql { pool, .. } => {
                MySql::create_payment(pool, true, payment_no, amount_cents).await
            }
            Self::Sqlite { pool, .. } => {
                Sqlite::create_payment(pool, true, payment_no, amount_cents).await
            }
        }
    }

    /// `WAIT_PAY -> PAID` with one ledger credit; already paid is a success,
    /// refunded is [`TransitionError::Illegal`].
    pub async fn mark_paid(
        &self,
        payment_no: &str,
        amount_cents: i64,
    ) -> Result<Result<Payment, TransitionError>, BoxError> {
        match self {
            Self::Memory(db) => Ok(db.mark_paid(payment_no, amount_cents)),
            Self::Postgres { pool, named, .. } => {
                Postgres::mark_paid(pool, *named, payment_no, amount_cents).await
            }
            Self::MySql { pool, .. } => {
                MySql::mark_paid(pool, true, payment_no, amount_cents).await
            }
            Self::Sqlite { pool, .. } => {
                Sqlite::mark_paid(pool, true, payment_no, amount_cents).await
            }
        }
    }

    /// `PAID -> REFUNDED` with one ledger reversal; already refunded is a
    /// success, unpaid is [`TransitionError::Illegal`].
    pub async fn refund(
        &self,
        payment_no: &str,
    ) -> Result<Result<Payment, TransitionError>, BoxError> {
        match self {
            Self::Memory(db) => Ok(db.refund(payment_no)),
            Self::Postgres { pool, named, .. } => Postgres::refund(pool, *named, payment_no).await,
            Self::MySql { pool, .. } => MySql::refund(pool, true, payment_no).await,
            Self::Sqlite { pool, .. } => Sqlite::refund(pool, true, payment_no).await,
        }
    }

    /// A payment by number.
    pub async fn payment(&self, payment_no: &str) -> Result<Option<Payment>, sqlx::Error> {
        match self {
            Self::Memory(db) => Ok(db.payment(payment_no)),
            Self::Postgres { pool, named, .. } => Postgres::payment(pool, *named, payment_no).await,
            Self::MySql { pool, .. } => MySql::payment(pool, true, payment_no).await,
            Self::Sqlite { pool, .. } => Sqlite::payment(pool, true, payment_no).await,
        }
    }
}

/// The app's tables and the outbox's on `pool`, created if missing.
async fn migrate<DB: OrdersSql + GuardDb>(pool: &sqlx::Pool<DB>) -> Result<Outbox<DB>, BoxError> {
    <DB as OrdersSql>::migrate(pool).await?;
    let outbox = Outbox::new(pool.clone())?;
    outbox.migrate().await?;
    Ok(outbox)
}

/// Where `POST /orders` writes: the memory database, or the transaction its
/// idempotency claim was made in (transactional mode's `Tx`), so that the
/// order, the debit, its `order.created` event and the stored response
/// commit together.
pub enum Writer {
    /// In memory.
    Memory(Arc<Db>),
    /// The claim's PostgreSQL transaction, the outbox, and whether the
    /// app's statements are named ([`Data::Postgres`]).
    Postgres(Tx<Postgres>, Outbox<Postgres>, bool),
    /// The claim's MySQL transaction, and the outbox.
    MySql(Tx<MySql>, Outbox<MySql>),
    /// The claim's SQLite transaction, and the outbox.
    Sqlite(Tx<Sqlite>, Outbox<Sqlite>),
}

impl Writer {
    /// Debits the balance of user `user` of `tenant`, inserts the order and,
    /// on SQL, enqueues its `order.created` event, all in the claim's
    /// transaction. In memory there is no outbox: no event.
    pub async fn place_order(
        &mut self,
        tenant: &str,
        user: &str,
        order: &NewOrder,
    ) -> Result<Order, BoxError> {
        match self {
            Self::Memory(db) => Ok(db.place_order(tenant, user, order)),
            Self::Postgres(tx, outbox, named) => {
                place_order(&mut **tx, *named, outbox, tenant, user, order).await
            }
            Self::MySql(tx, outbox) => {
                place_order(&mut **tx, true, outbox, tenant, user, order).await
            }
            Self::Sqlite(tx, outbox) => {
                place_order(&mut **tx, true, outbox, tenant, user, order).await
            }
        }
    }
}

/// The order, the debit and the event, on the transaction's connection.
async fn place_order<DB: OrdersSql + GuardDb>(
    conn: &mut DB::Connection,
    named: bool,
    outbox: &Outbox<DB>,
    tenant: &str,
    user: &str,
    order: &NewOrder,
) -> Result<Order, BoxError> {
    let placed = <DB as OrdersSql>::place_order(conn, named, tenant, user, order).await?;
    // A new order id, so a new event id: never `AlreadyQueued` here.
    let _ = outbox.enqueue(conn, &order_created(&placed)?).await?;
    Ok(placed)
}

impl FromRequestParts<App> for Writer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        let reject = IntoResponse::into_response;
        Ok(match &app.data {
            Data::Memory(db) => Self::Memory(db.clone()),
            Data::Postgres { outbox, named, .. } => Self::Postgres(
                Tx::from_request_parts(parts, app).await.map_err(reject)?,
                outbox.clone(),
                *named,
            ),
            Data::MySql { outbox, .. } => Self::MySql(
                Tx::from_request_parts(parts, app).await.map_err(reject)?,
                outbox.clone(),
            ),
            Data::Sqlite { outbox, .. } => Self::Sqlite(
                Tx::from_request_parts(parts, app).await.map_err(reject)?,
                outbox.clone(),
            ),
        })
    }
}
