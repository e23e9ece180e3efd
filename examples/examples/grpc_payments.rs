//! idem on a tonic server, and the caller's half on a tonic channel: the
//! `payments.Payments` service of `idem-examples`' `grpc_payments` module,
//! its `Charge` method deduplicated by the call's `idempotency-key`
//! metadata, health and reflection served beside it untouched.
//!
//! ```text
//! cargo run -p idem-examples --example grpc_payments
//! ```
//!
//! Needs no server: it serves on a loopback port and calls itself, then
//! prints what each call got. The card network is down for the first
//! charge: the client layer retries it with the same key, and it runs.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use idem_examples::grpc_payments::proto::ChargeRequest;
use idem_examples::grpc_payments::{self, Payments};
use idem_tower::client::{RetryPolicy, RetryReport};
use tonic::transport::Channel;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let payments = Payments::new();
    let idem = grpc_payments::idempotency();
    grpc_payments::serve(
        listener,
        payments.clone(),
        grpc_payments::idempotency_layer(&idem),
    )
    .await?;

    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = grpc_payments::client(channel, RetryPolicy::default());
    let charge = || {
        let mut request = tonic::Request::new(ChargeRequest {
            account: "acct_42".into(),
            amount_cents: 1250,
        });
        let metadata = request.metadata_mut();
        metadata.insert("x-tenant-id", "acme".parse().expect("ASCII"));
        metadata.insert(
            "idempotency-key",
            "order-1001-charge".parse().expect("ASCII"),
        );
        request
    };

    payments.fail_next(1);
    for call in ["first", "again"] {
        let reply = client.charge(charge()).await?;
        let report = reply.extensions().get::<RetryReport>().cloned();
        let replayed = reply.metadata().get("idempotent-replayed").is_some();
        println!(
            "{call}: {:?}, replayed: {replayed}, attempts: {:?}",
            reply.get_ref(),
            report.map(|r| r.attempts),
        );
    }
    println!(
        "Charge ran {} times, {} charge made",
        payments.runs(),
        payments.charges()
    );
    Ok(())
}
