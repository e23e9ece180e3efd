//! Where the CPU went during a measurement: this process's threads (the
//! load generator's runtime apart from everything else, which is the
//! server side: its runtime, the SQLite workers) from
//! `/proc/self/task/*/schedstat`, and the whole machine from `/proc/stat`
//! (databases and Redis included).

use std::fs;
use std::time::Instant;

/// The kernel's clock ticks per second in `/proc/stat` (`USER_HZ`), 100 on
/// every Linux architecture this runs on.
const TICK_NS: u64 = 10_000_000;

/// CPU time so far, in nanoseconds, and the machine's tick counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    at: Instant,
    server_ns: u64,
    load_ns: u64,
    machine_busy: u64,
    machine_total: u64,
}

/// CPU spent between two samples.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Spent {
    /// This process's server side, nanoseconds.
    pub(crate) server_ns: u64,
    /// The load generator, nanoseconds.
    pub(crate) load_ns: u64,
    /// The machine's busy share of all CPUs, 0 to 1.
    pub(crate) machine_busy: f64,
    /// CPUs kept busy by everything outside this process (databases,
    /// Redis, and anything else running on the machine).
    pub(crate) outside_cores: f64,
}

impl Sample {
    pub(crate) fn now() -> Self {
        let mut sample = Self {
            at: Instant::now(),
            server_ns: 0,
            load_ns: 0,
            machine_busy: 0,
            machine_total: 0,
        };
        if let Ok(tasks) = fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let path = task.path();
                let comm = fs::read_to_string(path.join("comm")).unwrap_or_default();
                let ns = fs::read_to_string(path.join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0);
                if comm.starts_with("idem-bench-load") {
                    sample.load_ns += ns;
                } else {
                    sample.server_ns += ns;
                }
            }
        }
        if let Some(line) = fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
        {
            // cpu user nice system idle iowait irq softirq steal ...
            let ticks: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|t| t.parse().ok())
                .collect();
            let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
            sample.machine_total = ticks.iter().take(8).sum();
            sample.machine_busy = sample.machine_total.saturating_sub(idle);
        }
        sample
    }

    pub(crate) fn since(&self, before: &Self) -> Spent {
        let total = self.machine_total.saturating_sub(before.machine_total);
        let busy = self.machine_busy.saturating_sub(before.machine_busy);
        let server_ns = self.server_ns.saturating_sub(before.server_ns);
        let load_ns = self.load_ns.saturating_sub(before.load_ns);
        let elapsed_ns = self.at.duration_since(before.at).as_nanos().max(1) as f64;
        let outside_ns = (busy * TICK_NS) as f64 - (server_ns + load_ns) as f64;
        Spent {
            server_ns,
            load_ns,
            machine_busy: if total == 0 {
                0.0
            } else {
                busy as f64 / total as f64
            },
            outside_cores: (outside_ns / elapsed_ns).max(0.0),
        }
    }
}
