//! The shop in phases: `POST /payments` creates the order pending, charges
//! the provider under `operation.key_for("psp-charge")`, and marks the
//! order paid, each phase recorded with its output
//! (`operation.phases(&store)`). The route is in plain mode, so each phase
//! commits on its own; a run after a failure or a crash resumes after the
//! last finished phase: the order is not made again, and once the charge's
//! answer is recorded the provider is not called again (docs/outbound.md,
//! "Phases").

use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router, http::StatusCode, middleware};
use idem_tower::sql::sqlx::{self, PgPool, SqlitePool};
use idem_tower::{IdempotencyLayer, Operation, PgStore, SqliteStore};
use serde_json::Value;

use super::shop::{BoxError, Pause, Payment, Shop, answering, idempotency, paid};

/// Why a payment failed: its status. A 5xx releases the key, and the
/// client's retry resumes the payment.
#[derive(Debug)]
pub struct Failed(StatusCode);

impl From<StatusCode> for Failed {
    fn from(status: StatusCode) -> Self {
        Self(status)
    }
}

impl From<idem_tower::Error> for Failed {
    /// The recovery points could not be read or written.
    fn from(_: idem_tower::Error) -> Self {
        Self(StatusCode::SERVICE_UNAVAILABLE)
    }
}

impl From<sqlx::Error> for Failed {
    fn from(_: sqlx::Error) -> Self {
        Self(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

/// The phased shop's state: the shop, and the store its points are in.
#[derive(Clone)]
struct Phased<S> {
    shop: Shop,
    store: S,
}

/// The payment on PostgreSQL, in three phases.
async fn pay_postgres(
    State(Phased { shop, store }): State<Phased<PgStore>>,
    operation: Operation,
    Json(payment): Json<Payment>,
) -> Result<(StatusCode, Json<Value>), Failed> {
    let (shop, payment) = (&shop, &payment);
    let phases = operation.phases(&store);
    let order: i64 = phases
        .transaction("create-order", |mut tx| async move {
            let id = sqlx::query_scalar(
                "INSERT INTO psp_phased_orders (reference, amount_cents, state) \
                 VALUES ($1, $2, 'pending') RETURNING id",
            )
            .bind(&payment.reference)
            .bind(payment.amount_cents)
            .fetch_one(&mut *tx)
            .await?;
            Ok::<_, Failed>(id)
        })
        .await?;
    shop.after_phase(1)?;
    shop.at(Pause::BeforeCharge, &payment.reference).await;
    let charge: String = phases
        .call("psp-charge", || async {
            Ok::<_, Failed>(shop.charge(&operation, payment).await?)
        })
        .await?;
    shop.after_phase(2)?;
    let paid_with = charge.clone();
    phases
        .transaction("mark-paid", |mut tx| async move {
            sqlx::query(
                "UPDATE psp_phased_orders SET state = 'paid', charge_id = $1 WHERE id = $2",
            )
            .bind(paid_with)
            .bind(order)
            .execute(&mut *tx)
            .await?;
            shop.before_commit(payment).await?;
            Ok::<_, Failed>(())
        })
        .await?;
    shop.after_phase(3)?;
    Ok(paid(payment, &charge))
}

/// The payment on SQLite, in three phases.
async fn pay_sqlite(
    State(Phased { shop, store }): State<Phased<SqliteStore>>,
    operation: Operation,
    Json(payment): Json<Payment>,
) -> Result<(StatusCode, Json<Value>), Failed> {
    let (shop, payment) = (&shop, &payment);
    let phases = operation.phases(&store);
    let order: i64 = phases
        .transaction("create-order", |mut tx| async move {
            let id = sqlx::query_scalar(
                "INSERT INTO psp_phased_orders (reference, amount_cents, state) \
                 VALUES (?, ?, 'pending') RETURNING id",
            )
            .bind(&payment.reference)
            .bind(payment.amount_cents)
            .fetch_one(&mut *tx)
            .await?;
            Ok::<_, Failed>(id)
        })
        .await?;
    shop.after_phase(1)?;
    shop.at(Pause::BeforeCharge, &payment.reference).await;
    let charge: String = phases
        .call("psp-charge", || async {
            Ok::<_, Failed>(shop.charge(&operation, payment).await?)
        })
        .await?;
    shop.after_phase(2)?;
    let paid_with = charge.clone();
    phases
        .transaction("mark-paid", |mut tx| async move {
            sqlx::query("UPDATE psp_phased_orders SET state = 'paid', charge_id = ? WHERE id = ?")
                .bind(paid_with)
                .bind(order)
                .execute(&mut *tx)
                .await?;
            shop.before_commit(payment).await?;
            Ok::<_, Failed>(())
        })
        .await?;
    shop.after_phase(3)?;
    Ok(paid(payment, &charge))
}

/// The payment's layer, in plain mode: each phase commits on its own. The
/// claim lives by its lease, renewed while the handler runs; the claim of
/// a process that died is taken over once 2 s have passed without renewal.
fn payment_layer<S>(store: &S, secret: &[u8]) -> Result<IdempotencyLayer, BoxError>
where
    S: idem_tower::core::IdempotencyStore + Clone,
{
    Ok(idempotency(store.clone(), secret)
        .layer_with_key("pay:{header:idempotency-key}")?
        .lease(Duration::from_secs(2)))
}

/// The phased shop on PostgreSQL: its table and idem's (records and
/// recovery points) made if missing.
pub async fn postgres(pool: PgPool, shop: Shop, secret: &[u8]) -> Result<Router, BoxError> {
    // Shops starting together make the table once.
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('psp_phased_orders'))")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS psp_phased_orders (id BIGSERIAL PRIMARY KEY, \
         reference TEXT NOT NULL, amount_cents BIGINT NOT NULL, state TEXT NOT NULL, \
         charge_id TEXT)",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let store = PgStore::new(pool);
    store.migrate().await?;
    let layer = payment_layer(&store, secret)?;
    Ok(Router::new()
        .route("/payments", post(pay_postgres).layer(layer))
        .with_state(Phased {
            shop: shop.clone(),
            store,
        })
        .layer(middleware::from_fn_with_state(shop, answering)))
}

/// The phased shop on SQLite: its table and idem's made if missing. Plain
/// mode is a must here: a transactional claim would hold SQLite's one
/// write lock, which each phase's transaction needs.
pub async fn sqlite(pool: SqlitePool, shop: Shop, secret: &[u8]) -> Result<Router, BoxError> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS psp_phased_orders (id INTEGER PRIMARY KEY AUTOINCREMENT, \
         reference TEXT NOT NULL, amount_cents INTEGER NOT NULL, state TEXT NOT NULL, \
         charge_id TEXT)",
    )
    .execute(&pool)
    .await?;
    let store = SqliteStore::new(pool);
    store.migrate().await?;
    let layer = payment_layer(&store, secret)?;
    Ok(Router::new()
        .route("/payments", post(pay_sqlite).layer(layer))
        .with_state(Phased {
            shop: shop.clone(),
            store,
        })
        .layer(middleware::from_fn_with_state(shop, answering)))
}
