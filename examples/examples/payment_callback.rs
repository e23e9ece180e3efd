//! A payment provider's callback: keyed by the payment number and shared by
//! every caller (`pay-callback:{path:payment_no}`), with the state-machine
//! guard behind it, so a callback that outlives its idempotency record
//! still credits the ledger once (docs/guards.md).
//!
//! ```text
//! cargo run -p idem-examples --example payment_callback
//! ```
//!
//! Needs PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); creates the tables
//! `example_payments` and `example_ledger` and, with `store.migrate()`,
//! idem's own. The provider pushes the callback three times (replays), then
//! once more after the record expired (the guard answers), then after a
//! refund (409).
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{FromRef, Path, State};
use axum::{Router, http::StatusCode, routing::post};
use idem_tower::guards::{LifecycleState, StateMachine, Transition};
use idem_tower::sql::sqlx::{self, PgPool, Postgres};
use idem_tower::{Idempotency, PgStore, Tx, idempotent};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PaymentState {
    WaitPay,
    Paid,
    Refunded,
}

impl LifecycleState for PaymentState {
    const ALL: &'static [Self] = &[Self::WaitPay, Self::Paid, Self::Refunded];

    fn as_str(&self) -> &'static str {
        match self {
            Self::WaitPay => "WAIT_PAY",
            Self::Paid => "PAID",
            Self::Refunded => "REFUNDED",
        }
    }
}

#[derive(Clone)]
struct AppState {
    idem: Idempotency,
    payments: StateMachine<PaymentState>,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idem.clone()
    }
}

/// The provider re-pushes a callback until it gets a 2xx, from any of its
/// addresses: one record per payment, whoever sends it. On a handle with
/// tenant or user resolvers every record is bound to its caller;
/// `shared_across_callers` says this one is not. The record is kept one
/// second here, so that the example can outlive it.
#[idempotent(
    key = "pay-callback:{path:payment_no}",
    shared_across_callers,
    transactional,
    ttl = "1s"
)]
async fn payment_callback(
    State(state): State<AppState>,
    Path(payment_no): Path<String>,
    mut tx: Tx<Postgres>,
) -> Result<&'static str, StatusCode> {
    // `UPDATE ... SET state = 'PAID' WHERE payment_no = $1 AND state IN ('WAIT_PAY')`,
    // in the claim's transaction.
    let moved = state
        .payments
        .transition(
            &mut *tx,
            &payment_no,
            &[PaymentState::WaitPay],
            PaymentState::Paid,
        )
        .await
        .map_err(internal)?;
    match moved {
        Transition::Applied => {
            sqlx::query("INSERT INTO example_ledger (payment_no) VALUES ($1)")
                .bind(&payment_no)
                .execute(&mut *tx)
                .await
                .map_err(internal)?;
            Ok("credited")
        }
        Transition::AlreadyInTarget => Ok("already paid: nothing booked"),
        Transition::Illegal { .. } => Err(StatusCode::CONFLICT),
        Transition::NotFound => Err(StatusCode::NOT_FOUND),
    }
}

/// A database error: a 500, which rolls the claim's transaction back and
/// frees the key for the provider's next push.
fn internal(err: impl std::fmt::Display) -> StatusCode {
    eprintln!("database error: {err}");
    StatusCode::INTERNAL_SERVER_ERROR
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = PgPool::connect(&url).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS example_payments (payment_no TEXT PRIMARY KEY, state TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS example_ledger (id BIGSERIAL PRIMARY KEY, payment_no TEXT NOT NULL);",
    )
    .execute(&pool)
    .await?;
    let store = PgStore::new(pool.clone());
    store.migrate().await?;
    let payments = StateMachine::new("example_payments", "payment_no", "state")?;
    let app = Router::new()
        .route("/payments/{payment_no}/callback", post(payment_callback))
        .with_state(AppState {
            idem: Idempotency::new(store),
            payments: payments.clone(),
        });

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // A payment of this run's own, waiting for its callback.
    let payment_no = format!(
        "P-{}",
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos()
    );
    sqlx::query("INSERT INTO example_payments (payment_no, state) VALUES ($1, 'WAIT_PAY')")
        .bind(&payment_no)
        .execute(&pool)
        .await?;
    let client = reqwest::Client::new();
    let callback = async || -> Result<String, reqwest::Error> {
        let response = client
            .post(format!("{base}/payments/{payment_no}/callback"))
            .send()
            .await?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        Ok(format!(
            "{status}, replayed: {replayed}, {:?}",
            response.text().await?
        ))
    };
    for push in 1..=3 {
        println!("callback {push}                -> {}", callback().await?);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    println!("after the record expired  -> {}", callback().await?);
    // A refund moves PAID -> REFUNDED through the same guard.
    let refund = payments
        .transition(
            &mut *pool.acquire().await?,
            &payment_no,
            &[PaymentState::Paid],
            PaymentState::Refunded,
        )
        .await?;
    println!("refund                    -> {refund:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    println!("after a refund            -> {}", callback().await?);

    let credits: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM example_ledger WHERE payment_no = $1")
            .bind(&payment_no)
            .fetch_one(&pool)
            .await?;
    println!("ledger credits for {payment_no}: {credits}");
    Ok(())
}
