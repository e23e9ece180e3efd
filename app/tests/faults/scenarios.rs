//! The faults, each alone and then mixed, and what a run of one reports.
//!
//! Every scenario: three `orders` instances (transactional `POST /orders`
//! on PostgreSQL, Redis gate in front), the workload for [`LOAD`] with the
//! fault injected on a timeline, the fault healed, every operation sent
//! once more (it must be replayed), then the checker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idem_tower::sql::sqlx::PgPool;

use crate::apps::Apps;
use crate::checker::{self, Verdict};
use crate::topology;
use crate::workload::Workload;
use idem_test_support::fault_proxy::{Mode, Proxy};
use idem_test_support::loss_window::LossWindow;
use idem_test_support::pgbouncer::PgBouncer;
use idem_test_support::postgres::Postgres;
use idem_test_support::redis::{RedisServer, Sentinel};
use idem_test_support::unique;

/// How long the workload sends new operations.
const LOAD: Duration = Duration::from_secs(10);
/// Concurrent workers.
const WORKERS: usize = 12;
/// `orders` processes per run.
pub(crate) const INSTANCES: usize = 6;
/// The Sentinel service name.
const SERVICE: &str = "idem";

pub(crate) type Run =
    for<'a> fn(&'a Postgres) -> Pin<Box<dyn Future<Output = Option<Report>> + 'a>>;

/// A fault to inject.
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) what: &'static str,
    /// The lane it runs in ([`LANES`]).
    pub(crate) lane: usize,
    pub(crate) run: Run,
}

/// The suite runs in two lanes at once, each its scenarios one after
/// another on a PostgreSQL of the lane's own: a scenario mostly waits (on
/// its timeline, on servers starting, on clients' timeouts), so two side by
/// side take about half the wall time and stay far from the load the suite
/// holds under (docs/development.md, "Tests that hold under load"). Lane 0
/// has the faults of single servers and Redis Cluster's; lane 1 Patroni's
/// and the partitions, which alone make network namespaces (their hosts
/// pick free indices one scenario at a time). `--test-threads=1` runs the
/// lanes one after the other, for figures without a neighbour.
pub(crate) const LANES: usize = 2;

/// The suite, in the table's order; each lane runs its own in this order.
pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "no-fault",
        what: "the baseline: the same workload, nothing injected",
        lane: 0,
        run: |pg| Box::pin(no_fault(pg)),
    },
    Scenario {
        name: "redis-failover",
        what: "replication cut, the primary killed, Sentinel promotes the stale replica",
        lane: 0,
        run: |pg| Box::pin(redis_failover(pg)),
    },
    Scenario {
        name: "redis-restart",
        what: "Redis killed and started again empty (no persistence)",
        lane: 0,
        run: |pg| Box::pin(redis_restart(pg)),
    },
    Scenario {
        name: "postgres-restart",
        what: "PostgreSQL crashes (stop -m immediate) and is started again 4.5 s later",
        lane: 0,
        run: |pg| Box::pin(postgres_restart(pg)),
    },
    Scenario {
        name: "pgbouncer-restart",
        what: "the instances through PgBouncer in transaction pooling, killed (kill -9) and started again 3.5 s later",
        lane: 0,
        run: |pg| Box::pin(pgbouncer_restart(pg)),
    },
    Scenario {
        name: "kill-instances",
        what: "kill -9 of one orders instance every 2 s, started again",
        lane: 0,
        run: |pg| Box::pin(kill_instances(pg)),
    },
    Scenario {
        name: "slow-and-cut-connections",
        what: "proxies before PostgreSQL and Redis: latency, resets, dropped answers",
        lane: 0,
        run: |pg| Box::pin(slow_and_cut_connections(pg)),
    },
    Scenario {
        name: "mixed",
        what: "all at once: failover, PostgreSQL crash, instance kills, a faulty proxy",
        lane: 0,
        run: |pg| Box::pin(mixed(pg)),
    },
    Scenario {
        name: "redis-cluster-kill",
        what: "a Redis Cluster primary killed (kill -9) mid-load, its replica promoted",
        lane: 0,
        run: |pg| Box::pin(topology::redis_cluster_kill(pg)),
    },
    Scenario {
        name: "redis-cluster-failover",
        what: "CLUSTER FAILOVER of two shards while writes go on",
        lane: 0,
        run: |pg| Box::pin(topology::redis_cluster_failover(pg)),
    },
    Scenario {
        name: "patroni-crash-sync",
        what: "Patroni, synchronous: the primary's node crashed (Patroni and PostgreSQL kill -9), the standby promoted",
        lane: 1,
        run: |pg| Box::pin(topology::patroni_crash_sync(pg)),
    },
    Scenario {
        name: "patroni-switchover-sync",
        what: "Patroni, synchronous: a planned switchover to the standby",
        lane: 1,
        run: |pg| Box::pin(topology::patroni_switchover_sync(pg)),
    },
    Scenario {
        name: "patroni-crash-async",
        what: "Patroni, asynchronous: the standby cut off 2 s, then the primary's node crashed and the stale standby promoted",
        lane: 1,
        run: |pg| Box::pin(topology::patroni_crash_async(pg)),
    },
    Scenario {
        name: "partition-postgres",
        what: "each instance on a host of its own; one cut from PostgreSQL for 5 s (iptables DROP)",
        lane: 1,
        run: |pg| Box::pin(topology::partition_postgres(pg)),
    },
    Scenario {
        name: "partition-redis",
        what: "each instance on a host of its own; one cut from Redis for 5 s",
        lane: 1,
        run: |pg| Box::pin(topology::partition_redis(pg)),
    },
    Scenario {
        name: "partition-clients",
        what: "each instance on a host of its own; one cut from its clients for 5 s",
        lane: 1,
        run: |pg| Box::pin(topology::partition_clients(pg)),
    },
    Scenario {
        name: "partition-plain-short",
        what: "plain mode (2 s lease): one instance cut from both stores for 0.5 s, shorter than a lease",
        lane: 1,
        run: |pg| Box::pin(topology::partition_plain_short(pg)),
    },
    Scenario {
        name: "partition-plain-long",
        what: "plain mode (2 s lease): one instance cut from both stores for 6 s, longer than a lease",
        lane: 1,
        run: |pg| Box::pin(topology::partition_plain_long(pg)),
    },
];

/// One row of the table.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) name: &'static str,
    pub(crate) verdict: Verdict,
    pub(crate) attempts: u64,
    pub(crate) five_xx: u64,
    pub(crate) unavailable_with_retry_after: u64,
    pub(crate) transport_errors: u64,
    pub(crate) fallback_caught: u64,
    pub(crate) served_by_sql_alone: u64,
    pub(crate) degraded_seconds: usize,
    pub(crate) kills: u64,
    /// From the fault's injection to service as before, where measured.
    pub(crate) recovered: Option<Duration>,
    /// Asynchronous replication: acknowledged operations lost with their
    /// record in a failover are counted, not a failure.
    pub(crate) may_lose_acknowledged: bool,
    /// What the scenario must also show (a fallback caught, a 503 with
    /// `Retry-After`), unmet.
    pub(crate) unmet: Vec<String>,
    pub(crate) notes: String,
}

impl Report {
    pub(crate) const HEADER: &'static str = "| fault | operations | effects | doubles | lost | acknowledged, lost with record | unanswered | wrong answers | recovered in s | attempts | 5xx answered | 503 + Retry-After | no answer | fallback caught | served by SQL alone | degraded s | instances killed | command |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

    /// The markdown row.
    pub(crate) fn row(&self) -> String {
        let v = &self.verdict;
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | `cargo test -p idem-app --test faults -- {}` |",
            self.name,
            v.operations,
            v.effects,
            v.doubles,
            v.lost,
            v.acknowledged_lost,
            v.unanswered,
            v.wrong_answers,
            self.recovered
                .map_or_else(|| "-".to_owned(), |d| format!("{:.1}", d.as_secs_f64())),
            self.attempts,
            self.five_xx,
            self.unavailable_with_retry_after,
            self.transport_errors,
            self.fallback_caught,
            self.served_by_sql_alone,
            self.degraded_seconds,
            self.kills,
            self.name,
        )
    }

    /// Why the run failed, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        let clean = if self.may_lose_acknowledged {
            self.verdict.clean_but_for_acknowledged_lost()
        } else {
            self.verdict.clean()
        };
        if clean && self.unmet.is_empty() {
            return None;
        }
        Some(format!(
            "{}: {:?}\nunmet: {:?}\nproblems: {:#?}\n{}",
            self.name, self.verdict, self.unmet, self.verdict.problems, self.notes
        ))
    }
}

/// Runs the workload against `apps` for `load` while `faults` plays out,
/// then heals nothing itself (the fault future ends healed), re-sends every
/// operation, and checks the ledger of the database at `checked`.
pub(crate) async fn drive(
    name: &'static str,
    checked: &str,
    apps: Arc<Apps>,
    load: Duration,
    faults: impl Future<Output = impl Into<Healed>>,
) -> Report {
    let workload = Workload::new(&unique(name), apps.clone());
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sending = tokio::spawn({
        let (workload, stop) = (workload.clone(), stop.clone());
        async move { workload.run(WORKERS, stop).await }
    });
    let Healed {
        notes,
        recovered,
        may_lose,
    } = faults.await.into();
    tokio::time::sleep_until((started + load).into()).await;
    stop.store(true, Ordering::Relaxed);
    let sent = sending.await.expect("the workload");
    let ops: Vec<_> = sent.iter().map(|s| s.op.clone()).collect();
    let resent = workload.resend(&ops, WORKERS).await;
    let (fallback_caught, served_by_sql_alone) = apps.tier_counters().await;
    let pool = PgPool::connect(checked)
        .await
        .expect("the checker's connection");
    let verdict = checker::check(&pool, &workload.tenant, &sent, &resent, may_lose).await;
    let tally = &workload.tally;
    let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    Report {
        name,
        verdict,
        attempts: read(&tally.attempts),
        five_xx: read(&tally.five_xx),
        unavailable_with_retry_after: read(&tally.unavailable_with_retry_after),
        transport_errors: read(&tally.transport_errors),
        fallback_caught,
        served_by_sql_alone,
        degraded_seconds: tally.degraded_seconds(),
        kills: read(&apps.kills),
        recovered,
        may_lose_acknowledged: may_lose.is_some(),
        unmet: Vec::new(),
        notes,
    }
}

/// How a fault ended: what it did, and how long after it was injected the
/// system served as before (when the scenario measures it).
pub(crate) struct Healed {
    pub(crate) notes: String,
    pub(crate) recovered: Option<Duration>,
    /// When acknowledged operations may have been lost (asynchronous
    /// replication's failover), for the checker.
    pub(crate) may_lose: Option<LossWindow>,
}

impl From<String> for Healed {
    fn from(notes: String) -> Self {
        Self {
            notes,
            recovered: None,
            may_lose: None,
        }
    }
}

/// Whether the topology scenarios run their full form
/// (`IDEM_FAULTS_FULL=1`); by default, and in CI, their short one.
pub(crate) fn full() -> bool {
    std::env::var("IDEM_FAULTS_FULL").is_ok_and(|v| v == "1" || v == "true")
}

/// The load of a topology scenario: `short` seconds, or `full` in its
/// full form.
pub(crate) fn load_of(short: u64, full_secs: u64) -> Duration {
    Duration::from_secs(if full() { full_secs } else { short })
}

/// Sleeps until `secs` after `start`.
pub(crate) async fn at(start: Instant, secs: f64) {
    tokio::time::sleep_until((start + Duration::from_secs_f64(secs)).into()).await;
}

/// A primary, its replica (replicating through a proxy, so the link can be
/// cut) and a Sentinel watching them.
struct Replicated {
    primary: RedisServer,
    replica: RedisServer,
    link: Proxy,
    sentinel: Sentinel,
}

impl Replicated {
    async fn start() -> Option<Self> {
        let primary = RedisServer::start(&[])?;
        let link = Proxy::start(([127, 0, 0, 1], primary.port()).into()).await;
        let replica = RedisServer::replica_of(link.addr.port())?;
        let sentinel = Sentinel::start(SERVICE, primary.port(), 1000)?;
        sentinel.wait_for_replicas(1, Duration::from_secs(30)).await;
        Some(Self {
            primary,
            replica,
            link,
            sentinel,
        })
    }

    /// Cuts replication, lets writes go on to the primary alone for
    /// `for_secs`, kills the primary and has Sentinel promote the replica,
    /// which has none of those writes. Returns when the replica is primary
    /// and every instance of `apps` uses it.
    async fn fail_over_losing_writes(&mut self, apps: &Apps, for_secs: f64) -> String {
        self.link.set(Mode::Cut);
        tokio::time::sleep(Duration::from_secs_f64(for_secs)).await;
        self.primary.kill_9();
        let promoted = Instant::now();
        self.sentinel
            .fail_over_to(self.replica.port(), Duration::from_secs(20))
            .await;
        let named = promoted.elapsed();
        apps.wait_for_gates(Duration::from_secs(30)).await;
        format!(
            "failover: the Sentinel named the replica {:.1} s after the primary's kill, \
             every instance used the gate again {:.1} s after it",
            named.as_secs_f64(),
            promoted.elapsed().as_secs_f64()
        )
    }
}

async fn no_fault(pg: &Postgres) -> Option<Report> {
    let redis = RedisServer::start(&[])?;
    let apps = Arc::new(Apps::start(&pg.url(), Some(&redis.url()), INSTANCES).await);
    let mut report = drive("no-fault", &pg.url(), apps, LOAD, async { String::new() }).await;
    // Concurrent copies race for the gate, but Redis lost nothing: a catch
    // here would be counted falsely, and the faults' counts would mean
    // nothing.
    if report.fallback_caught != 0 {
        report
            .unmet
            .push("SQL counted catches with Redis up and nothing lost".into());
    }
    Some(report)
}

async fn redis_failover(pg: &Postgres) -> Option<Report> {
    let mut redis = Replicated::start().await?;
    let apps = Arc::new(Apps::start(&pg.url(), Some(&redis.sentinel.url()), INSTANCES).await);
    let start = Instant::now();
    let mut report = drive("redis-failover", &pg.url(), apps.clone(), LOAD, async {
        at(start, 1.5).await;
        redis.fail_over_losing_writes(&apps, 2.5).await
    })
    .await;
    if report.fallback_caught == 0 {
        report
            .unmet
            .push("no duplicate was caught by SQL after the failover lost its key".into());
    }
    Some(report)
}

async fn redis_restart(pg: &Postgres) -> Option<Report> {
    let mut redis = RedisServer::start(&[])?;
    let port = redis.port();
    let apps = Arc::new(Apps::start(&pg.url(), Some(&redis.url()), INSTANCES).await);
    let start = Instant::now();
    let mut report = drive("redis-restart", &pg.url(), apps.clone(), LOAD, async {
        at(start, 4.0).await;
        redis.kill_9();
        tokio::time::sleep(Duration::from_millis(500)).await;
        redis = RedisServer::start_on(port, &[]).expect("Redis again on its port");
        let back = Instant::now();
        apps.wait_for_gates(Duration::from_secs(30)).await;
        format!(
            "Redis down 0.5 s at t=4 s, back empty on port {port}; every instance used the gate \
             again {:.1} s later",
            back.elapsed().as_secs_f64()
        )
    })
    .await;
    if report.fallback_caught == 0 {
        report
            .unmet
            .push("no duplicate was caught by SQL after Redis lost every key".into());
    }
    Some(report)
}

async fn postgres_restart(pg: &Postgres) -> Option<Report> {
    let redis = RedisServer::start(&[])?;
    let apps = Arc::new(Apps::start(&pg.url(), Some(&redis.url()), INSTANCES).await);
    let start = Instant::now();
    let mut report = drive("postgres-restart", &pg.url(), apps, LOAD, async {
        at(start, 2.5).await;
        tokio::task::block_in_place(|| pg.crash());
        at(start, 7.0).await;
        tokio::task::block_in_place(|| pg.start_again());
        format!(
            "PostgreSQL down from t=2.5 s, accepting again at t={:.1} s",
            start.elapsed().as_secs_f64()
        )
    })
    .await;
    if report.unavailable_with_retry_after == 0 {
        report
            .unmet
            .push("no 503 with Retry-After while PostgreSQL was down".into());
    }
    if report.kills != 0 {
        report.unmet.push("an instance was restarted".into());
    }
    Some(report)
}

async fn pgbouncer_restart(pg: &Postgres) -> Option<Report> {
    let redis = RedisServer::start(&[])?;
    let mut bouncer = PgBouncer::start(pg.port()).await?;
    let apps = Arc::new(Apps::start(&bouncer.url(), Some(&redis.url()), INSTANCES).await);
    let start = Instant::now();
    let mut report = drive("pgbouncer-restart", &pg.url(), apps, LOAD, async {
        at(start, 3.0).await;
        bouncer.crash().await;
        // Down past the pool's acquire timeout (3 s): requests meet it.
        at(start, 6.5).await;
        bouncer.start_again().await;
        format!(
            "PgBouncer killed at t=3 s, accepting again at t={:.1} s",
            start.elapsed().as_secs_f64()
        )
    })
    .await;
    if report.unavailable_with_retry_after == 0 {
        report
            .unmet
            .push("no 503 with Retry-After while PgBouncer was down".into());
    }
    if report.kills != 0 {
        report.unmet.push("an instance was restarted".into());
    }
    Some(report)
}

async fn kill_instances(pg: &Postgres) -> Option<Report> {
    let redis = RedisServer::start(&[])?;
    let apps = Arc::new(Apps::start(&pg.url(), Some(&redis.url()), INSTANCES).await);
    let start = Instant::now();
    let killer = apps.clone();
    let report = drive("kill-instances", &pg.url(), apps, LOAD, async move {
        for (i, second) in [2.0, 4.0, 6.0, 8.0].into_iter().enumerate() {
            at(start, second).await;
            killer.kill_and_restart(i % killer.len()).await;
        }
        "kill -9 at t=2, 4, 6, 8 s".to_owned()
    })
    .await;
    Some(report)
}

/// The proxies' fault rates: per chunk, so a request (several round trips
/// to PostgreSQL, one or two to Redis) meets one a few times in a hundred.
fn faulty(rate: f64) -> Mode {
    Mode::Faulty {
        latency: Duration::from_millis(1),
        reset: rate,
        drop_answer: rate,
    }
}

async fn slow_and_cut_connections(pg: &Postgres) -> Option<Report> {
    let redis = RedisServer::start(&[])?;
    let pg_proxy = Proxy::start(([127, 0, 0, 1], pg.port()).into()).await;
    let redis_proxy = Proxy::start(([127, 0, 0, 1], redis.port()).into()).await;
    let redis_url = format!("redis://127.0.0.1:{}", redis_proxy.addr.port());
    let apps = Arc::new(
        Apps::start(
            &pg.url_via(pg_proxy.addr.port()),
            Some(&redis_url),
            INSTANCES,
        )
        .await,
    );
    let report = drive("slow-and-cut-connections", &pg.url(), apps, LOAD, async {
        pg_proxy.set(faulty(0.004));
        redis_proxy.set(faulty(0.01));
        tokio::time::sleep(LOAD).await;
        pg_proxy.set(Mode::Pass);
        redis_proxy.set(Mode::Pass);
        format!(
            "PostgreSQL proxy: {}; Redis proxy: {}",
            pg_proxy.counts, redis_proxy.counts
        )
    })
    .await;
    Some(report)
}

async fn mixed(pg: &Postgres) -> Option<Report> {
    let mut redis = Replicated::start().await?;
    let pg_proxy = Proxy::start(([127, 0, 0, 1], pg.port()).into()).await;
    let apps = Arc::new(
        Apps::start(
            &pg.url_via(pg_proxy.addr.port()),
            Some(&redis.sentinel.url()),
            INSTANCES,
        )
        .await,
    );
    let start = Instant::now();
    let killer = apps.clone();
    let report = drive("mixed", &pg.url(), apps, LOAD, async {
        pg_proxy.set(faulty(0.002));
        let kills = async {
            for (i, second) in [1.5, 4.0, 8.5].into_iter().enumerate() {
                at(start, second).await;
                killer.kill_and_restart(i % killer.len()).await;
            }
        };
        let redis_fault = async {
            at(start, 2.0).await;
            redis.fail_over_losing_writes(&killer, 2.0).await
        };
        let pg_fault = async {
            at(start, 6.0).await;
            tokio::task::block_in_place(|| pg.crash());
            at(start, 7.5).await;
            tokio::task::block_in_place(|| pg.start_again());
        };
        let (failover, (), ()) = tokio::join!(redis_fault, kills, pg_fault);
        pg_proxy.set(Mode::Pass);
        format!("{failover}; PostgreSQL proxy: {}", pg_proxy.counts)
    })
    .await;
    Some(report)
}
