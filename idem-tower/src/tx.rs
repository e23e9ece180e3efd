//! The `Tx` extractor: the handler's share of a transactional claim.

use std::ops::{Deref, DerefMut};

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use idem_core::TxHandle;
use idem_sql::{Dialect, TxGuard, TxSlot};

use crate::Problem;

/// The database transaction the request's idempotency claim lives in, on a
/// route with [`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional).
///
/// Write through it and your writes commit together with the stored
/// response, or not at all: the layer commits after the handler returns a
/// final response, and rolls back on anything else. It dereferences to the
/// connection, so it goes wherever sqlx takes an executor; it cannot commit
/// or roll back by itself.
///
/// sqlx counts the transaction open, so a nested transaction on it
/// (`tx.begin()`, as on a sqlx `Transaction`) is a savepoint: its
/// `commit()` and `rollback()` touch only its own writes, and everything
/// still commits with the response, or not at all. Never send `COMMIT` or
/// `ROLLBACK` through it yourself: idem finds the transaction ended before
/// it settles, answers 500 (`urn:idem:problem:transaction-ended`) where
/// something may have been kept, and keeps the key from running again
/// (docs/transactional.md, "What a handler may do with `Tx`").
///
/// ```no_run
/// use axum::{Json, http::StatusCode};
/// use idem_tower::Tx;
/// use idem_tower::sql::sqlx::{self, Connection, Postgres};
///
/// async fn create_order(mut tx: Tx<Postgres>, Json(sku): Json<String>) -> Result<StatusCode, StatusCode> {
///     let failed = |_: sqlx::Error| StatusCode::INTERNAL_SERVER_ERROR;
///     sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
///         .bind(&sku)
///         .execute(&mut *tx)
///         .await
///         .map_err(failed)?;
///     // A savepoint: committing it keeps its write in the claim's transaction.
///     let mut line = tx.begin().await.map_err(failed)?;
///     sqlx::query("INSERT INTO order_lines (sku) VALUES ($1)")
///         .bind(&sku)
///         .execute(&mut *line)
///         .await
///         .map_err(failed)?;
///     line.commit().await.map_err(failed)?;
///     Ok(StatusCode::CREATED)
/// }
/// ```
pub struct Tx<DB: Dialect> {
    guard: TxGuard<DB>,
}

impl<DB: Dialect> Deref for Tx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.guard
            .as_ref()
            .expect("a Tx is only made from an open transaction")
    }
}

impl<DB: Dialect> DerefMut for Tx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard
            .as_mut()
            .expect("a Tx is only made from an open transaction")
    }
}

impl<DB: Dialect> std::fmt::Debug for Tx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

/// Why a [`Tx`] could not be extracted: the route is not transactional (a
/// wiring mistake), or the transaction was already finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxRejection;

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        tracing::error!(
            "Tx extractor used on a route without IdempotencyLayer::transactional() \
             for this database"
        );
        let mut response: Response = Problem::TransactionMissing.to_response();
        response.extensions_mut().insert(self);
        response
    }
}

impl<S: Send + Sync, DB: Dialect> FromRequestParts<S> for Tx<DB> {
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // The layer puts the claim's transaction handle in the extensions.
        let slot = parts
            .extensions
            .get::<TxHandle>()
            .and_then(TxHandle::get::<TxSlot<DB>>)
            .cloned()
            .ok_or(TxRejection)?;
        let guard = slot.lock().await;
        if guard.is_none() {
            return Err(TxRejection);
        }
        Ok(Self { guard })
    }
}
