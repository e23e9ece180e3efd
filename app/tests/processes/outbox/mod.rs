//! The transactional outbox end to end, with real processes: the `orders`
//! binary enqueues an `order.created` event in each order's transaction,
//! `relay` binaries publish the outbox to a NATS JetStream server, and the
//! `consumer` binary (`--feed orders`) books one rewards entry per order
//! through its inbox. Effects are counted as rows, not statuses:
//!
//! - an order rolled back (the handler failing after its writes, or the
//!   orders process killed with SIGKILL mid-transaction) leaves no outbox
//!   row, nothing on the stream and no rewards entry; a committed one,
//!   exactly one of each (PostgreSQL, MySQL/MariaDB, SQLite);
//! - a relay killed mid-batch, the NATS server killed and restarted
//!   mid-run, two relays racing: every order placed (concurrently, over
//!   HTTP) is booked exactly once and the outbox ends with nothing unsent;
//!   each test prints how many re-publishes JetStream dropped and how many
//!   deliveries the inbox skipped;
//! - one user's events are booked in `order_id` order;
//! - the relay serves its metrics at `GET /metrics`.
//!
//! Each test starts its own `nats-server` (a free port, a temporary store
//! directory, so it can kill and restart it) and, on PostgreSQL and MySQL,
//! creates its own database (dropped at the end): relays publish whatever
//! outbox they find, so tests must not share one. `IDEM_TEST_NATS_SERVER`
//! (default `/usr/sbin/nats-server`, else `nats-server` on the `PATH`), and
//! the SQL URLs of the other suites; a missing server skips the test, or
//! fails it with `CI=true`.

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{Spawned, handler_calls, metric, scrape, unique};
use async_nats::jetstream;
use futures_util::StreamExt;
use idem_app::consumer::{Ledger, Reward, points};
use idem_app::orders::ORDERS_STREAM;
use idem_app::sql_pool::SqlPool;
use idem_test_support::{mysql_url, postgres_url, server_missing, server_url};
use idem_tower::sql::sqlx::{self, AssertSqlSafe};
use serde_json::Value;

mod relays;
mod rolled_back;

/// What a relay logs when JetStream answers a publish as a duplicate (the
/// same `Nats-Msg-Id` inside the stream's window): `RUST_LOG` below turns
/// that debug line on.
const JETSTREAM_DUPLICATE: &str = "JetStream had this event already";
/// What a relay logs when a publish failed and was put back.
const PUBLISH_FAILED: &str = "publish failed; retrying later";
/// What the consumer logs when its inbox skips a delivery.
const INBOX_DUPLICATE: &str = "duplicate skipped";

// ---------------------------------------------------------------- servers

/// A private `nats-server` with JetStream: its own port and store.
struct Nats {
    binary: String,
    port: u16,
    store: PathBuf,
    server: Option<Spawned>,
    url: String,
}

impl Nats {
    /// Starts one, or `None` (skipped) if there is no `nats-server`.
    fn start() -> Option<Self> {
        let binary = server_url("IDEM_TEST_NATS_SERVER", "/usr/sbin/nats-server");
        let binary = if Path::new(&binary).exists() {
            binary
        } else {
            "nats-server".to_owned()
        };
        if let Err(err) = Command::new(&binary).arg("--version").output() {
            return server_missing("nats-server", &binary, err);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let store = std::env::temp_dir().join(unique("idem-outbox-nats"));
        let mut nats = Self {
            binary,
            port,
            store,
            server: None,
            url: format!("nats://127.0.0.1:{port}"),
        };
        nats.boot();
        Some(nats)
    }

    fn boot(&mut self) {
        let mut command = Command::new(&self.binary);
        command
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js"])
            .arg("-sd")
            .arg(&self.store);
        self.server = Some(Spawned::start(command, "Server is ready"));
    }

    /// SIGKILL, then the same server again: same port, same store.
    async fn kill_9_and_restart(&mut self, down_for: Duration) {
        if let Some(mut server) = self.server.take() {
            server.kill_9();
        }
        tokio::time::sleep(down_for).await;
        self.boot();
    }

    /// How many messages the orders stream holds (a new connection: the
    /// server may have restarted).
    async fn stored(&self) -> u64 {
        stored(&self.jetstream().await).await
    }

    async fn jetstream(&self) -> jetstream::Context {
        jetstream::new(async_nats::connect(&self.url).await.expect("NATS"))
    }
}

/// How many messages the orders stream holds.
async fn stored(js: &jetstream::Context) -> u64 {
    let mut stream = js.get_stream(ORDERS_STREAM).await.expect("the stream");
    stream.info().await.expect("stream info").state.messages
}

impl Drop for Nats {
    fn drop(&mut self) {
        drop(self.server.take());
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

#[derive(Debug, Clone, Copy)]
enum Backend {
    Postgres,
    MySql,
    Sqlite,
}

/// A database of one test: its own PostgreSQL or MySQL database, or SQLite
/// files.
struct TestDb {
    /// The orders app's and the relays'.
    url: String,
    /// The consumer's: the same server database, or another SQLite file.
    consumer_url: String,
    pool: SqlPool,
    /// The server database to drop at the end, and a pool to drop it from.
    created: Option<(SqlPool, String)>,
    files: Vec<PathBuf>,
}

impl TestDb {
    async fn create(backend: Backend) -> Option<Self> {
        let (what, admin_url) = match backend {
            Backend::Postgres => ("PostgreSQL", postgres_url()),
            Backend::MySql => ("MySQL/MariaDB", mysql_url()),
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{}.db", unique("idem-outbox")));
                let consumer = path.with_extension("consumer.db");
                let url = format!("sqlite://{}", path.display());
                let pool = SqlPool::connect(&url, 4).await.expect("SQLite");
                return Some(Self {
                    consumer_url: format!("sqlite://{}", consumer.display()),
                    url,
                    pool,
                    created: None,
                    files: vec![path, consumer],
                });
            }
        };
        let admin = match SqlPool::connect(&admin_url, 2).await {
            Ok(admin) => admin,
            Err(err) => return server_missing(what, &admin_url, err),
        };
        let name = unique("idem_outbox").replace('-', "_");
        execute(&admin, &format!("CREATE DATABASE {name}")).await;
        let (base, query) = admin_url.split_once('?').unwrap_or((&admin_url, ""));
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        let url = match query {
            "" => format!("{server}/{name}"),
            query => format!("{server}/{name}?{query}"),
        };
        let pool = SqlPool::connect(&url, 4).await.expect("the test database");
        Some(Self {
            consumer_url: url.clone(),
            url,
            pool,
            created: Some((admin, name)),
            files: Vec::new(),
        })
    }

    /// `SELECT COUNT(*) ...`.
    async fn count(&self, sql: &str) -> i64 {
        let query = AssertSqlSafe(sql.to_owned());
        match &self.pool {
            SqlPool::Postgres(pool) => sqlx::query_scalar(query).fetch_one(pool).await,
            SqlPool::MySql(pool) => sqlx::query_scalar(query).fetch_one(pool).await,
            SqlPool::Sqlite(pool) => sqlx::query_scalar(query).fetch_one(pool).await,
        }
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    async fn outbox_rows(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM idem_outbox").await
    }

    async fn unsent(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
            .await
    }

    async fn sent(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NOT NULL")
            .await
    }

    /// Events claimed by a relay and not sent yet.
    async fn leased(&self) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM idem_outbox WHERE locked_by IS NOT NULL AND sent_at IS NULL",
        )
        .await
    }

    async fn orders_of(&self, tenant: &str) -> i64 {
        self.count(&format!(
            "SELECT COUNT(*) FROM orders_orders WHERE tenant = '{tenant}'"
        ))
        .await
    }

    async fn drop_database(self) {
        if let Some((admin, name)) = &self.created {
            let force = match admin {
                SqlPool::Postgres(_) => " WITH (FORCE)",
                _ => "",
            };
            execute(admin, &format!("DROP DATABASE IF EXISTS {name}{force}")).await;
        }
        for file in &self.files {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
    }
}

async fn execute(pool: &SqlPool, sql: &str) {
    let statement = AssertSqlSafe(sql.to_owned());
    match pool {
        SqlPool::Postgres(pool) => sqlx::raw_sql(statement).execute(pool).await.map(drop),
        SqlPool::MySql(pool) => sqlx::raw_sql(statement).execute(pool).await.map(drop),
        SqlPool::Sqlite(pool) => sqlx::raw_sql(statement).execute(pool).await.map(drop),
    }
    .unwrap_or_else(|err| panic!("{sql}: {err}"));
}

// -------------------------------------------------------------- processes

/// A `relay` process on `db`'s outbox, publishing to `nats`: quick to
/// notice work (50 ms idle), a 1.5 s lease, retries within half a second.
fn relay(db: &TestDb, nats: &Nats, name: &str, extra: &[&str]) -> Spawned {
    let mut command = Command::new(env!("CARGO_BIN_EXE_relay"));
    command
        .args(["--database", &db.url, "--nats", &nats.url, "--name", name])
        .args(["--idle-ms", "50", "--lease-ms", "1500"])
        .args(["--max-backoff-ms", "500", "--publish-timeout-ms", "1000"])
        .args(extra)
        .env("RUST_LOG", "warn,idem_guards::outbox=debug");
    Spawned::start(command, "relay ready")
}

/// A `consumer --feed orders` process booking rewards in `db`'s consumer
/// database.
fn consumer(db: &TestDb, nats: &Nats, concurrency: usize) -> Spawned {
    let mut command = Command::new(env!("CARGO_BIN_EXE_consumer"));
    command
        .args(["--feed", "orders", "--nats", &nats.url])
        .args(["--database", &db.consumer_url, "--ack-wait-ms", "2000"])
        .args(["--concurrency", &concurrency.to_string()])
        .env("RUST_LOG", "warn,idem_app::consumer=info");
    Spawned::start(command, "consumer ready")
}

// ----------------------------------------------------------------- orders

/// An order the app answered 201 to.
#[derive(Debug, Clone)]
struct Placed {
    order_id: u64,
    user: String,
    amount_cents: i64,
}

fn price(i: usize) -> i64 {
    100 * (1 + (i % 5) as i64) + (i % 100) as i64
}

/// `POST /orders` for `user` with key `key` and extra headers; the reply's
/// status and body.
async fn post_order(
    base: &str,
    tenant: &str,
    user: &str,
    key: &str,
    amount_cents: i64,
    headers: &[(&str, &str)],
) -> Result<(u16, Value), reqwest::Error> {
    let mut request = support::order(base, key, tenant, user, amount_cents);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let reply = request.send().await?;
    let status = reply.status().as_u16();
    Ok((status, reply.json().await.unwrap_or(Value::Null)))
}

/// Places `count` orders, `concurrency` at once, spread over `users` users.
async fn place_concurrently(
    base: &str,
    tenant: &str,
    users: usize,
    count: usize,
    concurrency: usize,
) -> Vec<Placed> {
    futures_util::stream::iter(0..count)
        .map(|i| async move {
            let (user, amount_cents) = (format!("user-{}", i % users), price(i));
            let key = format!("order-{i}");
            let (status, body) = post_order(base, tenant, &user, &key, amount_cents, &[])
                .await
                .expect("POST /orders");
            assert_eq!(status, 201, "order {i}: {body}");
            Placed {
                order_id: body["order_id"].as_u64().expect("an order id"),
                user,
                amount_cents,
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

async fn wait_for(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every order of `placed` is booked and nothing is left
/// unsent, then checks: one rewards entry per order, none for anything
/// else, the points right, as many orders in the table. The rewards, in
/// booking order.
async fn each_order_booked_once(
    db: &TestDb,
    ledger: &Ledger,
    tenant: &str,
    placed: &[Placed],
) -> Vec<Reward> {
    wait_for(
        "every order booked and the outbox drained",
        Duration::from_secs(60),
        async || {
            let (rewards, _) = ledger.rewards(tenant).await.expect("rewards");
            rewards.len() >= placed.len() && db.unsent().await == 0
        },
    )
    .await;
    let (rewards, balance) = ledger.rewards(tenant).await.expect("rewards");
    let booked: HashSet<u64> = rewards.iter().map(|r| r.order_id).collect();
    assert_eq!(booked.len(), rewards.len(), "no order booked twice");
    let expected: HashSet<u64> = placed.iter().map(|p| p.order_id).collect();
    assert_eq!(booked, expected, "every order booked, nothing else");
    let amounts: BTreeMap<u64, &Placed> = placed.iter().map(|p| (p.order_id, p)).collect();
    for reward in &rewards {
        let order = amounts[&reward.order_id];
        assert_eq!(reward.user, order.user);
        assert_eq!(reward.points, points(order.amount_cents));
    }
    let total: i64 = placed.iter().map(|p| points(p.amount_cents)).sum();
    assert_eq!(balance, total, "the points balances add up");
    assert_eq!(db.orders_of(tenant).await, placed.len() as i64);
    assert_eq!(db.unsent().await, 0, "nothing left unsent");
    rewards
}

/// What the brokers and the inbox absorbed, for the test's output.
async fn report(
    what: &str,
    started: Instant,
    nats: &Nats,
    relays: &[&Spawned],
    consumer: &Spawned,
    orders: usize,
) {
    let stored = nats.stored().await;
    let absorbed: usize = relays.iter().map(|r| r.count(JETSTREAM_DUPLICATE)).sum();
    let retried: usize = relays.iter().map(|r| r.count(PUBLISH_FAILED)).sum();
    assert!(
        stored >= orders as u64,
        "{stored} messages for {orders} orders"
    );
    eprintln!(
        "outbox/{what}: {orders} orders booked once each in {:.1?}; stream stored {stored}; \
         publishes retried {retried}; re-publishes JetStream dropped {absorbed}; \
         deliveries the inbox skipped {}",
        started.elapsed(),
        consumer.count(INBOX_DUPLICATE),
    );
}
