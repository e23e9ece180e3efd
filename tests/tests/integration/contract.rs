//! The HTTP contract (README.md; rounds 1-3 of ARCHITECTURE.md, "The five rounds") against the orders
//! app on the memory store, each case run twice: over real HTTP on loopback
//! and through `oneshot`.

use std::time::Duration;

use http::StatusCode;
use idem_app::orders::{STARTING_BALANCE_CENTS, Wiring};
use idem_tests::{Backend, Call, Harness, Via};
use serde_json::json;

idem_tests::on_every_backend!(
    same_request_ten_times_has_one_effect_and_nine_replays,
    fifty_concurrent_copies_have_one_effect,
    slow_first_attempt_then_retry_gets_the_first_success,
    failed_first_attempt_then_retry_runs_once,
    same_key_with_a_different_body_is_422,
    missing_key_is_400,
    key_of_256_characters_is_400,
    two_key_headers_are_400,
    a_quoted_key_and_its_bare_form_are_one_order,
    a_quoted_key_may_hold_spaces_and_takes_no_parameters,
    missing_tenant_is_400_naming_it,
    same_client_key_under_two_tenants_is_two_effects,
    same_client_key_under_two_users_is_two_effects,
    payment_callback_repeated_fifteen_times_credits_once,
    concurrent_payment_callbacks_credit_once,
);

const PRICE: i64 = 1999;

async fn same_request_ten_times_has_one_effect_and_nine_replays(h: Harness) {
    let first = h.send(h.order("acme", "alice", "round-1", PRICE)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    for _ in 0..9 {
        let again = h.send(h.order("acme", "alice", "round-1", PRICE)).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed(), "{again:?}");
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers["location"], first.headers["location"]);
        assert_eq!(again.headers["content-type"], "application/json");
    }
    assert_eq!(h.app.calls.orders(), 1);
    assert_eq!(
        h.account("acme", "alice").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}

async fn fifty_concurrent_copies_have_one_effect(h: Harness) {
    let call = h
        .order("acme", "bob", "round-2", PRICE)
        .header("x-chaos-delay-ms", "200");
    let (mut created, mut replayed, mut in_flight) = (0, 0, 0);
    for reply in h.send_together(50, call).await {
        match reply.status {
            StatusCode::CREATED if reply.replayed() => replayed += 1,
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {
                assert_eq!(reply.problem_type(), "urn:idem:problem:in-flight");
                assert!(reply.headers.contains_key("retry-after"));
                in_flight += 1;
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(created + replayed + in_flight, 50);
    assert_eq!(h.app.calls.orders(), 1);
    assert_eq!(
        h.account("acme", "bob").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}

async fn slow_first_attempt_then_retry_gets_the_first_success(h: Harness) {
    let slow = {
        let h = h.clone();
        tokio::spawn(async move {
            h.send(
                h.order("acme", "carol", "round-3", PRICE)
                    .header("x-chaos-delay-ms", "600"),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let early = h.send(h.order("acme", "carol", "round-3", PRICE)).await;
    let first = slow.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    // The memory store answers 409 at once; in transactional mode the
    // duplicate waits on the first transaction's row and replays it.
    if early.status == StatusCode::CONFLICT {
        assert_eq!(early.problem_type(), "urn:idem:problem:in-flight");
    } else {
        assert!(early.replayed(), "{early:?}");
        assert_eq!(early.body, first.body);
    }
    let late = h.send(h.order("acme", "carol", "round-3", PRICE)).await;
    assert!(late.replayed());
    assert_eq!(late.body, first.body);
    assert_eq!(h.app.calls.orders(), 1);
    assert_eq!(
        h.account("acme", "carol").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}

async fn failed_first_attempt_then_retry_runs_once(h: Harness) {
    let failed = h
        .send(
            h.order("acme", "dave", "round-3b", PRICE)
                .header("x-chaos-fail", "503"),
        )
        .await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!failed.replayed());
    let retry = h.send(h.order("acme", "dave", "round-3b", PRICE)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed(), "the failed attempt must not be replayed");
    let again = h.send(h.order("acme", "dave", "round-3b", PRICE)).await;
    assert!(again.replayed());
    assert_eq!(again.body, retry.body);
    assert_eq!(h.app.calls.orders(), 2, "the failure, then one success");
    assert_eq!(
        h.account("acme", "dave").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}

async fn same_key_with_a_different_body_is_422(h: Harness) {
    let first = h.send(h.order("acme", "erin", "k", PRICE)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = h.send(h.order("acme", "erin", "k", PRICE + 1)).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.problem_type(),
        "urn:idem:problem:fingerprint-mismatch"
    );
    assert_eq!(h.app.calls.orders(), 1);
    assert_eq!(
        h.account("acme", "erin").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}

async fn missing_key_is_400(h: Harness) {
    let call = Call::post("/orders", &json!({"sku": "x", "qty": 1, "amount_cents": 1}))
        .header("x-tenant-id", &h.unique("acme"))
        .header("authorization", "Bearer frank");
    let reply = h.send(call).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem_type(), "urn:idem:problem:key-missing");
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("idempotency-key")
    );
    assert_eq!(h.app.calls.orders(), 0);
}

async fn key_of_256_characters_is_400(h: Harness) {
    let reply = h
        .send(h.order("acme", "gina", &"k".repeat(256), PRICE))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem_type(), "urn:idem:problem:key-invalid");
    assert_eq!(h.app.calls.orders(), 0);
    let reply = h
        .send(h.order("acme", "gina", &"k".repeat(255), PRICE))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(h.app.calls.orders(), 1);
}

async fn two_key_headers_are_400(h: Harness) {
    let reply = h
        .send(
            h.order("acme", "hank", "k1", PRICE)
                .header("idempotency-key", "k2"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem_type(), "urn:idem:problem:key-invalid");
    assert_eq!(h.app.calls.orders(), 0);
}

/// The IETF draft's form (`Idempotency-Key: "k"`, a Structured Field
/// String) and Stripe's bare form of the same characters are one key: one
/// order, the second request replayed.
async fn a_quoted_key_and_its_bare_form_are_one_order(h: Harness) {
    let quoted = h.send(h.order("acme", "quinn", "\"k-7\"", PRICE)).await;
    let bare = h.send(h.order("acme", "quinn", "k-7", PRICE)).await;
    assert_eq!(quoted.status, StatusCode::CREATED);
    assert!(!quoted.replayed());
    assert_eq!(bare.status, StatusCode::CREATED);
    assert!(bare.replayed(), "{bare:?}");
    assert_eq!(bare.body, quoted.body);
    assert_eq!(h.app.calls.orders(), 1);
    assert_eq!(
        h.account("acme", "quinn").await,
        (1, STARTING_BALANCE_CENTS - PRICE)
    );
}

/// What a String may hold (spaces, escaped quotes) is a key; parameters
/// and a list are a 400 that says why, and run nothing.
async fn a_quoted_key_may_hold_spaces_and_takes_no_parameters(h: Harness) {
    let spaced = r#""order \"7\" of 9""#;
    let first = h.send(h.order("acme", "rae", spaced, PRICE)).await;
    let again = h.send(h.order("acme", "rae", spaced, PRICE)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(h.app.calls.orders(), 1);
    for (value, why) in [
        (r#""k-8";x=1"#, "parameters"),
        (r#""k-8", "k-9""#, "list"),
        (r#""k-8"#, "Structured Field String"),
    ] {
        let refused = h.send(h.order("acme", "rae", value, PRICE)).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{value}");
        assert_eq!(refused.problem_type(), "urn:idem:problem:key-invalid");
        let detail = refused.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(why), "{value}: {detail}");
    }
    assert_eq!(h.app.calls.orders(), 1);
}

async fn missing_tenant_is_400_naming_it(h: Harness) {
    let call = Call::post("/orders", &json!({"sku": "x", "qty": 1, "amount_cents": 1}))
        .header("idempotency-key", "k")
        .header("authorization", "Bearer ivy");
    let reply = h.send(call).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem_type(), "urn:idem:problem:key-missing");
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("{tenant}")
    );
    assert_eq!(h.app.calls.orders(), 0);
}

async fn same_client_key_under_two_tenants_is_two_effects(h: Harness) {
    let a = h.send(h.order("acme", "jay", "shared", 100)).await;
    let b = h.send(h.order("globex", "jay", "shared", 100)).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!a.replayed() && !b.replayed());
    assert_eq!(a.json()["tenant"], h.unique("acme"));
    assert_eq!(b.json()["tenant"], h.unique("globex"));
    assert_eq!(h.app.calls.orders(), 2);
    assert_eq!(
        h.account("acme", "jay").await,
        (1, STARTING_BALANCE_CENTS - 100)
    );
    assert_eq!(
        h.account("globex", "jay").await,
        (1, STARTING_BALANCE_CENTS - 100)
    );
}

async fn same_client_key_under_two_users_is_two_effects(h: Harness) {
    let a = h.send(h.order("acme", "kim", "shared", 100)).await;
    let b = h.send(h.order("acme", "lee", "shared", 100)).await;
    assert!(!a.replayed() && !b.replayed());
    assert_eq!(a.json()["user"], "kim");
    assert_eq!(b.json()["user"], "lee");
    assert_eq!(h.app.calls.orders(), 2);
    assert_eq!(h.account("acme", "kim").await.0, 1);
    assert_eq!(h.account("acme", "lee").await.0, 1);
}

async fn create_payment(h: &Harness, payment_no: &str, amount: i64) {
    let reply = h
        .send(Call::post(
            "/payments",
            &json!({"payment_no": payment_no, "amount_cents": amount}),
        ))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
}

fn callback(payment_no: &str, amount: i64) -> Call {
    Call::post(
        &format!("/payments/{payment_no}/callback"),
        &json!({"status": "PAID", "amount_cents": amount}),
    )
}

async fn credits(h: &Harness, payment_no: &str) -> (String, u64) {
    let p = h
        .send(Call::get(&format!("/payments/{payment_no}")))
        .await
        .json();
    (
        p["state"].as_str().unwrap().to_owned(),
        p["credits"].as_u64().unwrap(),
    )
}

async fn payment_callback_repeated_fifteen_times_credits_once(h: Harness) {
    let no = h.unique("P-seq");
    create_payment(&h, &no, 500).await;
    for i in 0..15 {
        let reply = h.send(callback(&no, 500)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.replayed(), i > 0);
    }
    assert_eq!(h.app.calls.callbacks(), 1);
    assert_eq!(credits(&h, &no).await, ("PAID".to_owned(), 1));
}

async fn concurrent_payment_callbacks_credit_once(h: Harness) {
    let no = h.unique("P-par");
    create_payment(&h, &no, 700).await;
    for reply in h.send_together(15, callback(&no, 700)).await {
        let status = reply.status;
        assert!(
            matches!(status, StatusCode::OK | StatusCode::CONFLICT),
            "{status}"
        );
    }
    assert_eq!(h.app.calls.callbacks(), 1);
    assert_eq!(credits(&h, &no).await, ("PAID".to_owned(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_over_the_cap_is_413_and_claims_nothing() {
    let h = Harness::start_with(Backend::Memory, Via::Http, Wiring::Attribute, |b| {
        b.max_body(1024)
    })
    .await
    .expect("the memory backend is always there");
    let big = json!({"sku": "x".repeat(4096), "qty": 1, "amount_cents": 5});
    let reply = h
        .send(h.order("acme", "max", "big", 5).raw_body(big.to_string()))
        .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.problem_type(), "urn:idem:problem:body-too-large");
    assert_eq!(h.app.calls.orders(), 0);
    // Nothing was claimed: the same key with a body under the cap runs.
    let reply = h.send(h.order("acme", "max", "big", 5)).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(!reply.replayed());
    assert_eq!(h.app.calls.orders(), 1);
}
