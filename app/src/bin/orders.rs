//! The reference app: `cargo run -p idem-app --bin orders -- --help`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use idem_app::orders::{App, install_prometheus, register_purge_counter, register_tier_counters};
use idem_tower::IdempotencyBuilder;
use idem_tower::sql::PurgeOptions;
use tracing_subscriber::EnvFilter;

/// Orders and payments, made idempotent with idem.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Where data and idempotency records live: `memory`, `sqlite://PATH`
    /// (WAL with synchronous=NORMAL: add `?synchronous=full` to survive an
    /// OS crash too, slower), `postgres://...` or `mysql://...`. On SQL, the outbox of
    /// `order.created` events too, which the `relay` binary publishes.
    #[arg(long, default_value = "sqlite://idem-orders.db")]
    database: String,
    /// Put a Redis fast gate in front of the SQL database (with `--database
    /// memory`, Redis alone keeps the records): `redis://HOST:PORT` for one
    /// server, or `redis+sentinel://[user:password@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`
    /// for the primary Redis Sentinel names, followed through a failover,
    /// or `redis+cluster://HOST:PORT[,HOST:PORT...]` for a Redis Cluster
    /// (any of its nodes).
    #[arg(long)]
    redis: Option<String>,
    /// Honour the X-Chaos-Delay-Ms and X-Chaos-Fail request headers.
    #[arg(long)]
    chaos: bool,
    /// The lease of a plain (non-transactional) claim in milliseconds,
    /// renewed while its handler runs (idem's default, 10 s, if unset).
    #[arg(long, value_name = "MS")]
    lease_ms: Option<u64>,
    /// On SQL, how often expired idempotency records are deleted, in
    /// milliseconds (idem's default, a minute, if unset).
    #[arg(long, value_name = "MS")]
    purge_every_ms: Option<u64>,
}

#[tokio::main]
async fn main() -> Result<(), idem_app::orders::BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    // Before anything records: what `GET /metrics` serves of idem's own
    // metrics comes from this recorder.
    let prometheus = install_prometheus()?;
    let lease = args.lease_ms.map(Duration::from_millis);
    let configure = |builder: IdempotencyBuilder| match lease {
        Some(lease) => builder.lease(lease),
        None => builder,
    };
    let mut app =
        App::connect_tiered(&args.database, args.redis.as_deref(), args.chaos, configure).await?;
    if app.tier.is_some() {
        register_tier_counters();
    }
    app.prometheus = Some(prometheus.clone());
    // Expired records deleted in the background, in every instance.
    let purge_options = args
        .purge_every_ms
        .map_or_else(PurgeOptions::default, |ms| {
            PurgeOptions::every(Duration::from_millis(ms))
        });
    let purge = app.purge_in_background(purge_options);
    if purge.is_some() {
        register_purge_counter();
    }
    // Drains recorded latencies into the histogram even when nobody scrapes.
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            prometheus.run_upkeep();
        }
    });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, database = %args.database, redis = ?args.redis, chaos = args.chaos, "orders listening on http://{addr}");
    eprintln!(
        "orders listening on http://{addr}\ntry:\n  curl -i -X POST http://{addr}/orders \\\n    \
         -H 'Idempotency-Key: 8e03978e' -H 'X-Tenant-Id: acme' -H 'Authorization: Bearer alice' \\\n    \
         -H 'Content-Type: application/json' -d '{{\"sku\":\"book\",\"qty\":1,\"amount_cents\":1999}}'"
    );
    axum::serve(listener, app.router())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    if let Some(purge) = purge {
        purge.stop().await;
    }
    Ok(())
}
