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

mod apps;
mod cpu;
mod load;
mod report;
mod stats;
mod storm;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use clap::Parser;
use http::{HeaderName, HeaderValue, StatusCode, header};
use idem_tower::core::conformance::RedisServer;
use idem_tower::redis::redis;
use idem_tower::sql::sqlx;
use tokio::runtime::{Handle, Runtime};

use crate::apps::{Env, Kind, Server};
use crate::load::{Bodies, ConnSpec, Expect, Keys, Plan};
use crate::report::{BurstRow, Mode, RedisUse, Row, SqlUse};
use crate::stats::{PgStats, RedisInfo};

/// idem's replay header.
const IDEM_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// axum-idempotent's replay header (its default).
const PEER_REPLAYED: HeaderName = HeaderName::from_static("idempotency-replayed");

/// Load benchmark: idem's layer on each store vs a bare axum handler vs
/// axum-idempotent, all over loopback HTTP/1.1 keep-alive.
#[derive(Debug, Clone, Parser)]
#[command(name = "idem-bench", version)]
struct Args {
    /// Measured time per scenario and mode.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured warm-up before each measurement.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Concurrent keep-alive connections (one request in flight on each).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Cap on the requests of one measurement, warm-up included.
    #[arg(long, default_value_t = 2_000_000)]
    max_requests: u64,
    /// Worker threads of the server runtime (default: the CPU count).
    #[arg(long)]
    server_threads: Option<usize>,
    /// Worker threads of the load generator's runtime (default: the CPU count).
    #[arg(long)]
    client_threads: Option<usize>,
    /// PostgreSQL server, without a database.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    postgres: String,
    /// The database the benchmark owns (created if missing; its records
    /// table is emptied at the start).
    #[arg(long, default_value = "idem_bench")]
    pg_database: String,
    /// Connections in each PostgreSQL pool.
    #[arg(long, default_value_t = 10)]
    pg_pool: u32,
    /// How long `pg_stat_database` must stay still to count as settled
    /// (the measured pool is closed first, which flushes its statistics).
    #[arg(long, default_value = "1500ms", value_parser = humantime::parse_duration)]
    pg_settle: Duration,
    /// Pace the load to about this many requests per second in all (each
    /// connection sends at rate / connections), instead of as fast as the
    /// server answers: rows that keep up run at the same throughput, so
    /// their CPU per request compares the work per request alone, without
    /// the batching of wake-ups a faster row gets.
    #[arg(long)]
    rate: Option<u32>,
    /// Connections in each SQLite pool.
    #[arg(long, default_value_t = 8)]
    sqlite_pool: u32,
    /// Redis to use if a private `redis-server` cannot be started (its
    /// command counts then include anyone else's traffic).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Copies of one fresh request sent at once in the correctness check.
    #[arg(long, default_value_t = 50)]
    burst: usize,
    /// Rounds of the correctness check, each with a fresh key.
    #[arg(long, default_value_t = 3)]
    burst_rounds: usize,
    /// Simulated work in the handler for the second correctness check
    /// (the first runs the handler as measured, with none).
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    burst_delay: Duration,
    /// Measure every scenario and mode this many times, round after round
    /// (so a drift of the machine's speed spreads over all of them), and
    /// report the median round of each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Pool sizes of the storm (transactional PostgreSQL): one storm each.
    #[arg(long, value_delimiter = ',', default_value = "4,64")]
    storm_pools: Vec<u32>,
    /// Duplicates of one key in the storm, beside the first request.
    #[arg(long, default_value_t = 80)]
    storm_duplicates: usize,
    /// Distinct keys sent with the storm's duplicates.
    #[arg(long, default_value_t = 8)]
    storm_keys: usize,
    /// How long the storm's handler runs (inside its transaction).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    storm_handler: Duration,
    /// Accounts of the orders endpoint, over which its first requests
    /// spread their debits.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    orders_accounts: u32,
    /// Run only these scenarios (comma-separated): bare, bare-redis,
    /// memory, sqlite, postgres, tiered, peer, burst, storm; orders (the
    /// orders endpoint's rows), or one of them: orders-bare,
    /// orders-postgres, orders-tiered, orders-sqlite-bare, orders-sqlite.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Measure only these modes of the idem and peer scenarios
    /// (comma-separated): first, duplicate.
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
}

impl Args {
    fn wants(&self, name: &str) -> bool {
        self.only.is_empty()
            || self.only.iter().any(|o| o == name)
            || (name.starts_with("orders-") && self.only.iter().any(|o| o == "orders"))
    }
}

/// What the scenarios share.
struct Ctx {
    args: Args,
    server_rt: Handle,
    env: Env,
    redis_info: Option<redis::aio::MultiplexedConnection>,
    pg: Option<PgStats>,
    pg_url: String,
    sqlite_dir: PathBuf,
    nonce: String,
}

fn main() {
    let args = Args::parse();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server_rt = runtime("idem-bench-server", args.server_threads.unwrap_or(cpus));
    let client_rt = runtime("idem-bench-load", args.client_threads.unwrap_or(cpus));
    let code = client_rt.block_on(run(args, server_rt.handle().clone(), cpus));
    server_rt.shutdown_timeout(Duration::from_secs(2));
    client_rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}

fn runtime(name: &str, threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(name)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

async fn run(args: Args, server_rt: Handle, cpus: usize) -> i32 {
    let nonce = format!(
        "{:x}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let mut notes = Vec::new();
    // How busy the machine is before we load it: anything else running
    // competes with the scenarios for the same CPUs.
    let quiet = cpu::Sample::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_run = cpu::Sample::now().since(&quiet);

    // Redis: a private server, so that its counts are ours alone.
    let needs_redis =
        args.wants("bare-redis") || args.wants("tiered") || args.wants("orders-tiered");
    let private_redis = if needs_redis {
        RedisServer::start(&[])
    } else {
        None
    };
    let redis_url = match &private_redis {
        Some(server) => Some(server.url()),
        None if needs_redis => {
            notes.push(format!(
                "no private redis-server could be started; used {} (its command counts may include other clients)",
                args.redis
            ));
            Some(args.redis.clone())
        }
        None => None,
    };
    let redis_info = match &redis_url {
        Some(url) => match redis_info_connection(url).await {
            Ok(conn) => Some(conn),
            Err(err) => {
                notes.push(format!("Redis scenarios skipped: {err}"));
                None
            }
        },
        None => None,
    };
    let redis_url = redis_info.as_ref().and(redis_url);

    // PostgreSQL: a database of our own, its records table emptied.
    let pg_url = format!("{}/{}", args.postgres, args.pg_database);
    let pg = if [
        "postgres",
        "tiered",
        "storm",
        ORDERS_BARE,
        ORDERS_PG,
        ORDERS_TIERED,
    ]
    .iter()
    .any(|name| args.wants(name))
    {
        match prepare_postgres(&args).await {
            Ok(stats) => Some(stats),
            Err(err) => {
                notes.push(format!("PostgreSQL scenarios skipped: {err}"));
                None
            }
        }
    } else {
        None
    };

    let sqlite_dir =
        std::env::temp_dir().join(format!("idem-bench-{}-{nonce}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&sqlite_dir) {
        notes.push(format!("SQLite scenarios skipped: {err}"));
    }

    let ctx = Ctx {
        env: Env {
            redis_url,
            redis_sent: Arc::new(AtomicU64::new(0)),
        },
        server_rt,
        redis_info,
        pg,
        pg_url,
        sqlite_dir: sqlite_dir.clone(),
        nonce,
        args,
    };
    say(&format!(
        "idem-bench: {} connections, {:?} warm-up + {:?} per measurement",
        ctx.args.connections, ctx.args.warmup, ctx.args.duration
    ));

    // Every measurement to take, in order; then rounds of them.
    let mut jobs = Vec::new();
    let mut checked = Vec::new();
    for (name, label, kind, modes, redis_use, sql_use) in scenarios(&ctx) {
        if !ctx.args.wants(name) {
            continue;
        }
        if (redis_use != RedisUse::None && ctx.env.redis_url.is_none())
            || (sql_use == SqlUse::Postgres && ctx.pg.is_none())
        {
            continue;
        }
        for mode in modes {
            if mode != Mode::Baseline
                && !ctx.args.modes.is_empty()
                && !ctx.args.modes.iter().any(|m| *m == mode.to_string())
            {
                continue;
            }
            jobs.push((label, kind.clone(), mode, redis_use, sql_use));
        }
        if ctx.args.wants("burst")
            && !matches!(
                name,
                "bare" | "bare-redis" | ORDERS_BARE | ORDERS_SQLITE_BARE
            )
        {
            checked.push((label, kind));
        }
    }

    let mut failed = false;
    let mut taken: Vec<Vec<Row>> = jobs.iter().map(|_| Vec::new()).collect();
    for round in 1..=ctx.args.rounds {
        for ((label, kind, mode, redis_use, sql_use), taken) in jobs.iter().zip(&mut taken) {
            say(&format!(
                "measuring {label} ({mode}), round {round} of {}",
                ctx.args.rounds
            ));
            let measured = measure(
                &ctx,
                label,
                kind.clone(),
                *mode,
                *redis_use,
                *sql_use,
                round,
            );
            match measured.await {
                Ok(row) => taken.push(row),
                Err(err) => {
                    failed = true;
                    notes.push(format!("{label} ({mode}) failed in round {round}: {err}"));
                }
            }
        }
    }
    let rows: Vec<Row> = taken.into_iter().filter_map(report::median_round).collect();

    let mut bursts = Vec::new();
    for (label, kind) in checked {
        say(&format!(
            "checking {label} with {} simultaneous duplicates",
            ctx.args.burst
        ));
        match burst_check(&ctx, label, kind).await {
            Ok(rows) => bursts.extend(rows),
            Err(err) => {
                failed = true;
                notes.push(format!("{label} burst check failed: {err}"));
            }
        }
    }
    let mut storms = Vec::new();
    if ctx.args.wants("storm") && ctx.pg.is_some() {
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
                        failed = true;
                        notes.push(format!(
                            "storm on a pool of {pool}: errors or wrong run count"
                        ));
                    }
                    storms.extend(rows);
                }
                Err(err) => {
                    failed = true;
                    notes.push(format!("storm on a pool of {pool} failed: {err}"));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&sqlite_dir);
    drop(private_redis);

    let machine = report::Machine::read(cpus, &ctx.args, before_run.machine_busy);
    let mut out = std::io::stdout().lock();
    let _ = report::write(&mut out, &machine, &rows, &bursts, &notes);
    if !storms.is_empty() {
        let _ = writeln!(out);
        let _ = storm::write(&mut out, &storms);
    }
    let _ = out.flush();
    i32::from(failed)
}

/// The orders endpoint's selectors (`--only orders` picks them all).
const ORDERS_BARE: &str = "orders-bare";
const ORDERS_PG: &str = "orders-postgres";
const ORDERS_TIERED: &str = "orders-tiered";
const ORDERS_SQLITE_BARE: &str = "orders-sqlite-bare";
const ORDERS_SQLITE: &str = "orders-sqlite";

type Scenario = (
    &'static str,
    &'static str,
    Kind,
    Vec<Mode>,
    RedisUse,
    SqlUse,
);

fn scenarios(ctx: &Ctx) -> Vec<Scenario> {
    let both = || vec![Mode::First, Mode::Duplicate];
    let pg_pool = ctx.args.pg_pool;
    vec![
        (
            "bare",
            "bare handler",
            Kind::Bare,
            vec![Mode::Baseline],
            RedisUse::None,
            SqlUse::None,
        ),
        (
            "bare-redis",
            "bare handler + 1 Redis GET",
            Kind::BareRedisGet,
            vec![Mode::Baseline],
            RedisUse::Counted,
            SqlUse::None,
        ),
        (
            "memory",
            "idem: memory",
            Kind::Memory,
            both(),
            RedisUse::None,
            SqlUse::None,
        ),
        (
            "sqlite",
            "idem: SQLite (synchronous FULL)",
            Kind::Sqlite {
                path: ctx.sqlite_dir.join("records-full.db"),
                pool: ctx.args.sqlite_pool,
                full: true,
            },
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        (
            "sqlite",
            "idem: SQLite (synchronous NORMAL)",
            Kind::Sqlite {
                path: ctx.sqlite_dir.join("records-normal.db"),
                pool: ctx.args.sqlite_pool,
                full: false,
            },
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        (
            "postgres",
            "idem: PostgreSQL",
            Kind::Postgres {
                url: ctx.pg_url.clone(),
                pool: pg_pool,
            },
            both(),
            RedisUse::None,
            SqlUse::Postgres,
        ),
        (
            "tiered",
            "idem: Redis + PostgreSQL",
            Kind::Tiered {
                url: ctx.pg_url.clone(),
                pool: pg_pool,
            },
            both(),
            RedisUse::Counted,
            SqlUse::Postgres,
        ),
        (
            "peer",
            "axum-idempotent 0.6.0 (moka sessions)",
            Kind::Peer,
            both(),
            RedisUse::None,
            SqlUse::None,
        ),
        (
            ORDERS_BARE,
            report::ORDERS_BARE,
            Kind::OrdersBare {
                url: ctx.pg_url.clone(),
                pool: pg_pool,
            },
            vec![Mode::Baseline],
            RedisUse::None,
            SqlUse::Postgres,
        ),
        (
            ORDERS_PG,
            report::ORDERS_PG,
            Kind::OrdersPg {
                url: ctx.pg_url.clone(),
                pool: pg_pool,
            },
            both(),
            RedisUse::None,
            SqlUse::Postgres,
        ),
        (
            ORDERS_TIERED,
            report::ORDERS_TIERED,
            Kind::OrdersTiered {
                url: ctx.pg_url.clone(),
                pool: pg_pool,
            },
            both(),
            RedisUse::Counted,
            SqlUse::Postgres,
        ),
        (
            ORDERS_SQLITE_BARE,
            report::ORDERS_SQLITE_BARE,
            Kind::OrdersSqliteBare {
                path: ctx.sqlite_dir.join("orders-bare.db"),
                pool: ctx.args.sqlite_pool,
                accounts: ctx.args.orders_accounts,
            },
            vec![Mode::Baseline],
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        (
            ORDERS_SQLITE,
            report::ORDERS_SQLITE,
            Kind::OrdersSqlite {
                path: ctx.sqlite_dir.join("orders-idem.db"),
                pool: ctx.args.sqlite_pool,
                accounts: ctx.args.orders_accounts,
            },
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
    ]
}

async fn redis_info_connection(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("Redis at {url}: {e}"))
}

async fn prepare_postgres(args: &Args) -> Result<PgStats, String> {
    let stats = PgStats::connect(&args.postgres, &args.pg_database, args.pg_settle).await?;
    let url = format!("{}/{}", args.postgres, args.pg_database);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
    let store = idem_tower::PgStore::new(pool.clone());
    store.migrate().await.map_err(|e| e.to_string())?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("TRUNCATE {}", store.table())))
        .execute(&pool)
        .await
        .map_err(|e| format!("TRUNCATE: {e}"))?;
    if [ORDERS_BARE, ORDERS_PG, ORDERS_TIERED]
        .iter()
        .any(|name| args.wants(name))
    {
        apps::prepare_orders(&pool, args.orders_accounts).await?;
    }
    pool.close().await;
    Ok(stats)
}

fn key(text: String) -> HeaderValue {
    HeaderValue::try_from(text).expect("a visible-ASCII key")
}

/// Starts a session on the peer's app; the `Cookie` header that carries it.
async fn peer_session(
    addr: std::net::SocketAddr,
    login_key: String,
) -> Result<HeaderValue, String> {
    let request = http::Request::post("/login")
        .header(header::HOST, "127.0.0.1")
        .header("idempotency-key", key(login_key))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("a valid request");
    let response = load::send_once(addr, request).await?;
    if response.status() != StatusCode::OK {
        return Err(format!("login answered {}", response.status()));
    }
    let cookie = response
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("session="))
        .and_then(|v| v.split(';').next())
        .ok_or("login set no session cookie")?;
    HeaderValue::try_from(cookie).map_err(|e| e.to_string())
}

/// Completes `key` with one request (`body`) and checks that a second is
/// replayed.
async fn complete_first(
    addr: std::net::SocketAddr,
    key: &HeaderValue,
    cookie: Option<&HeaderValue>,
    body: &Bytes,
    replay_header: &HeaderName,
) -> Result<(), String> {
    let request = load::order_request(key.clone(), cookie, body.clone());
    let first = load::send_once(addr, request).await?;
    if first.status() != StatusCode::CREATED {
        return Err(format!("the first request answered {}", first.status()));
    }
    let again =
        load::send_once(addr, load::order_request(key.clone(), cookie, body.clone())).await?;
    let replayed = again
        .headers()
        .get(replay_header)
        .is_some_and(|v| v == "true");
    if again.status() != StatusCode::CREATED || !replayed {
        return Err(format!(
            "a duplicate answered {} without `{replay_header}: true`",
            again.status()
        ));
    }
    Ok(())
}

async fn measure(
    ctx: &Ctx,
    label: &'static str,
    kind: Kind,
    mode: Mode,
    redis_use: RedisUse,
    sql_use: SqlUse,
    round: u32,
) -> Result<Row, String> {
    let peer = matches!(kind, Kind::Peer);
    let probe = matches!(kind, Kind::BareRedisGet);
    let replay_header = if peer { PEER_REPLAYED } else { IDEM_REPLAYED };
    let (spread, fixed) = bodies(ctx, &kind);
    let pg_before = match (sql_use, &ctx.pg) {
        (SqlUse::Postgres, Some(pg)) => Some(pg.settled().await),
        _ => None,
    };
    let server = Server::start(&ctx.server_rt, kind, ctx.env.clone(), Duration::ZERO).await?;
    let addr = server.addr;
    // Keys of their own in every round: the SQL and Redis stores outlive a
    // measurement.
    let tag = format!(
        "{}-{}-{round}",
        label.replace(|c: char| !c.is_ascii_alphanumeric(), ""),
        mode
    );
    let n = ctx.args.connections;
    let mut setup_requests = 0u64;

    let result = async {
        // axum-idempotent caches per session: each connection is a client
        // with a session of its own.
        let mut cookies = vec![None; n];
        if peer {
            for (i, cookie) in cookies.iter_mut().enumerate() {
                *cookie = Some(peer_session(addr, format!("login-{}-{tag}-{i}", ctx.nonce)).await?);
                setup_requests += 1;
            }
        }
        if probe {
            seed_probe(ctx).await?;
        }
        let conns: Vec<ConnSpec> = match mode {
            Mode::First | Mode::Baseline => cookies
                .into_iter()
                .map(|cookie| ConnSpec {
                    keys: Keys::Unique(format!("{}-{tag}", ctx.nonce)),
                    bodies: spread.clone(),
                    cookie,
                })
                .collect(),
            Mode::Duplicate if peer => {
                let mut conns = Vec::with_capacity(n);
                for (i, cookie) in cookies.into_iter().enumerate() {
                    let key = key(format!("dup-{}-{tag}-{i}", ctx.nonce));
                    complete_first(addr, &key, cookie.as_ref(), &fixed, &replay_header).await?;
                    setup_requests += 2;
                    conns.push(ConnSpec {
                        keys: Keys::Fixed(key),
                        bodies: Bodies::Fixed(fixed.clone()),
                        cookie,
                    });
                }
                conns
            }
            Mode::Duplicate => {
                let key = key(format!("dup-{}-{tag}", ctx.nonce));
                complete_first(addr, &key, None, &fixed, &replay_header).await?;
                setup_requests += 2;
                (0..n)
                    .map(|_| ConnSpec {
                        keys: Keys::Fixed(key.clone()),
                        bodies: Bodies::Fixed(fixed.clone()),
                        cookie: None,
                    })
                    .collect()
            }
        };
        let expect = match mode {
            Mode::Duplicate => Expect::Replayed {
                replay_header: replay_header.clone(),
            },
            Mode::First | Mode::Baseline => Expect::Created {
                replay_header: replay_header.clone(),
            },
        };

        let redis_before = match (redis_use, ctx.redis_info.clone()) {
            (RedisUse::Counted, Some(mut conn)) => Some((
                ctx.env.redis_sent.load(Ordering::Relaxed),
                RedisInfo::read(&mut conn).await?,
                conn,
            )),
            _ => None,
        };
        let calls_before = server.calls.load(Ordering::Relaxed);
        let cpu_before = cpu::Sample::now();
        let measured = load::run(Plan {
            addr,
            conns,
            warmup: ctx.args.warmup,
            duration: ctx.args.duration,
            max_requests: ctx.args.max_requests,
            rate: ctx.args.rate,
            expect,
        })
        .await;
        let cpu = cpu::Sample::now().since(&cpu_before);
        let handler_calls = server.calls.load(Ordering::Relaxed) - calls_before;
        let redis = match redis_before {
            Some((sent_before, info_before, mut conn)) => {
                let sent = ctx.env.redis_sent.load(Ordering::Relaxed) - sent_before;
                let after = RedisInfo::read(&mut conn).await?;
                let (server_total, calls) = after.since(&info_before);
                let per = |n: u64| n as f64 / measured.total.max(1) as f64;
                Some(report::RedisCounts {
                    client: per(sent),
                    server: per(server_total),
                    breakdown: calls.into_iter().map(|(name, n)| (name, per(n))).collect(),
                })
            }
            None => None,
        };
        Ok::<_, String>((measured, handler_calls, redis, cpu))
    }
    .await;
    server.stop().await;
    let (measured, handler_calls, redis, cpu) = result?;

    let sql = match (pg_before, &ctx.pg) {
        (Some(before), Some(pg)) => {
            let after = pg.settled().await;
            let requests = (measured.total + setup_requests).max(1) as f64;
            Some(report::SqlCounts {
                commits: (after.commits - before.commits) as f64 / requests,
                rollbacks: (after.rollbacks - before.rollbacks) as f64 / requests,
            })
        }
        _ => None,
    };
    Ok(Row {
        scenario: label,
        mode,
        measured,
        handler_calls,
        redis,
        sql,
        cpu,
        spread: None,
    })
}

/// What `kind`'s requests carry: under load with fresh keys, and the one
/// body of a key sent more than once (duplicates, the correctness check).
/// The orders endpoint's name an account: spread over all of them, or the
/// first.
fn bodies(ctx: &Ctx, kind: &Kind) -> (Bodies, Bytes) {
    if kind.orders() {
        let spread = Bodies::Spread {
            accounts: ctx.args.orders_accounts,
            conns: u32::try_from(ctx.args.connections).unwrap_or(u32::MAX),
        };
        (spread, load::account_order(0))
    } else {
        (Bodies::Order, Bytes::from_static(load::ORDER.as_bytes()))
    }
}

async fn seed_probe(ctx: &Ctx) -> Result<(), String> {
    let Some(mut conn) = ctx.redis_info.clone() else {
        return Err("no Redis".into());
    };
    // About the size of a stored replay record.
    let value = "x".repeat(160);
    redis::cmd("SET")
        .arg(apps::PROBE_KEY)
        .arg(value)
        .exec_async(&mut conn)
        .await
        .map_err(|e| e.to_string())
}

async fn burst_check(ctx: &Ctx, label: &'static str, kind: Kind) -> Result<Vec<BurstRow>, String> {
    let mut rows = Vec::new();
    for delay in [Duration::ZERO, ctx.args.burst_delay] {
        rows.push(burst_rounds(ctx, label, kind.clone(), delay).await?);
    }
    Ok(rows)
}

/// `--burst-rounds` rounds of `--burst` simultaneous copies of a fresh
/// request, on a server whose handler takes `delay`.
async fn burst_rounds(
    ctx: &Ctx,
    label: &'static str,
    kind: Kind,
    delay: Duration,
) -> Result<BurstRow, String> {
    let peer = matches!(kind, Kind::Peer);
    let (_, body) = bodies(ctx, &kind);
    let server = Server::start(&ctx.server_rt, kind, ctx.env.clone(), delay).await?;
    let addr = server.addr;
    let tag = label.replace(|c: char| !c.is_ascii_alphanumeric(), "");
    let result = async {
        // The same client retrying: for the peer, one session.
        let cookie = if peer {
            Some(peer_session(addr, format!("login-{}-{tag}-{delay:?}", ctx.nonce)).await?)
        } else {
            None
        };
        let mut runs = Vec::new();
        let mut seen = load::Burst::default();
        for round in 0..ctx.args.burst_rounds {
            let before = server.calls.load(Ordering::Relaxed);
            let one = load::burst(
                addr,
                ctx.args.burst,
                key(format!("burst-{}-{tag}-{delay:?}-{round}", ctx.nonce)),
                cookie.clone(),
                body.clone(),
                if peer { PEER_REPLAYED } else { IDEM_REPLAYED },
            )
            .await;
            runs.push(server.calls.load(Ordering::Relaxed) - before);
            seen.add(&one);
        }
        Ok::<_, String>((seen, runs))
    }
    .await;
    server.stop().await;
    let (seen, runs) = result?;
    Ok(BurstRow {
        scenario: label,
        delay,
        copies: ctx.args.burst,
        handler_runs: runs,
        seen,
    })
}
