//! Round trips and Redis commands.
//!
//! Through the orders app with PostgreSQL behind a Redis gate
//! (transactional mode): a duplicate of a completed request costs one
//! Redis command and no SQL at all; a first request costs at most two Redis
//! commands and exactly one database commit. Redis commands are what clients
//! send to a Redis of the test's own (`MONITOR`); SQL is `pg_stat_database`
//! of a database of its own.
//!
//! On PgStore alone, a transactional first request costs one round trip
//! to PostgreSQL more than the same handler without idem, counted on the
//! wire (`idem_test_support::round_trips`): the claim's BEGIN, lock and
//! read go in one, where the handler alone sends BEGIN, the record goes
//! with COMMIT, and the one more lends the transaction to the handler, so
//! that sqlx counts it open and a nested `begin()` is a savepoint
//! (idem-sql's `claim_tx.rs`). On MySqlStore the same, its long statements
//! prepared once per connection, not per request, and one ROLLBACK of
//! nothing after the response, when the connection goes back to the pool:
//! sqlx's count of the transaction set back.

use idem_app::orders::App;
use idem_tests::Harness;
use idem_tests::pg_stats::PgStats;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use idem_test_support::redis::RedisServer;
use idem_test_support::round_trips::RoundTrips;
use idem_tower::sql::sqlx::mysql::MySqlPoolOptions;
use idem_tower::sql::sqlx::postgres::PgPoolOptions;
use idem_tower::sql::sqlx::{self, MySql, MySqlPool, PgPool, Postgres};
use idem_tower::{Idempotency, MySqlStore, PgStore, Tx, idempotent};

/// What clients send to a Redis, seen through `MONITOR` (which marks the
/// commands a Lua script runs inside Redis as `lua`: those are not round
/// trips and are left out).
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(port: u16) -> Self {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli monitor");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let (ready, started) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if line == "OK" {
                        let _ = ready.send(());
                    } else {
                        lines.lock().unwrap().push(line);
                    }
                }
            });
        }
        started
            .recv_timeout(Duration::from_secs(10))
            .expect("MONITOR started");
        Self { child, lines }
    }

    /// The command names clients sent, once the stream has caught up.
    fn stop(mut self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(300));
        let _ = self.child.kill();
        let _ = self.child.wait();
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter(|line| !line.contains(" lua] "))
            .filter_map(|line| line.split("] ").nth(1)?.split(' ').next())
            .map(|name| name.trim_matches('"').to_uppercase())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_costs_one_redis_command_and_no_sql() {
    let Some(stats) = PgStats::for_database("idem_round_trips").await else {
        return;
    };
    let Some(redis_server) = RedisServer::start(&[]) else {
        return;
    };
    let app = App::connect_tiered(&stats.url(), Some(&redis_server.url()), false, |b| b)
        .await
        .expect("the orders app behind a Redis gate");
    let h = Harness::serve(app).await;

    // Warm up: scripts loaded, statements prepared, connections open.
    let warm = h.send(h.order("trips", "u", "warm-up", 10)).await;
    assert_eq!(warm.status, 201);

    let before = stats.settled().await;
    let monitor = Monitor::start(redis_server.port());
    let first = h.send(h.order("trips", "u", "measured", 10)).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let first_redis = monitor.stop();
    let after_first = stats.settled().await;

    let monitor = Monitor::start(redis_server.port());
    let duplicate = h.send(h.order("trips", "u", "measured", 10)).await;
    assert!(duplicate.replayed());
    let duplicate_redis = monitor.stop();
    let after_duplicate = stats.settled().await;

    eprintln!(
        "first request: Redis {first_redis:?}, commits {}; duplicate: Redis {duplicate_redis:?}, \
         commits {}, rollbacks {}",
        after_first.commits - before.commits,
        after_duplicate.commits - after_first.commits,
        after_duplicate.rollbacks - after_first.rollbacks,
    );
    assert!(first_redis.len() <= 2, "first request: {first_redis:?}");
    assert_eq!(
        after_first.commits - before.commits,
        1,
        "first request: one commit"
    );
    assert_eq!(duplicate_redis, ["SET"], "duplicate: one SET ... NX GET");
    assert_eq!(
        after_duplicate, after_first,
        "a duplicate touches no SQL at all"
    );
    assert_eq!(h.app.calls.orders(), 2);
}

/// The orders of the round-trip test.
const INSERT: &str = "INSERT INTO idem_round_trip_orders (note) VALUES ($1)";

#[idempotent(key = "trips:{header:idempotency-key}", transactional)]
async fn order_with_idem(mut tx: Tx<Postgres>, note: String) -> StatusCode {
    match sqlx::query(INSERT).bind(note).execute(&mut *tx).await {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The same handler without idem: its own transaction, one insert, commit.
async fn order_bare(pool: PgPool, note: String) -> StatusCode {
    let placed = async {
        let mut tx = pool.begin().await?;
        sqlx::query(INSERT).bind(note).execute(&mut *tx).await?;
        tx.commit().await
    };
    match placed.await {
        Ok(()) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_first_request_costs_one_round_trip_more_than_the_handler_alone() {
    let Some(url) = idem_tests::Backend::Postgres.database_url().await else {
        return;
    };
    let trips = RoundTrips::proxy(&url).await;
    // One connection, warmed up below: its statements prepared, both
    // sqlx's and the store's scripts' (prepared once per connection). With
    // more, the pool may hand the measured request one that never served
    // the route, and the count would include its preparing.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&trips.url(&url))
        .await
        .expect("PostgreSQL through the proxy");
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idem_round_trip_orders (id BIGSERIAL PRIMARY KEY, note TEXT)",
    )
    .execute(&pool)
    .await
    .expect("the orders table");
    let store = PgStore::builder(pool.clone())
        .table("idem_round_trip_records")
        .build()
        .expect("a store");
    store.migrate().await.expect("migrated");
    let bare_pool = pool.clone();
    let app = Router::new()
        .route("/idem", post(order_with_idem))
        .route(
            "/bare",
            post(move |note: String| order_bare(bare_pool.clone(), note)),
        )
        .with_state(Idempotency::new(store));
    let orders = Orders::serve(app).await;
    let nonce = idem_tests::nonce();
    let send = |path: &'static str, key: String| orders.send(path, key);
    let rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idem_round_trip_orders")
            .fetch_one(&pool)
            .await
            .expect("a count")
    };
    orders.warm_up(&nonce).await;

    let before = trips.settled().await;
    assert_eq!(send("/bare", format!("{nonce}-bare")).await, (201, false));
    let bare = trips.settled().await - before;

    let rows_before = rows().await;
    let before = trips.settled().await;
    assert_eq!(send("/idem", format!("{nonce}-first")).await, (201, false));
    let first = trips.settled().await - before;

    let before = trips.settled().await;
    assert_eq!(send("/idem", format!("{nonce}-first")).await, (201, true));
    let duplicate = trips.settled().await - before;
    assert_eq!(rows().await - rows_before, 1, "one order for the key");

    eprintln!(
        "round trips to PostgreSQL: bare {bare}, first request {first}, duplicate {duplicate}"
    );
    assert_eq!(
        first,
        bare + 1,
        "a first request: the bare endpoint's round trips, BEGIN in the claim's and \
         the record in COMMIT's, and the transaction lent to the handler"
    );
}

/// The orders of the MySQL round-trip test.
const MYSQL_INSERT: &str = "INSERT INTO idem_round_trip_orders (note) VALUES (?)";

#[idempotent(key = "trips:{header:idempotency-key}", transactional)]
async fn mysql_order_with_idem(mut tx: Tx<MySql>, note: String) -> StatusCode {
    match sqlx::query(MYSQL_INSERT).bind(note).execute(&mut *tx).await {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The same handler without idem, on MySQL.
async fn mysql_order_bare(pool: MySqlPool, note: String) -> StatusCode {
    let placed = async {
        let mut tx = pool.begin().await?;
        sqlx::query(MYSQL_INSERT)
            .bind(note)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    };
    match placed.await {
        Ok(()) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Whether a round trip's first send is MySQL's text query `ROLLBACK`
/// (a packet header of four bytes, then `COM_QUERY`, 3, and the text).
fn is_rollback(send: &[u8]) -> bool {
    send.get(4) == Some(&3)
        && send
            .get(5..)
            .is_some_and(|text| text.starts_with(b"ROLLBACK"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_transactional_first_request_costs_one_round_trip_more_than_the_handler_alone() {
    let Some(url) = idem_tests::Backend::MySql.database_url().await else {
        return;
    };
    let trips = RoundTrips::proxy(&url).await;
    // One connection, warmed up below, as in the PostgreSQL test.
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&trips.url(&url))
        .await
        .expect("MySQL through the proxy");
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idem_round_trip_orders \
         (id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT)",
    )
    .execute(&pool)
    .await
    .expect("the orders table");
    let store = MySqlStore::builder(pool.clone())
        .table("idem_round_trip_records")
        .build()
        .expect("a store");
    store.migrate().await.expect("migrated");
    let bare_pool = pool.clone();
    let app = Router::new()
        .route("/idem", post(mysql_order_with_idem))
        .route(
            "/bare",
            post(move |note: String| mysql_order_bare(bare_pool.clone(), note)),
        )
        .with_state(Idempotency::new(store));
    let orders = Orders::serve(app).await;
    let nonce = idem_tests::nonce();
    let send = |path: &'static str, key: String| orders.send(path, key);
    let rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idem_round_trip_orders")
            .fetch_one(&pool)
            .await
            .expect("a count")
    };
    orders.warm_up(&nonce).await;
    let sql_before = prepared_sql(&pool).await;

    let before = trips.settled().await;
    assert_eq!(send("/bare", format!("{nonce}-bare")).await, (201, false));
    let bare = trips.settled().await - before;

    let rows_before = rows().await;
    let before = trips.settled().await;
    let sent_before = trips.sends().len();
    assert_eq!(send("/idem", format!("{nonce}-first")).await, (201, false));
    let first = trips.settled().await - before;
    let rollbacks = trips.sends()[sent_before..]
        .iter()
        .filter(|send| is_rollback(send))
        .count();

    let before = trips.settled().await;
    let sent_before = trips.sends().len();
    assert_eq!(send("/idem", format!("{nonce}-first")).await, (201, true));
    let duplicate = trips.settled().await - before;
    // A duplicate's claim is never lent to a handler: its ROLLBACK goes
    // alone, without setting the session back (`mysql.rs`, `end_transaction`).
    let session_set_back = trips.sends()[sent_before..]
        .iter()
        .filter(|send| send.windows(10).any(|w| w == b"autocommit"))
        .count();
    assert_eq!(rows().await - rows_before, 1, "one order for the key");
    let (prepared, executed) = prepared_sql(&pool).await;
    let (prepared, executed) = (prepared - sql_before.0, executed - sql_before.1);

    eprintln!(
        "round trips to MySQL: bare {bare}, first request {first} \
         ({rollbacks} of them a ROLLBACK), duplicate {duplicate}; \
         statements prepared {prepared}, executed {executed}"
    );
    // The claim's statements were prepared on the connection by the
    // warm-up, and are only executed since (`mysql/script.rs`): on MySQL
    // the upsert, its read and the completion for the first request, the
    // upsert and the read for the duplicate; on MariaDB from 10.5 the
    // upsert that answers the row, and the completion.
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await
        .expect("the server's version");
    let expected = if returns_rows(&version) { 3 } else { 5 };
    assert_eq!(prepared, 0, "no statement prepared again per request");
    assert_eq!(executed, expected, "the claim's statements, executed");
    // BEGIN, the claim's row, the session's lock wait and the read back go
    // in one round trip, the transaction is lent to the handler in another,
    // the completion with COMMIT in a third, which ends the claim's own
    // transaction; sqlx's count of it is set back by a ROLLBACK queued to
    // go with the pool's check of the connection, after the response.
    assert_eq!(
        rollbacks, 1,
        "one ROLLBACK of nothing, as the connection is released"
    );
    assert_eq!(session_set_back, 0, "a duplicate set its session back");
    assert_eq!(
        first,
        bare + 2,
        "a first request: the bare endpoint's round trips, BEGIN in the claim's and \
         the completion in COMMIT's, the transaction lent to the handler, and the \
         ROLLBACK as the connection is released"
    );
}

/// The statements the one connection of `pool` has prepared and executed
/// with SQL's `PREPARE` and `EXECUTE` so far (its session's
/// `Com_prepare_sql`, `Com_execute_sql`).
async fn prepared_sql(pool: &MySqlPool) -> (u64, u64) {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW SESSION STATUS WHERE Variable_name IN ('Com_prepare_sql', 'Com_execute_sql')",
    )
    .fetch_all(pool)
    .await
    .expect("the session's status");
    let count = |name: &str| {
        rows.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.parse().ok())
            .expect("a count")
    };
    (count("Com_prepare_sql"), count("Com_execute_sql"))
}

/// Whether a server of `version` (its `VERSION()`) is a MariaDB from
/// 10.5, whose upsert answers the row it leaves (`INSERT ... RETURNING`).
fn returns_rows(version: &str) -> bool {
    let Some(at) = version.find("-MariaDB") else {
        return false;
    };
    let mut numbers = version[..at].split('.').map(|n| n.parse::<u32>().ok());
    matches!(
        (numbers.next().flatten(), numbers.next().flatten()),
        (Some(major), Some(minor)) if (major, minor) >= (10, 5)
    )
}

/// The round-trip tests' app served on loopback, and its client.
struct Orders {
    client: reqwest::Client,
    base: String,
}

impl Orders {
    /// Serves `app` on an ephemeral loopback port.
    async fn serve(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            client: reqwest::Client::new(),
            base,
        }
    }

    /// `POST path` with `key`: the status, and whether it was a replay.
    async fn send(&self, path: &'static str, key: String) -> (u16, bool) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", key)
            .body("an order")
            .send()
            .await
            .expect("an answer");
        let replayed = response.headers().contains_key("idempotent-replayed");
        (response.status().as_u16(), replayed)
    }

    /// Statements prepared and connections open, on both routes.
    async fn warm_up(&self, nonce: &str) {
        for n in 0..3 {
            assert_eq!(self.send("/bare", format!("{nonce}-w{n}")).await.0, 201);
            assert_eq!(self.send("/idem", format!("{nonce}-w{n}")).await.0, 201);
        }
    }
}
