//! The command line of `idem-bench`.

use std::time::Duration;

use clap::Parser;

/// The orders endpoint's selectors (`--only orders` picks them all).
pub(crate) const ORDERS_BARE: &str = "orders-bare";
pub(crate) const ORDERS_PG: &str = "orders-postgres";
pub(crate) const ORDERS_TIERED: &str = "orders-tiered";
pub(crate) const ORDERS_SQLITE_BARE: &str = "orders-sqlite-bare";
pub(crate) const ORDERS_SQLITE: &str = "orders-sqlite";
pub(crate) const ORDERS_SQLITE_SOLE: &str = "orders-sqlite-sole";
pub(crate) const ORDERS_MYSQL_BARE: &str = "orders-mysql-bare";
pub(crate) const ORDERS_MYSQL: &str = "orders-mysql";
/// The hand-written deduplication's rows (`apps/handwritten.rs`).
pub(crate) const ORDERS_PG_HAND: &str = "orders-postgres-hand";
pub(crate) const ORDERS_MYSQL_HAND: &str = "orders-mysql-hand";
pub(crate) const ORDERS_SQLITE_HAND: &str = "orders-sqlite-hand";

/// Load benchmark: idem's layer on each store vs a bare axum handler vs
/// axum-idempotent, all over loopback HTTP/1.1 keep-alive.
#[derive(Debug, Clone, Parser)]
#[command(name = "idem-bench", version)]
pub(crate) struct Args {
    /// Measured time per scenario and mode.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Unmeasured warm-up before each measurement.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) warmup: Duration,
    /// Concurrent keep-alive connections (one request in flight on each).
    #[arg(long, default_value_t = 32)]
    pub(crate) connections: usize,
    /// Cap on the requests of one measurement, warm-up included.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) max_requests: u64,
    /// Worker threads of the server runtime (default: the CPU count).
    #[arg(long)]
    pub(crate) server_threads: Option<usize>,
    /// Worker threads of the load generator's runtime (default: the CPU count).
    #[arg(long)]
    pub(crate) client_threads: Option<usize>,
    /// PostgreSQL server, without a database.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub(crate) postgres: String,
    /// The database the benchmark owns (created if missing; its records
    /// table is emptied at the start).
    #[arg(long, default_value = "idem_bench")]
    pub(crate) pg_database: String,
    /// Connections in each PostgreSQL pool.
    #[arg(long, default_value_t = 10)]
    pub(crate) pg_pool: u32,
    /// How long `pg_stat_database` must stay still to count as settled
    /// (the measured pool is closed first, which flushes its statistics).
    #[arg(long, default_value = "1500ms", value_parser = humantime::parse_duration)]
    pub(crate) pg_settle: Duration,
    /// Pace the load to about this many requests per second in all (each
    /// connection sends at rate / connections), instead of as fast as the
    /// server answers: rows that keep up run at the same throughput, so
    /// their CPU per request compares the work per request alone, without
    /// the batching of wake-ups a faster row gets.
    #[arg(long)]
    pub(crate) rate: Option<u32>,
    /// Put PostgreSQL and Redis a network hop away: a proxy that holds
    /// every chunk of bytes this long in each direction (say `500us`), as
    /// a link with that latency would. Every row that uses them goes
    /// through it; the statistics the benchmark reads do not.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) net_delay: Option<Duration>,
    /// MySQL/MariaDB server, without a database.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    pub(crate) mysql: String,
    /// The MySQL/MariaDB database the benchmark owns (created if missing;
    /// the orders endpoint's tables are emptied by each of its rows).
    #[arg(long, default_value = "idem_bench")]
    pub(crate) mysql_database: String,
    /// Connections in each SQLite pool.
    #[arg(long, default_value_t = 8)]
    pub(crate) sqlite_pool: u32,
    /// Redis to use if a private `redis-server` cannot be started (its
    /// command counts then include anyone else's traffic).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub(crate) redis: String,
    /// Copies of one fresh request sent at once in the correctness check.
    #[arg(long, default_value_t = 50)]
    pub(crate) burst: usize,
    /// Rounds of the correctness check, each with a fresh key.
    #[arg(long, default_value_t = 3)]
    pub(crate) burst_rounds: usize,
    /// Simulated work in the handler for the second correctness check
    /// (the first runs the handler as measured, with none).
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub(crate) burst_delay: Duration,
    /// Measure every scenario and mode this many times, round after round
    /// (so a drift of the machine's speed spreads over all of them), and
    /// report the median round of each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,
    /// Pool sizes of the storm (transactional PostgreSQL): one storm each.
    #[arg(long, value_delimiter = ',', default_value = "4,64")]
    pub(crate) storm_pools: Vec<u32>,
    /// Duplicates of one key in the storm, beside the first request.
    #[arg(long, default_value_t = 80)]
    pub(crate) storm_duplicates: usize,
    /// Distinct keys sent with the storm's duplicates.
    #[arg(long, default_value_t = 8)]
    pub(crate) storm_keys: usize,
    /// How long the storm's handler runs (inside its transaction).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub(crate) storm_handler: Duration,
    /// Accounts of the orders endpoint, over which its first requests
    /// spread their debits.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) orders_accounts: u32,
    /// Run only these scenarios (comma-separated): bare, bare-redis,
    /// memory, sqlite, postgres, tiered, peer, burst, storm; orders (the
    /// orders endpoint's rows), or one of them: orders-bare,
    /// orders-postgres, orders-postgres-hand, orders-tiered,
    /// orders-mysql-bare, orders-mysql, orders-mysql-hand,
    /// orders-sqlite-bare, orders-sqlite, orders-sqlite-sole,
    /// orders-sqlite-hand.
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// Measure only these modes of the idem and peer scenarios
    /// (comma-separated): first, duplicate.
    #[arg(long, value_delimiter = ',')]
    pub(crate) modes: Vec<String>,
    /// Write the charts (`throughput.svg`, `latency.svg`) in this directory,
    /// beside the report printed on stdout.
    #[arg(long)]
    pub(crate) charts: Option<std::path::PathBuf>,
    /// Instead of the benchmark, send `--requests` requests of one case
    /// through its app in process, for an instruction count
    /// (`.ci/instructions`): bare, idem-first, idem-replay, peer-first,
    /// peer-replay; and, for a profile of the SQL paths on one pooled
    /// connection, orders-{mysql,postgres}[-hand]-{first,replay}.
    #[arg(long)]
    pub(crate) instructions: Option<String>,
    /// Requests of `--instructions`.
    #[arg(long, default_value_t = 1000)]
    pub(crate) requests: u64,
}

impl Args {
    /// Whether `--only` selects the scenario `name` (everything does when
    /// it is empty; `orders` selects every `orders-` one).
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.only.is_empty()
            || self.only.iter().any(|o| o == name)
            || (name.starts_with("orders-") && self.only.iter().any(|o| o == "orders"))
    }
}
