//! What idem's tests share, in one place: the servers they start (Redis,
//! Redis Sentinel and Cluster, a PostgreSQL cluster of their own,
//! PostgreSQL under Patroni with etcd and HAProxy, PgBouncer), hosts of
//! their own in network namespaces, where the
//! servers already running are (`servers`), free ports, the TCP proxies
//! that delay, break or count traffic, the Prometheus scrape, the fault
//! checker's window of commits a failover may lose, and the HTTP
//! reply type and service helpers of the layer's tests. Never published; nothing of idem's own
//! in it, so that every crate of the workspace can take it as a
//! dev-dependency.
//!
//! A server whose binary is not installed skips the test that wanted it,
//! saying why, or fails it under `CI=true` ([`servers::server_missing`]).

pub mod daemon;
pub mod etcd;
pub mod fault_proxy;
pub mod haproxy;
pub mod loss_window;
pub mod lossy_proxy;
pub mod netns;
pub mod orders;
pub mod patroni;
pub mod pgbouncer;
pub mod postgres;
pub mod prometheus;
pub mod redis;
pub mod redis_cluster;
pub mod reply;
pub mod round_trips;
pub mod servers;
pub mod service;
pub mod urls;

pub use redis::free_port;
pub use servers::{
    missing, mysql_url, pgbouncer_url, postgres_url, redis_url, server_missing, server_url,
};

/// `prefix` made unique to this process and moment: names of directories,
/// tenants and tables that outlive a test.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{nanos:08x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
