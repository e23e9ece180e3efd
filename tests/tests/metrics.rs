//! What the orders app's `GET /metrics` says after known traffic: requests
//! by outcome, claim latency and the keys duplicates hit most. In a test
//! binary of its own: the metrics recorder is process-wide.

use http::StatusCode;
use idem_examples::orders::App;
use idem_tests::{Call, Harness};
use metrics_exporter_prometheus::PrometheusBuilder;

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_outcome_and_the_most_collided_keys() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder in this binary");

    let mut app = App::in_memory(true);
    app.prometheus = Some(handle);
    let h = Harness::serve(app).await;

    for _ in 0..10 {
        let reply = h.send(h.order("m", "ann", "storm", 100)).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let mismatch = h.send(h.order("m", "ann", "storm", 101)).await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    let other = h.send(h.order("m", "bob", "calm", 100)).await;
    assert_eq!(other.status, StatusCode::CREATED);
    let missing = Call::post(
        "/orders",
        &serde_json::json!({"sku": "x", "qty": 1, "amount_cents": 1}),
    )
    .header("x-tenant-id", "m")
    .header("authorization", "Bearer ann");
    assert_eq!(h.send(missing).await.status, StatusCode::BAD_REQUEST);

    let text = String::from_utf8(h.send(Call::get("/metrics")).await.body.to_vec()).unwrap();
    let outcome = |o: &str| value(&text, &format!("idem_requests_total{{outcome=\"{o}\"}}"));
    assert_eq!(outcome("first"), Some(2.0), "{text}");
    assert_eq!(outcome("replayed"), Some(9.0), "{text}");
    assert_eq!(outcome("mismatch"), Some(1.0), "{text}");
    assert_eq!(outcome("missing_key"), Some(1.0), "{text}");
    assert!(text.contains("idem_claim_seconds"), "{text}");
    assert_eq!(value(&text, "orders_handler_calls_total"), Some(2.0));

    let storm_key = format!(
        "idem_key_collisions{{key=\"order-create:{}:ann:storm\"}}",
        h.unique("m")
    );
    assert_eq!(value(&text, &storm_key), Some(10.0), "{text}");
    assert!(
        !text.contains(":bob:calm"),
        "a key without duplicates never collided"
    );
}
