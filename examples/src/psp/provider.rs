//! A stand-in payment service provider over real HTTP: `POST /v1/charges`
//! with an `Idempotency-Key` makes one charge per key, and answers a
//! repeat of the key with the same charge (it runs on idem itself, with
//! the memory store); a key reused for another amount is refused 422, as
//! Stripe does.
//!
//! In front of it sits what a test can break: a gateway that answers 5xx
//! after the charge was made, or holds the answer back past the caller's
//! timeout. [`Provider::charges`] counts the charges actually made.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router, http::StatusCode};
use idem_tower::{Idempotency, MemoryStore};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A charge request, as the shop sends it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChargeRequest {
    /// The amount, in cents.
    pub amount_cents: i64,
    /// What the charge is for.
    pub reference: String,
}

/// The provider's state: the charges it made, the requests it got, and the
/// faults still to come.
#[derive(Debug, Clone, Default)]
pub struct Provider(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    charges: AtomicU64,
    requests: AtomicUsize,
    fail_after_charge: AtomicUsize,
    late_after_charge: AtomicUsize,
    late_by_ms: AtomicU64,
}

impl Provider {
    /// A provider with no faults planned.
    pub fn new() -> Self {
        Self::default()
    }

    /// Charges made: one per `Idempotency-Key` the provider accepted.
    pub fn charges(&self) -> u64 {
        self.0.charges.load(Ordering::SeqCst)
    }

    /// Requests that reached the provider, repeats included.
    pub fn requests(&self) -> usize {
        self.0.requests.load(Ordering::SeqCst)
    }

    /// The next `n` requests are charged (or replayed) and then answered
    /// `502 Bad Gateway`: the charge is made, the caller does not learn it.
    pub fn fail_after_charge(&self, n: usize) {
        self.0.fail_after_charge.store(n, Ordering::SeqCst);
    }

    /// The next `n` requests are charged (or replayed) and their answers
    /// held back `by`: longer than the caller waits, it times out.
    pub fn late_after_charge(&self, n: usize, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.0.late_by_ms.store(ms, Ordering::SeqCst);
        self.0.late_after_charge.store(n, Ordering::SeqCst);
    }

    /// Serves the provider on `listener`; returns its address.
    pub async fn serve(&self, listener: tokio::net::TcpListener) -> std::io::Result<SocketAddr> {
        let addr = listener.local_addr()?;
        let idem = Idempotency::new(MemoryStore::new());
        let dedupe = idem
            .layer_with_key("charge:{header:idempotency-key}")
            .expect("a valid template");
        let app = Router::new()
            .route("/v1/charges", post(charge).layer(dedupe))
            .layer(middleware::from_fn_with_state(self.clone(), gateway))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(addr)
    }
}

/// Takes one planned fault, if any is left.
fn take(count: &AtomicUsize) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// The gateway in front of the provider: passes every request on (the
/// charge happens), then loses or delays the answer if a fault is planned.
async fn gateway(State(provider): State<Provider>, request: Request, next: Next) -> Response {
    provider.0.requests.fetch_add(1, Ordering::SeqCst);
    let response = next.run(request).await;
    if take(&provider.0.fail_after_charge) {
        return (StatusCode::BAD_GATEWAY, "upstream connection reset").into_response();
    }
    if take(&provider.0.late_after_charge) {
        let late = provider.0.late_by_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(late)).await;
    }
    response
}

/// One charge: runs once per key (the idem layer in front replays the rest).
async fn charge(
    State(provider): State<Provider>,
    Json(request): Json<ChargeRequest>,
) -> impl IntoResponse {
    let n = provider.0.charges.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::OK,
        Json(json!({
            "id": format!("ch_{n:06}"),
            "amount_cents": request.amount_cents,
            "reference": request.reference,
        })),
    )
}
