//! The cross-crate integration tests, one module per subject, in one test
//! binary: each binary links every backend's client, so one binary instead
//! of nine saves the workspace's build most of their link and code
//! generation time. `metrics.rs` stays a binary of its own: the metrics
//! recorder it installs is process-wide.
//!
//! `cargo test -p idem-tests --test integration -- storm` runs one subject.

mod abandoned;
mod client;
mod client_faults;
mod contract;
mod counted;
mod handler_tx;
mod payments;
mod pooler;
mod redis_outage;
mod storm;
