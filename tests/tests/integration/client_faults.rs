//! The client half against the orders app when the network or a concurrent
//! first attempt gets in the way: an in-flight 409 retried until the
//! replay, and 200 operations through a TCP fault proxy that loses answers
//! and closes connections, one order per operation.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_app::orders::{App, STARTING_BALANCE_CENTS};
use idem_test_support::lossy_proxy::fault_proxy;
use idem_tests::Harness;
use idem_tower::client::{IdempotencyClientLayer, RetryPolicy, RetryReport};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const PRICE: i64 = 1999;

/// The orders app with chaos on, served on loopback; its base URL.
async fn start() -> (Harness, String) {
    let h = Harness::serve(App::in_memory(true)).await;
    let base = h
        .base()
        .expect("Harness::serve serves over HTTP")
        .to_owned();
    (h, base)
}

fn order_body(sku: &str, amount_cents: i64) -> String {
    json!({ "sku": sku, "qty": 1, "amount_cents": amount_cents }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_409_is_retried_until_the_replay() {
    let (h, base) = start().await;
    let key = "in-flight-1";
    // The first attempt, sent directly: it holds its key for 2 s, the client starting half a second later.
    let first = {
        let h = h.clone();
        tokio::spawn(async move {
            h.send(
                h.order("acme", "carol", key, PRICE)
                    .header("x-chaos-delay-ms", "2000"),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The same request through the client: every attempt's status and
    // `Retry-After` recorded on the way.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner = {
        let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let seen = seen.clone();
        service_fn(move |request: Request<Full<Bytes>>| {
            let (http, seen) = (http.clone(), seen.clone());
            async move {
                let response = http.request(request).await?;
                let retry_after = response.headers().contains_key(http::header::RETRY_AFTER);
                seen.lock().unwrap().push((response.status(), retry_after));
                Ok::<_, hyper_util::client::legacy::Error>(response)
            }
        })
    };
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(
            RetryPolicy::default()
                .max_attempts(20)
                .deadline(Duration::from_secs(20))
                .backoff(Duration::from_millis(10), Duration::from_millis(100))
                .max_retry_after(Duration::from_millis(200)),
        ))
        .service(inner);
    let request = Request::post(format!("{base}/orders"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("x-tenant-id", h.unique("acme"))
        .header("authorization", "Bearer carol")
        .header("x-chaos-delay-ms", "2000")
        .body(Full::new(Bytes::from(order_body("book", PRICE))))
        .unwrap();
    let response = client.oneshot(request).await.expect("an answer");
    let delivery = response.extensions().get::<RetryReport>().cloned().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        response.status(),
        StatusCode::CREATED,
        "{delivery:?} {seen:?}"
    );
    assert!(delivery.replayed, "{delivery:?}");
    assert!(delivery.attempts >= 2, "{delivery:?}");
    assert_eq!(seen.len(), delivery.attempts as usize);
    assert_eq!(
        seen[0],
        (StatusCode::CONFLICT, true),
        "the first client attempt met the running one: {seen:?}"
    );
    assert_eq!(
        delivery.key.as_ref().map(|k| k.to_str().unwrap()),
        Some(key),
        "the caller's key, kept"
    );
    let replay = response.into_body().collect().await.unwrap().to_bytes();

    let first = first.await.expect("the first attempt");
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(replay, first.body, "the replay is the first answer");
    assert_eq!(
        h.account("acme", "carol").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
    assert_eq!(h.app.calls.orders(), 1, "the handler ran once");
    eprintln!(
        "in-flight: attempts {}, statuses {seen:?}",
        delivery.attempts
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_operations_through_a_fault_proxy_make_two_hundred_orders() {
    const OPERATIONS: usize = 200;
    const TASKS: usize = 8;
    let (h, base) = start().await;
    let upstream: SocketAddr = base
        .strip_prefix("http://")
        .expect("an http base")
        .parse()
        .expect("a socket address");
    let (proxy, faults) = fault_proxy(upstream).await;

    // No pooled connections: every attempt meets the proxy's next fate.
    let http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Full<Bytes>>();
    let client = ServiceBuilder::new()
        .layer(IdempotencyClientLayer::new(
            RetryPolicy::default()
                .max_attempts(20)
                .backoff(Duration::from_millis(2), Duration::from_millis(20))
                .max_retry_after(Duration::from_millis(50))
                .attempt_timeout(Duration::from_secs(5))
                .deadline(Duration::from_secs(60)),
        ))
        .service(http);
    let tenant = h.unique("proxied");

    // Operation `op` orders sku `op-{op}` for 100 + op cents: 200 orders
    // cost 39,900 of the 100,000 starting cents.
    let amount = |op: usize| 100 + op as i64;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (client, tenant) = (client.clone(), tenant.clone());
            tokio::spawn(async move {
                let mut done = Vec::new();
                for op in (task..OPERATIONS).step_by(TASKS) {
                    let request = Request::post(format!("http://{proxy}/orders"))
                        .header("content-type", "application/json")
                        .header("x-tenant-id", &tenant)
                        .header("authorization", "Bearer dave")
                        .body(Full::new(Bytes::from(order_body(
                            &format!("op-{op}"),
                            amount(op),
                        ))))
                        .unwrap();
                    let response = client
                        .clone()
                        .oneshot(request)
                        .await
                        .unwrap_or_else(|e| panic!("operation {op}: {e}"));
                    let delivery = response.extensions().get::<RetryReport>().cloned().unwrap();
                    let status = response.status();
                    let bytes = response.into_body().collect().await.unwrap().to_bytes();
                    let placed: Value = serde_json::from_slice(&bytes).expect("JSON");
                    done.push((op, status, delivery, placed));
                }
                done
            })
        })
        .collect();
    let mut results = Vec::with_capacity(OPERATIONS);
    for task in tasks {
        results.extend(task.await.expect("an operations task"));
    }

    assert_eq!(results.len(), OPERATIONS);
    let mut order_ids = std::collections::BTreeSet::new();
    for (op, status, delivery, placed) in &results {
        assert_eq!(
            *status,
            StatusCode::CREATED,
            "operation {op}: {delivery:?} {placed}"
        );
        assert_eq!(
            placed["sku"],
            format!("op-{op}"),
            "operation {op}: {placed}"
        );
        assert_eq!(
            placed["amount_cents"],
            amount(*op),
            "operation {op}: {placed}"
        );
        assert_eq!(placed["tenant"], tenant.as_str());
        assert_eq!(placed["user"], "dave");
        assert!(
            order_ids.insert(placed["order_id"].to_string()),
            "operation {op}: an order id seen twice: {placed}"
        );
    }
    let replays = results.iter().filter(|(.., d, _)| d.replayed).count();
    let attempts: u32 = results.iter().map(|(_, _, d, _)| d.attempts).sum();
    let retried = results.iter().filter(|(_, _, d, _)| d.attempts > 1).count();
    let lost = faults.lost.load(Ordering::SeqCst);
    let closed = faults.closed.load(Ordering::SeqCst);
    let passed = faults.passed.load(Ordering::SeqCst);
    eprintln!(
        "fault proxy: {OPERATIONS} operations, {attempts} attempts, {retried} retried, \
         {replays} replays; connections: {passed} passed, {lost} lost, {closed} closed"
    );
    assert!(
        lost > 0 && closed > 0,
        "the proxy lost and closed connections"
    );
    assert!(replays > 0, "some answers were lost and replayed");
    let spent: i64 = (0..OPERATIONS).map(amount).sum();
    assert_eq!(
        h.account("proxied", "dave").await,
        (OPERATIONS as u64, STARTING_BALANCE_CENTS - spent)
    );
}
