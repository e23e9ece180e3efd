//! `idem-bench`: a load benchmark of idem's layer against a bare axum
//! handler and the peer crate `axum-idempotent`, in one invocation.
//!
//! Each scenario runs on a server of its own (an axum app on a task of the
//! server runtime, bound to `127.0.0.1:0`); a closed-loop load generator on
//! a second runtime drives it over HTTP/1.1 keep-alive loopback connections
//! and records latency in an HDR histogram. The results are printed as
//! Markdown tables; see `BENCHMARKS.md` at the repository root.
//!
//! ```text
//! cargo run --release -p idem-bench -- --duration 5s --connections 32
//! ```
//!
//! `--instructions CASE --requests N` instead sends N requests of one case
//! through its app in process, for valgrind to count their instructions
//! (`.ci/instructions`, `instructions.rs`).

mod apps;
mod burst;
mod cli;
mod client;
mod cpu;
mod instructions;
mod load;
mod measure;
mod netdelay;
mod report;
mod scenarios;
mod services;
mod stats;
mod storm;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use clap::Parser;
use idem_tower::redis::redis;
use tokio::runtime::{Handle, Runtime};

use crate::apps::Env;
use crate::cli::Args;
use crate::report::{BurstRow, Row};
use crate::stats::PgStats;
use crate::storm::StormRow;

/// What the scenarios share.
struct Ctx {
    args: Args,
    server_rt: Handle,
    env: Env,
    redis_info: Option<redis::aio::MultiplexedConnection>,
    pg: Option<PgStats>,
    pg_url: String,
    /// The MySQL/MariaDB database of the orders endpoint's MySQL rows, if
    /// it is up.
    mysql_url: Option<String>,
    sqlite_dir: PathBuf,
    nonce: String,
}

/// The notes printed under the report, and whether anything failed (the
/// exit code).
#[derive(Default)]
struct Outcome {
    notes: Vec<String>,
    failed: bool,
}

impl Outcome {
    /// Notes something skipped or shared, which is no failure.
    fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Notes a failure.
    fn fail(&mut self, note: String) {
        self.failed = true;
        self.notes.push(note);
    }
}

fn main() {
    let args = Args::parse();
    if let Some(case) = &args.instructions {
        std::process::exit(instructions::run(case, args.requests));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server_rt = runtime("idem-bench-server", args.server_threads.unwrap_or(cpus));
    let client_rt = runtime("idem-bench-load", args.client_threads.unwrap_or(cpus));
    let code = client_rt.block_on(run(args, server_rt.handle().clone(), cpus));
    server_rt.shutdown_timeout(Duration::from_secs(2));
    client_rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}

/// A multi-threaded runtime of `threads` workers named `name`.
fn runtime(name: &str, threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(name)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Prints a progress line on stderr.
fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Sets up the services, takes every measurement, check and storm, and
/// prints the report; the exit code.
async fn run(args: Args, server_rt: Handle, cpus: usize) -> i32 {
    let nonce = format!(
        "{:x}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let mut outcome = Outcome::default();
    // How busy the machine is before we load it: anything else running
    // competes with the scenarios for the same CPUs.
    let quiet = cpu::Sample::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_run = cpu::Sample::now().since(&quiet);

    // Redis: a private server, so that its counts are ours alone.
    let mut redis = services::redis(&args, &mut outcome).await;
    // PostgreSQL: a database of our own, its records table emptied.
    let mut pg_url = format!("{}/{}", args.postgres, args.pg_database);
    let pg = services::postgres(&args, &mut outcome).await;
    // MySQL/MariaDB: a database of our own.
    let mut mysql_url = services::mysql(&args, &mut outcome).await;
    // All of them a network hop away, if asked.
    if let Some(delay) = args.net_delay {
        match behind_delay(&mut pg_url, &mut redis.url, &mut mysql_url, delay) {
            Ok(note) => outcome.note(note),
            Err(err) => outcome.fail(format!("--net-delay: {err}")),
        }
    }

    let sqlite_dir =
        std::env::temp_dir().join(format!("idem-bench-{}-{nonce}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&sqlite_dir) {
        outcome.note(format!("SQLite scenarios skipped: {err}"));
    }

    let ctx = Ctx {
        env: Env {
            redis_url: redis.url,
            redis_sent: Arc::new(AtomicU64::new(0)),
        },
        server_rt,
        redis_info: redis.info,
        pg,
        pg_url,
        mysql_url,
        sqlite_dir: sqlite_dir.clone(),
        nonce,
        args,
    };
    say(&format!(
        "idem-bench: {} connections, {:?} warm-up + {:?} per measurement",
        ctx.args.connections, ctx.args.warmup, ctx.args.duration
    ));

    let rows = measure_rounds(&ctx, &mut outcome).await;
    let bursts = check_bursts(&ctx, &mut outcome).await;
    let storms = storms(&ctx, &mut outcome).await;
    let _ = std::fs::remove_dir_all(&sqlite_dir);
    drop(redis.server);

    if let Some(dir) = &ctx.args.charts {
        let title = match ctx.args.net_delay {
            Some(delay) => format!("net delay {delay:?} each way"),
            None => "loopback".to_owned(),
        };
        match report::charts::write(dir, &rows, &title) {
            Ok(files) => {
                let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
                outcome.note(format!("charts: {}", names.join(", ")));
            }
            Err(err) => outcome.fail(format!("charts: {err}")),
        }
    }
    let machine = report::Machine::read(cpus, &ctx.args, before_run.machine_busy);
    let mut out = std::io::stdout().lock();
    let _ = report::write(&mut out, &machine, &rows, &bursts, &outcome.notes);
    if !storms.is_empty() {
        let _ = writeln!(out);
        let _ = storm::write(&mut out, &storms);
    }
    let _ = out.flush();
    i32::from(outcome.failed)
}

/// Points the rows' PostgreSQL, Redis and MySQL URLs at delay proxies; a
/// note for the report.
fn behind_delay(
    pg_url: &mut String,
    redis_url: &mut Option<String>,
    mysql_url: &mut Option<String>,
    delay: Duration,
) -> Result<String, String> {
    let pg = netdelay::DelayProxy::start(&netdelay::host_port(pg_url, 5432), delay)?;
    *pg_url = pg.url(pg_url);
    if let Some(url) = redis_url {
        let redis = netdelay::DelayProxy::start(&netdelay::host_port(url, 6379), delay)?;
        *url = redis.url(url);
    }
    if let Some(url) = mysql_url {
        let mysql = netdelay::DelayProxy::start(&netdelay::host_port(url, 3306), delay)?;
        *url = mysql.url(url);
    }
    Ok(format!(
        "PostgreSQL, MySQL and Redis behind a delay proxy: {delay:?} each way, {:?} per round trip",
        2 * delay
    ))
}

/// Takes every measurement `--rounds` times, round after round; the median
/// round of each.
async fn measure_rounds(ctx: &Ctx, outcome: &mut Outcome) -> Vec<Row> {
    let jobs = scenarios::jobs(ctx);
    let mut taken: Vec<Vec<Row>> = jobs.iter().map(|_| Vec::new()).collect();
    for round in 1..=ctx.args.rounds {
        for (job, taken) in jobs.iter().zip(&mut taken) {
            let (label, mode) = (job.label, job.mode);
            say(&format!(
                "measuring {label} ({mode}), round {round} of {}",
                ctx.args.rounds
            ));
            match measure::measure(ctx, job, round).await {
                Ok(row) => taken.push(row),
                Err(err) => {
                    outcome.fail(format!("{label} ({mode}) failed in round {round}: {err}"));
                }
            }
        }
    }
    taken.into_iter().filter_map(report::median_round).collect()
}

/// Puts every scenario with idempotency through the correctness check.
async fn check_bursts(ctx: &Ctx, outcome: &mut Outcome) -> Vec<BurstRow> {
    let mut bursts = Vec::new();
    for (label, kind) in scenarios::checks(ctx) {
        say(&format!(
            "checking {label} with {} simultaneous duplicates",
            ctx.args.burst
        ));
        match burst::check(ctx, label, kind).await {
            Ok(rows) => bursts.extend(rows),
            Err(err) => outcome.fail(format!("{label} burst check failed: {err}")),
        }
    }
    bursts
}

/// Runs a storm on each of `--storm-pools` (with `storm` selected and
/// PostgreSQL up).
async fn storms(ctx: &Ctx, outcome: &mut Outcome) -> Vec<StormRow> {
    let mut storms = Vec::new();
    if !ctx.args.wants("storm") || ctx.pg.is_none() {
        return storms;
    }
    for &pool in &ctx.args.storm_pools {
        let shape = storm::Shape {
            pool,
            duplicates: ctx.args.storm_duplicates,
            keys: ctx.args.storm_keys,
            handler: ctx.args.storm_handler,
        };
        say(&format!("storm: {shape:?}"));
        match storm::run(&ctx.server_rt, &ctx.pg_url, &ctx.nonce, shape).await {
            Ok(rows) => {
                if rows
                    .iter()
                    .any(|r| r.errors > 0 || r.runs != r.expected_runs)
                {
                    outcome.fail(format!(
                        "storm on a pool of {pool}: errors or wrong run count"
                    ));
                }
                storms.extend(rows);
            }
            Err(err) => outcome.fail(format!("storm on a pool of {pool} failed: {err}")),
        }
    }
    storms
}
