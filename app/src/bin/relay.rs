//! The orders app's outbox relay: publishes the `order.created` events
//! that `POST /orders` committed to its outbox, to NATS JetStream, at least
//! once each and one user's in order:
//! `cargo run -p idem-app --bin relay -- --help`.
//!
//! It runs idem's `Relay` over the orders database's outbox with a
//! `JetStreamPublisher`: each event goes to the subject named by its topic
//! (`orders.created`), with its id as `Nats-Msg-Id`, so JetStream drops a
//! re-publish (a relay that died between the acknowledgement and marking
//! the event sent) inside the stream's duplicate window, and the consumer's
//! inbox drops any other. Run as many relays as you like: they share the
//! work under leases. The stream is created (file storage) if missing: a
//! subject no stream captures cannot be published to.
//!
//! ```text
//! cargo run -p idem-app --bin orders -- --database postgres://postgres@127.0.0.1/test
//! cargo run -p idem-app --bin relay -- --database postgres://postgres@127.0.0.1/test \
//!     --metrics-listen 127.0.0.1:9187
//! cargo run -p idem-app --bin consumer -- --feed orders --database sqlite://rewards.db
//! ```
//!
//! It prints `relay ready: NAME` on stderr once it runs (after
//! `relay metrics on http://ADDR` with `--metrics-listen`), and stops on
//! SIGTERM or ctrl-c after the batch under way.

use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use clap::Parser;
use idem_app::orders::{
    BoxError, ORDER_CREATED_SUBJECT, ORDERS_STREAM, install_prometheus, metrics_router,
    register_outbox_metrics,
};
use idem_app::sql_pool::SqlPool;
use idem_tower::core::BoxFuture;
use idem_tower::guards::GuardDb;
use idem_tower::guards::{JetStreamPublisher, Outbox, PendingEvent, Published, Publisher, Relay};
use idem_tower::sql::sqlx::Pool;

/// Publishes the orders app's outbox events to NATS JetStream.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The orders database, whose outbox it publishes: `sqlite://PATH`,
    /// `postgres://...` or `mysql://...`.
    #[arg(long, default_value = "sqlite://idem-orders.db")]
    database: String,
    /// The NATS server, with JetStream enabled.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// The JetStream stream capturing `--subject`, created if missing.
    #[arg(long, default_value = ORDERS_STREAM)]
    stream: String,
    /// The subject the events are published to (their topic).
    #[arg(long, default_value = ORDER_CREATED_SUBJECT)]
    subject: String,
    /// The relay's name, in its lease tokens and logs (`relay-PID` if
    /// unset).
    #[arg(long)]
    name: Option<String>,
    /// Events claimed at once.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// How long a claimed batch is leased: a relay that dies mid-batch
    /// delays its events by up to this much.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// How long an idle relay waits before looking again.
    #[arg(long, default_value_t = 200)]
    idle_ms: u64,
    /// The longest wait before retrying a failed publish (the first is a
    /// tenth of a second, doubling).
    #[arg(long, default_value_t = 30_000)]
    max_backoff_ms: u64,
    /// How long one publish may wait for JetStream's acknowledgement.
    #[arg(long, default_value_t = 10_000)]
    publish_timeout_ms: u64,
    /// Serve the relay's metrics at `GET http://ADDR/metrics`.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Test fixture: sleep this long before each publish, so that a test
    /// can kill the relay mid-batch.
    #[arg(long, default_value_t = 0, hide = true)]
    chaos_publish_delay_ms: u64,
    /// Test fixture: sleep this long after JetStream acknowledged each
    /// publish, before the event is marked sent, so that a test can kill
    /// the relay between the two (the event is then published again).
    #[arg(long, default_value_t = 0, hide = true)]
    chaos_acked_delay_ms: u64,
}

/// Test fixture: a publisher that sleeps before each publish, and after
/// its acknowledgement.
struct SlowPublisher<P> {
    inner: P,
    before: Duration,
    after: Duration,
}

impl<P: Publisher> Publisher for SlowPublisher<P> {
    fn publish<'a>(
        &'a self,
        event: &'a PendingEvent,
    ) -> BoxFuture<'a, Result<Published, idem_tower::core::BoxError>> {
        Box::pin(async move {
            tokio::time::sleep(self.before).await;
            let published = self.inner.publish(event).await?;
            tokio::time::sleep(self.after).await;
            Ok(published)
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    idem_app::log_to_stderr();
    let args = Args::parse();
    if let Some(addr) = args.metrics_listen {
        let prometheus = install_prometheus()?;
        register_outbox_metrics(&args.subject);
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!("relay metrics on http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, metrics_router(prometheus)).await {
                tracing::error!(%err, "the metrics server stopped");
            }
        });
    }

    let client = async_nats::connect(&args.nats).await?;
    let js = jetstream::new(client.clone());
    js.get_or_create_stream(stream::Config {
        name: args.stream.clone(),
        subjects: vec![args.subject.clone()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await?;
    let publisher = SlowPublisher {
        inner: JetStreamPublisher::with_context(js),
        before: Duration::from_millis(args.chaos_publish_delay_ms),
        after: Duration::from_millis(args.chaos_acked_delay_ms),
    };
    match SqlPool::connect(&args.database, 4).await? {
        SqlPool::Postgres(pool) => relay(pool, publisher, &args).await,
        SqlPool::MySql(pool) => relay(pool, publisher, &args).await,
        SqlPool::Sqlite(pool) => relay(pool, publisher, &args).await,
    }
}

/// Migrates the outbox (so the relay may start before the app) and relays
/// until SIGTERM or ctrl-c.
async fn relay<DB: GuardDb, P: Publisher>(
    pool: Pool<DB>,
    publisher: P,
    args: &Args,
) -> Result<(), BoxError> {
    let outbox = Outbox::new(pool)?;
    outbox.migrate().await?;
    let name = (args.name.clone()).unwrap_or_else(|| format!("relay-{}", std::process::id()));
    let relay = Relay::new(outbox, publisher)
        .name(&name)
        .batch(args.batch)
        .lease(Duration::from_millis(args.lease_ms))
        .idle(Duration::from_millis(args.idle_ms))
        .publish_timeout(Duration::from_millis(args.publish_timeout_ms))
        .backoff(
            Duration::from_millis(100),
            Duration::from_millis(args.max_backoff_ms),
        );
    tracing::info!(relay = %name, database = %args.database, nats = %args.nats, subject = %args.subject, "relaying");
    eprintln!("relay ready: {name}");
    relay.run(stopped()).await;
    Ok(())
}

/// SIGTERM or ctrl-c.
async fn stopped() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
