//! 200 operations through a fault proxy: a small TCP proxy in front of the
//! server that closes some connections before forwarding anything and
//! drops others after forwarding the request, once the answer has started
//! (the server committed, the caller never hears). With the client layer
//! in front, every operation still ends with its own order's 201, and the
//! server made exactly one order per operation.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_tower::client::{IdempotencyClientLayer, RetryPolicy};
use tokio::task::JoinSet;
use tower::{Layer, ServiceExt};

use super::{Server, order, read};

use idem_test_support::lossy_proxy::fault_proxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_operations_through_a_fault_proxy_make_two_hundred_orders() {
    let server = Server::default();
    let upstream = server.start().await;
    let (proxy, faults) = fault_proxy(upstream).await;

    // No pooled connections: every attempt meets the proxy's next fate.
    let http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let client = IdempotencyClientLayer::new(
        RetryPolicy::default()
            .max_attempts(20)
            .backoff(Duration::from_millis(2), Duration::from_millis(20))
            .max_retry_after(Duration::from_millis(50))
            .attempt_timeout(Duration::from_secs(5))
            .deadline(Duration::from_secs(30)),
    )
    .layer(http);

    let mut operations = JoinSet::new();
    for op in 0..200 {
        let client = client.clone();
        operations.spawn(async move {
            let body = format!(r#"{{"sku":"op-{op}"}}"#);
            let response = client
                .oneshot(order(proxy, None, &body))
                .await
                .unwrap_or_else(|e| panic!("operation {op}: {e}"));
            let (status, delivery, answer) = read(response).await;
            assert_eq!(status, StatusCode::CREATED, "operation {op}: {answer}");
            assert!(answer.contains(&body), "operation {op} got {answer}");
            delivery
        });
    }
    let mut replays = 0;
    let mut retried = 0;
    while let Some(delivery) = operations.join_next().await {
        let delivery = delivery.expect("an operation");
        replays += usize::from(delivery.replayed);
        retried += usize::from(delivery.attempts > 1);
    }

    assert_eq!(server.runs(), 200, "one order per operation");
    assert!(faults.closed.load(Ordering::SeqCst) > 0);
    assert!(faults.lost.load(Ordering::SeqCst) > 0);
    assert!(replays > 0, "lost answers were replayed");
    assert!(retried >= replays);
}
