//! The idempotency layer's overhead over the bare service, with the
//! in-memory store, each request sent through `oneshot` and its body read:
//!
//! - `bare service`: a `service_fn` answering a small JSON `201`;
//! - `layered/first request`: the same service behind the layer, a fresh key
//!   every iteration (buffer, key, fingerprint, claim, call, store);
//! - `layered/replay`: the same service behind the layer (on a store of its
//!   own), replaying one completed key (buffer, key, fingerprint, claim
//!   answered with the stored response).
//!
//! ```text
//! cargo bench -p idem-tower --bench layer
//! ```

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use idem_tower::{Idempotency, MemoryStore};
use tower::{Layer, Service, ServiceExt, service_fn};

const ORDER: &str = r#"{"sku":"SKU-0042","qty":2,"amount_cents":1299}"#;
const CREATED: &str = r#"{"order_id":42,"sku":"SKU-0042","qty":2,"amount_cents":1299}"#;

/// The one inner service of every case: a small JSON `201`, counting its
/// calls so the benchmark can check the layer really replays.
fn orders(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    service_fn(move |_request: Request<Full<Bytes>>| {
        calls.fetch_add(1, Ordering::Relaxed);
        async {
            Ok(Response::builder()
                .status(StatusCode::CREATED)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::LOCATION, "/orders/42")
                .body(Full::new(Bytes::from_static(CREATED.as_bytes())))
                .expect("a valid response"))
        }
    })
}

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(ORDER.as_bytes())))
        .expect("a valid request")
}

/// Sends `request` through a clone of `service` and reads the whole body.
async fn roundtrip<S, B>(service: &S, request: Request<Full<Bytes>>) -> (StatusCode, Bytes)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let response = service.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let body = response.into_body().collect().await.expect("a body");
    (status, body.to_bytes())
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let calls = Arc::new(AtomicUsize::new(0));
    let bare = orders(Arc::clone(&calls));
    // Two stores: the fresh keys of one case fill their store to its
    // capacity, and MemoryStore evicts when full, which would forget the
    // replayed key of the other.
    let layered = Idempotency::new(MemoryStore::new())
        .layer()
        .layer(orders(Arc::clone(&calls)));
    let replaying = Idempotency::new(MemoryStore::new())
        .layer()
        .layer(orders(Arc::clone(&calls)));

    // The replayed key, completed once up front.
    runtime.block_on(async {
        let (status, body) = roundtrip(&replaying, request("bench-replay")).await;
        assert_eq!(
            (status, &body[..]),
            (StatusCode::CREATED, CREATED.as_bytes())
        );
        let replay = replaying
            .clone()
            .oneshot(request("bench-replay"))
            .await
            .expect("an answer");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
    });

    let mut group = c.benchmark_group("layer");
    group.bench_function("bare service", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(roundtrip(&bare, request("bench-bare")).await) })
    });

    let next_key = AtomicU64::new(0);
    group.bench_function("layered/first request (fresh key)", |b| {
        b.to_async(&runtime).iter(|| {
            let key = format!("bench-fresh-{}", next_key.fetch_add(1, Ordering::Relaxed));
            let layered = &layered;
            async move { black_box(roundtrip(layered, request(&key)).await) }
        })
    });

    let before = calls.load(Ordering::Relaxed);
    group.bench_function("layered/replay", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(roundtrip(&replaying, request("bench-replay")).await) })
    });
    assert_eq!(
        calls.load(Ordering::Relaxed),
        before,
        "replays never reach the inner service"
    );
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
