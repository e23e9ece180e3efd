//! The Markdown tables `idem-bench` prints.

mod bursts;
pub(crate) mod charts;
mod costs;
mod machine;
mod results;
mod targets;

use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

use crate::burst::Burst;
use crate::cpu::Spent;
use crate::load::Measured;

pub(crate) use machine::Machine;

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
pub(crate) const ORDERS_SQLITE_SOLE: &str =
    "orders endpoint on SQLite, idem transactional (SqliteStore, sole writer)";
/// The same endpoint on MySQL/MariaDB; its "vs bare" is against the first.
pub(crate) const ORDERS_MYSQL_BARE: &str = "orders endpoint on MySQL, bare";
pub(crate) const ORDERS_MYSQL: &str = "orders endpoint on MySQL, idem transactional (MySqlStore)";
/// The endpoint with deduplication written by hand, on each database.
pub(crate) const ORDERS_PG_HAND: &str = "orders endpoint, hand-written dedup";
pub(crate) const ORDERS_MYSQL_HAND: &str = "orders endpoint on MySQL, hand-written dedup";
pub(crate) const ORDERS_SQLITE_HAND: &str = "orders endpoint on SQLite, hand-written dedup";

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
    Mysql,
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

/// The row of `scenario` in `mode`, if measured.
fn find<'a>(rows: &'a [Row], scenario: &str, mode: Mode) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.mode == mode)
}

/// `row`'s throughput over `base`'s.
fn ratio(row: &Row, base: Option<&Row>) -> Option<f64> {
    base.map(|b| row.measured.throughput() / b.measured.throughput())
}

/// Whether `row` is one of the orders endpoint's.
fn orders(row: &Row) -> bool {
    [ORDERS_BARE, ORDERS_PG, ORDERS_TIERED, ORDERS_PG_HAND].contains(&row.scenario)
        || orders_on_sqlite(row)
        || orders_on_mysql(row)
}

/// Whether `row` is one of the orders endpoint's on SQLite.
fn orders_on_sqlite(row: &Row) -> bool {
    [
        ORDERS_SQLITE_BARE,
        ORDERS_SQLITE,
        ORDERS_SQLITE_SOLE,
        ORDERS_SQLITE_HAND,
    ]
    .contains(&row.scenario)
}

/// Whether `row` is one of the orders endpoint's on MySQL/MariaDB.
fn orders_on_mysql(row: &Row) -> bool {
    [ORDERS_MYSQL_BARE, ORDERS_MYSQL, ORDERS_MYSQL_HAND].contains(&row.scenario)
}

/// The baseline `row` is compared with: the bare orders endpoint on its
/// database, or the bare handler.
fn vs_bare<'a>(row: &Row, baselines: &Baselines<'a>) -> Option<&'a Row> {
    if orders_on_sqlite(row) {
        baselines.orders_sqlite_bare
    } else if orders_on_mysql(row) {
        baselines.orders_mysql_bare
    } else if orders(row) {
        baselines.orders_bare
    } else {
        baselines.bare
    }
}

/// A ratio as the report prints it (`–` if there is none).
fn times(r: Option<f64>) -> String {
    r.map_or("–".to_owned(), |r| format!("{r:.2}x"))
}

/// The rows the others are compared with.
struct Baselines<'a> {
    /// The bare handler.
    bare: Option<&'a Row>,
    /// The bare handler with one Redis `GET`.
    bare_get: Option<&'a Row>,
    /// The bare orders endpoint on PostgreSQL.
    orders_bare: Option<&'a Row>,
    /// The bare orders endpoint on SQLite.
    orders_sqlite_bare: Option<&'a Row>,
    /// The bare orders endpoint on MySQL/MariaDB.
    orders_mysql_bare: Option<&'a Row>,
}

impl<'a> Baselines<'a> {
    /// The baselines among `rows`.
    fn find(rows: &'a [Row]) -> Self {
        Self {
            bare: find(rows, "bare handler", Mode::Baseline),
            bare_get: find(rows, "bare handler + 1 Redis GET", Mode::Baseline),
            orders_bare: find(rows, ORDERS_BARE, Mode::Baseline),
            orders_sqlite_bare: find(rows, ORDERS_SQLITE_BARE, Mode::Baseline),
            orders_mysql_bare: find(rows, ORDERS_MYSQL_BARE, Mode::Baseline),
        }
    }
}

/// Prints the machine, the results, the checks and the targets.
pub(crate) fn write(
    out: &mut impl Write,
    machine: &Machine,
    rows: &[Row],
    bursts: &[BurstRow],
    notes: &[String],
) -> io::Result<()> {
    let baselines = Baselines::find(rows);
    machine.write(out)?;
    results::write(out, rows, &baselines)?;
    costs::write_cpu(out, rows)?;
    costs::write_redis(out, rows)?;
    costs::write_sql(out, rows)?;
    bursts::write(out, bursts)?;
    targets::write(out, rows, bursts, &baselines)?;
    write_notes(out, notes)
}

/// The notes, if any.
fn write_notes(out: &mut impl Write, notes: &[String]) -> io::Result<()> {
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
