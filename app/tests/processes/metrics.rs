//! The `orders` binary, run as a process, serves idem's metrics at
//! `GET /metrics`: requests by outcome and matched route, the claim latency
//! histogram, the keys duplicates hit most, the expired records its purge
//! deleted and, behind a Redis gate, the tiered store's counters. Nothing
//! is installed by hand here: what is scraped is what the binary set up.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{account, metric, samples, scrape, unique};
use idem_test_support::{redis_url, server_missing};
use idem_tower::SqliteStore;
use idem_tower::core::conformance::{acquire, fp, fresh_key};
use idem_tower::redis::redis;
use idem_tower::sql::sqlx::{self, sqlite::SqliteConnectOptions, sqlite::SqlitePoolOptions};
use serde_json::Value;

const STARTING_BALANCE: i64 = 100_000;
const PRICE: i64 = 1_999;
const USER: &str = "metrics-user";

fn temp_sqlite() -> String {
    let path = std::env::temp_dir().join(format!("{}.db", unique("idem-metrics")));
    format!("sqlite://{}", path.display())
}

async fn order(base: &str, tenant: &str, key: &str) -> reqwest::Response {
    support::order(base, key, tenant, USER, PRICE)
        .send()
        .await
        .expect("POST /orders")
}

/// Sends the first request, checks it ran; sends the duplicate, checks it
/// replayed the first's answer.
async fn first_then_duplicate(base: &str, tenant: &str, key: &str) {
    let first = order(base, tenant, key).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.expect("JSON");
    let duplicate = order(base, tenant, key).await;
    assert_eq!(duplicate.status(), 201);
    assert_eq!(duplicate.headers()["idempotent-replayed"], "true");
    let duplicate: Value = duplicate.json().await.expect("JSON");
    assert_eq!(duplicate, first, "the duplicate gets the first's answer");
}

fn requests(text: &str, outcome: &str) -> Option<f64> {
    metric(
        text,
        "idem_requests_total",
        &[("outcome", outcome), ("route", "/orders")],
    )
}

async fn a_first_and_a_duplicate_show_in_the_binarys_metrics(database: &str) {
    let orders = support::start_orders(database, None);
    let base = &orders.base;
    let tenant = unique("metrics");
    first_then_duplicate(base, &tenant, "metrics-key").await;

    let text = scrape(base).await;
    assert_eq!(requests(&text, "first"), Some(1.0), "{text}");
    assert_eq!(requests(&text, "replayed"), Some(1.0), "{text}");
    assert_eq!(
        metric(&text, "idem_requests_total", &[]),
        Some(2.0),
        "two requests, both on /orders, no other outcome: {text}"
    );
    assert!(
        samples(&text)
            .filter(|s| s.name.starts_with("idem_"))
            .all(|s| s.labels.iter().all(|(k, v)| k != "route" || v == "/orders")),
        "the route label is the matched pattern: {text}"
    );

    // The claim latency, as a histogram with buckets: one claim per request.
    assert!(
        text.contains("# TYPE idem_claim_seconds histogram"),
        "{text}"
    );
    let route = [("route", "/orders")];
    assert_eq!(
        metric(&text, "idem_claim_seconds_count", &route),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "idem_claim_seconds_bucket",
            &[("route", "/orders"), ("le", "+Inf")]
        ),
        Some(2.0),
        "{text}"
    );
    let sum = metric(&text, "idem_claim_seconds_sum", &route).expect("a sum");
    assert!(sum > 0.0 && sum < 60.0, "{text}");
    let buckets = samples(&text)
        .filter(|s| s.name == "idem_claim_seconds_bucket")
        .count();
    assert_eq!(
        buckets,
        idem_app::orders::CLAIM_SECONDS_BUCKETS.len() + 1,
        "{text}"
    );

    // The key the duplicate hit, and the app's own effect counter.
    let key = format!("order-create:{tenant}:metrics-user:metrics-key");
    assert_eq!(
        metric(&text, "idem_key_duplicates", &[("key", &key)]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "orders_handler_calls_total", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        account(base, &tenant, USER).await,
        (1, STARTING_BALANCE - PRICE),
        "one order, one debit"
    );
    drop(orders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_requests_by_outcome_and_route_and_the_claim_histogram_on_sqlite() {
    a_first_and_a_duplicate_show_in_the_binarys_metrics(&temp_sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_requests_by_outcome_and_route_and_the_claim_histogram_in_memory() {
    a_first_and_a_duplicate_show_in_the_binarys_metrics("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_counts_a_duplicate_sql_caught_after_redis_lost_the_key() {
    let url = redis_url();
    let connected = match redis::Client::open(url.as_str()) {
        Ok(client) => client.get_multiplexed_async_connection().await,
        Err(err) => Err(err),
    };
    let mut conn = match connected {
        Ok(conn) => conn,
        Err(err) => {
            server_missing::<()>("Redis", &url, err);
            return;
        }
    };
    let orders = support::start_orders(&temp_sqlite(), Some(&url));
    let base = &orders.base;
    let tenant = unique("metrics-tier");

    let text = scrape(base).await;
    for (name, _) in idem_app::orders::TIER_COUNTERS {
        assert_eq!(
            metric(&text, name, &[]),
            Some(0.0),
            "reported from the start: {text}"
        );
    }

    let first = order(base, &tenant, "tier-key").await;
    assert_eq!(first.status(), 201);
    // Redis loses the record: an eviction, an early expiry, a failover.
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!(
            "idem:{{order-create:{tenant}:metrics-user:tier-key}}"
        ))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1, "the gate held the key");
    let caught = order(base, &tenant, "tier-key").await;
    assert_eq!(caught.status(), 201);
    assert_eq!(caught.headers()["idempotent-replayed"], "true");
    // The gate was re-warmed: the next duplicate stops at Redis.
    let gated = order(base, &tenant, "tier-key").await;
    assert_eq!(gated.headers()["idempotent-replayed"], "true");

    let text = scrape(base).await;
    assert_eq!(
        metric(&text, "idem_tier_fallback_caught_total", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "idem_tier_answered_by_gate_total", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(requests(&text, "first"), Some(1.0), "{text}");
    assert_eq!(requests(&text, "replayed"), Some(2.0), "{text}");
    assert_eq!(
        account(base, &tenant, USER).await,
        (1, STARTING_BALANCE - PRICE)
    );
}

/// `orders --purge-every-ms` deletes the expired records of its SQL store
/// in the background and counts them; the live ones stay and still replay.
/// The expired records are written by another process's store on the same
/// SQLite file (this test's), as another instance would leave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_purges_expired_records_and_counts_them_on_sqlite() {
    const EXPIRED: usize = 25;
    let database = temp_sqlite();
    let orders = support::start_orders_with(&database, None, &["--purge-every-ms", "100"]);
    let base = &orders.base;
    let purged = |text: &str| metric(text, "idem_records_purged_total", &[]);
    let text = scrape(base).await;
    assert_eq!(purged(&text), Some(0.0), "reported from the start: {text}");

    let tenant = unique("metrics-purge");
    first_then_duplicate(base, &tenant, "purge-key").await;
    let path = database.strip_prefix("sqlite://").expect("a sqlite:// URL");
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(SqliteConnectOptions::new().filename(path))
        .await
        .expect("the orders app's SQLite file");
    let elsewhere = SqliteStore::new(pool.clone());
    for _ in 0..EXPIRED {
        let key = fresh_key("purged-by-orders");
        acquire(&elsewhere, &key, &fp(1), Duration::from_millis(200)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(base).await;
        if purged(&text) == Some(EXPIRED as f64) || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(purged(&text), Some(EXPIRED as f64), "{text}");
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .expect("count the records");
    assert_eq!(left, 1, "the order's record is kept, nothing else");
    let replay = order(base, &tenant, "purge-key").await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        account(base, &tenant, USER).await,
        (1, STARTING_BALANCE - PRICE),
        "one order, one debit"
    );
}

#[test]
fn prometheus_samples_are_read_whatever_the_label_order() {
    let text = "# TYPE idem_requests_total counter\n\
                idem_requests_total{route=\"/orders\",outcome=\"replayed\"} 3\n\
                idem_requests_total{outcome=\"replayed\",route=\"/payments/{payment_no}/callback\"} 4\n\
                idem_key_duplicates{key=\"a\\\"b,c}\"} 2\n\
                orders_handler_calls_total 1\n";
    let replayed = [("outcome", "replayed"), ("route", "/orders")];
    assert_eq!(metric(text, "idem_requests_total", &replayed), Some(3.0));
    assert_eq!(
        metric(text, "idem_requests_total", &[("outcome", "replayed")]),
        Some(7.0)
    );
    assert_eq!(
        metric(text, "idem_key_duplicates", &[("key", "a\"b,c}")]),
        Some(2.0)
    );
    assert_eq!(metric(text, "orders_handler_calls_total", &[]), Some(1.0));
    assert_eq!(metric(text, "idem_requests_total", &[("route", "x")]), None);
}
