//! kill -9 during a transactional `POST /orders`: the orders process dies
//! while its handler sits between its business writes and its answer. While
//! it lives, a duplicate gets 409. After a restart there is no partial
//! effect (no order, no debit), and a retry with the same key runs at once
//! (the database rolled the claim back with the dead session: no lease to
//! wait out, behind the Redis gate too) and exactly once.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{account, handler_calls, unique};
use idem_test_support::{mysql_url, postgres_url, redis_url, server_missing};

const STARTING_BALANCE: i64 = 100_000;
const PRICE: i64 = 2_500;
const USER: &str = "crash-user";

/// The order every request of a test sends: the crash's key, as its user.
fn order(base: &str, tenant: &str, delay_ms: Option<u64>) -> reqwest::RequestBuilder {
    let request = support::order(base, "crash-key", tenant, USER, PRICE);
    match delay_ms {
        Some(ms) => request.header("x-chaos-delay-ms", ms.to_string()),
        None => request,
    }
}

async fn kill_mid_handler_then_retry_once(database: &str, redis: Option<&str>) {
    let tenant = unique("crash");
    let first = support::start_orders(database, redis);
    let base = first.base.clone();
    let doomed = tokio::spawn({
        let (base, tenant) = (base.clone(), tenant.clone());
        async move { order(&base, &tenant, Some(60_000)).send().await }
    });
    // Inside the handler: it counts itself, then writes, then sleeps.
    let deadline = Instant::now() + Duration::from_secs(30);
    while handler_calls(&base).await == 0.0 {
        assert!(Instant::now() < deadline, "the handler never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let live = order(&base, &tenant, None).send().await.unwrap();
    assert_eq!(live.status(), 409, "a live first request keeps its key");
    first.kill_9();
    assert!(
        doomed.await.unwrap().is_err(),
        "the client saw the connection die"
    );

    let second = support::start_orders(database, redis);
    assert_eq!(
        account(&second.base, &tenant, USER).await,
        (0, STARTING_BALANCE),
        "no partial effect survives the crash"
    );
    let retry = order(&second.base, &tenant, None).send().await.unwrap();
    assert_eq!(retry.status(), 201, "no 409 while no one owns the key");
    assert!(retry.headers().get("idempotent-replayed").is_none());
    let again = order(&second.base, &tenant, None).send().await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(handler_calls(&second.base).await, 1.0);
    assert_eq!(
        account(&second.base, &tenant, USER).await,
        (1, STARTING_BALANCE - PRICE),
        "exactly one effect"
    );
}

async fn reachable(what: &str, url: &str, addr: &str) -> bool {
    match tokio::net::TcpStream::connect(addr).await {
        Ok(_) => true,
        Err(err) => server_missing::<()>(what, url, err).is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_crash_mid_handler_leaves_no_partial_effect() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("idem-crash")));
    kill_mid_handler_then_retry_once(&format!("sqlite://{}", path.display()), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_mid_handler_leaves_no_partial_effect() {
    let url = postgres_url();
    if reachable("PostgreSQL", &url, "127.0.0.1:5432").await {
        kill_mid_handler_then_retry_once(&url, None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_crash_mid_handler_leaves_no_partial_effect() {
    let url = mysql_url();
    if reachable("MySQL/MariaDB", &url, "127.0.0.1:3306").await {
        kill_mid_handler_then_retry_once(&url, None).await;
    }
}

/// Behind the Redis gate, the dead request's in-flight record outlives it
/// in Redis for its whole lease; the retry must not wait that out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_behind_the_redis_gate_frees_the_key_at_once() {
    let (url, redis) = (postgres_url(), redis_url());
    if reachable("PostgreSQL", &url, "127.0.0.1:5432").await
        && reachable("Redis", &redis, "127.0.0.1:6379").await
    {
        kill_mid_handler_then_retry_once(&url, Some(&redis)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_crash_behind_the_redis_gate_frees_the_key_at_once() {
    let (url, redis) = (mysql_url(), redis_url());
    if reachable("MySQL/MariaDB", &url, "127.0.0.1:3306").await
        && reachable("Redis", &redis, "127.0.0.1:6379").await
    {
        kill_mid_handler_then_retry_once(&url, Some(&redis)).await;
    }
}
