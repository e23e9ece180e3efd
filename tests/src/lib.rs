//! Test harness: the orders app on any backend, driven over real loopback
//! HTTP or through `oneshot`, with the same requests and the same assertions
//! either way.
//!
//! Server URLs come from `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`
//! and `IDEM_TEST_REDIS_URL` (defaults: the local services). Names
//! (tenants, payment numbers) carry a per-harness nonce, since the SQL
//! databases outlive a test run.

mod backend;
mod call;
pub mod fault_proxy;
mod harness;
pub mod pg_stats;
pub mod prometheus;
mod reply;

pub use backend::Backend;
pub use call::{Call, order};
pub use harness::{Harness, Transport, Via};
pub use reply::Reply;

/// A random hex nonce.
pub fn nonce() -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "{:016x}",
        RandomState::new().hash_one(std::time::SystemTime::now())
    )
}
