//! The store conformance suite against a real Redis (`IDEM_TEST_REDIS_URL`,
//! default `redis://127.0.0.1:6379`).

use idem_redis::RedisStore;
use idem_test_support::{redis_url, server_missing};
use redis::aio::ConnectionManager;

async fn redis() -> Option<RedisStore<ConnectionManager>> {
    let url = redis_url();
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
/// this test binary. The nodes live in a static, never dropped: each is
/// stopped by a watchdog once this process exits
/// (`RedisServer::stop_when_this_process_exits`), so a run leaves nothing
/// behind.
mod cluster {
    use std::sync::OnceLock;

    use idem_redis::RedisStore;
    use idem_test_support::redis::{RedisServer, redis_cli_says, wait_until};
    use redis::cluster::ClusterClient;
    use redis::cluster_async::ClusterConnection;

    /// The nodes, started on first use and kept for the test binary's life
    /// (each stops itself when the binary exits).
    static NODES: OnceLock<Option<Vec<RedisServer>>> = OnceLock::new();

    fn start() -> Option<Vec<RedisServer>> {
        let node = || {
            RedisServer::start(&[
                "--cluster-enabled yes",
                "--cluster-config-file nodes.conf",
                "--cluster-node-timeout 5000",
            ])
        };
        let nodes = vec![node()?, node()?, node()?];
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let created = std::process::Command::new("redis-cli")
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
        for node in &nodes {
            node.stop_when_this_process_exits();
            wait_until("cluster_state:ok", || {
                redis_cli_says(node.port(), &["cluster", "info"], "cluster_state:ok")
            });
        }
        Some(nodes)
    }

    async fn store() -> Option<RedisStore<ClusterConnection>> {
        let nodes: Vec<String> = NODES
            .get_or_init(start)
            .as_ref()?
            .iter()
            .map(RedisServer::url)
            .collect();
        let client = ClusterClient::new(nodes).expect("cluster client");
        let conn = client
            .get_async_connection()
            .await
            .expect("a cluster connection");
        Some(RedisStore::new(conn))
    }

    idem_core::store_conformance_tests!(store());
}

/// A claim whose `SET NX ... GET` ran on the server but whose reply was lost
/// may be sent again by the connection (redis-rs's cluster connection
/// re-sends a command on a dropped connection or a timeout). The re-sent
/// command finds the claim's own in-flight record: that is the claim
/// acquired, not a duplicate in flight, or the only request for the key
/// would get 409 and block the key for a lease. Another owner is still
/// told "in flight".
#[tokio::test]
async fn a_resent_claim_finds_its_own_record_acquired() {
    use std::time::Duration;

    use idem_core::{Claim, Fingerprint, IdempotencyKey, IdempotencyStore, OwnerToken};

    let Some(store) = redis().await else { return };
    let key = IdempotencyKey::new(
        "idem-test:",
        &format!("resent-claim:{:016x}", rand::random::<u64>()),
    );
    let fingerprint = Fingerprint::from_bytes([7; 32]);
    let lease = Duration::from_secs(60);
    let owner = OwnerToken::generate();
    let claim = |owner| store.claim(&key, &fingerprint, lease, owner);

    assert_eq!(claim(owner).await.unwrap(), Claim::Acquired(owner));
    assert_eq!(
        claim(owner).await.unwrap(),
        Claim::Acquired(owner),
        "the re-sent claim is still the key's owner"
    );
    let other = claim(OwnerToken::generate()).await.unwrap();
    assert!(matches!(other, Claim::InFlight { .. }), "{other:?}");
}
