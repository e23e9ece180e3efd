//! The store conformance suite against a real Redis (`IDEM_TEST_REDIS_URL`,
//! default `redis://127.0.0.1:6379`).
#![cfg(all(feature = "test-util", feature = "redis"))]

use idem_core::conformance::{server_missing, server_url};
use idem_core::redis::RedisStore;
use redis::aio::ConnectionManager;

async fn redis() -> Option<RedisStore<ConnectionManager>> {
    let url = server_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    match client.get_connection_manager().await {
        Ok(conn) => Some(RedisStore::new(conn)),
        Err(err) => server_missing("Redis", &url, err),
    }
}

mod single {
    idem_core::store_conformance_tests!(super::redis());
}

/// A Redis Cluster of three masters on loopback ports, started once for
/// this test binary. Each node runs under a watchdog that stops it when this
/// process exits, so a run leaves nothing behind.
mod cluster {
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use idem_core::conformance::server_missing;
    use idem_core::redis::RedisStore;
    use redis::cluster::ClusterClient;
    use redis::cluster_async::ClusterConnection;

    static NODES: OnceLock<Option<Vec<String>>> = OnceLock::new();

    /// A port free for a node and for its cluster bus (port + 10000).
    fn free_port(taken: &[u16]) -> u16 {
        loop {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("an ephemeral port");
            let fits = (1024..55535).contains(&port)
                && !taken.contains(&port)
                && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok();
            if fits {
                return port;
            }
        }
    }

    fn answers(port: u16, command: &[&str], expect: &str) -> bool {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(command)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(expect))
    }

    fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            assert!(Instant::now() < deadline, "{what} never happened");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start() -> Option<Vec<String>> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            return server_missing("redis-server (for a Redis Cluster)", "PATH", "not found");
        }
        let mut ports = Vec::new();
        for _ in 0..3 {
            let port = free_port(&ports);
            ports.push(port);
        }
        let me = std::process::id();
        for port in &ports {
            let dir: PathBuf = std::env::temp_dir().join(format!("idem-cluster-{me}-{port}"));
            std::fs::create_dir_all(&dir).expect("a node directory");
            let node = format!(
                "redis-server --port {port} --bind 127.0.0.1 --cluster-enabled yes \
                 --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
                 --dir {dir} --save '' --appendonly no --logfile node.log",
                dir = dir.display()
            );
            let watchdog = format!(
                "{node} & node=$!; while kill -0 {me} 2>/dev/null; do sleep 1; done; \
                 kill $node; rm -rf {dir}",
                dir = dir.display()
            );
            Command::new("sh")
                .args(["-c", &watchdog])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a cluster node");
        }
        for port in &ports {
            wait_until("a cluster node answering", || {
                answers(*port, &["ping"], "PONG")
            });
        }
        let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            created.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        for port in &ports {
            wait_until("cluster_state:ok", || {
                answers(*port, &["cluster", "info"], "cluster_state:ok")
            });
        }
        Some(addresses.iter().map(|a| format!("redis://{a}")).collect())
    }

    async fn store() -> Option<RedisStore<ClusterConnection>> {
        let nodes = NODES.get_or_init(start).clone()?;
        let client = ClusterClient::new(nodes).expect("cluster client");
        let conn = client
            .get_async_connection()
            .await
            .expect("a cluster connection");
        Some(RedisStore::new(conn))
    }

    idem_core::store_conformance_tests!(store());
}
