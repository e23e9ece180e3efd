//! A Redis Cluster of the suite's own: primaries with one replica each,
//! `redis-server --cluster-enabled yes` on free loopback ports (each with
//! its bus port, port + 10000, free too), joined by
//! `redis-cli --cluster create`. A primary can be killed and its replica
//! promoted by the cluster, or a replica asked to take over
//! (`CLUSTER FAILOVER`).
//!
//! Self-contained but for the servers of `redis_servers.rs`: no scenario
//! in it, so it can move to a shared test-support crate as it is.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::free_port;
use crate::redis::{RedisServer, Reply};

/// How long a node may go unanswered before the others call it failed
/// (`cluster-node-timeout`). Redis's default is 15 s; 1.5 s makes a
/// failover take a few seconds and is still far above any pause a loaded
/// machine makes.
const NODE_TIMEOUT_MS: u64 = 1500;

/// A running cluster; every node killed on drop.
pub struct RedisCluster {
    /// Every node, `None` once killed.
    nodes: Vec<Option<RedisServer>>,
}

/// A primary and the replica of its slots, by port.
#[derive(Debug, Clone, Copy)]
pub struct Shard {
    /// The primary's port.
    pub primary: u16,
    /// Its replica's port.
    pub replica: u16,
}

impl RedisCluster {
    /// Starts `primaries` primaries and as many replicas, creates the
    /// cluster and waits until every node says `cluster_state:ok` and every
    /// replica's link to its primary is up. `None` if `redis-server` is not
    /// installed (a panic under `CI=true`).
    pub async fn start(primaries: usize) -> Option<Self> {
        if Command::new("redis-cli").arg("--version").output().is_err() {
            crate::missing("redis-cli (Redis's package)");
            return None;
        }
        let timeout = NODE_TIMEOUT_MS.to_string();
        let mut nodes = Vec::with_capacity(primaries * 2);
        for _ in 0..primaries * 2 {
            let node = RedisServer::start_on(
                port_with_free_bus(),
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &timeout,
                ],
            )?;
            nodes.push(Some(node));
        }
        let addresses: Vec<String> = nodes
            .iter()
            .flatten()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_until_healthy(Duration::from_secs(30)).await;
        Some(cluster)
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`: every node, as the
    /// `orders` app takes it.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .flatten()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The shards as the live nodes see them now.
    pub fn shards(&self) -> Vec<Shard> {
        let Some(text) = self
            .live()
            .find_map(|node| match node.query(&["CLUSTER", "NODES"]) {
                Ok(Reply::Bulk(Some(text))) => Some(text),
                _ => None,
            })
        else {
            return Vec::new();
        };
        // <id> <ip:port@bus> <flags> <primary id or -> ...
        let nodes: Vec<(String, u16, String, String)> = text
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let port = fields.get(1)?.split('@').next()?.rsplit(':').next()?;
                Some((
                    fields[0].to_owned(),
                    port.parse().ok()?,
                    fields.get(2)?.to_string(),
                    fields.get(3)?.to_string(),
                ))
            })
            .filter(|(_, _, flags, _)| !flags.contains("fail"))
            .collect();
        nodes
            .iter()
            .filter(|(_, _, flags, _)| flags.contains("slave"))
            .filter_map(|(_, replica, _, primary_id)| {
                let primary = nodes.iter().find(|(id, ..)| id == primary_id)?.1;
                Some(Shard {
                    primary,
                    replica: *replica,
                })
            })
            .collect()
    }

    /// kill -9 of the node on `port`; it stays dead.
    pub fn kill_9(&mut self, port: u16) {
        for slot in &mut self.nodes {
            if slot.as_ref().is_some_and(|node| node.port() == port) {
                slot.take().expect("a live node").kill_9();
            }
        }
    }

    /// `CLUSTER FAILOVER` on the replica at `port`: it takes its primary's
    /// slots over with the primary's agreement, after catching up with it
    /// (no acknowledged write lost).
    pub fn failover(&self, port: u16) -> Result<(), String> {
        let node = self.node(port);
        match node.query(&["CLUSTER", "FAILOVER"]) {
            Ok(Reply::Status(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }

    /// Waits until the node at `port` is a primary and every live node
    /// says `cluster_state:ok`; how long that took.
    ///
    /// # Panics
    ///
    /// If it is not within `within`.
    pub async fn wait_for_primary(&self, port: u16, within: Duration) -> Duration {
        let started = Instant::now();
        let deadline = started + within;
        while !self.node(port).info("replication").contains("role:master") {
            assert!(
                Instant::now() < deadline,
                "the node on port {port} was not promoted within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.wait_until_healthy(deadline.saturating_duration_since(Instant::now()))
            .await;
        started.elapsed()
    }

    /// Waits until every live node says `cluster_state:ok` and every live
    /// replica's link to its primary is up: a replica whose link is not up
    /// yet never fails over.
    ///
    /// # Panics
    ///
    /// If they do not within `within`.
    pub async fn wait_until_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let healthy = self.live().all(|node| {
                let state = matches!(
                    node.query(&["CLUSTER", "INFO"]),
                    Ok(Reply::Bulk(Some(info))) if info.contains("cluster_state:ok")
                );
                let replication = node.info("replication");
                let linked = replication.contains("role:master")
                    || replication.contains("master_link_status:up");
                state && linked
            });
            if healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster was not healthy within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().flatten()
    }

    fn node(&self, port: u16) -> &RedisServer {
        self.live()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no live node on port {port}"))
    }
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn port_with_free_bus() -> u16 {
    loop {
        let port = free_port();
        if port > 55_000 {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}
