//! The shop: `POST /payments` charges the provider, then writes the order,
//! in transactional mode (the order and the stored answer commit together).
//! The charge is outside that transaction: what makes it happen once per
//! operation is its key, `operation.key_for("psp-charge")`, the same on
//! every run of the payment, sent by idem's retrying client with every
//! attempt (docs/outbound.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router, http::StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use idem_tower::client::{IdempotencyClient, IdempotencyClientLayer, RetryPolicy};
use idem_tower::sql::sqlx::{self, PgPool, Postgres, Sqlite, SqlitePool};
use idem_tower::{Idempotency, Operation, PgStore, SqliteStore, Tx};
use serde::Deserialize;
use serde_json::{Value, json};
use tower::{Layer, ServiceExt};

use super::provider::ChargeRequest;

/// A payment, as the shop's clients send it.
#[derive(Debug, Clone, Deserialize)]
pub struct Payment {
    /// The amount, in cents.
    pub amount_cents: i64,
    /// The order's reference.
    pub reference: String,
}

/// The shop's state: where the provider is, the client that calls it, and
/// the faults still to come.
#[derive(Clone)]
pub struct Shop(Arc<Inner>);

struct Inner {
    charges_url: String,
    provider: IdempotencyClient<Client<HttpConnector, Full<Bytes>>>,
    fail_before_commit: AtomicUsize,
    fail_after_phase: AtomicU8,
    pause: Option<(Pause, Duration)>,
}

impl Shop {
    /// A shop that charges the provider at `provider` (`http://host:port`)
    /// through idem's retrying client, under `policy`.
    pub fn new(provider: &str, policy: RetryPolicy) -> Self {
        let http = Client::builder(TokioExecutor::new()).build_http();
        Self(Arc::new(Inner {
            charges_url: format!("{provider}/v1/charges"),
            provider: IdempotencyClientLayer::new(policy).layer(http),
            fail_before_commit: AtomicUsize::new(0),
            fail_after_phase: AtomicU8::new(0),
            pause: None,
        }))
    }

    /// The retry policy of a shop's calls to the provider: each attempt
    /// given `attempt_timeout`, quick backoff, 20 s in all.
    pub fn policy(attempt_timeout: Duration) -> RetryPolicy {
        RetryPolicy::default()
            .attempt_timeout(attempt_timeout)
            .backoff(Duration::from_millis(5), Duration::from_millis(50))
            .deadline(Duration::from_secs(20))
    }

    /// Every payment waits `pause` at `at`, having said so on stderr
    /// (`before commit: REFERENCE`): the window a `kill -9` is aimed at.
    /// Before any clone.
    pub fn pause(mut self, at: Pause, pause: Duration) -> Self {
        Arc::get_mut(&mut self.0)
            .expect("configured before it is shared")
            .pause = Some((at, pause));
        self
    }

    /// Says where the payment is and waits, if the shop pauses at `here`.
    pub(super) async fn at(&self, here: Pause, what: &str) {
        if let Some((at, pause)) = self.0.pause
            && at == here
        {
            eprintln!("{}: {what}", at.as_str());
            tokio::time::sleep(pause).await;
        }
    }

    /// The next `n` payments fail after the provider's answer and the
    /// order's insert, before the commit: 503, rolled back, key released.
    pub fn fail_before_commit(&self, n: usize) {
        self.0.fail_before_commit.store(n, Ordering::SeqCst);
    }

    /// Charges the provider for `payment`, under the key of this operation's
    /// charge: the charge's id, or 502 (not final, so the key is released
    /// and the client's retry runs the payment again, with the same key).
    pub(super) async fn charge(
        &self,
        operation: &Operation,
        payment: &Payment,
    ) -> Result<String, StatusCode> {
        let body = serde_json::to_vec(&ChargeRequest {
            amount_cents: payment.amount_cents,
            reference: payment.reference.clone(),
        })
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        let mut request = http::Request::post(&self.0.charges_url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        // The client half sends it with every attempt.
        request
            .extensions_mut()
            .insert(operation.key_for("psp-charge"));
        let response = self
            .0
            .provider
            .clone()
            .oneshot(request)
            .await
            .map_err(|_| StatusCode::BAD_GATEWAY)?;
        if !response.status().is_success() {
            return Err(StatusCode::BAD_GATEWAY);
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|_| StatusCode::BAD_GATEWAY)?
            .to_bytes();
        let charge: Value = serde_json::from_slice(&body).map_err(|_| StatusCode::BAD_GATEWAY)?;
        charge["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or(StatusCode::BAD_GATEWAY)
    }

    /// The next payment of the phased shop ([`super::phased`]) fails after
    /// its phase `phase` (1, 2 or 3) has committed: 503, the key released.
    pub fn fail_after_phase(&self, phase: u8) {
        self.0.fail_after_phase.store(phase, Ordering::SeqCst);
    }

    /// 503 if the payment should fail now that `phase` is done.
    pub(super) fn after_phase(&self, phase: u8) -> Result<(), StatusCode> {
        let fail = self
            .0
            .fail_after_phase
            .compare_exchange(phase, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if fail {
            return Err(StatusCode::SERVICE_UNAVAILABLE);
        }
        Ok(())
    }

    /// What runs between the order's insert and the commit.
    pub(super) async fn before_commit(&self, payment: &Payment) -> Result<(), StatusCode> {
        self.at(Pause::BeforeCommit, &payment.reference).await;
        let fail = self
            .0
            .fail_before_commit
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(StatusCode::SERVICE_UNAVAILABLE);
        }
        Ok(())
    }
}

/// Where a shop may pause each payment ([`Shop::pause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Before the provider is called: nothing charged, nothing written.
    BeforeCharge,
    /// After the provider's answer and the order's insert, before the
    /// commit.
    BeforeCommit,
    /// After the commit, before the answer leaves.
    AfterCommit,
}

impl Pause {
    /// `before charge`, `before commit`, `after commit`: what the shop says
    /// on stderr when it pauses there.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BeforeCharge => "before charge",
            Self::BeforeCommit => "before commit",
            Self::AfterCommit => "after commit",
        }
    }
}

/// Outside the idem layer: the payment's answer, committed, paused on its
/// way out if the shop pauses after the commit.
pub(super) async fn answering(State(shop): State<Shop>, request: Request, next: Next) -> Response {
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let response = next.run(request).await;
    shop.at(Pause::AfterCommit, &key).await;
    response
}

/// Whatever failed while setting the shop up.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Answer = Result<(StatusCode, Json<Value>), StatusCode>;

pub(super) fn paid(payment: &Payment, charge: &str) -> (StatusCode, Json<Value>) {
    (
        StatusCode::CREATED,
        Json(json!({ "reference": payment.reference, "charge": charge })),
    )
}

/// The payment handler on PostgreSQL.
async fn pay_postgres(
    State(shop): State<Shop>,
    operation: Operation,
    mut tx: Tx<Postgres>,
    Json(payment): Json<Payment>,
) -> Answer {
    shop.at(Pause::BeforeCharge, &payment.reference).await;
    let charge = shop.charge(&operation, &payment).await?;
    sqlx::query("INSERT INTO psp_orders (reference, charge_id, amount_cents) VALUES ($1, $2, $3)")
        .bind(&payment.reference)
        .bind(&charge)
        .bind(payment.amount_cents)
        .execute(&mut *tx)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    shop.before_commit(&payment).await?;
    Ok(paid(&payment, &charge))
}

/// The payment handler on SQLite.
async fn pay_sqlite(
    State(shop): State<Shop>,
    operation: Operation,
    mut tx: Tx<Sqlite>,
    Json(payment): Json<Payment>,
) -> Answer {
    shop.at(Pause::BeforeCharge, &payment.reference).await;
    let charge = shop.charge(&operation, &payment).await?;
    sqlx::query("INSERT INTO psp_orders (reference, charge_id, amount_cents) VALUES (?, ?, ?)")
        .bind(&payment.reference)
        .bind(&charge)
        .bind(payment.amount_cents)
        .execute(&mut *tx)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    shop.before_commit(&payment).await?;
    Ok(paid(&payment, &charge))
}

/// The handle: the same secret on every instance of the shop, so every run
/// of a payment derives the same charge key.
pub(super) fn idempotency(
    store: impl idem_tower::core::IdempotencyStore,
    secret: &[u8],
) -> Idempotency {
    Idempotency::builder(store)
        .outbound_key_secret(secret)
        .build()
}

/// The shop on PostgreSQL: its table and idem's made if missing.
pub async fn postgres(pool: PgPool, shop: Shop, secret: &[u8]) -> Result<Router, BoxError> {
    // Shops starting together make the table once (CREATE TABLE IF NOT
    // EXISTS alone races in the catalog).
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('psp_orders'))")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS psp_orders (id BIGSERIAL PRIMARY KEY, \
         reference TEXT NOT NULL, charge_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let store = PgStore::new(pool);
    store.migrate().await?;
    let idem = idempotency(store, secret);
    let layer = idem
        .layer_with_key("pay:{header:idempotency-key}")?
        .transactional()?;
    Ok(Router::new()
        .route("/payments", post(pay_postgres).layer(layer))
        .layer(middleware::from_fn_with_state(shop.clone(), answering))
        .with_state(shop))
}

/// The shop on SQLite: its table and idem's made if missing.
pub async fn sqlite(pool: SqlitePool, shop: Shop, secret: &[u8]) -> Result<Router, BoxError> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS psp_orders (id INTEGER PRIMARY KEY AUTOINCREMENT, \
         reference TEXT NOT NULL, charge_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let store = SqliteStore::new(pool);
    store.migrate().await?;
    let idem = idempotency(store, secret);
    let layer = idem
        .layer_with_key("pay:{header:idempotency-key}")?
        .transactional()?;
    Ok(Router::new()
        .route("/payments", post(pay_sqlite).layer(layer))
        .layer(middleware::from_fn_with_state(shop.clone(), answering))
        .with_state(shop))
}
