//! The Markdown tables `idem-bench` prints.

use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

use crate::Args;
use crate::cpu::Spent;
use crate::load::{Burst, Measured};

/// The orders endpoint's rows: an order and a balance debit in one
/// PostgreSQL transaction; their "vs bare" is against the first.
pub(crate) const ORDERS_BARE: &str = "orders endpoint, bare";
pub(crate) const ORDERS_PG: &str = "orders endpoint, idem transactional (PgStore)";
pub(crate) const ORDERS_TIERED: &str = "orders endpoint, idem transactional behind the Redis gate";
/// The same endpoint on SQLite (WAL, `synchronous = NORMAL`), as the orders
/// app runs it by default; its "vs bare" is against the first of these.
pub(crate) const ORDERS_SQLITE_BARE: &str = "orders endpoint on SQLite, bare";
pub(crate) const ORDERS_SQLITE: &str =
    "orders endpoint on SQLite, idem transactional (SqliteStore)";

/// What a measurement sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A baseline with no idempotency: the key header is sent and ignored.
    Baseline,
    /// A fresh `Idempotency-Key` on every request.
    First,
    /// One completed key, replayed.
    Duplicate,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Baseline => "baseline",
            Self::First => "first",
            Self::Duplicate => "duplicate",
        })
    }
}

/// Whether a scenario's Redis commands are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedisUse {
    None,
    Counted,
}

/// Which SQL database a scenario writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqlUse {
    None,
    Sqlite,
    Postgres,
}

/// Redis commands per request.
#[derive(Debug, Clone)]
pub(crate) struct RedisCounts {
    /// Sent by the app (counted on its connection).
    pub(crate) client: f64,
    /// Executed by the server (`total_commands_processed`), Lua's
    /// `redis.call`s included.
    pub(crate) server: f64,
    /// `INFO commandstats` calls per command.
    pub(crate) breakdown: Vec<(String, f64)>,
}

/// PostgreSQL transactions per request.
#[derive(Debug, Clone)]
pub(crate) struct SqlCounts {
    pub(crate) commits: f64,
    pub(crate) rollbacks: f64,
}

/// One measurement.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) scenario: &'static str,
    pub(crate) mode: Mode,
    pub(crate) measured: Measured,
    /// Handler invocations during the load (setup excluded).
    pub(crate) handler_calls: usize,
    pub(crate) redis: Option<RedisCounts>,
    pub(crate) sql: Option<SqlCounts>,
    /// CPU over the whole load (warm-up included).
    pub(crate) cpu: Spent,
    /// The lowest and highest throughput over the rounds, when there were
    /// several (this row is the median one).
    pub(crate) spread: Option<(f64, f64)>,
}

/// The round with the median throughput of one scenario and mode, knowing
/// the spread of the others; `None` if no round succeeded.
pub(crate) fn median_round(mut rounds: Vec<Row>) -> Option<Row> {
    rounds.sort_by(|a, b| a.measured.throughput().total_cmp(&b.measured.throughput()));
    let spread = (rounds.len() > 1).then(|| {
        (
            rounds[0].measured.throughput(),
            rounds[rounds.len() - 1].measured.throughput(),
        )
    });
    let mid = rounds.len().checked_sub(1)? / 2;
    let mut median = rounds.swap_remove(mid);
    median.spread = spread;
    Some(median)
}

/// One correctness check.
#[derive(Debug)]
pub(crate) struct BurstRow {
    pub(crate) scenario: &'static str,
    /// The handler's simulated work.
    pub(crate) delay: Duration,
    pub(crate) copies: usize,
    /// Handler invocations, one entry per round.
    pub(crate) handler_runs: Vec<usize>,
    /// Responses, all rounds together.
    pub(crate) seen: Burst,
}

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
}

fn ms(micros: u64) -> String {
    format!("{:.2}", micros as f64 / 1000.0)
}

fn find<'a>(rows: &'a [Row], scenario: &str, mode: Mode) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.mode == mode)
}

fn ratio(row: &Row, base: Option<&Row>) -> Option<f64> {
    base.map(|b| row.measured.throughput() / b.measured.throughput())
}

/// Whether `row` is one of the orders endpoint's.
fn orders(row: &Row) -> bool {
    [ORDERS_BARE, ORDERS_PG, ORDERS_TIERED].contains(&row.scenario) || orders_on_sqlite(row)
}

/// Whether `row` is one of the orders endpoint's on SQLite.
fn orders_on_sqlite(row: &Row) -> bool {
    [ORDERS_SQLITE_BARE, ORDERS_SQLITE].contains(&row.scenario)
}

fn times(r: Option<f64>) -> String {
    r.map_or("–".to_owned(), |r| format!("{r:.2}x"))
}

/// Prints the machine, the results, the checks and the targets.
pub(crate) fn write(
    out: &mut impl Write,
    machine: &Machine,
    rows: &[Row],
    bursts: &[BurstRow],
    notes: &[String],
) -> io::Result<()> {
    let bare = find(rows, "bare handler", Mode::Baseline);
    let bare_get = find(rows, "bare handler + 1 Redis GET", Mode::Baseline);
    let orders_bare = find(rows, ORDERS_BARE, Mode::Baseline);
    let orders_sqlite_bare = find(rows, ORDERS_SQLITE_BARE, Mode::Baseline);

    writeln!(
        out,
        "Machine: {} CPUs ({}), {} RAM, Linux {}",
        machine.cpus, machine.cpu_model, machine.memory, machine.kernel
    )?;
    writeln!(out, "Settings: {}", machine.settings)?;
    writeln!(
        out,
        "Machine busy in the second before the run: {:.0}%",
        machine.busy_before * 100.0
    )?;
    if rows.iter().any(orders) {
        writeln!(
            out,
            "The orders endpoint's rows: \"vs bare\" is against the bare orders endpoint on the same database (\"{ORDERS_BARE}\", \"{ORDERS_SQLITE_BARE}\")."
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "| scenario | mode | req/s | req/s, all rounds | p50 ms | p99 ms | vs bare | vs bare + Redis GET | Redis cmds/req | SQL commits/req | handler runs | bad responses |"
    )?;
    writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for row in rows {
        let m = &row.measured;
        let vs_bare = if orders_on_sqlite(row) {
            orders_sqlite_bare
        } else if orders(row) {
            orders_bare
        } else {
            bare
        };
        let vs_get = if row.redis.is_some()
            && row.scenario != "bare handler + 1 Redis GET"
            && !orders(row)
        {
            times(ratio(row, bare_get))
        } else {
            "–".to_owned()
        };
        let redis = row
            .redis
            .as_ref()
            .map_or("–".to_owned(), |r| format!("{:.2}", r.client));
        let sql = row
            .sql
            .as_ref()
            .map_or("–".to_owned(), |s| format!("{:.2}", s.commits));
        let bad = m.unexpected + m.errors;
        writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.scenario,
            row.mode,
            m.throughput(),
            row.spread
                .map_or("–".to_owned(), |(lo, hi)| format!("{lo:.0}-{hi:.0}")),
            ms(m.latency.value_at_quantile(0.50)),
            ms(m.latency.value_at_quantile(0.99)),
            times(ratio(row, vs_bare)),
            vs_get,
            redis,
            sql,
            row.handler_calls,
            bad,
        )?;
    }

    let bad_rows: Vec<_> = rows
        .iter()
        .filter(|r| !r.measured.unexpected_by.is_empty())
        .collect();
    if !bad_rows.is_empty() {
        writeln!(out)?;
        writeln!(out, "Bad responses by status (`+r`: marked as a replay)")?;
        writeln!(out)?;
        for row in bad_rows {
            let by: Vec<String> = row
                .measured
                .unexpected_by
                .iter()
                .map(|(status, n)| format!("{status} x {n}"))
                .collect();
            writeln!(out, "- {} ({}): {}", row.scenario, row.mode, by.join(", "))?;
        }
    }

    writeln!(out)?;
    writeln!(
        out,
        "CPU per request (warm-up included): this process's server side (runtime, SQLite workers) and load generator; the machine's busy share; and the CPUs kept busy outside this process (databases, Redis, and anything else running on the machine)"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| scenario | mode | server CPU µs/req | load generator CPU µs/req | machine busy | CPUs busy outside this process |"
    )?;
    writeln!(out, "|---|---|---:|---:|---:|---:|")?;
    for row in rows {
        let n = row.measured.total.max(1) as f64;
        writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.0}% | {:.2} |",
            row.scenario,
            row.mode,
            row.cpu.server_ns as f64 / 1000.0 / n,
            row.cpu.load_ns as f64 / 1000.0 / n,
            row.cpu.machine_busy * 100.0,
            row.cpu.outside_cores,
        )?;
    }

    let redis_rows: Vec<_> = rows.iter().filter(|r| r.redis.is_some()).collect();
    if !redis_rows.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "Redis, per request: commands the app sent, and what the server executed (`INFO`: Lua's `redis.call`s included)"
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "| scenario | mode | sent by the app | executed by the server | by command (server) |"
        )?;
        writeln!(out, "|---|---|---:|---:|---|")?;
        for row in redis_rows {
            let Some(r) = &row.redis else { continue };
            let by: Vec<String> = r
                .breakdown
                .iter()
                .filter(|(_, n)| *n >= 0.005)
                .map(|(name, n)| format!("{name} {n:.2}"))
                .collect();
            writeln!(
                out,
                "| {} | {} | {:.2} | {:.2} | {} |",
                row.scenario,
                row.mode,
                r.client,
                r.server,
                by.join(", ")
            )?;
        }
    }

    let sql_rows: Vec<_> = rows.iter().filter(|r| r.sql.is_some()).collect();
    if !sql_rows.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "PostgreSQL, per request (`pg_stat_database` of the benchmark's database)"
        )?;
        writeln!(out)?;
        writeln!(out, "| scenario | mode | commits | rollbacks |")?;
        writeln!(out, "|---|---|---:|---:|")?;
        for row in sql_rows {
            let Some(s) = &row.sql else { continue };
            writeln!(
                out,
                "| {} | {} | {:.3} | {:.3} |",
                row.scenario, row.mode, s.commits, s.rollbacks
            )?;
        }
    }

    if !bursts.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "Correctness: rounds of simultaneous copies of one fresh request, each copy on its own connection; responses of all rounds together"
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "| scenario | handler work | copies | handler runs per round | 201 | 201 replayed | 409 | other | errors |"
        )?;
        writeln!(out, "|---|---:|---:|---|---:|---:|---:|---:|---:|")?;
        for b in bursts {
            let s = &b.seen;
            let runs: Vec<String> = b.handler_runs.iter().map(usize::to_string).collect();
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                b.scenario,
                if b.delay.is_zero() {
                    "none".to_owned()
                } else {
                    humantime::format_duration(b.delay).to_string()
                },
                b.copies,
                runs.join(", "),
                s.created,
                s.replayed,
                s.conflict,
                s.other,
                s.errors
            )?;
        }
    }

    writeln!(out)?;
    writeln!(out, "Targets")?;
    writeln!(out)?;
    let memory_first = find(rows, "idem: memory", Mode::First);
    let memory_dup = find(rows, "idem: memory", Mode::Duplicate);
    let tiered_dup = find(rows, "idem: Redis + PostgreSQL", Mode::Duplicate);
    let peer_dup = rows
        .iter()
        .find(|r| r.scenario.starts_with("axum-idempotent") && r.mode == Mode::Duplicate);
    let mut target = |what: &str, got: Option<f64>, goal: f64| {
        let verdict = match got {
            Some(g) if g >= goal => format!("{g:.2}x: met"),
            Some(g) => format!("{g:.2}x: NOT met"),
            None => "not measured".to_owned(),
        };
        writeln!(out, "- {what} >= {goal:.2}x: {verdict}")
    };
    target(
        "memory store, first requests, vs bare",
        memory_first.and_then(|r| ratio(r, bare)),
        0.85,
    )?;
    target(
        "memory store, replays, vs bare",
        memory_dup.and_then(|r| ratio(r, bare)),
        0.90,
    )?;
    target(
        "Redis + PostgreSQL, replays, vs bare + one Redis GET",
        tiered_dup.and_then(|r| ratio(r, bare_get)),
        0.80,
    )?;
    target(
        "memory store replays vs axum-idempotent replays (ahead = above 1)",
        memory_dup.and_then(|r| ratio(r, peer_dup)),
        1.0,
    )?;
    target(
        "Redis + PostgreSQL replays vs axum-idempotent replays (ahead = above 1)",
        tiered_dup.and_then(|r| ratio(r, peer_dup)),
        1.0,
    )?;
    target(
        "orders endpoint, idem transactional (PgStore), first requests, vs the bare endpoint",
        find(rows, ORDERS_PG, Mode::First).and_then(|r| ratio(r, orders_bare)),
        0.90,
    )?;
    target(
        "orders endpoint, idem transactional behind the Redis gate, first requests, vs the bare endpoint",
        find(rows, ORDERS_TIERED, Mode::First).and_then(|r| ratio(r, orders_bare)),
        0.90,
    )?;
    target(
        "orders endpoint, idem transactional behind the Redis gate, duplicates, vs the bare endpoint",
        find(rows, ORDERS_TIERED, Mode::Duplicate).and_then(|r| ratio(r, orders_bare)),
        5.0,
    )?;
    target(
        "orders endpoint on SQLite, idem transactional, first requests, vs the bare endpoint on SQLite",
        find(rows, ORDERS_SQLITE, Mode::First).and_then(|r| ratio(r, orders_sqlite_bare)),
        0.90,
    )?;
    let idem_bursts: Vec<_> = bursts
        .iter()
        .filter(|b| {
            b.scenario.starts_with("idem")
                || [ORDERS_PG, ORDERS_TIERED, ORDERS_SQLITE].contains(&b.scenario)
        })
        .collect();
    if !idem_bursts.is_empty() {
        let once = idem_bursts
            .iter()
            .all(|b| b.handler_runs.iter().all(|&runs| runs == 1));
        writeln!(
            out,
            "- idem runs the handler once for simultaneous duplicates on every store: {}",
            if once { "yes" } else { "NO" }
        )?;
    }

    if !notes.is_empty() {
        writeln!(out)?;
        writeln!(out, "Notes")?;
        writeln!(out)?;
        for note in notes {
            writeln!(out, "- {note}")?;
        }
    }
    Ok(())
}
