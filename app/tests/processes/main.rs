//! The reference app's processes, started for real (`orders`, `consumer`,
//! `relay`), one module per subject, in one test binary: one link of
//! every backend's client instead of six. The fault suite (`faults/`) is a
//! binary of its own, with its own `main`.
//!
//! `cargo test -p idem-app --test processes -- crash` runs one subject.

mod consumer;
mod crash;
mod metrics;
mod outbox;
mod plain_lease;
mod support;
mod two_instances;
