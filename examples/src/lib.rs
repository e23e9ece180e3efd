//! Runnable idem apps. [`orders`] is the reference app (README.md, "The reference app"):
//! run it with `cargo run -p idem-examples --bin orders`. [`consumer`] is an
//! idempotent NATS JetStream consumer: `cargo run -p idem-examples --bin consumer`.

pub mod consumer;
pub mod orders;
pub mod placeholders;
pub mod sql_pool;
