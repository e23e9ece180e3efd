//! The production topology under faults (DESIGN.md, section 13): Redis
//! Cluster failovers, PostgreSQL failovers under Patroni, and network
//! partitions between an instance and its stores or its clients.
//!
//! Each scenario runs a short form by default (CI runs these) and its full
//! form, a longer load, with `IDEM_FAULTS_FULL=1`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::apps::Apps;
use crate::checker::LossWindow;
use crate::haproxy::HaProxy;
use crate::patroni::{Patroni, Replication};
use crate::postgres::Postgres;
use crate::proxy::Mode;
use crate::redis_cluster::RedisCluster;
use crate::redis_servers::RedisServer;
use crate::scenarios::{Healed, INSTANCES, Report, at, drive, load_of};

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
                at(start, 3.0).await;
                cluster.link(0).set(Mode::Cut);
                // A commit acknowledged just before the cut may not have
                // been streamed yet.
                let cut = Instant::now() - Duration::from_millis(100);
                at(start, 5.0).await;
                cluster.crash(0);
                let crashed = Instant::now();
                let what = "node0's replication to node1 cut at t=3 s, node0 crashed at t=5 s";
                // An answer node0 sent before it died may be read just
                // after; node1 is promoted seconds later.
                let window = LossWindow {
                    from: cut,
                    to: crashed + Duration::from_secs(1),
                };
                (crashed, what.to_owned(), Some(window))
            }
        };
        cluster.wait_for_role(1, "primary", within).await;
        let promoted = injected.elapsed();
        let served = haproxy.wait_for_primary(within).await;
        let recovered = injected.elapsed();
        Healed {
            notes: format!(
                "{what}; {} primary {:.1} s after it, HAProxy routing to it {:.1} s after it \
                 ({:.1} s after the promotion)",
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
