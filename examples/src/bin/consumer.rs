//! An idempotent consumer of transfer messages on NATS JetStream:
//! `cargo run -p idem-examples --bin consumer -- --help`.
//!
//! Each message credits an account once, whatever the broker redelivers and
//! whatever the producer re-publishes: the idem inbox row (unique on the
//! message id and on the transfer id) commits with the ledger entry. See
//! [`idem_examples::consumer`] for why JetStream (a durable pull consumer
//! with explicit acknowledgement) and how a crash is survived.
//!
//! Try it (with `nats` from the NATS CLI, or any JetStream publisher):
//!
//! ```text
//! cargo run -p idem-examples --bin consumer -- --database sqlite://ledger.db
//! nats pub transfers '{"transfer_id":"T-1","account":"alice","amount_cents":500}' \
//!     -H 'Idem-Message-Id: m-1'     # twice: one credit
//! ```

use std::time::Duration;

use clap::Parser;
use idem_examples::consumer::{self, Ledger, Settings};
use tracing_subscriber::EnvFilter;

/// Credits accounts from transfer messages, exactly once each.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The NATS server, with JetStream enabled.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Where the ledger and the inbox live: `sqlite://PATH`,
    /// `postgres://...` or `mysql://...`.
    #[arg(long, default_value = "sqlite://idem-consumer.db")]
    database: String,
    /// The JetStream stream (created if missing).
    #[arg(long, default_value = "TRANSFERS")]
    stream: String,
    /// The subject the stream captures.
    #[arg(long, default_value = "transfers")]
    subject: String,
    /// The durable consumer, and the inbox's consumer name.
    #[arg(long, default_value = "ledger")]
    durable: String,
    /// How long JetStream waits for an acknowledgement before redelivering.
    #[arg(long, default_value_t = 30_000)]
    ack_wait_ms: u64,
    /// How many messages are handled at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Chaos: fail this percentage of handler runs after their writes.
    #[arg(long, default_value_t = 0)]
    chaos_fail_percent: u8,
    /// Chaos: sleep this long between a handler's writes and its commit.
    #[arg(long, default_value_t = 0)]
    chaos_delay_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), consumer::BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let ledger = Ledger::connect(&args.database).await?;
    let settings = Settings {
        nats: args.nats,
        stream: args.stream,
        subject: args.subject,
        durable: args.durable,
        ack_wait: Duration::from_millis(args.ack_wait_ms.max(1)),
        concurrency: args.concurrency,
        chaos_fail_percent: args.chaos_fail_percent.min(100),
        chaos_delay: Duration::from_millis(args.chaos_delay_ms),
    };
    tokio::select! {
        result = consumer::run(settings, ledger) => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
