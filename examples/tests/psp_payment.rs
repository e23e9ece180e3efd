//! The `psp_payment` example's shop and stand-in provider, both over real
//! HTTP on loopback, the shop in transactional mode on SQLite and on
//! PostgreSQL: whatever fails between the charge and the commit, and
//! whatever the retries, the provider charges once per payment and the
//! shop writes one order, and every answer names that one charge. Effects
//! are counted at both ends: charges at the provider, orders in the
//! database (ARCHITECTURE.md, "Calls out of a handler"). The same shop in
//! phases (`psp/phased.rs`, `phases_*` and `killed_in_phases`), failed or
//! killed after each phase, resumes after the last finished one: one order,
//! one charge, and the provider not asked again once its answer is
//! recorded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use idem_examples::psp::phased;
use idem_examples::psp::provider::Provider;
use idem_examples::psp::shop::{self, Pause, Shop};
use idem_test_support::orders::Spawned;
use idem_test_support::{postgres_url, server_missing, unique};
use idem_tower::client::{IdempotencyClient, IdempotencyClientLayer, RetryPolicy, RetryReport};
use idem_tower::sql::sqlx::{self, PgPool, SqlitePool};
use serde_json::Value;
use tower::{Layer, ServiceExt};

const SECRET: &[u8] = b"psp tests: the shop's key secret";

/// The shop's database.
#[derive(Clone)]
enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Db {
    async fn postgres() -> Option<Self> {
        let url = postgres_url();
        match PgPool::connect(&url).await {
            Ok(pool) => Some(Self::Postgres(pool)),
            Err(err) => server_missing("PostgreSQL", &url, err),
        }
    }

    async fn sqlite() -> Self {
        let path = std::env::temp_dir().join(format!("{}.db", unique("idem-psp")));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        Self::Sqlite(SqlitePool::connect(&url).await.expect("a SQLite file"))
    }

    /// The orders written for `reference`, with their charge.
    async fn orders(&self, reference: &str) -> Vec<String> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT charge_id FROM psp_orders WHERE reference = $1")
                    .bind(reference)
                    .fetch_all(pool)
                    .await
            }
            Self::Sqlite(pool) => {
                sqlx::query_scalar("SELECT charge_id FROM psp_orders WHERE reference = ?")
                    .bind(reference)
                    .fetch_all(pool)
                    .await
            }
        }
        .expect("the orders")
    }

    /// The phased shop's orders for `reference`: state and charge.
    async fn phased_orders(&self, reference: &str) -> Vec<(String, Option<String>)> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT state, charge_id FROM psp_phased_orders WHERE reference = $1",
                )
                .bind(reference)
                .fetch_all(pool)
                .await
            }
            Self::Sqlite(pool) => {
                sqlx::query_as("SELECT state, charge_id FROM psp_phased_orders WHERE reference = ?")
                    .bind(reference)
                    .fetch_all(pool)
                    .await
            }
        }
        .expect("the phased orders")
    }
}

/// The provider and the shop, each on a loopback port.
struct Running {
    provider: Provider,
    shop: Shop,
    shop_addr: SocketAddr,
    db: Db,
}

async fn start(db: Db, attempt_timeout: Duration) -> Running {
    start_with(db, Shop::policy(attempt_timeout)).await
}

async fn start_with(db: Db, policy: RetryPolicy) -> Running {
    start_shop(db, policy, false).await
}

/// The shop, in phases if `in_phases` (`psp/phased.rs`).
async fn start_shop(db: Db, policy: RetryPolicy, in_phases: bool) -> Running {
    let provider = Provider::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider_addr = provider.serve(listener).await.unwrap();
    let shop = Shop::new(&format!("http://{provider_addr}"), policy);
    let router = match (&db, in_phases) {
        (Db::Postgres(pool), false) => shop::postgres(pool.clone(), shop.clone(), SECRET).await,
        (Db::Sqlite(pool), false) => shop::sqlite(pool.clone(), shop.clone(), SECRET).await,
        (Db::Postgres(pool), true) => phased::postgres(pool.clone(), shop.clone(), SECRET).await,
        (Db::Sqlite(pool), true) => phased::sqlite(pool.clone(), shop.clone(), SECRET).await,
    }
    .expect("the shop starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shop_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    Running {
        provider,
        shop,
        shop_addr,
        db,
    }
}

/// The shop's customer: idem's retrying client.
fn customer() -> IdempotencyClient<Client<HttpConnector, Full<Bytes>>> {
    let policy = RetryPolicy::default()
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .deadline(Duration::from_secs(30));
    IdempotencyClientLayer::new(policy).layer(Client::builder(TokioExecutor::new()).build_http())
}

/// Pays `reference` under the customer's `key`: status, body, attempts.
async fn pay(running: &Running, key: &str, reference: &str) -> (StatusCode, Value, RetryReport) {
    let request = http::Request::post(format!("http://{}/payments", running.shop_addr))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(format!(
            r#"{{"amount_cents":1200,"reference":"{reference}"}}"#
        ))))
        .unwrap();
    let response = customer().oneshot(request).await.expect("an answer");
    let status = response.status();
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, body, report)
}

/// Pays once, then sends the payment again as a duplicate: one charge at
/// the provider, one order naming it, the same answer both times.
async fn paid_once(running: &Running, provider_requests: usize, customer_attempts: u32) {
    let (key, reference) = (unique("pay"), unique("order"));
    let (status, body, report) = pay(running, &key, &reference).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(report.attempts, customer_attempts, "{report:?}");
    let charge = body["charge"].as_str().expect("a charge").to_owned();

    assert_eq!(running.provider.charges(), 1, "charged once");
    assert_eq!(running.provider.requests(), provider_requests);
    assert_eq!(running.db.orders(&reference).await, vec![charge.clone()]);

    let (again, replay, report) = pay(running, &key, &reference).await;
    assert_eq!(again, StatusCode::CREATED);
    assert!(report.replayed);
    assert_eq!(replay["charge"], charge);
    assert_eq!(running.provider.charges(), 1);
    assert_eq!(running.db.orders(&reference).await.len(), 1);
}

async fn a_5xx_after_the_charge(db: Db) {
    let running = start(db, Duration::from_secs(5)).await;
    running.provider.fail_after_charge(1);
    // The shop's client retries the 502 with the same key: the provider
    // replays the charge it made.
    paid_once(&running, 2, 1).await;
}

async fn a_5xx_after_the_charge_past_the_shops_retries(db: Db) {
    // The shop's client gives up after two attempts: the shop answers 502,
    // its order rolled back and the key released. The customer's retry
    // runs the handler again, a new run whose charge carries the same
    // derived key: the provider replays the charge it made.
    let policy = Shop::policy(Duration::from_secs(5)).max_attempts(2);
    let running = start_with(db, policy).await;
    running.provider.fail_after_charge(2);
    paid_once(&running, 3, 2).await;
}

async fn a_timeout_after_the_charge(db: Db) {
    let running = start(db, Duration::from_millis(300)).await;
    running
        .provider
        .late_after_charge(1, Duration::from_millis(1500));
    paid_once(&running, 2, 1).await;
}

async fn a_failure_before_the_commit(db: Db) {
    let running = start(db, Duration::from_secs(5)).await;
    running.shop.fail_before_commit(1);
    // The shop's 503 rolls the order back and frees the payment's key; the
    // customer's retry runs the handler again, which charges under the
    // same derived key: the provider replays.
    paid_once(&running, 2, 2).await;
}

async fn concurrent_payments(db: Db) {
    let running = Arc::new(start(db, Duration::from_millis(300)).await);
    running.provider.fail_after_charge(3);
    running
        .provider
        .late_after_charge(3, Duration::from_millis(1000));
    let payments: Vec<_> = (0..8)
        .map(|_| {
            let running = Arc::clone(&running);
            tokio::spawn(async move {
                let (key, reference) = (unique("pay"), unique("order"));
                let (status, body, _) = pay(&running, &key, &reference).await;
                assert_eq!(status, StatusCode::CREATED, "{body}");
                let charge = body["charge"].as_str().unwrap().to_owned();
                assert_eq!(running.db.orders(&reference).await, vec![charge.clone()]);
                charge
            })
        })
        .collect();
    let mut charges = Vec::new();
    for payment in payments {
        charges.push(payment.await.expect("no payment panics"));
    }
    charges.sort();
    charges.dedup();
    assert_eq!(charges.len(), 8, "one charge per payment, each its own");
    assert_eq!(running.provider.charges(), 8);
    assert!(running.provider.requests() > 8, "the faults made retries");
}

/// The phased shop pays once, failing first where `fail` breaks it, then
/// the payment is sent again as a duplicate: one charge, `provider_requests`
/// requests to the provider, one order, paid with that charge, the same
/// answer both times.
async fn phases_paid_once(
    db: Db,
    policy: RetryPolicy,
    fail: impl FnOnce(&Running),
    provider_requests: usize,
    customer_attempts: u32,
) {
    let running = start_shop(db, policy, true).await;
    fail(&running);
    let (key, reference) = (unique("pay"), unique("order"));
    let (status, body, report) = pay(&running, &key, &reference).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(report.attempts, customer_attempts, "{report:?}");
    let charge = body["charge"].as_str().expect("a charge").to_owned();
    assert_eq!(running.provider.charges(), 1, "charged once");
    assert_eq!(running.provider.requests(), provider_requests);
    let paid = vec![("paid".to_owned(), Some(charge.clone()))];
    assert_eq!(
        running.db.phased_orders(&reference).await,
        paid,
        "one order"
    );

    let (again, replay, report) = pay(&running, &key, &reference).await;
    assert_eq!(again, StatusCode::CREATED);
    assert!(report.replayed);
    assert_eq!(replay["charge"], charge);
    assert_eq!(running.provider.requests(), provider_requests);
    assert_eq!(running.db.phased_orders(&reference).await, paid);
}

async fn phases_a_failure_after_the_order(db: Db) {
    // The retry finds the order made, and makes no other.
    let policy = Shop::policy(Duration::from_secs(5));
    phases_paid_once(db, policy, |r| r.shop.fail_after_phase(1), 1, 2).await;
}

async fn phases_a_failure_after_the_charge(db: Db) {
    // The charge's answer is recorded: the retry does not call the
    // provider again (without phases it would, and be replayed).
    let policy = Shop::policy(Duration::from_secs(5));
    phases_paid_once(db, policy, |r| r.shop.fail_after_phase(2), 1, 2).await;
}

async fn phases_a_failure_before_marking_paid_commits(db: Db) {
    // The last phase's update rolls back with its point; the retry runs
    // that phase alone, with the order and the charge of the first run.
    let policy = Shop::policy(Duration::from_secs(5));
    phases_paid_once(db, policy, |r| r.shop.fail_before_commit(1), 1, 2).await;
}

async fn phases_a_failure_after_the_last_phase(db: Db) {
    let policy = Shop::policy(Duration::from_secs(5));
    phases_paid_once(db, policy, |r| r.shop.fail_after_phase(3), 1, 2).await;
}

async fn phases_a_5xx_after_the_charge_past_the_shops_retries(db: Db) {
    // The call phase fails (two 502s): nothing recorded for it, the key
    // released. The retry calls again under the same derived key, and the
    // provider replays the charge it made.
    let policy = Shop::policy(Duration::from_secs(5)).max_attempts(2);
    let fail = |r: &Running| r.provider.fail_after_charge(2);
    phases_paid_once(db, policy, fail, 3, 2).await;
}

macro_rules! on_both_databases {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(super::Db::sqlite().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(db) = super::Db::postgres().await else { return };
                    super::$case(db).await;
                }
            )*
        }
    };
}

on_both_databases!(
    a_5xx_after_the_charge,
    a_5xx_after_the_charge_past_the_shops_retries,
    a_timeout_after_the_charge,
    a_failure_before_the_commit,
    concurrent_payments,
    phases_a_failure_after_the_order,
    phases_a_failure_after_the_charge,
    phases_a_failure_before_marking_paid_commits,
    phases_a_failure_after_the_last_phase,
    phases_a_5xx_after_the_charge_past_the_shops_retries,
);

/// The shop as a process of its own (`psp_shop`), on `database`, pausing
/// every payment at `pause` if given.
fn shop_process(provider: SocketAddr, database: &str, pause: Option<Pause>) -> (Spawned, String) {
    shop_process_in(provider, database, pause, false)
}

/// [`shop_process`], in phases if `in_phases`.
fn shop_process_in(
    provider: SocketAddr,
    database: &str,
    pause: Option<Pause>,
    in_phases: bool,
) -> (Spawned, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_psp_shop"));
    command
        .env("PSP_SHOP_SECRET", std::str::from_utf8(SECRET).unwrap())
        .args(["--provider", &format!("http://{provider}")])
        .args(["--database", database])
        .args(["--phased", if in_phases { "true" } else { "false" }]);
    if let Some(pause) = pause {
        let flag = match pause {
            Pause::BeforeCharge => "--pause-before-charge-ms",
            Pause::BeforeCommit => "--pause-before-commit-ms",
            Pause::AfterCommit => "--pause-after-commit-ms",
        };
        command.args([flag, "60000"]);
    }
    let spawned = Spawned::start(command, "listening on");
    let addr = spawned.said("listening on ").expect("an address");
    (spawned, addr)
}

/// The shop killed (`kill -9`) with a payment paused at `at`; then a new
/// shop process on the same database and the customer's retry with the
/// same key. Before the charge: nothing was charged or written, the retry
/// charges. Between the charge and the commit: the order rolled back, and
/// the retry's charge carries the same derived key, which the provider
/// replays. After the commit: the retry is replayed the committed answer.
/// Always one charge, one order naming it.
async fn killed(db: Db, database: &str, at: Pause) {
    let provider = Provider::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider_addr = provider.serve(listener).await.unwrap();
    let (key, reference) = (unique("pay"), unique("order"));
    let body = format!(r#"{{"amount_cents":1200,"reference":"{reference}"}}"#);
    let request = |addr: &str| {
        http::Request::post(format!("http://{addr}/payments"))
            .header("content-type", "application/json")
            .header("idempotency-key", &key)
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap()
    };

    let (mut first, addr) = shop_process(provider_addr, database, Some(at));
    // One attempt, no retry: the process it reaches dies under it.
    let once = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let cut = tokio::spawn(once.request(request(&addr)));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while first.count(&format!("{}: ", at.as_str())) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the shop never paused"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill_9();
    assert!(
        cut.await.unwrap().is_err(),
        "the shop died before answering"
    );
    let (charged, committed) = match at {
        Pause::BeforeCharge => (0, 0),
        Pause::BeforeCommit => (1, 0),
        Pause::AfterCommit => (1, 1),
    };
    assert_eq!(provider.charges(), charged);
    assert_eq!(db.orders(&reference).await.len(), committed);

    let (_second, addr) = shop_process(provider_addr, database, None);
    let response = customer().oneshot(request(&addr)).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::CREATED);
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    assert_eq!(report.replayed, at == Pause::AfterCommit, "{report:?}");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    let charge = body["charge"].as_str().expect("a charge");
    assert_eq!(provider.charges(), 1, "charged once");
    let provider_requests = if at == Pause::BeforeCommit { 2 } else { 1 };
    assert_eq!(provider.requests(), provider_requests);
    assert_eq!(db.orders(&reference).await, vec![charge.to_owned()]);
}

/// The phased shop killed (`kill -9`) in its last phase, the order marked
/// paid and not committed; then a phased shop process on the same
/// database and the customer's retry. The order was made and the charge's
/// answer recorded before the kill: the retry resumes with both, and the
/// provider is called once in all (the shop without phases calls it again,
/// and is replayed).
async fn killed_in_phases(db: Db, database: &str) {
    let provider = Provider::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider_addr = provider.serve(listener).await.unwrap();
    let (key, reference) = (unique("pay"), unique("order"));
    let body = format!(r#"{{"amount_cents":1200,"reference":"{reference}"}}"#);
    let request = |addr: &str| {
        http::Request::post(format!("http://{addr}/payments"))
            .header("content-type", "application/json")
            .header("idempotency-key", &key)
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap()
    };

    let at = Pause::BeforeCommit;
    let (mut first, addr) = shop_process_in(provider_addr, database, Some(at), true);
    let once = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let cut = tokio::spawn(once.request(request(&addr)));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while first.count(&format!("{}: ", at.as_str())) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the shop never paused"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill_9();
    assert!(
        cut.await.unwrap().is_err(),
        "the shop died before answering"
    );
    assert_eq!(provider.charges(), 1);
    let pending = vec![("pending".to_owned(), None)];
    assert_eq!(
        db.phased_orders(&reference).await,
        pending,
        "made, not paid"
    );

    let (_second, addr) = shop_process_in(provider_addr, database, None, true);
    // In plain mode the dead process's claim lives until its lease ends
    // (2 s without renewal, `psp/phased.rs`); until then a retry is 409.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let response = customer().oneshot(request(&addr)).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    let charge = body["charge"].as_str().expect("a charge").to_owned();
    assert_eq!(provider.charges(), 1, "charged once");
    assert_eq!(
        provider.requests(),
        1,
        "the recorded charge was not asked again"
    );
    let paid = vec![("paid".to_owned(), Some(charge))];
    assert_eq!(db.phased_orders(&reference).await, paid);
}

mod killed_in_phases {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        let path = std::env::temp_dir().join(format!("{}.db", unique("idem-psp-phases")));
        let database = format!("sqlite://{}", path.display());
        // A first process makes the tables.
        let (_made, _) = shop_process_in(free_provider(), &database, None, true);
        let db = Db::Sqlite(SqlitePool::connect(&database).await.expect("the file"));
        killed_in_phases(db, &database).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        let Some(db) = Db::postgres().await else {
            return;
        };
        // A first process makes the table before the test reads it.
        let (_made, _) = shop_process_in(free_provider(), &postgres_url(), None, true);
        killed_in_phases(db, &postgres_url()).await;
    }
}

/// A SQLite file the shop processes share, made (with its tables) by a
/// first shop process, and the test's own pool on it.
async fn sqlite_file() -> (Db, String, Spawned) {
    let path = std::env::temp_dir().join(format!("{}.db", unique("idem-psp-kill")));
    let database = format!("sqlite://{}", path.display());
    let (made, _) = shop_process(free_provider(), &database, None);
    let db = Db::Sqlite(SqlitePool::connect(&database).await.expect("the file"));
    (db, database, made)
}

macro_rules! killed_on_both_databases {
    ($($name:ident: $at:expr),* $(,)?) => {
        mod killed {
            use super::*;
            $(
                mod $name {
                    use super::*;

                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn sqlite() {
                        let (db, database, _made) = sqlite_file().await;
                        killed(db, &database, $at).await;
                    }

                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn postgres() {
                        let Some(db) = Db::postgres().await else { return };
                        killed(db, &postgres_url(), $at).await;
                    }
                }
            )*
        }
    };
}

killed_on_both_databases!(
    before_the_charge: Pause::BeforeCharge,
    between_the_charge_and_the_commit: Pause::BeforeCommit,
    after_the_commit_before_the_answer: Pause::AfterCommit,
);

/// An address no provider listens on, for a shop that will charge nothing.
fn free_provider() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}
