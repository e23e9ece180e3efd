//! What the orders app's `GET /metrics` says after known traffic: requests
//! by outcome and matched route, claim latency and the keys duplicates hit
//! most. In a test binary of its own: the metrics recorder is process-wide.
//! The recorder is the one the `orders` binary installs
//! (`app/tests/processes/metrics.rs` scrapes the binary itself).

use http::StatusCode;
use idem_app::orders::{App, install_prometheus};
use idem_test_support::prometheus::metric as value;
use idem_tests::{Call, Harness};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_outcome_and_route_and_the_most_collided_keys() {
    let mut app = App::in_memory(true);
    app.prometheus = Some(install_prometheus().expect("the only recorder in this binary"));
    let h = Harness::serve(app).await;

    for _ in 0..10 {
        let reply = h.send(h.order("m", "ann", "storm", 100)).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let mismatch = h.send(h.order("m", "ann", "storm", 101)).await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    let other = h.send(h.order("m", "bob", "calm", 100)).await;
    assert_eq!(other.status, StatusCode::CREATED);
    let missing = Call::post("/orders", &json!({"sku": "x", "qty": 1, "amount_cents": 1}))
        .header("x-tenant-id", "m")
        .header("authorization", "Bearer ann");
    assert_eq!(h.send(missing).await.status, StatusCode::BAD_REQUEST);

    // A route with a path parameter: labelled by its pattern, never its path.
    let payment_no = h.unique("P-metrics");
    let created = Call::post(
        "/payments",
        &json!({"payment_no": payment_no, "amount_cents": 500}),
    );
    assert_eq!(h.send(created).await.status, StatusCode::CREATED);
    let callback = || {
        Call::post(
            &format!("/payments/{payment_no}/callback"),
            &json!({"status": "PAID", "amount_cents": 500}),
        )
    };
    assert_eq!(h.send(callback()).await.status, StatusCode::OK);
    assert!(h.send(callback()).await.replayed());

    let text = String::from_utf8(h.send(Call::get("/metrics")).await.body.to_vec()).unwrap();
    let orders = |o: &str| {
        value(
            &text,
            "idem_requests_total",
            &[("outcome", o), ("route", "/orders")],
        )
    };
    assert_eq!(orders("first"), Some(2.0), "{text}");
    assert_eq!(orders("replayed"), Some(9.0), "{text}");
    assert_eq!(orders("mismatch"), Some(1.0), "{text}");
    assert_eq!(orders("missing_key"), Some(1.0), "{text}");
    let callbacks = |o: &str| {
        value(
            &text,
            "idem_requests_total",
            &[("outcome", o), ("route", "/payments/{payment_no}/callback")],
        )
    };
    assert_eq!(callbacks("first"), Some(1.0), "{text}");
    assert_eq!(callbacks("replayed"), Some(1.0), "{text}");
    assert!(
        !text.contains(&format!("route=\"/payments/{payment_no}")),
        "a path is never a label: {text}"
    );
    assert_eq!(
        value(&text, "idem_requests_total", &[]),
        Some(15.0),
        "every request, on a named route: {text}"
    );
    assert!(
        text.contains("# TYPE idem_claim_seconds histogram"),
        "{text}"
    );
    assert_eq!(
        value(&text, "idem_claim_seconds_count", &[("route", "/orders")]),
        Some(12.0),
        "the claims of the keyed orders (not the one without a key): {text}"
    );
    assert_eq!(value(&text, "orders_handler_calls_total", &[]), Some(2.0));

    let storm_key = format!("order-create:{}:ann:storm", h.unique("m"));
    assert_eq!(
        value(&text, "idem_key_duplicates", &[("key", &storm_key)]),
        Some(10.0),
        "{text}"
    );
    assert!(
        !text.contains(":bob:calm"),
        "a key without duplicates never collided"
    );
}
