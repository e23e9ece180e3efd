//! gRPC payments on tonic: a `payments.Payments` server with idem's layer
//! on its `Charge` method, beside tonic's health and reflection services,
//! and a client whose channel carries idem's client layer. The
//! `grpc_payments` example runs both; `examples/tests/grpc_payments.rs`
//! tests them over HTTP/2 on loopback.
//!
//! `payments.proto` beside this file is the service; `payments.rs` and
//! `payments_descriptor.bin` are generated from it and committed, so a
//! build needs no `protoc` (this folder's README.md says how to make them
//! again).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_tower::client::{IdempotencyClient, IdempotencyClientLayer, RetryPolicy};
use idem_tower::{Idempotency, IdempotencyLayer, MemoryStore, Resolver};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// The messages, the server trait and the client, as tonic-prost-build
/// generated them from `payments.proto`.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    reason = "generated code, committed as generated"
)]
pub mod proto {
    include!("payments.rs");

    /// The encoded descriptors of `payments.proto`, for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("payments_descriptor.bin");
}

use proto::payments_client::PaymentsClient;
use proto::payments_server::{self, PaymentsServer};
use proto::{ChargeReply, ChargeRequest, GetChargeRequest};

/// The one method idem deduplicates: reads and the other services on the
/// server pass through the layer untouched.
pub const CHARGE: &str = "/payments.Payments/Charge";

/// The payments service: charges kept in memory, each run of `Charge`
/// counted so tests can tell a replay from a second run.
#[derive(Clone, Default)]
pub struct Payments {
    inner: Arc<Ledger>,
}

#[derive(Default)]
struct Ledger {
    runs: AtomicU64,
    outages: AtomicU32,
    delay_ms: AtomicU64,
    charges: Mutex<HashMap<String, ChargeReply>>,
}

impl Payments {
    /// A service that answers at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// Each charge takes this long (so that duplicates meet it in flight).
    pub fn with_delay(self, delay: Duration) -> Self {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.inner.delay_ms.store(millis, Ordering::Relaxed);
        self
    }

    /// The next `calls` charges fail with `UNAVAILABLE` (the card network
    /// is down) without charging.
    pub fn fail_next(&self, calls: u32) {
        self.inner.outages.store(calls, Ordering::SeqCst);
    }

    /// How many times `Charge` ran.
    pub fn runs(&self) -> u64 {
        self.inner.runs.load(Ordering::SeqCst)
    }

    /// How many charges were made.
    pub fn charges(&self) -> usize {
        self.inner.charges.lock().expect("not poisoned").len()
    }
}

#[tonic::async_trait]
impl payments_server::Payments for Payments {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        let run = self.inner.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let outage = self
            .inner
            .outages
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if outage.is_ok() {
            return Err(Status::unavailable("the card network is down"));
        }
        let ChargeRequest {
            account,
            amount_cents,
        } = request.into_inner();
        if amount_cents <= 0 {
            return Err(Status::invalid_argument("amount_cents must be positive"));
        }
        let delay = self.inner.delay_ms.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let reply = ChargeReply {
            charge_id: format!("ch_{run}"),
            account,
            amount_cents,
        };
        self.inner
            .charges
            .lock()
            .expect("not poisoned")
            .insert(reply.charge_id.clone(), reply.clone());
        Ok(Response::new(reply))
    }

    async fn get_charge(
        &self,
        request: Request<GetChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        let id = request.into_inner().charge_id;
        let charges = self.inner.charges.lock().expect("not poisoned");
        match charges.get(&id) {
            Some(reply) => Ok(Response::new(reply.clone())),
            None => Err(Status::not_found(format!("no charge {id}"))),
        }
    }
}

/// idem's layer as this server puts it: keyed by the call's
/// `idempotency-key` metadata, per tenant (`x-tenant-id` metadata), on
/// `Charge` alone.
pub fn idempotency_layer(idem: &Idempotency) -> IdempotencyLayer {
    idem.layer().only([CHARGE])
}

/// An `Idempotency` on the memory store, its tenant read from the
/// `x-tenant-id` metadata.
pub fn idempotency() -> Idempotency {
    Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build()
}

/// Serves `payments`, tonic's health service (reporting `Payments` as
/// serving) and reflection on `listener`, all behind `layer` set on the
/// whole server, until the task is dropped. The health reporter is handed
/// back so a caller can change what it reports.
pub async fn serve(
    listener: TcpListener,
    payments: Payments,
    layer: IdempotencyLayer,
) -> Result<tonic_health::server::HealthReporter, Box<dyn std::error::Error + Send + Sync>> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<PaymentsServer<Payments>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let router = Server::builder()
        .layer(layer)
        .add_service(health)
        .add_service(reflection)
        .add_service(PaymentsServer::new(payments));
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    Ok(reporter)
}

/// A channel through idem's client layer: one key per call, kept across
/// the retries of `UNAVAILABLE` and of idem's in-flight answer.
pub type RetryingChannel = IdempotencyClient<Channel, tonic::body::Body>;

/// A `Payments` client on `channel`, its calls retried under `policy` with
/// one `idempotency-key` each.
pub fn client(channel: Channel, policy: RetryPolicy) -> PaymentsClient<RetryingChannel> {
    let channel = tower::ServiceBuilder::new()
        .layer(IdempotencyClientLayer::grpc(policy))
        .service(channel);
    PaymentsClient::new(channel)
}
