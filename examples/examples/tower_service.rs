//! The plain `IdempotencyLayer` on a tower service that is not axum: a
//! `service_fn` over `http` requests, its key naming a path parameter that
//! `.route(...)` tells the layer how to find (docs/keys.md).
//!
//! ```text
//! cargo run -p idem-examples --example tower_service
//! ```
//!
//! Needs no server: it calls the service in process with `oneshot`, as any
//! tower-based server (hyper, or tonic with the `grpc` feature) would, and
//! prints each answer.
//! `idem.layer()` instead keys by method, route and the `Idempotency-Key`
//! header, with no template to write.
#![allow(clippy::print_stdout, reason = "the example prints what happened")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_tower::{Idempotency, MemoryStore};
use tower::{ServiceBuilder, ServiceExt, service_fn};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let refunds = Arc::new(AtomicU64::new(0));
    let made = refunds.clone();
    // The service: refunds the charge named in the path, once per key.
    let refund = service_fn(move |request: Request<Full<Bytes>>| {
        let n = made.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let body = format!("refund {n} of {}", request.uri().path());
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::from(body)))
                    .expect("a valid response"),
            )
        }
    });

    let idem = Idempotency::new(MemoryStore::new());
    let service = ServiceBuilder::new()
        .layer(
            idem.layer_with_key("refund:{path:charge_id}:{header:idempotency-key}")?
                // No axum router to say which route matched: name it here.
                .route("/charges/{charge_id}/refund"),
        )
        .service(refund);

    for (what, charge, key) in [
        ("first request", "ch_1", "k-1"),
        ("retry", "ch_1", "k-1"),
        ("same key, other charge", "ch_2", "k-1"),
    ] {
        let request = Request::post(format!("/charges/{charge}/refund"))
            .header("Idempotency-Key", key)
            .body(Full::default())?;
        let response = service.clone().oneshot(request).await?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let body = response.into_body().collect().await?.to_bytes();
        println!(
            "{what:<22} -> {status}, replayed: {replayed}, {}",
            String::from_utf8_lossy(&body)
        );
    }
    println!("refunds made: {}", refunds.load(Ordering::SeqCst));
    Ok(())
}
