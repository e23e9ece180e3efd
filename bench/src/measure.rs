//! One measurement: a scenario's server under load in one mode, and what
//! the load cost its stores and the CPU.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use idem_tower::redis::redis;
use idem_tower::redis::redis::aio::MultiplexedConnection;

use crate::Ctx;
use crate::apps::{self, Kind, Server};
use crate::client::{bodies, complete_first, key, peer_session, replay_header};
use crate::cpu::{self, Spent};
use crate::load::{self, Bodies, ConnSpec, Expect, Keys, Measured, Plan};
use crate::report::{Mode, RedisCounts, RedisUse, Row, SqlCounts, SqlUse};
use crate::scenarios::Job;
use crate::stats::{PgStats, RedisInfo, Transactions};

/// Measures `job` in round `round` on a server of its own.
pub(crate) async fn measure(ctx: &Ctx, job: &Job, round: u32) -> Result<Row, String> {
    let pg_before = match (job.sql_use, &ctx.pg) {
        (SqlUse::Postgres, Some(pg)) => Some(pg.settled().await),
        _ => None,
    };
    let server = Server::start(
        &ctx.server_rt,
        job.kind.clone(),
        ctx.env.clone(),
        Duration::ZERO,
    )
    .await?;
    // Keys of their own in every round: the SQL and Redis stores outlive a
    // measurement.
    let tag = format!(
        "{}-{}-{round}",
        job.label.replace(|c: char| !c.is_ascii_alphanumeric(), ""),
        job.mode
    );
    let result = async {
        let setup = connections(ctx, job, server.addr, &tag).await?;
        let expect = match job.mode {
            Mode::Duplicate => Expect::Replayed {
                replay_header: replay_header(&job.kind),
            },
            Mode::First | Mode::Baseline => Expect::Created {
                replay_header: replay_header(&job.kind),
            },
        };
        let loaded = load(ctx, job.redis_use, &server, setup.conns, expect).await?;
        Ok::<_, String>((setup.requests, loaded))
    }
    .await;
    server.stop().await;
    let (setup_requests, loaded) = result?;
    let sql = match (pg_before, &ctx.pg) {
        (Some(before), Some(pg)) => {
            let requests = loaded.measured.total + setup_requests;
            Some(sql_counts(pg, before, requests).await)
        }
        _ => None,
    };
    Ok(Row {
        scenario: job.label,
        mode: job.mode,
        measured: loaded.measured,
        handler_calls: loaded.handler_calls,
        redis: loaded.redis,
        sql,
        cpu: loaded.cpu,
        spread: None,
    })
}

/// The load's connections, and the requests sent to set them up.
struct Setup {
    conns: Vec<ConnSpec>,
    requests: u64,
}

/// Sets up `job`'s connections to `addr`: the peer's sessions, the probe's
/// key, the completed keys that duplicates replay.
async fn connections(ctx: &Ctx, job: &Job, addr: SocketAddr, tag: &str) -> Result<Setup, String> {
    let n = ctx.args.connections;
    let mut requests = 0u64;
    // axum-idempotent caches per session: each connection is a client
    // with a session of its own.
    let mut cookies = vec![None; n];
    if matches!(job.kind, Kind::Peer) {
        for (i, cookie) in cookies.iter_mut().enumerate() {
            *cookie = Some(peer_session(addr, format!("login-{}-{tag}-{i}", ctx.nonce)).await?);
            requests += 1;
        }
    }
    if matches!(job.kind, Kind::BareRedisGet) {
        seed_probe(ctx).await?;
    }
    let (spread, fixed) = bodies(ctx, &job.kind);
    let replay_header = replay_header(&job.kind);
    let conns = match job.mode {
        Mode::First | Mode::Baseline => cookies
            .into_iter()
            .map(|cookie| ConnSpec {
                keys: Keys::Unique(format!("{}-{tag}", ctx.nonce)),
                bodies: spread.clone(),
                cookie,
            })
            .collect(),
        // Each connection replays a completed key of its own: a duplicate
        // is one request's retry, not a crowd on one key (which transactional
        // stores answer from one shared check in the process).
        Mode::Duplicate => {
            let mut conns = Vec::with_capacity(n);
            for (i, cookie) in cookies.into_iter().enumerate() {
                let key = key(format!("dup-{}-{tag}-{i}", ctx.nonce));
                conns.push(duplicate(addr, key, cookie, &fixed, &replay_header).await?);
                requests += 2;
            }
            conns
        }
    };
    Ok(Setup { conns, requests })
}

/// Completes `key` (on the session of `cookie`, if any) and returns a
/// connection that replays it.
async fn duplicate(
    addr: SocketAddr,
    key: HeaderValue,
    cookie: Option<HeaderValue>,
    body: &Bytes,
    replay_header: &HeaderName,
) -> Result<ConnSpec, String> {
    complete_first(addr, &key, cookie.as_ref(), body, replay_header).await?;
    Ok(ConnSpec {
        keys: Keys::Fixed(key),
        bodies: Bodies::Fixed(body.clone()),
        cookie,
    })
}

/// Writes the key the Redis baseline reads.
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

/// What the load saw and cost.
struct Loaded {
    measured: Measured,
    /// Handler invocations during the load.
    handler_calls: usize,
    redis: Option<RedisCounts>,
    cpu: Spent,
}

/// Runs the load on `server` over `conns`, counting the handler's calls,
/// the CPU and (if counted) the Redis commands meanwhile.
async fn load(
    ctx: &Ctx,
    redis_use: RedisUse,
    server: &Server,
    conns: Vec<ConnSpec>,
    expect: Expect,
) -> Result<Loaded, String> {
    let redis_before = match (redis_use, ctx.redis_info.clone()) {
        (RedisUse::Counted, Some(conn)) => Some(RedisSnapshot::take(ctx, conn).await?),
        _ => None,
    };
    let calls_before = server.calls.load(Ordering::Relaxed);
    let cpu_before = cpu::Sample::now();
    let measured = load::run(Plan {
        addr: server.addr,
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
        Some(before) => Some(before.per_request(ctx, measured.total).await?),
        None => None,
    };
    Ok(Loaded {
        measured,
        handler_calls,
        redis,
        cpu,
    })
}

/// The Redis counts before a load: the app's and the server's.
struct RedisSnapshot {
    /// Commands the app had sent.
    sent: u64,
    /// The server's counts.
    info: RedisInfo,
    /// The connection that reads them.
    conn: MultiplexedConnection,
}

impl RedisSnapshot {
    /// Reads the counts now, the server's on `conn`.
    async fn take(ctx: &Ctx, mut conn: MultiplexedConnection) -> Result<Self, String> {
        Ok(Self {
            sent: ctx.env.redis_sent.load(Ordering::Relaxed),
            info: RedisInfo::read(&mut conn).await?,
            conn,
        })
    }

    /// The commands since, per request of the `total` the load completed.
    async fn per_request(mut self, ctx: &Ctx, total: u64) -> Result<RedisCounts, String> {
        let sent = ctx.env.redis_sent.load(Ordering::Relaxed) - self.sent;
        let after = RedisInfo::read(&mut self.conn).await?;
        let (server_total, calls) = after.since(&self.info);
        let per = |n: u64| n as f64 / total.max(1) as f64;
        Ok(RedisCounts {
            client: per(sent),
            server: per(server_total),
            breakdown: calls.into_iter().map(|(name, n)| (name, per(n))).collect(),
        })
    }
}

/// PostgreSQL transactions per request since `before`, once the database's
/// statistics have settled, over `requests` (the setup's included).
async fn sql_counts(pg: &PgStats, before: Transactions, requests: u64) -> SqlCounts {
    let after = pg.settled().await;
    let requests = requests.max(1) as f64;
    SqlCounts {
        commits: (after.commits - before.commits) as f64 / requests,
        rollbacks: (after.rollbacks - before.rollbacks) as f64 / requests,
    }
}
