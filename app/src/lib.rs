//! idem's reference app and its companions. [`orders`] is the reference
//! app (docs/reference-app.md): run it with
//! `cargo run -p idem-app --bin orders`.
//! On SQL it enqueues an `order.created` event per order in idem's
//! transactional outbox, which the `relay` binary publishes to NATS
//! JetStream (`cargo run -p idem-app --bin relay`). [`consumer`] is an
//! idempotent NATS JetStream consumer, of transfers or of those events:
//! `cargo run -p idem-app --bin consumer`. The small examples, one
//! concept each, are the idem-examples crate: `examples/README.md`
//! lists them, and how to run the three binaries together.

pub mod consumer;
pub mod orders;
pub mod placeholders;
pub mod sql_pool;

/// Logs to stderr, at `RUST_LOG`'s levels (`info` by default): how the
/// `relay` and `consumer` binaries log, so stdout stays free.
pub fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}
