//! Runnable idem apps. [`orders`] is the reference app (README.md, "The
//! reference app"): run it with `cargo run -p idem-examples --bin orders`.
//! On SQL it enqueues an `order.created` event per order in idem's
//! transactional outbox, which the `relay` binary publishes to NATS
//! JetStream (`cargo run -p idem-examples --bin relay`). [`consumer`] is an
//! idempotent NATS JetStream consumer, of transfers or of those events:
//! `cargo run -p idem-examples --bin consumer`. The small examples, one
//! concept each, are cargo examples of this crate: `examples/README.md`
//! lists them, and how to run the three binaries together.

pub mod consumer;
pub mod orders;
pub mod placeholders;
pub mod sql_pool;
