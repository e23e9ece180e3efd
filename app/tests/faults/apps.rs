//! The orders instances of a run: real `orders` processes over one
//! database and one Redis, which the workload spreads its attempts over,
//! and which a fault may kill -9 and start again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use idem_test_support::orders::{Orders, client};

/// The tiered store's counters each instance serves on `/metrics`.
const COUNTERS: [&str; 2] = [
    "idem_tier_fallback_caught_total",
    "idem_tier_degraded_total",
];

/// How to start one instance.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// A prefix to run it through (`ip netns exec NAME`), or none.
    pub(crate) wrapper: Vec<String>,
    /// `--listen`.
    pub(crate) listen: String,
    pub(crate) database: String,
    pub(crate) redis: Option<String>,
    /// More arguments (`--lease-ms 1000`).
    pub(crate) extra: Vec<String>,
}

impl Launch {
    /// On loopback, on `database`, behind `redis` if given.
    pub(crate) fn local(database: &str, redis: Option<&str>) -> Self {
        Self {
            wrapper: Vec::new(),
            listen: "127.0.0.1:0".to_owned(),
            database: database.to_owned(),
            redis: redis.map(str::to_owned),
            extra: Vec::new(),
        }
    }
}

/// Running `orders` processes.
pub(crate) struct Apps {
    launches: Vec<Launch>,
    slots: Mutex<Vec<Option<Orders>>>,
    bases: RwLock<Vec<String>>,
    /// What killed instances had counted, read just before each kill.
    counted_by_the_dead: [AtomicU64; 2],
    /// Instances killed with SIGKILL.
    pub(crate) kills: AtomicU64,
    /// What the workload's payment callbacks ask the instances for:
    /// `X-Chaos-Delay-Ms` (0: none), a handler still running after its
    /// effect.
    pub(crate) callback_delay_ms: AtomicU64,
}

impl Apps {
    /// Starts `count` instances of `orders --chaos` on `database`, with
    /// `--redis redis` if given.
    pub(crate) async fn start(database: &str, redis: Option<&str>, count: usize) -> Self {
        Self::start_each(vec![Launch::local(database, redis); count]).await
    }

    /// Starts one instance as each of `launches` says.
    pub(crate) async fn start_each(launches: Vec<Launch>) -> Self {
        let mut slots = Vec::with_capacity(launches.len());
        for launch in &launches {
            slots.push(Some(spawn(launch).await));
        }
        let bases = slots
            .iter()
            .map(|slot| slot.as_ref().expect("started").base.clone())
            .collect();
        Self {
            launches,
            slots: Mutex::new(slots),
            bases: RwLock::new(bases),
            counted_by_the_dead: Default::default(),
            kills: AtomicU64::new(0),
            callback_delay_ms: AtomicU64::new(0),
        }
    }

    /// The base URL of the instance `turn` falls on (round robin).
    pub(crate) fn base(&self, turn: usize) -> String {
        let bases = self.bases.read().expect("bases");
        bases[turn % bases.len()].clone()
    }

    /// kill -9 of instance `index`, then a new process in its place (on a
    /// new port, which the workload picks up).
    pub(crate) async fn kill_and_restart(&self, index: usize) {
        let base = self.base(index);
        let counted = counters(&base).await;
        let doomed = self.slots.lock().expect("slots")[index].take();
        if let Some(doomed) = doomed {
            doomed.kill_9();
            self.kills.fetch_add(1, Ordering::Relaxed);
            for (total, value) in self.counted_by_the_dead.iter().zip(counted) {
                total.fetch_add(value, Ordering::Relaxed);
            }
        }
        let fresh = spawn(&self.launches[index]).await;
        self.bases.write().expect("bases")[index] = fresh.base.clone();
        self.slots.lock().expect("slots")[index] = Some(fresh);
    }

    /// How many instances there are.
    pub(crate) fn len(&self) -> usize {
        self.bases.read().expect("bases").len()
    }

    /// Duplicates SQL caught after Redis let them through, and requests
    /// served by SQL alone while Redis was out: summed over every instance
    /// that ran, the killed ones as of just before their kill.
    pub(crate) async fn tier_counters(&self) -> (u64, u64) {
        let bases = self.bases.read().expect("bases").clone();
        let mut sums = [0, 1].map(|i| self.counted_by_the_dead[i].load(Ordering::Relaxed));
        for base in bases {
            for (sum, value) in sums.iter_mut().zip(counters(&base).await) {
                *sum += value;
            }
        }
        (sums[0], sums[1])
    }

    /// Waits (while the workload runs) until every instance uses its Redis
    /// gate again: for a whole second, no instance served a claim from SQL
    /// alone. A fault is healed only then; the re-send after it is meant
    /// to meet the gate.
    pub(crate) async fn wait_for_gates(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut before = self.served_by_sql_alone().await;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = self.served_by_sql_alone().await;
            if now == before {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "instances still serving from SQL alone after {within:?}: {now:?}"
            );
            before = now;
        }
    }

    /// The sum over the live instances of the `/metrics` samples of
    /// `name` whose labels include `label` (`result="failed"`; `""` for
    /// all).
    pub(crate) async fn sum_of(&self, name: &str, label: &str) -> u64 {
        let bases = self.bases.read().expect("bases").clone();
        let mut sum = 0;
        for base in &bases {
            let text = match client().get(format!("{base}/metrics")).send().await {
                Ok(response) => response.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            sum += text
                .lines()
                .filter(|line| line.starts_with(name) && line.contains(label))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
        }
        sum
    }

    /// Each instance's count of claims made without the gate.
    async fn served_by_sql_alone(&self) -> Vec<u64> {
        let bases = self.bases.read().expect("bases").clone();
        let mut counts = Vec::with_capacity(bases.len());
        for base in &bases {
            counts.push(counters(base).await[1]);
        }
        counts
    }
}

/// Starts one instance (the start blocks until it listens). A start fails
/// while a server it needs at startup is out (Redis mid-failover,
/// PostgreSQL down) or when a fault hits its migration: it is tried again
/// every half second, as an orchestrator would, for up to 15 s.
async fn spawn(launch: &Launch) -> Orders {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let launch = launch.clone();
        let started = tokio::task::spawn_blocking(move || {
            let extra: Vec<&str> = launch.extra.iter().map(String::as_str).collect();
            Orders::start_wrapped(
                env!("CARGO_BIN_EXE_orders"),
                &launch.wrapper,
                &launch.listen,
                &launch.database,
                launch.redis.as_deref(),
                &extra,
            )
        })
        .await;
        match started {
            Ok(orders) => return orders,
            Err(failed) if Instant::now() < deadline => {
                eprintln!("an orders instance failed to start, trying again: {failed}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(failed) => panic!("an orders instance failed to start for 15 s: {failed}"),
        }
    }
}

/// [`COUNTERS`] as `base` serves them (0 where it does not answer).
async fn counters(base: &str) -> [u64; 2] {
    let text = match client().get(format!("{base}/metrics")).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    COUNTERS.map(|name| {
        text.lines()
            .filter(|line| line.starts_with(name))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    })
}
