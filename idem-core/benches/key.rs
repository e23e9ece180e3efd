//! Building a key and fingerprinting a 1 KiB JSON body.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, Method};
use idem_core::{Fingerprint, FingerprintSpec, KeyTemplate, RequestView};

fn body_1kib() -> Vec<u8> {
    let items: Vec<String> = (0..36)
        .map(|i| format!(r#"{{"sku":"SKU-{i:04}","qty":{i}}}"#))
        .collect();
    let body = format!(
        r#"{{"order_no":"ORD-2026-000123","amount_cents":129900,"items":[{}]}}"#,
        items.join(",")
    );
    assert!((900..1200).contains(&body.len()), "{}", body.len());
    body.into_bytes()
}

fn bench(c: &mut Criterion) {
    let template: KeyTemplate = "order-create:{tenant}:{user}:{header:idempotency-key}"
        .parse()
        .unwrap();
    let body_template: KeyTemplate = "refund:{tenant}:{body:/order_no}".parse().unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        "idempotency-key",
        "8e03978e-40d5-43e8-bc93-6894a57f9324".parse().unwrap(),
    );
    let body = body_1kib();
    let method = Method::POST;
    let view = || {
        RequestView::new(&method, "/orders", &headers)
            .body(&body)
            .tenant(Some("acme"))
            .user(Some("user-42"))
    };

    c.bench_function("key/header template", |b| {
        b.iter(|| black_box(template.evaluate(&view(), "idem:").unwrap()))
    });
    c.bench_function("key/body template (parses 1 KiB JSON)", |b| {
        b.iter(|| black_box(body_template.evaluate(&view(), "idem:").unwrap()))
    });
    c.bench_function("fingerprint/1 KiB JSON body", |b| {
        b.iter(|| black_box(Fingerprint::of(&view(), &FingerprintSpec::Request).unwrap()))
    });
    c.bench_function("key + fingerprint/1 KiB JSON body", |b| {
        b.iter(|| {
            let v = view();
            let key = template.evaluate(&v, "idem:").unwrap();
            black_box((key, Fingerprint::of(&v, &FingerprintSpec::Request).unwrap()))
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
