//! Runnable idem apps. [`orders`] is the reference app (README.md, "The
//! reference app"): run it with `cargo run -p idem-examples --bin orders`.
//! [`consumer`] is an idempotent NATS JetStream consumer:
//! `cargo run -p idem-examples --bin consumer`. The small examples, one
//! concept each, are cargo examples of this crate: `examples/README.md`
//! lists them.

pub mod consumer;
pub mod orders;
pub mod placeholders;
pub mod sql_pool;
