//! The production topology under faults (DESIGN.md, section 13): Redis
//! Cluster failovers, PostgreSQL failovers under Patroni, and network
//! partitions between an instance and its stores or its clients (each
//! instance on a host of its own, a network namespace: `netns.rs`).
//!
//! Each scenario runs a short form by default (CI runs these) and its full
//! form, a longer load, with `IDEM_FAULTS_FULL=1`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::apps::{Apps, Launch};
use crate::scenarios::{Healed, INSTANCES, Report, at, drive, load_of};
use idem_test_support::fault_proxy::{Mode, Proxy};
use idem_test_support::haproxy::HaProxy;
use idem_test_support::loss_window::LossWindow;
use idem_test_support::netns::{Host, free_indices};
use idem_test_support::patroni::{Patroni, Replication};
use idem_test_support::postgres::Postgres;
use idem_test_support::redis::RedisServer;
use idem_test_support::redis_cluster::RedisCluster;

/// kill -9 of a cluster primary at 3 s: the others mark it failed after
/// the node timeout and its replica is elected; meanwhile the cluster
/// refuses every command (its slots are not covered) and the instances
/// serve from SQL alone.
pub(crate) async fn redis_cluster_kill(pg: &Postgres) -> Option<Report> {
    let mut cluster = RedisCluster::start(3).await?;
    let apps = Arc::new(Apps::start(&pg.url(), Some(&cluster.url()), INSTANCES).await);
    let start = Instant::now();
    let load = load_of(12, 20);
    let report = drive("redis-cluster-kill", &pg.url(), apps.clone(), load, async {
        at(start, 3.0).await;
        let shard = cluster.shards()[0];
        cluster.kill_9(shard.primary);
        let killed = Instant::now();
        let promoted = cluster
            .wait_for_primary(shard.replica, Duration::from_secs(30))
            .await;
        apps.wait_for_gates(Duration::from_secs(30)).await;
        Healed {
            notes: format!(
                "the primary on port {} killed at t=3 s; its replica on port {} primary and the \
                 cluster ok {:.1} s later, every instance using the gate again {:.1} s after the kill",
                shard.primary,
                shard.replica,
                promoted.as_secs_f64(),
                killed.elapsed().as_secs_f64()
            ),
            recovered: Some(killed.elapsed()),
            may_lose: None,
        }
    })
    .await;
    Some(report)
}

/// `CLUSTER FAILOVER` on the replica of one shard at 3 s and of another
/// at 7 s: each replica catches up with its primary, which stops writes
/// for that moment, and they swap roles. Nothing acknowledged is lost.
pub(crate) async fn redis_cluster_failover(pg: &Postgres) -> Option<Report> {
    let cluster = RedisCluster::start(3).await?;
    let apps = Arc::new(Apps::start(&pg.url(), Some(&cluster.url()), INSTANCES).await);
    let start = Instant::now();
    let load = load_of(12, 20);
    let report = drive(
        "redis-cluster-failover",
        &pg.url(),
        apps.clone(),
        load,
        async {
            let shards = cluster.shards();
            let mut notes = Vec::new();
            let mut longest = Duration::ZERO;
            for (shard, second) in shards.iter().zip([3.0, 7.0]) {
                at(start, second).await;
                let asked = Instant::now();
                cluster
                    .failover(shard.replica)
                    .unwrap_or_else(|err| panic!("CLUSTER FAILOVER refused: {err}"));
                let promoted = cluster
                    .wait_for_primary(shard.replica, Duration::from_secs(30))
                    .await;
                longest = longest.max(asked.elapsed());
                notes.push(format!(
                    "at t={second} s the replica on port {} primary {:.1} s after CLUSTER FAILOVER",
                    shard.replica,
                    promoted.as_secs_f64()
                ));
            }
            apps.wait_for_gates(Duration::from_secs(30)).await;
            Healed {
                notes: notes.join("; "),
                recovered: Some(longest),
                may_lose: None,
            }
        },
    )
    .await;
    Some(report)
}

/// What happens to the Patroni cluster mid-load.
#[derive(Debug, Clone, Copy)]
enum PatroniFault {
    /// The primary's node crashes at 4 s (its Patroni and its PostgreSQL
    /// killed with kill -9); Patroni promotes the standby when the leader
    /// lock expires.
    Crash,
    /// A planned switchover to the standby at 4 s.
    Switchover,
    /// The standby's replication cut at 3 s (it falls behind, the primary
    /// acknowledging commits alone), then the primary's node crashes at
    /// 5 s and the stale standby is promoted.
    CrashBehind,
}

pub(crate) async fn patroni_crash_sync(_: &Postgres) -> Option<Report> {
    patroni(
        "patroni-crash-sync",
        Replication::Synchronous,
        PatroniFault::Crash,
    )
    .await
}

pub(crate) async fn patroni_switchover_sync(_: &Postgres) -> Option<Report> {
    patroni(
        "patroni-switchover-sync",
        Replication::Synchronous,
        PatroniFault::Switchover,
    )
    .await
}

pub(crate) async fn patroni_crash_async(_: &Postgres) -> Option<Report> {
    patroni(
        "patroni-crash-async",
        Replication::Asynchronous,
        PatroniFault::CrashBehind,
    )
    .await
}

/// A primary and a standby under Patroni, the instances and the checker
/// on the primary through HAProxy, the Redis gate in front; `fault` mid-load.
async fn patroni(
    name: &'static str,
    replication: Replication,
    fault: PatroniFault,
) -> Option<Report> {
    let mut cluster = Patroni::start(2, replication).await?;
    let haproxy = HaProxy::start(&cluster.backends()).await?;
    let redis = RedisServer::start(&[])?;
    let apps = Arc::new(Apps::start(&haproxy.url(), Some(&redis.url()), INSTANCES).await);
    // The standby has the app's tables before any fault: promoted without
    // them, it would answer every request with an error until the
    // workload gave up (seen under load, in CI's run beside the checks).
    let caught_up = cluster.wait_caught_up(0, Duration::from_secs(60)).await;
    let start = Instant::now();
    let load = load_of(20, 30);
    let mut report = drive(name, &haproxy.url(), apps, load, async {
        let within = Duration::from_secs(60);
        let (injected, what, may_lose) = match fault {
            PatroniFault::Crash => {
                at(start, 4.0).await;
                cluster.crash(0);
                (Instant::now(), "node0 crashed at t=4 s".to_owned(), None)
            }
            PatroniFault::Switchover => {
                at(start, 4.0).await;
                let asked = Instant::now();
                let said = cluster
                    .switchover(0, 1)
                    .await
                    .unwrap_or_else(|err| panic!("the switchover failed: {err}"));
                let what = format!("switchover asked at t=4 s ({})", said.trim());
                (asked, what, None)
            }
            PatroniFault::CrashBehind => {
                // Where node0's WAL stood, sampled from the start: the
                // loss window opens at the last sample node1 had received
                // when it was cut off. A commit acknowledged before that
                // sample is on node1; one after it may be lost. (A fixed
                // guess of node1's lag, 1 s, fell short on a loaded
                // machine.)
                let sampling = Arc::new(AtomicBool::new(true));
                let samples = tokio::spawn(wal_samples(cluster.url(0), sampling.clone()));
                at(start, 3.0).await;
                cluster.link(0).set(Mode::Cut);
                let cut = Instant::now();
                at(start, 5.0).await;
                sampling.store(false, Ordering::Relaxed);
                let received = cluster.wal_position(1).await.expect("node1's WAL position");
                let samples = samples.await.expect("node0's WAL samples");
                cluster.crash(0);
                let crashed = Instant::now();
                let from = samples
                    .iter()
                    .filter(|(_, position)| *position <= received)
                    .map(|(at, _)| *at)
                    .max()
                    .unwrap_or(start);
                let what = format!(
                    "node0's replication to node1 cut at t=3 s, node0 crashed at t=5 s; node1 had \
                     node0's WAL as of {:.2} s before the cut ({} samples)",
                    cut.saturating_duration_since(from).as_secs_f64(),
                    samples.len(),
                );
                let window = LossWindow { from, crashed };
                (crashed, what, Some(window))
            }
        };
        cluster.wait_for_role(1, "primary", within).await;
        let promoted = injected.elapsed();
        let served = haproxy.wait_for_primary(within).await;
        let recovered = injected.elapsed();
        Healed {
            notes: format!(
                "standby caught up with the schema in {:.1} s; {what}; {} primary {:.1} s after \
                 it, HAProxy routing to it {:.1} s after it ({:.1} s after the promotion)",
                caught_up.as_secs_f64(),
                cluster.name(1),
                promoted.as_secs_f64(),
                recovered.as_secs_f64(),
                served.as_secs_f64(),
            ),
            recovered: Some(recovered),
            may_lose,
        }
    })
    .await;
    if report.may_lose_acknowledged {
        let v = &report.verdict;
        report.notes.push_str(&format!(
            "; asynchronous replication: {} operations acknowledged while node1 was cut off were \
             lost with their idempotency record in the failover (committed and acknowledged by \
             node0 alone, gone with it): {} of them the Redis gate, which still held their \
             completed record, kept replaying with no effect behind it; the others ran again \
             (one effect each now, not the one first acknowledged). 0 doubles",
            v.acknowledged_lost, v.replayed_without_effect
        ));
    }
    Some(report)
}

/// Six instances, each on a host of its own (a network namespace), each
/// reaching PostgreSQL and Redis through forwarders on the suite's side of
/// its link: a host's packets to one of them dropped is that host cut
/// from that server, the others unaffected.
struct Partitioned {
    hosts: Vec<Host>,
    /// Per host: the forwarders' ports to PostgreSQL and to Redis.
    ports: Vec<(u16, u16)>,
    apps: Arc<Apps>,
}

impl Partitioned {
    async fn start(pg: &Postgres, redis: &RedisServer, extra: &[&str]) -> Option<Self> {
        let mut hosts = Vec::with_capacity(INSTANCES);
        for index in free_indices(INSTANCES) {
            hosts.push(Host::create(index)?);
        }
        let mut ports = Vec::with_capacity(INSTANCES);
        let mut launches = Vec::with_capacity(INSTANCES);
        for host in &hosts {
            let gateway = host.gateway();
            let to_pg = Proxy::start_on((gateway, 0).into(), ([127, 0, 0, 1], pg.port()).into());
            let to_redis =
                Proxy::start_on((gateway, 0).into(), ([127, 0, 0, 1], redis.port()).into());
            let (to_pg, to_redis) = (to_pg.await.addr.port(), to_redis.await.addr.port());
            ports.push((to_pg, to_redis));
            launches.push(Launch {
                wrapper: host.exec_prefix(),
                listen: format!("{}:0", host.address()),
                database: pg.url_via(to_pg).replace("127.0.0.1", &gateway.to_string()),
                redis: Some(format!("redis://{gateway}:{to_redis}")),
                extra: extra.iter().map(|arg| (*arg).to_owned()).collect(),
            });
        }
        let apps = Arc::new(Apps::start_each(launches).await);
        Some(Self { hosts, ports, apps })
    }

    /// Cuts host `i` as `cut` says.
    fn cut(&self, i: usize, cut: Cut) {
        let (to_pg, to_redis) = self.ports[i];
        let host = &self.hosts[i];
        match cut {
            Cut::Postgres => host.cut_from(to_pg),
            Cut::Redis => host.cut_from(to_redis),
            Cut::Stores => {
                host.cut_from(to_pg);
                host.cut_from(to_redis);
            }
            Cut::Clients => {
                let base = self.apps.base(i);
                let port = base.rsplit(':').next().and_then(|p| p.parse().ok());
                host.cut_clients_of(port.expect("the instance's port"));
            }
        }
    }

    /// Waits until instance `i` answers a request that needs PostgreSQL
    /// (`GET /payments/none`: 404); how long that took.
    async fn wait_serving(&self, i: usize, within: Duration) -> Duration {
        let started = Instant::now();
        let url = format!("{}/payments/none", self.apps.base(i));
        loop {
            let answer = reqwest::Client::new()
                .get(&url)
                .timeout(Duration::from_secs(1))
                .send()
                .await;
            if answer.is_ok_and(|a| a.status() == 404) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "instance {i} did not serve again within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What a host is cut from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Postgres,
    Redis,
    /// PostgreSQL and Redis: every store of its claims.
    Stores,
    Clients,
}

pub(crate) async fn partition_postgres(pg: &Postgres) -> Option<Report> {
    partition("partition-postgres", pg, Cut::Postgres).await
}

pub(crate) async fn partition_redis(pg: &Postgres) -> Option<Report> {
    partition("partition-redis", pg, Cut::Redis).await
}

pub(crate) async fn partition_clients(pg: &Postgres) -> Option<Report> {
    partition("partition-clients", pg, Cut::Clients).await
}

/// One instance cut from `cut` at 3 s for 5 s, then healed, while the
/// other five serve. The cut instance's transactional claims in flight
/// hold their keys in PostgreSQL (their sessions live on) until the heal:
/// their retries meet 409 with `Retry-After` elsewhere meanwhile.
async fn partition(name: &'static str, pg: &Postgres, cut: Cut) -> Option<Report> {
    let redis = RedisServer::start(&[])?;
    let topology = Partitioned::start(pg, &redis, &[]).await?;
    let start = Instant::now();
    let load = load_of(12, 20);
    let cut_for = if crate::scenarios::full() { 8.0 } else { 5.0 };
    let report = drive(name, &pg.url(), topology.apps.clone(), load, async {
        at(start, 3.0).await;
        topology.cut(0, cut);
        at(start, 3.0 + cut_for).await;
        topology.hosts[0].heal();
        let healed = Instant::now();
        let within = Duration::from_secs(30);
        topology.wait_serving(0, within).await;
        if cut == Cut::Redis {
            topology.apps.wait_for_gates(within).await;
        }
        Healed {
            notes: format!(
                "instance 0 (on {}) cut from {cut:?} at t=3 s for {cut_for} s; serving as before \
                 {:.1} s after the heal",
                topology.hosts[0].address(),
                healed.elapsed().as_secs_f64()
            ),
            recovered: Some(healed.elapsed()),
            may_lose: None,
        }
    })
    .await;
    Some(report)
}

/// The lease of plain claims in the plain-mode partitions.
const PLAIN_LEASE_MS: u64 = 2000;
/// How long a payment callback's handler runs on after its effect there.
const CALLBACK_DELAY_MS: u64 = 4000;

pub(crate) async fn partition_plain_short(pg: &Postgres) -> Option<Report> {
    partition_plain("partition-plain-short", pg, 0.5).await
}

pub(crate) async fn partition_plain_long(pg: &Postgres) -> Option<Report> {
    partition_plain("partition-plain-long", pg, 6.0).await
}

/// Plain mode's limit: the payment callback (a plain claim, 2 s lease,
/// the state machine behind it, its handler running on 4 s after its
/// effect) on an instance cut from both its stores for `cut_for` seconds. Shorter than a lease, its renewals and its
/// completion retries land after the heal and no key is taken over. Longer,
/// a handler that made its effect loses its record (its completion fails
/// for a whole lease: `failed`) or its lease (`lost`), and the key frees:
/// a retry runs the handler again. The ledger stays single (the state
/// machine books nothing twice); the counts say how many runs a route
/// without such a guard would have doubled.
async fn partition_plain(name: &'static str, pg: &Postgres, cut_for: f64) -> Option<Report> {
    let redis = RedisServer::start(&[])?;
    let lease = PLAIN_LEASE_MS.to_string();
    let topology = Partitioned::start(pg, &redis, &["--lease-ms", &lease]).await?;
    // Each callback's handler runs on 4 s after its effect: at the cut,
    // the cut instance has some mid-way.
    topology
        .apps
        .callback_delay_ms
        .store(CALLBACK_DELAY_MS, std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    let load = load_of(12, 20);
    let apps = topology.apps.clone();
    let mut report = drive(name, &pg.url(), apps.clone(), load, async {
        at(start, 3.0).await;
        topology.cut(0, Cut::Stores);
        at(start, 3.0 + cut_for).await;
        topology.hosts[0].heal();
        let healed = Instant::now();
        topology.wait_serving(0, Duration::from_secs(30)).await;
        apps.wait_for_gates(Duration::from_secs(30)).await;
        Healed {
            notes: format!(
                "instance 0 cut from PostgreSQL and Redis at t=3 s for {cut_for} s (lease {} s, \
                 callback handlers running on {} s after their effect)",
                PLAIN_LEASE_MS as f64 / 1000.0,
                CALLBACK_DELAY_MS as f64 / 1000.0
            ),
            recovered: Some(healed.elapsed()),
            may_lose: None,
        }
    })
    .await;
    // Let the cut instance's completions retried in the background end.
    tokio::time::sleep(Duration::from_millis(PLAIN_LEASE_MS)).await;
    let completions = "idem_completions_total{";
    let renewals = "idem_lease_renewals_total{";
    let failed = apps.sum_of(completions, "result=\"failed\"").await;
    let retried = apps.sum_of(completions, "result=\"retried\"").await;
    let completion_lost = apps.sum_of(completions, "result=\"lost\"").await;
    let renewals_failed = apps.sum_of(renewals, "result=\"failed\"").await;
    let renewals_lost = apps.sum_of(renewals, "result=\"lost\"").await;
    let runs = apps
        .sum_of("payment_callback_handler_calls_total", "")
        .await;
    let payments = report.verdict.operations.div_ceil(4);
    report.notes.push_str(&format!(
        "; plain claims: completions retried and landed {retried}, failed for a whole lease \
         {failed}, refused as lost {completion_lost}; renewals failed {renewals_failed}, found \
         taken over {renewals_lost}; callback handler runs {runs} for about {payments} payments. \
         Runs a route without a guard would have doubled: {} (failed + lost completions); the \
         ledger: {} doubles",
        failed + completion_lost,
        report.verdict.doubles
    ));
    Some(report)
}

/// Samples the WAL position of the PostgreSQL at `url` every 50 ms while
/// `sampling` holds: when each sample was asked for, and the position.
async fn wal_samples(url: String, sampling: Arc<AtomicBool>) -> Vec<(Instant, i64)> {
    use idem_tower::sql::sqlx::{Connection, PgConnection};

    let mut samples = Vec::new();
    let Ok(mut primary) = PgConnection::connect(&url).await else {
        return samples;
    };
    while sampling.load(Ordering::Relaxed) {
        let asked = Instant::now();
        if let Some(position) = idem_test_support::patroni::wal_position(&mut primary).await {
            samples.push((asked, position));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    samples
}
