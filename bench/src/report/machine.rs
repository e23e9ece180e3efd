//! Where the benchmark ran, and with which settings.

use std::io::{self, Write};

use crate::cli::Args;

/// Where it ran.
#[derive(Debug)]
pub(crate) struct Machine {
    cpus: usize,
    cpu_model: String,
    memory: String,
    kernel: String,
    settings: String,
    busy_before: f64,
}

impl Machine {
    /// Reads the machine from `/proc`, and the settings from `args`.
    pub(crate) fn read(cpus: usize, args: &Args, busy_before: f64) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or("unknown".to_owned(), |(_, m)| m.trim().to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or("unknown".to_owned(), |kb| {
                format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0)
            });
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or("unknown".to_owned(), |k| k.trim().to_owned());
        let threads =
            |t: Option<usize>| t.map_or_else(|| format!("{cpus} (CPU count)"), |t| t.to_string());
        let settings = format!(
            "{} connections{}, {} warm-up + {} measured per row, {} round(s) (each row: the median), \
             server runtime {} worker threads, load generator runtime {} worker threads, \
             PostgreSQL pool {}, SQLite pool {} (WAL), orders endpoint over {} accounts",
            args.connections,
            args.rate.map_or(String::new(), |rate| format!(
                " paced to {rate} req/s in all"
            )),
            humantime::format_duration(args.warmup),
            humantime::format_duration(args.duration),
            args.rounds,
            threads(args.server_threads),
            threads(args.client_threads),
            args.pg_pool,
            args.sqlite_pool,
            args.orders_accounts,
        );
        Self {
            cpus,
            cpu_model,
            memory,
            kernel,
            settings,
            busy_before,
        }
    }

    /// The lines that open the report: the machine, the settings and how
    /// busy the machine was before the run.
    pub(super) fn write(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "Machine: {} CPUs ({}), {} RAM, Linux {}",
            self.cpus, self.cpu_model, self.memory, self.kernel
        )?;
        writeln!(out, "Settings: {}", self.settings)?;
        writeln!(
            out,
            "Machine busy in the second before the run: {:.0}%",
            self.busy_before * 100.0
        )
    }
}
