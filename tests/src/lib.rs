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
pub mod wire;

pub use backend::Backend;
pub use call::{Call, order};
pub use harness::{Harness, Transport, Via};
pub use reply::Reply;

/// README.md's Rust snippets, compiled as doc tests so that the README
/// cannot drift from the API. They live here rather than in idem-tower, whose
/// published package holds its own directory only (the workspace's README is
/// outside it).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// idem-tower/README.md's snippet (its crates.io page), compiled likewise,
/// with the features it names.
#[cfg(doctest)]
#[doc = include_str!("../../idem-tower/README.md")]
pub struct TowerReadmeDoctests;

/// The guides' Rust snippets (`docs/*.md`, one struct per guide), compiled
/// likewise: README.md's map of the guides lists them.
#[cfg(doctest)]
#[doc = include_str!("../../docs/attribute.md")]
pub struct AttributeGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/keys.md")]
pub struct KeysGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/stores.md")]
pub struct StoresGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/transactional.md")]
pub struct TransactionalGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/redis-gate.md")]
pub struct RedisGateGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/leases-and-crashes.md")]
pub struct LeasesAndCrashesGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/metrics.md")]
pub struct MetricsGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/client.md")]
pub struct ClientGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/guards.md")]
pub struct GuardsGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/grpc.md")]
pub struct GrpcGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/operations.md")]
pub struct OperationsGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/reference-app.md")]
pub struct ReferenceAppGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/development.md")]
pub struct DevelopmentGuideDoctests;

/// A random hex nonce.
pub fn nonce() -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "{:016x}",
        RandomState::new().hash_one(std::time::SystemTime::now())
    )
}
