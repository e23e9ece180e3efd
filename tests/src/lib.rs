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
mod harness;
pub mod pg_stats;

pub use backend::Backend;
pub use call::{Call, order};
pub use harness::{Harness, Transport, Via};
pub use idem_test_support::reply::Reply;

/// Runs each listed case on every backend: the memory store over HTTP and
/// through `oneshot`, SQLite, PostgreSQL (directly and through PgBouncer)
/// and MySQL/MariaDB in transactional mode over HTTP, Redis alone, and
/// PostgreSQL behind the Redis gate; with `#[idempotent]` handlers and with
/// hand-built layers, so the two paths cannot drift apart. A module per
/// backend and wiring, a test per case. A case is an `async fn(Harness)`
/// in the calling module; after `parts:`, an `async fn(Backend, Via,
/// Wiring)` that starts its harness itself (with a configuration of its
/// own).
#[macro_export]
macro_rules! on_every_backend {
    (parts: $($case:ident),* $(,)?) => {
        $crate::on_every_backend!(@all parts; $($case),*);
    };
    ($($case:ident),* $(,)?) => {
        $crate::on_every_backend!(@all harness; $($case),*);
    };
    (@all $how:ident; $($case:ident),*) => {
        $crate::on_every_backend!(@module $how, memory_attribute_http, Memory, Http, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, memory_attribute_oneshot, Memory, Oneshot, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, memory_layer_http, Memory, Http, Layer; $($case),*);
        $crate::on_every_backend!(@module $how, memory_layer_oneshot, Memory, Oneshot, Layer; $($case),*);
        $crate::on_every_backend!(@module $how, sqlite_attribute_http, Sqlite, Http, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, sqlite_layer_http, Sqlite, Http, Layer; $($case),*);
        $crate::on_every_backend!(@module $how, postgres_attribute_http, Postgres, Http, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, postgres_layer_http, Postgres, Http, Layer; $($case),*);
        $crate::on_every_backend!(@module $how, pgbouncer_attribute_http, PgBouncer, Http, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, pgbouncer_layer_http, PgBouncer, Http, Layer; $($case),*);
        $crate::on_every_backend!(@module $how, mysql_attribute_http, MySql, Http, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, mysql_layer_http, MySql, Http, Layer; $($case),*);
        $crate::on_every_backend!(@module $how, redis_attribute_http, Redis, Http, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, tiered_attribute_http, PostgresWithRedis, Http, Attribute; $($case),*);
        $crate::on_every_backend!(@module $how, tiered_layer_http, PostgresWithRedis, Http, Layer; $($case),*);
    };
    (@module $how:ident, $module:ident, $backend:ident, $via:ident, $wiring:ident; $($case:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    $crate::on_every_backend!(@run $how, $case, $backend, $via, $wiring);
                }
            )*
        }
    };
    (@run harness, $case:ident, $backend:ident, $via:ident, $wiring:ident) => {
        let harness = $crate::Harness::start_with(
            $crate::Backend::$backend,
            $crate::Via::$via,
            idem_app::orders::Wiring::$wiring,
            |builder| builder,
        )
        .await;
        if let Some(harness) = harness {
            super::$case(harness).await;
        }
    };
    (@run parts, $case:ident, $backend:ident, $via:ident, $wiring:ident) => {
        super::$case(
            $crate::Backend::$backend,
            $crate::Via::$via,
            idem_app::orders::Wiring::$wiring,
        )
        .await;
    };
}

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

/// The `#[idempotent]` attribute's reference (`idem-macros/src/idempotent.md`,
/// its rustdoc), compiled likewise.
#[cfg(doctest)]
#[doc = include_str!("../../idem-macros/src/idempotent.md")]
pub struct AttributeReferenceDoctests;

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
#[doc = include_str!("../../docs/outbound.md")]
pub struct OutboundGuideDoctests;

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
#[doc = include_str!("../../docs/poolers.md")]
pub struct PoolersGuideDoctests;

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
