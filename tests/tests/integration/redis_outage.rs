//! Round 4 of ARCHITECTURE.md, "The five rounds", for real: Redis is shut down in the middle of a
//! burst of duplicate requests to the orders app (PostgreSQL behind the
//! Redis gate), then started again. Every key still has exactly one effect,
//! and the degraded and recovered states show in the app's counters.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use idem_app::orders::{App, STARTING_BALANCE_CENTS};
use idem_test_support::redis::RedisServer;
use idem_tests::{Backend, Harness};
use tokio::sync::Mutex;

const KEYS: usize = 24;
const PRICE: i64 = 700;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stopped_mid_burst_still_one_effect_per_key() {
    let Some(database) = Backend::Postgres.database_url().await else {
        return;
    };
    let Some(mut redis) = RedisServer::start(&[]) else {
        return;
    };
    let app = App::connect_tiered(&database, Some(&redis.url()), true, |b| b)
        .await
        .expect("the orders app behind a Redis gate");
    let tier = app.tier.clone().expect("a tiered store");
    let h = Harness::serve(app).await;

    let seen: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let traffic_ends = Instant::now() + Duration::from_secs(6);
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (h, seen) = (h.clone(), seen.clone());
            tokio::spawn(async move {
                let mut i = w;
                while Instant::now() < traffic_ends {
                    // Every key is sent again and again, by several workers.
                    let k = i % KEYS;
                    i += 3;
                    let call = h
                        .order("outage", &format!("user-{k}"), &format!("key-{k}"), PRICE)
                        .header("x-chaos-delay-ms", "20");
                    let reply = h.send(call).await;
                    match reply.status {
                        StatusCode::CREATED => {
                            seen.lock().await.insert(k);
                        }
                        StatusCode::CONFLICT => {}
                        other => panic!("unexpected {other}: {reply:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.stop();
    let while_down = tier.snapshot();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    redis.restart();
    for worker in workers {
        worker.await.unwrap();
    }

    let seen = seen.lock().await.clone();
    assert_eq!(seen.len(), KEYS, "every key was answered at least once");
    for k in 0..KEYS {
        assert_eq!(
            h.account("outage", &format!("user-{k}")).await,
            (1, STARTING_BALANCE_CENTS - PRICE),
            "key {k}: exactly one effect"
        );
    }
    assert_eq!(
        h.app.calls.orders() as usize,
        KEYS,
        "one handler run per key"
    );

    let stats = tier.snapshot();
    eprintln!("tier counters after the outage: {stats:?}");
    assert!(
        stats.degraded > while_down.degraded,
        "degraded requests counted"
    );
    assert!(stats.breaker_opened >= 1, "the breaker opened");
    assert!(
        stats.breaker_recovered >= 1,
        "the gate came back without a restart"
    );
    assert!(stats.answered_by_gate > while_down.answered_by_gate);
}
