//! `GET /metrics` and the Prometheus recorder behind it: what the `orders`
//! binary installs so that idem's metrics (requests by outcome and route,
//! claim latency, lease renewals, the tiered store's counters, the expired
//! records purged) are served
//! next to the app's own (docs/metrics.md), and what the `relay`
//! binary serves with `--metrics-listen` ([`metrics_router`]): the outbox
//! relay's published and retried events by topic, its lag and its purges.

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics::Unit;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use super::{App, BoxError};

/// The claim latency histogram's upper bounds, in seconds: from an
/// in-memory claim (microseconds) through a Redis or SQL round trip
/// (milliseconds) to a duplicate waiting on a row lock (seconds).
pub const CLAIM_SECONDS_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The tiered store's counters, all reported from the start (at 0) once a
/// Redis gate is in front, so that `increase()` sees their first event.
pub const TIER_COUNTERS: &[(&str, &str)] = &[
    (
        "idem_tier_answered_by_gate_total",
        "Claims answered by the Redis gate alone (replay, in flight, mismatch).",
    ),
    (
        "idem_tier_cache_hits_total",
        "Claims answered by the in-process cache of completed records.",
    ),
    (
        "idem_tier_degraded_total",
        "Claims decided by SQL alone because Redis failed, timed out or its breaker was open.",
    ),
    (
        "idem_tier_fallback_caught_total",
        "Duplicates the Redis gate let through and SQL's unique index caught.",
    ),
    (
        "idem_tier_breaker_opened_total",
        "Times the Redis circuit breaker opened.",
    ),
    (
        "idem_tier_breaker_recovered_total",
        "Times a probe found Redis back and closed the breaker.",
    ),
];

/// A Prometheus recorder for the app: `idem_claim_seconds` renders as a
/// histogram with [`CLAIM_SECONDS_BUCKETS`] (aggregatable across instances
/// with `histogram_quantile`), other histograms as summaries.
pub fn prometheus_recorder() -> PrometheusRecorder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("idem_claim_seconds".to_owned()),
            CLAIM_SECONDS_BUCKETS,
        )
        .expect("CLAIM_SECONDS_BUCKETS is not empty")
        .build_recorder()
}

/// Installs [`prometheus_recorder`] as this process's `metrics` recorder,
/// describes idem's metrics, and returns the handle `GET /metrics` renders
/// from (put it in [`App::prometheus`](super::App::prometheus)). Once per
/// process: a second call fails. Nothing drains the histograms between
/// scrapes unless the caller runs [`PrometheusHandle::run_upkeep`] now and
/// then (the binary does, every few seconds).
pub fn install_prometheus() -> Result<PrometheusHandle, BoxError> {
    let recorder = prometheus_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    metrics::describe_counter!(
        "idem_requests_total",
        "Requests through the idempotency layer, by outcome and matched route pattern."
    );
    metrics::describe_histogram!(
        "idem_claim_seconds",
        Unit::Seconds,
        "Time to claim an idempotency key in the store, by matched route pattern."
    );
    metrics::describe_counter!(
        "idem_lease_renewals_total",
        "Lease renewals of plain claims while their handlers run, by result (ok, failed, lost) and matched route pattern."
    );
    metrics::describe_counter!(
        "idem_completions_total",
        "Completions of plain claims, by result (ok, retried, lost, failed: an effect left without its record) and matched route pattern."
    );
    for (name, help) in TIER_COUNTERS {
        metrics::describe_counter!(*name, *help);
    }
    metrics::describe_counter!(
        "idem_records_purged_total",
        "Expired idempotency records deleted by the SQL store's purge."
    );
    describe_outbox_metrics();
    Ok(handle)
}

/// The outbox relay's metrics (idem's `Relay` records them).
fn describe_outbox_metrics() {
    metrics::describe_counter!(
        "idem_outbox_published_total",
        "Outbox events published and marked sent, by topic."
    );
    metrics::describe_counter!(
        "idem_outbox_retried_total",
        "Outbox event publishes that failed and were put back for a retry, by topic."
    );
    metrics::describe_gauge!(
        "idem_outbox_lag_seconds",
        Unit::Seconds,
        "Age of the oldest unsent outbox event, as of the relay's last look (every idle pass, every second while busy)."
    );
    metrics::describe_counter!(
        "idem_outbox_already_stored_total",
        "Outbox event publishes the broker had already stored (a re-publish its deduplication caught), by topic."
    );
    metrics::describe_counter!(
        "idem_outbox_lease_lost_total",
        "Outbox events published after another relay had taken their lease over, by topic."
    );
    metrics::describe_counter!(
        "idem_outbox_purged_total",
        "Sent outbox events deleted once old enough."
    );
}

/// Reports the relay's counters for `topic` at 0, so that they exist
/// before their first event: call it once, after installing the recorder.
pub fn register_outbox_metrics(topic: &str) {
    for name in [
        "idem_outbox_published_total",
        "idem_outbox_retried_total",
        "idem_outbox_already_stored_total",
        "idem_outbox_lease_lost_total",
    ] {
        metrics::counter!(name, "topic" => topic.to_owned()).increment(0);
    }
    metrics::counter!("idem_outbox_purged_total").increment(0);
}

/// `GET /metrics` alone, rendering `handle`: for a process with no other
/// routes (the `relay` binary).
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(async move || {
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                handle.render(),
            )
        }),
    )
}

/// Reports the purged records' counter at 0, so that it exists before the
/// first purge: call it once, after installing the recorder, when the SQL
/// store's purge runs ([`App::purge_in_background`](super::App::purge_in_background)).
pub fn register_purge_counter() {
    metrics::counter!("idem_records_purged_total").increment(0);
}

/// Reports the tiered store's counters at 0, so that they exist before
/// their first event: call it once, after installing the recorder, when a
/// Redis gate is in front.
pub fn register_tier_counters() {
    for (name, _) in TIER_COUNTERS {
        metrics::counter!(*name).increment(0);
    }
}

/// `GET /metrics`: idem's metrics from the installed recorder (if any), the
/// handler call counts, and the keys duplicates hit most.
pub(crate) async fn metrics(State(app): State<App>) -> Response {
    let mut body = app
        .prometheus
        .as_ref()
        .map(PrometheusHandle::render)
        .unwrap_or_default();
    body.push_str(&app.calls.prometheus_text());
    // The keys duplicates hit most, from idem's bounded table: at most ten
    // series, each a key's first 64 characters and its duplicates so far.
    body.push_str(
        "# HELP idem_key_duplicates Duplicates seen per key since start (an upper bound), top ten keys.\n\
         # TYPE idem_key_duplicates gauge\n",
    );
    for top in app.idem.top_duplicated_keys(10) {
        let key = top.key.replace('\\', "\\\\").replace('"', "\\\"");
        body.push_str(&format!(
            "idem_key_duplicates{{key=\"{key}\"}} {}\n",
            top.count
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}
