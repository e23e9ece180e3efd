//! Payment callbacks at the HTTP level: the idempotency layer in front, the
//! state-machine transition (`WAIT_PAY -> PAID`, `PAID -> REFUNDED`) behind
//! it, on every backend and both wirings. Effects are counted in the ledger
//! (`credits`, `refunds` of `GET /payments/{payment_no}`), not guessed from
//! answers.

use std::time::Duration;

use http::StatusCode;
use idem_app::orders::Wiring;
use idem_tests::{Backend, Call, Harness, Via};
use serde_json::json;

/// A ttl short enough to outlive in a test.
const SHORT_TTL: Duration = Duration::from_millis(300);
/// Long enough after [`SHORT_TTL`] for every store's clock to agree.
const PAST_RETENTION: Duration = Duration::from_millis(1200);

idem_tests::on_every_backend!(
    parts:
    fifteen_sequential_callbacks_credit_once,
    fifteen_concurrent_callbacks_credit_once,
    callback_after_the_record_expired_books_no_second_credit,
    callback_for_a_refunded_payment_is_409_and_books_nothing,
    refund_applies_once_and_only_to_a_paid_payment,
);

async fn harness(backend: Backend, via: Via, wiring: Wiring, short: bool) -> Option<Harness> {
    Harness::start_with(backend, via, wiring, |builder| {
        if short {
            builder.ttl(SHORT_TTL)
        } else {
            builder
        }
    })
    .await
}

async fn create_payment(h: &Harness, payment_no: &str, amount: i64) {
    let reply = h
        .send(Call::post(
            "/payments",
            &json!({"payment_no": payment_no, "amount_cents": amount}),
        ))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
}

fn callback(payment_no: &str, amount: i64) -> Call {
    Call::post(
        &format!("/payments/{payment_no}/callback"),
        &json!({"status": "PAID", "amount_cents": amount}),
    )
}

fn refund(payment_no: &str) -> Call {
    Call::post(&format!("/payments/{payment_no}/refund"), &json!({}))
}

/// `(state, credits, refunds)` as `GET /payments/{payment_no}` reports them.
async fn ledger(h: &Harness, payment_no: &str) -> (String, u64, u64) {
    let reply = h.send(Call::get(&format!("/payments/{payment_no}"))).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let p = reply.json();
    (
        p["state"].as_str().unwrap().to_owned(),
        p["credits"].as_u64().unwrap(),
        p["refunds"].as_u64().unwrap(),
    )
}

fn paid(credits: u64) -> (String, u64, u64) {
    ("PAID".to_owned(), credits, 0)
}

async fn fifteen_sequential_callbacks_credit_once(backend: Backend, via: Via, wiring: Wiring) {
    let Some(h) = harness(backend, via, wiring, false).await else {
        return;
    };
    let no = h.unique("P-seq");
    create_payment(&h, &no, 500).await;
    let first = h.send(callback(&no, 500)).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert!(!first.replayed());
    for _ in 1..15 {
        let again = h.send(callback(&no, 500)).await;
        assert_eq!(again.status, StatusCode::OK, "{again:?}");
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
    }
    assert_eq!(h.app.calls.callbacks(), 1);
    assert_eq!(ledger(&h, &no).await, paid(1));
}

async fn fifteen_concurrent_callbacks_credit_once(backend: Backend, via: Via, wiring: Wiring) {
    let Some(h) = harness(backend, via, wiring, false).await else {
        return;
    };
    let no = h.unique("P-par");
    create_payment(&h, &no, 700).await;
    let mut ok = 0;
    for reply in h.send_together(15, callback(&no, 700)).await {
        match reply.status {
            StatusCode::OK => ok += 1,
            // Still running: the provider retries later, and gets the replay.
            StatusCode::CONFLICT => {
                assert_eq!(reply.problem_type(), "urn:idem:problem:in-flight")
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert!(ok >= 1);
    // Whoever got the in-flight 409 retries: a success, nothing booked.
    let retry = h.send(callback(&no, 700)).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(h.app.calls.callbacks(), 1);
    assert_eq!(ledger(&h, &no).await, paid(1));
}

/// The provider re-pushes after the idempotency record is gone: the handler
/// runs again, and the transition finds the payment already `PAID`.
async fn callback_after_the_record_expired_books_no_second_credit(
    backend: Backend,
    via: Via,
    wiring: Wiring,
) {
    let Some(h) = harness(backend, via, wiring, true).await else {
        return;
    };
    let no = h.unique("P-late");
    create_payment(&h, &no, 900).await;
    let first = h.send(callback(&no, 900)).await;
    assert_eq!(first.status, StatusCode::OK);
    tokio::time::sleep(PAST_RETENTION).await;
    for round in 0..3 {
        let late = h.send(callback(&no, 900)).await;
        assert_eq!(late.status, StatusCode::OK, "{late:?}");
        assert_eq!(late.json()["state"], "PAID");
        assert_eq!(late.json()["credits"], 1);
        if round == 0 {
            assert!(!late.replayed(), "the record had expired: it ran again");
        }
    }
    assert!(h.app.calls.callbacks() >= 2, "the handler ran again");
    assert_eq!(ledger(&h, &no).await, paid(1), "the CAS caught it");
}

async fn callback_for_a_refunded_payment_is_409_and_books_nothing(
    backend: Backend,
    via: Via,
    wiring: Wiring,
) {
    let Some(h) = harness(backend, via, wiring, true).await else {
        return;
    };
    let no = h.unique("P-refunded");
    create_payment(&h, &no, 1100).await;
    assert_eq!(h.send(callback(&no, 1100)).await.status, StatusCode::OK);
    let refunded = h.send(refund(&no)).await;
    assert_eq!(refunded.status, StatusCode::OK, "{refunded:?}");
    assert_eq!(refunded.json()["state"], "REFUNDED");
    tokio::time::sleep(PAST_RETENTION).await;
    for _ in 0..3 {
        let late = h.send(callback(&no, 1100)).await;
        assert_eq!(late.status, StatusCode::CONFLICT, "{late:?}");
        assert!(!late.replayed());
        assert!(late.json()["error"].as_str().unwrap().contains("REFUNDED"));
    }
    assert_eq!(
        ledger(&h, &no).await,
        ("REFUNDED".to_owned(), 1, 1),
        "one credit, one reversal, nothing more"
    );
}

async fn refund_applies_once_and_only_to_a_paid_payment(
    backend: Backend,
    via: Via,
    wiring: Wiring,
) {
    let Some(h) = harness(backend, via, wiring, false).await else {
        return;
    };
    let no = h.unique("P-refund");
    create_payment(&h, &no, 300).await;
    let early = h.send(refund(&no)).await;
    assert_eq!(early.status, StatusCode::CONFLICT, "an unpaid payment");
    assert_eq!(ledger(&h, &no).await, ("WAIT_PAY".to_owned(), 0, 0));
    assert_eq!(h.send(callback(&no, 300)).await.status, StatusCode::OK);
    for reply in h.send_together(10, refund(&no)).await {
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert_eq!(reply.json()["state"], "REFUNDED");
    }
    assert_eq!(ledger(&h, &no).await, ("REFUNDED".to_owned(), 1, 1));
    let missing = h.send(refund(&h.unique("P-missing"))).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let mismatch = h.send(callback(&h.unique("P-missing"), 1)).await;
    assert_eq!(mismatch.status, StatusCode::NOT_FOUND);
}
