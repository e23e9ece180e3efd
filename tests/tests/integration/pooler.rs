//! The orders app through PgBouncer in transaction pooling (`.ci/services`
//! starts it; `IDEM_TEST_PGBOUNCER_URL`), under concurrency, in both modes:
//! `POST /orders` transactional (the claim, the order and the debit in one
//! transaction), the payment callback plain (a lease, the handler's own
//! transaction, then the completion). Many keys, concurrent copies of
//! each, every 409 and 5xx retried with the same key, effects counted in
//! the database: exactly one per key, every request answered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use idem_app::orders::{STARTING_BALANCE_CENTS, Wiring};
use idem_tests::{Backend, Call, Harness, Reply, Via};
use serde_json::json;
use tokio::sync::Semaphore;

/// Keys, copies of each sent at once, and requests in flight at most.
const KEYS: usize = 200;
const COPIES: usize = 5;
const IN_FLIGHT: usize = 40;
/// Attempts of one request before the test gives up on it.
const ATTEMPTS: usize = 100;
const PRICE: i64 = 1_00;

/// Sends `call` until it gets a final answer: 409 (in flight) and 5xx are
/// retried with the same key, after a short pause. The final reply, and
/// how many 5xx came before it.
async fn until_final(h: &Harness, call: Call) -> (Reply, u64) {
    let mut five_xx = 0;
    for _ in 0..ATTEMPTS {
        let reply = h.send(call.clone()).await;
        if reply.status == StatusCode::CONFLICT || reply.status.is_server_error() {
            five_xx += u64::from(reply.status.is_server_error());
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        return (reply, five_xx);
    }
    panic!("no final answer in {ATTEMPTS} attempts: {call:?}");
}

/// Sends `COPIES` copies of each call at once, `IN_FLIGHT` requests at a
/// time at most, each until final. The replies by call, and the 5xx seen.
async fn burst(h: &Harness, calls: Vec<Call>) -> (Vec<Vec<Reply>>, u64) {
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = Vec::new();
    for call in calls {
        let copies: Vec<_> = (0..COPIES)
            .map(|_| {
                let (h, gate, call) = (h.clone(), gate.clone(), call.clone());
                tokio::spawn(async move {
                    let _turn = gate.acquire_owned().await.expect("open");
                    until_final(&h, call).await
                })
            })
            .collect();
        tasks.push(copies);
    }
    let (mut replies, mut five_xx) = (Vec::new(), 0);
    for copies in tasks {
        let mut these = Vec::new();
        for copy in copies {
            let (reply, errors) = copy.await.expect("a sending task");
            five_xx += errors;
            these.push(reply);
        }
        replies.push(these);
    }
    (replies, five_xx)
}

async fn through_pgbouncer() -> Option<Harness> {
    Harness::start_with(Backend::PgBouncer, Via::Http, Wiring::Attribute, |b| b).await
}

/// Transactional mode: one order per key, each user debited once, every
/// copy answered with the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_through_pgbouncer_one_per_key() {
    let Some(h) = through_pgbouncer().await else {
        return;
    };
    let calls = (0..KEYS)
        .map(|i| h.order("pool", &format!("u{}", i % 20), &format!("k{i}"), PRICE))
        .collect();
    let (replies, five_xx) = burst(&h, calls).await;
    for (i, copies) in replies.iter().enumerate() {
        let first = &copies[0];
        assert_eq!(first.status, StatusCode::CREATED, "key {i}: {first:?}");
        for copy in copies {
            assert_eq!(copy.status, StatusCode::CREATED, "key {i}: {copy:?}");
            assert_eq!(copy.json()["order_id"], first.json()["order_id"], "key {i}");
        }
        assert_eq!(
            copies.iter().filter(|r| !r.replayed()).count(),
            1,
            "key {i}: exactly one first response"
        );
    }
    // Counted in the database, per user: ten keys each.
    for user in 0..20 {
        let (count, balance) = h.account("pool", &format!("u{user}")).await;
        assert_eq!(count, 10, "user u{user}");
        assert_eq!(balance, STARTING_BALANCE_CENTS - 10 * PRICE, "user u{user}");
    }
    assert_eq!(h.app.calls.orders(), KEYS as u64);
    assert_eq!(five_xx, 0, "no 5xx from idem's own statements");
}

/// Plain mode: each payment credited once, by one run of the callback.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payment_callbacks_through_pgbouncer_credit_once() {
    let Some(h) = through_pgbouncer().await else {
        return;
    };
    let numbers: Vec<String> = (0..KEYS).map(|i| h.unique(&format!("P{i}"))).collect();
    for no in &numbers {
        let created = h
            .send(Call::post(
                "/payments",
                &json!({"payment_no": no, "amount_cents": 700}),
            ))
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    }
    let calls = numbers
        .iter()
        .map(|no| {
            Call::post(
                &format!("/payments/{no}/callback"),
                &json!({"status": "PAID", "amount_cents": 700}),
            )
        })
        .collect();
    let (replies, five_xx) = burst(&h, calls).await;
    let mut statuses = BTreeMap::<u16, usize>::new();
    for copies in &replies {
        for copy in copies {
            *statuses.entry(copy.status.as_u16()).or_default() += 1;
        }
    }
    assert_eq!(statuses, BTreeMap::from([(200, KEYS * COPIES)]));
    for no in &numbers {
        let payment = h.send(Call::get(&format!("/payments/{no}"))).await.json();
        assert_eq!(payment["state"], "PAID", "{no}");
        assert_eq!(payment["credits"], 1, "{no}");
    }
    assert_eq!(h.app.calls.callbacks(), KEYS as u64);
    assert_eq!(five_xx, 0, "no 5xx from idem's own statements");
}
