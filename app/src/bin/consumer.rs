//! An idempotent consumer on NATS JetStream, of transfer messages or of the
//! orders app's `order.created` events:
//! `cargo run -p idem-app --bin consumer -- --help`.
//!
//! Each transfer credits an account once, and each order books its user's
//! loyalty points once (`--feed orders`), whatever the broker redelivers
//! and whatever the producer re-publishes: the idem inbox row (unique on
//! the message id and on the business id) commits with the ledger entry.
//! See [`idem_app::consumer`] for why JetStream (a durable pull
//! consumer with explicit acknowledgement) and how a crash is survived.
//!
//! Try it (with `nats` from the NATS CLI, or any JetStream publisher):
//!
//! ```text
//! cargo run -p idem-app --bin consumer -- --database sqlite://ledger.db
//! nats pub transfers '{"transfer_id":"T-1","account":"alice","amount_cents":500}' \
//!     -H 'Idem-Message-Id: m-1'     # twice: one credit
//! ```
//!
//! or, with the `orders` app and its `relay` running (examples/README.md):
//!
//! ```text
//! cargo run -p idem-app --bin consumer -- --feed orders --database sqlite://rewards.db
//! ```

use std::time::Duration;

use clap::{Parser, ValueEnum};
use idem_app::consumer::{self, Feed, Ledger, Settings};
use idem_app::orders::{ORDER_CREATED_SUBJECT, ORDERS_STREAM};

/// What to consume.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum FeedArg {
    /// Transfer messages (stream TRANSFERS, subject `transfers`, durable
    /// `ledger`): one account credit per transfer.
    Transfers,
    /// The orders app's `order.created` events (stream ORDERS, subject
    /// `orders.created`, durable `rewards`): one rewards entry per order.
    Orders,
}

/// Credits accounts from transfer messages, or books loyalty points from
/// order events, exactly once each.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// What to consume; it sets the defaults of `--stream`, `--subject`
    /// and `--durable`.
    #[arg(long, value_enum, default_value = "transfers")]
    feed: FeedArg,
    /// The NATS server, with JetStream enabled.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Where the ledger and the inbox live: `sqlite://PATH`,
    /// `postgres://...` or `mysql://...`.
    #[arg(long, default_value = "sqlite://idem-consumer.db")]
    database: String,
    /// The JetStream stream (created if missing).
    #[arg(long)]
    stream: Option<String>,
    /// The subject the stream captures.
    #[arg(long)]
    subject: Option<String>,
    /// The durable consumer, and the inbox's consumer name.
    #[arg(long)]
    durable: Option<String>,
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
    idem_app::log_to_stderr();
    let args = Args::parse();
    let ledger = Ledger::connect(&args.database).await?;
    let (feed, stream, subject, durable) = match args.feed {
        FeedArg::Transfers => (Feed::Transfers, "TRANSFERS", "transfers", "ledger"),
        FeedArg::Orders => (
            Feed::Orders,
            ORDERS_STREAM,
            ORDER_CREATED_SUBJECT,
            "rewards",
        ),
    };
    let settings = Settings {
        feed,
        nats: args.nats,
        stream: args.stream.unwrap_or_else(|| stream.to_owned()),
        subject: args.subject.unwrap_or_else(|| subject.to_owned()),
        durable: args.durable.unwrap_or_else(|| durable.to_owned()),
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
