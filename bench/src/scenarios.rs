//! The scenarios, in the order they are measured and reported, and the
//! measurements and checks `--only` and `--modes` select among them.

use crate::Ctx;
use crate::apps::Kind;
use crate::cli::{
    ORDERS_BARE, ORDERS_MYSQL, ORDERS_MYSQL_BARE, ORDERS_MYSQL_HAND, ORDERS_PG, ORDERS_PG_HAND,
    ORDERS_SQLITE, ORDERS_SQLITE_BARE, ORDERS_SQLITE_HAND, ORDERS_SQLITE_SOLE, ORDERS_TIERED,
};
use crate::report::{self, Mode, RedisUse, SqlUse};

/// One scenario: an app, the modes it is measured in, and the services it
/// needs.
struct Scenario {
    /// Its `--only` selector.
    name: &'static str,
    /// Its row label in the report.
    label: &'static str,
    kind: Kind,
    modes: Vec<Mode>,
    redis_use: RedisUse,
    sql_use: SqlUse,
}

impl Scenario {
    /// The scenario `name`, reported as `label`.
    fn new(
        name: &'static str,
        label: &'static str,
        kind: Kind,
        modes: Vec<Mode>,
        redis_use: RedisUse,
        sql_use: SqlUse,
    ) -> Self {
        Self {
            name,
            label,
            kind,
            modes,
            redis_use,
            sql_use,
        }
    }
}

/// One measurement to take: a scenario in one mode.
pub(crate) struct Job {
    /// The scenario's row label.
    pub(crate) label: &'static str,
    pub(crate) kind: Kind,
    pub(crate) mode: Mode,
    pub(crate) redis_use: RedisUse,
    pub(crate) sql_use: SqlUse,
}

/// Every measurement to take, in order: the selected scenarios whose
/// services are up, in their selected modes (a baseline is always taken).
pub(crate) fn jobs(ctx: &Ctx) -> Vec<Job> {
    let mut jobs = Vec::new();
    for scenario in runnable(ctx) {
        for mode in scenario.modes {
            if mode != Mode::Baseline
                && !ctx.args.modes.is_empty()
                && !ctx.args.modes.iter().any(|m| *m == mode.to_string())
            {
                continue;
            }
            jobs.push(Job {
                label: scenario.label,
                kind: scenario.kind.clone(),
                mode,
                redis_use: scenario.redis_use,
                sql_use: scenario.sql_use,
            });
        }
    }
    jobs
}

/// The scenarios to put through the correctness check (with `burst`
/// selected), by label: the runnable ones with idempotency.
pub(crate) fn checks(ctx: &Ctx) -> Vec<(&'static str, Kind)> {
    if !ctx.args.wants("burst") {
        return Vec::new();
    }
    runnable(ctx)
        .filter(|s| {
            !matches!(
                s.name,
                "bare" | "bare-redis" | ORDERS_BARE | ORDERS_SQLITE_BARE | ORDERS_MYSQL_BARE
            )
        })
        .map(|s| (s.label, s.kind))
        .collect()
}

/// The scenarios `--only` selects whose Redis, PostgreSQL and MySQL are
/// up.
fn runnable(ctx: &Ctx) -> impl Iterator<Item = Scenario> {
    let mut all = bare_scenarios();
    all.extend(idempotent_scenarios(ctx));
    all.extend(orders_scenarios(ctx));
    all.into_iter().filter(|s| {
        ctx.args.wants(s.name)
            && !(s.redis_use != RedisUse::None && ctx.env.redis_url.is_none())
            && !(s.sql_use == SqlUse::Postgres && ctx.pg.is_none())
            && !(s.sql_use == SqlUse::Mysql && ctx.mysql_url.is_none())
    })
}

/// The bare handlers: the baselines of idem's layer and the peer crate.
fn bare_scenarios() -> Vec<Scenario> {
    vec![
        Scenario::new(
            "bare",
            "bare handler",
            Kind::Bare,
            vec![Mode::Baseline],
            RedisUse::None,
            SqlUse::None,
        ),
        Scenario::new(
            "bare-redis",
            "bare handler + 1 Redis GET",
            Kind::BareRedisGet,
            vec![Mode::Baseline],
            RedisUse::Counted,
            SqlUse::None,
        ),
    ]
}

/// idem's layer on each store, and the peer crate.
fn idempotent_scenarios(ctx: &Ctx) -> Vec<Scenario> {
    let both = || vec![Mode::First, Mode::Duplicate];
    let (pg_url, pg_pool) = (&ctx.pg_url, ctx.args.pg_pool);
    let sqlite = |file: &str, full| Kind::Sqlite {
        path: ctx.sqlite_dir.join(file),
        pool: ctx.args.sqlite_pool,
        full,
    };
    vec![
        Scenario::new(
            "memory",
            "idem: memory",
            Kind::Memory,
            both(),
            RedisUse::None,
            SqlUse::None,
        ),
        Scenario::new(
            "sqlite",
            "idem: SQLite (synchronous FULL)",
            sqlite("records-full.db", true),
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        Scenario::new(
            "sqlite",
            "idem: SQLite (synchronous NORMAL)",
            sqlite("records-normal.db", false),
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        Scenario::new(
            "postgres",
            "idem: PostgreSQL",
            Kind::Postgres {
                url: pg_url.clone(),
                pool: pg_pool,
            },
            both(),
            RedisUse::None,
            SqlUse::Postgres,
        ),
        Scenario::new(
            "tiered",
            "idem: Redis + PostgreSQL",
            Kind::Tiered {
                url: pg_url.clone(),
                pool: pg_pool,
            },
            both(),
            RedisUse::Counted,
            SqlUse::Postgres,
        ),
        Scenario::new(
            "peer",
            "axum-idempotent 0.6.0 (moka sessions)",
            Kind::Peer,
            both(),
            RedisUse::None,
            SqlUse::None,
        ),
    ]
}

/// The orders endpoint, bare, with hand-written deduplication and behind
/// idem, on PostgreSQL, MySQL/MariaDB and SQLite.
fn orders_scenarios(ctx: &Ctx) -> Vec<Scenario> {
    let mut all = orders_on_postgres(ctx);
    all.extend(orders_on_mysql(ctx));
    all.extend(orders_on_sqlite(ctx));
    all
}

/// The orders endpoint on PostgreSQL.
fn orders_on_postgres(ctx: &Ctx) -> Vec<Scenario> {
    let both = || vec![Mode::First, Mode::Duplicate];
    let (url, pool) = (ctx.pg_url.clone(), ctx.args.pg_pool);
    vec![
        Scenario::new(
            ORDERS_BARE,
            report::ORDERS_BARE,
            Kind::OrdersBare {
                url: url.clone(),
                pool,
            },
            vec![Mode::Baseline],
            RedisUse::None,
            SqlUse::Postgres,
        ),
        Scenario::new(
            ORDERS_PG,
            report::ORDERS_PG,
            Kind::OrdersPg {
                url: url.clone(),
                pool,
            },
            both(),
            RedisUse::None,
            SqlUse::Postgres,
        ),
        Scenario::new(
            ORDERS_PG_HAND,
            report::ORDERS_PG_HAND,
            Kind::OrdersPgHand {
                url: url.clone(),
                pool,
            },
            both(),
            RedisUse::None,
            SqlUse::Postgres,
        ),
        Scenario::new(
            ORDERS_TIERED,
            report::ORDERS_TIERED,
            Kind::OrdersTiered { url, pool },
            both(),
            RedisUse::Counted,
            SqlUse::Postgres,
        ),
    ]
}

/// The orders endpoint on MySQL/MariaDB (its pool as large as
/// PostgreSQL's).
fn orders_on_mysql(ctx: &Ctx) -> Vec<Scenario> {
    let both = || vec![Mode::First, Mode::Duplicate];
    let url = ctx.mysql_url.clone().unwrap_or_default();
    let (pool, accounts) = (ctx.args.pg_pool, ctx.args.orders_accounts);
    vec![
        Scenario::new(
            ORDERS_MYSQL_BARE,
            report::ORDERS_MYSQL_BARE,
            Kind::OrdersMysqlBare {
                url: url.clone(),
                pool,
                accounts,
            },
            vec![Mode::Baseline],
            RedisUse::None,
            SqlUse::Mysql,
        ),
        Scenario::new(
            ORDERS_MYSQL,
            report::ORDERS_MYSQL,
            Kind::OrdersMysql {
                url: url.clone(),
                pool,
                accounts,
            },
            both(),
            RedisUse::None,
            SqlUse::Mysql,
        ),
        Scenario::new(
            ORDERS_MYSQL_HAND,
            report::ORDERS_MYSQL_HAND,
            Kind::OrdersMysqlHand {
                url,
                pool,
                accounts,
            },
            both(),
            RedisUse::None,
            SqlUse::Mysql,
        ),
    ]
}

/// The orders endpoint on SQLite, each row on a file of its own.
fn orders_on_sqlite(ctx: &Ctx) -> Vec<Scenario> {
    let both = || vec![Mode::First, Mode::Duplicate];
    let (sqlite_pool, accounts) = (ctx.args.sqlite_pool, ctx.args.orders_accounts);
    let idem = |file: &str, sole_writer| Kind::OrdersSqlite {
        path: ctx.sqlite_dir.join(file),
        pool: sqlite_pool,
        accounts,
        sole_writer,
    };
    vec![
        Scenario::new(
            ORDERS_SQLITE_BARE,
            report::ORDERS_SQLITE_BARE,
            Kind::OrdersSqliteBare {
                path: ctx.sqlite_dir.join("orders-bare.db"),
                pool: sqlite_pool,
                accounts,
            },
            vec![Mode::Baseline],
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        Scenario::new(
            ORDERS_SQLITE,
            report::ORDERS_SQLITE,
            idem("orders-idem.db", false),
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        Scenario::new(
            ORDERS_SQLITE_SOLE,
            report::ORDERS_SQLITE_SOLE,
            idem("orders-idem-sole.db", true),
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
        Scenario::new(
            ORDERS_SQLITE_HAND,
            report::ORDERS_SQLITE_HAND,
            Kind::OrdersSqliteHand {
                path: ctx.sqlite_dir.join("orders-hand.db"),
                pool: sqlite_pool,
                accounts,
            },
            both(),
            RedisUse::None,
            SqlUse::Sqlite,
        ),
    ]
}
