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

// ------------------------------------------------------------------ tests

/// One committed order; one failing after its writes; one killed with the
/// orders process mid-transaction; one more committed after the restart.
async fn a_rolled_back_order_publishes_nothing(backend: Backend) {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("rollback");
    let first = support::start_orders(&db.url, None);
    let relay = relay(&db, &nats, "relay-a", &[]);
    let consumer = consumer(&db, &nats, 1);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");
    let place = async |base: &str, key: &str, headers: &[(&str, &str)]| {
        post_order(base, &tenant, "user-1", key, 1_500, headers).await
    };

    let (status, body) = place(&first.base, "committed-1", &[]).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let committed_1 = body["order_id"].as_u64().unwrap();

    let fail = [("x-chaos-fail-after-write", "500")];
    let (status, _) = place(&first.base, "rolled-back", &fail).await.unwrap();
    assert_eq!(status, 500, "the handler failed after its writes");

    let doomed = tokio::spawn({
        let (base, tenant) = (first.base.clone(), tenant.clone());
        async move {
            let delay = [("x-chaos-delay-ms", "60000")];
            post_order(&base, &tenant, "user-1", "killed", 1_500, &delay).await
        }
    });
    // Inside the third handler: it counts itself, writes, then sleeps.
    wait_for("the third handler", Duration::from_secs(30), async || {
        handler_calls(&first.base).await >= 3.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.kill_9();
    assert!(doomed.await.unwrap().is_err(), "the client saw it die");

    let second = support::start_orders(&db.url, None);
    let (status, body) = place(&second.base, "committed-2", &[]).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let committed_2 = body["order_id"].as_u64().unwrap();

    let placed: Vec<Placed> = [committed_1, committed_2]
        .into_iter()
        .map(|order_id| Placed {
            order_id,
            user: "user-1".to_owned(),
            amount_cents: 1_500,
        })
        .collect();
    each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    assert_eq!(
        db.outbox_rows().await,
        2,
        "an outbox row per committed order only"
    );
    assert_eq!(db.sent().await, 2);
    assert_eq!(nats.stored().await, 2, "nothing else on the stream");
    report(
        &format!("rollback-{backend:?}"),
        started,
        &nats,
        &[&relay],
        &consumer,
        2,
    )
    .await;
    drop((second, relay, consumer, ledger));
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_rolled_back_order_publishes_nothing() {
    a_rolled_back_order_publishes_nothing(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_rolled_back_order_publishes_nothing() {
    a_rolled_back_order_publishes_nothing(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_rolled_back_order_publishes_nothing() {
    a_rolled_back_order_publishes_nothing(Backend::Sqlite).await;
}

const ORDERS: usize = 150;

/// A relay that sleeps 5 ms before each publish and 15 ms after JetStream
/// acknowledged it (before it marks the event sent), killed with SIGKILL
/// while it holds a batch; a second relay takes over once the lease runs
/// out, and publishes again whatever the first had published but not
/// marked: JetStream drops those re-publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_relay_killed_mid_batch_loses_nothing() {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("relay-kill");
    let orders = support::start_orders(&db.url, None);
    let slow = [
        "--batch",
        "50",
        "--chaos-publish-delay-ms",
        "5",
        "--chaos-acked-delay-ms",
        "15",
    ];
    let mut doomed = relay(&db, &nats, "relay-doomed", &slow);
    let consumer = consumer(&db, &nats, 4);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");

    let placing = tokio::spawn({
        let (base, tenant) = (orders.base.clone(), tenant.clone());
        async move { place_concurrently(&base, &tenant, 10, ORDERS, 16).await }
    });
    wait_for("the first publishes", Duration::from_secs(30), async || {
        db.sent().await >= 20
    })
    .await;
    // Aim the kill between an acknowledgement and the mark (15 ms of every
    // 20 or so); whenever it lands, the counts below are read after it.
    let js = nats.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while stored(&js).await <= db.sent().await as u64 && Instant::now() < deadline {}
    doomed.kill_9();
    let leased = db.leased().await;
    assert!(leased > 0, "killed holding a batch");
    // What the dead relay wrote before it died may still be arriving (a
    // publish or a mark in a socket's buffer): read the counts once they
    // have held still for a while.
    let mut counts = (db.sent().await, stored(&js).await);
    let mut still_since = Instant::now();
    while still_since.elapsed() < Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = (db.sent().await, stored(&js).await);
        if now != counts {
            (counts, still_since) = (now, Instant::now());
        }
    }
    let (sent_at_kill, stored_at_kill) = counts;
    // Published (stored by JetStream) but not marked sent: 0 or 1.
    let stored_unmarked = stored_at_kill - sent_at_kill as u64;
    let takeover = relay(&db, &nats, "relay-takeover", &[]);
    let placed = placing.await.expect("placing");

    each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    // Dropped by JetStream: what the dead relay had published but not
    // marked, and a publish of the takeover's own that JetStream stored but
    // acknowledged too late (put back, published again).
    let dropped = takeover.count(JETSTREAM_DUPLICATE) as u64;
    let own_retries = takeover.count(PUBLISH_FAILED) as u64;
    assert!(
        (stored_unmarked..=stored_unmarked + own_retries).contains(&dropped),
        "what the dead relay had published but not marked ({stored_unmarked}) was published \
         again, and dropped: {dropped} dropped, {own_retries} of the takeover's publishes retried"
    );
    eprintln!(
        "outbox/relay-kill: killed holding {leased} events, {sent_at_kill} sent, \
         {stored_unmarked} published but not marked"
    );
    report(
        "relay-kill",
        started,
        &nats,
        &[&doomed, &takeover],
        &consumer,
        ORDERS,
    )
    .await;
    drop((orders, doomed, takeover, consumer, ledger));
    db.drop_database().await;
}

/// The NATS server killed with SIGKILL mid-run and started again a second
/// later on the same port and store, while orders keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_nats_restart_mid_run_loses_nothing() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("nats-restart");
    let orders = support::start_orders(&db.url, None);
    let paced = ["--batch", "20", "--chaos-publish-delay-ms", "10"];
    let relay = relay(&db, &nats, "relay-a", &paced);
    let consumer = consumer(&db, &nats, 4);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");

    let placing = tokio::spawn({
        let (base, tenant) = (orders.base.clone(), tenant.clone());
        async move { place_concurrently(&base, &tenant, 10, ORDERS, 8).await }
    });
    wait_for("the first publishes", Duration::from_secs(30), async || {
        db.sent().await >= 30
    })
    .await;
    let sent_at_kill = db.sent().await;
    nats.kill_9_and_restart(Duration::from_secs(1)).await;
    let placed = placing.await.expect("placing");

    each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    assert!(
        relay.count(PUBLISH_FAILED) > 0,
        "the relay saw the server gone"
    );
    eprintln!("outbox/nats-restart: killed the server with {sent_at_kill} events sent");
    report("nats-restart", started, &nats, &[&relay], &consumer, ORDERS).await;
    drop((orders, relay, consumer, ledger));
    db.drop_database().await;
}

/// Two relays on one outbox, small batches: each event published by one of
/// them (their `idem_outbox_published_total` add up to the orders), each
/// order booked once. Also the relay's `GET /metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_racing_relays_publish_each_event_once_and_serve_metrics() {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("two-relays");
    let orders = support::start_orders(&db.url, None);
    let racing = [
        "--batch",
        "10",
        "--chaos-publish-delay-ms",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let relays = [
        relay(&db, &nats, "relay-a", &racing),
        relay(&db, &nats, "relay-b", &racing),
    ];
    let consumer = consumer(&db, &nats, 4);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");
    let count = 200;

    let placed = place_concurrently(&orders.base, &tenant, 20, count, 16).await;
    each_order_booked_once(&db, &ledger, &tenant, &placed).await;

    let topic = [("topic", "orders.created")];
    let mut published = Vec::new();
    for relay in &relays {
        let base = relay
            .said("relay metrics on ")
            .expect("its metrics address");
        let text = scrape(&base).await;
        published.push(metric(&text, "idem_outbox_published_total", &topic).expect("published"));
        assert!(
            metric(&text, "idem_outbox_retried_total", &topic).is_some(),
            "{text}"
        );
        assert!(
            metric(&text, "idem_outbox_purged_total", &[]).is_some(),
            "{text}"
        );
        let lag = metric(&text, "idem_outbox_lag_seconds", &[]).expect("the lag gauge");
        assert!((0.0..60.0).contains(&lag), "{text}");
        assert!(
            text.contains("# TYPE idem_outbox_lag_seconds gauge"),
            "{text}"
        );
    }
    assert_eq!(
        published.iter().sum::<f64>(),
        count as f64,
        "each event marked sent by one relay: {published:?}"
    );
    assert!(
        published.iter().all(|&p| p > 0.0),
        "both relays published: {published:?}"
    );
    eprintln!("outbox/two-relays: published {published:?}");
    report(
        "two-relays",
        started,
        &nats,
        &[&relays[0], &relays[1]],
        &consumer,
        count,
    )
    .await;
    drop((orders, relays, consumer, ledger));
    db.drop_database().await;
}

/// Each user's orders placed one after another (users side by side), two
/// relays with small batches, one consumer handling one message at a time:
/// each user's rewards are booked in `order_id` order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_one_users_events_are_consumed_in_order() {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("in-order");
    let orders = support::start_orders(&db.url, None);
    let relays = [
        relay(
            &db,
            &nats,
            "relay-a",
            &["--batch", "7", "--chaos-publish-delay-ms", "3"],
        ),
        relay(&db, &nats, "relay-b", &["--batch", "5"]),
    ];
    let consumer = consumer(&db, &nats, 1);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");
    let (users, each) = (4, 25);

    let placed: Vec<Placed> = futures_util::future::join_all((0..users).map(|u| {
        let (base, tenant) = (&orders.base, &tenant);
        async move {
            let user = format!("user-{u}");
            let mut placed = Vec::new();
            for i in 0..each {
                let amount_cents = price(i);
                let key = format!("order-{u}-{i}");
                let (status, body) = post_order(base, tenant, &user, &key, amount_cents, &[])
                    .await
                    .expect("POST /orders");
                assert_eq!(status, 201, "{body}");
                let order_id = body["order_id"].as_u64().unwrap();
                placed.push(Placed {
                    order_id,
                    user: user.clone(),
                    amount_cents,
                });
            }
            placed
        }
    }))
    .await
    .into_iter()
    .flatten()
    .collect();

    let rewards = each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    for u in 0..users {
        let user = format!("user-{u}");
        let booked: Vec<u64> = rewards
            .iter()
            .filter(|r| r.user == user)
            .map(|r| r.order_id)
            .collect();
        assert_eq!(booked.len(), each);
        assert!(
            booked.windows(2).all(|w| w[0] < w[1]),
            "{user}'s orders booked in order: {booked:?}"
        );
    }
    report(
        "in-order",
        started,
        &nats,
        &[&relays[0], &relays[1]],
        &consumer,
        users * each,
    )
    .await;
    drop((orders, relays, consumer, ledger));
    db.drop_database().await;
}
