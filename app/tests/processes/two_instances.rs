//! Round 5 of ARCHITECTURE.md, "The five rounds": two `orders` processes share one PostgreSQL
//! and one Redis; 50 concurrent copies of one request, split between them,
//! make exactly one order.

use crate::support;

use std::sync::Arc;

use idem_test_support::{postgres_url, redis_url, server_missing};
use serde_json::{Value, json};
use tokio::sync::Barrier;

const PRICE: i64 = 4_200;

async fn reachable(what: &str, url: &str, addr: &str) -> bool {
    match tokio::net::TcpStream::connect(addr).await {
        Ok(_) => true,
        Err(err) => server_missing::<()>(what, url, err).is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_copies_across_two_instances_make_one_order() {
    let database = postgres_url();
    let redis = redis_url();
    if !reachable("PostgreSQL", &database, "127.0.0.1:5432").await
        || !reachable("Redis", &redis, redis.trim_start_matches("redis://")).await
    {
        return;
    }
    let a = support::start_orders(&database, Some(&redis));
    let b = support::start_orders(&database, Some(&redis));
    let tenant = format!("two-instances-{:x}", rand_suffix());
    let client = reqwest::Client::new();

    let barrier = Arc::new(Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let base = if i % 2 == 0 {
                a.base.clone()
            } else {
                b.base.clone()
            };
            let (client, barrier, tenant) = (client.clone(), barrier.clone(), tenant.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                client
                    .post(format!("{base}/orders"))
                    .header("idempotency-key", "shared-key")
                    .header("x-tenant-id", tenant)
                    .header("authorization", "Bearer pat")
                    .header("x-chaos-delay-ms", "200")
                    .json(&json!({"sku": "book", "qty": 1, "amount_cents": PRICE}))
                    .send()
                    .await
                    .expect("POST /orders")
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        match task.await.unwrap() {
            201 => created += 1,
            409 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(created >= 1, "the first request succeeded");

    let calls = |base: String| {
        let client = client.clone();
        async move {
            let text = client
                .get(format!("{base}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("orders_handler_calls_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("the counter")
        }
    };
    assert_eq!(
        calls(a.base.clone()).await + calls(b.base.clone()).await,
        1,
        "one handler run across both instances"
    );
    let account: Value = client
        .get(format!("{}/orders?tenant={tenant}&user=pat", a.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(account["count"], 1);
    assert_eq!(account["balance_cents"], 100_000 - PRICE);
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now())
}
