//! The handler's view of its operation: the same identity, and the same
//! outbound keys, on every run of one operation; others for another key or
//! another caller; nothing without a secret (ARCHITECTURE.md, "Calls out
//! of a handler").

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, Response, StatusCode};
use idem_tower::{Idempotency, MemoryStore, Operation, Resolver};
use tower::service_fn;

use crate::fixtures::{ORDER, OTHER_ORDER};
use crate::support::{Calls, post as post_request, send};

const SECRET: [u8; 32] = *b"layer tests' outbound key secret";

/// What each run of the handler saw: its operation's id and its key for
/// `"psp-charge"`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, String)>>>);

impl Seen {
    fn push(&self, operation: &Operation) {
        let key = operation.key_for("psp-charge").as_str().to_owned();
        self.0.lock().unwrap().push((operation.id(), key));
    }

    fn all(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap().clone()
    }
}

/// A router whose handler records its operation and fails its first `fail`
/// runs with a 503 (released: the client may retry).
fn app(idem: &Idempotency, calls: &Calls, seen: &Seen, fail: usize) -> Router {
    let (calls, seen) = (calls.clone(), seen.clone());
    let handler = move |operation: Operation| {
        let (calls, seen) = (calls.clone(), seen.clone());
        async move {
            let run = calls.run();
            seen.push(&operation);
            if run <= fail {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::CREATED
            }
        }
    };
    Router::new().route(
        "/pay",
        post(handler).layer(
            idem.layer_with_key("pay:{tenant}:{header:idempotency-key}")
                .unwrap(),
        ),
    )
}

fn handle() -> Idempotency {
    Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .outbound_key_secret(SECRET)
        .build()
}

fn pay(tenant: &str, key: &str) -> Request<Body> {
    let mut request = post_request("/pay", Some(key), ORDER);
    request
        .headers_mut()
        .insert("x-tenant-id", tenant.parse().unwrap());
    request
}

#[tokio::test]
async fn every_run_of_an_operation_sees_the_same_identity_and_keys() {
    let (calls, seen) = (Calls::default(), Seen::default());
    let app = app(&handle(), &calls, &seen, 2);
    for expected in [503, 503, 201] {
        let reply = send(&app, pay("acme", "order-42")).await;
        assert_eq!(reply.status.as_u16(), expected);
    }
    // A replay runs nothing.
    assert!(send(&app, pay("acme", "order-42")).await.replayed());
    assert_eq!(calls.get(), 3);
    let seen = seen.all();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|run| *run == seen[0]), "{seen:?}");
    let (id, key) = &seen[0];
    assert_eq!(id.len(), 64);
    assert_ne!(id, key);
    for part in ["acme", "order-42"] {
        assert!(!id.contains(part) && !key.contains(part));
    }
}

#[tokio::test]
async fn operations_differ_per_key_and_per_caller() {
    let (calls, seen) = (Calls::default(), Seen::default());
    let app = app(&handle(), &calls, &seen, 0);
    for (tenant, key) in [
        ("acme", "order-42"),
        ("acme", "order-43"),
        ("zeta", "order-42"),
    ] {
        assert_eq!(
            send(&app, pay(tenant, key)).await.status,
            StatusCode::CREATED
        );
    }
    assert_eq!(calls.get(), 3);
    let seen = seen.all();
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            assert_ne!(a.0, b.0);
            assert_ne!(a.1, b.1);
        }
    }
}

#[tokio::test]
async fn instances_with_one_secret_derive_one_operation() {
    // Two handles on one store, as two instances of a deployment: a retry
    // on the second after a failure on the first.
    let store = MemoryStore::new();
    let instance = || {
        Idempotency::builder(store.clone())
            .tenant(Resolver::header("x-tenant-id"))
            .outbound_key_secret(SECRET)
            .build()
    };
    let (calls, seen) = (Calls::default(), Seen::default());
    let first = app(&instance(), &calls, &seen, 1);
    let second = app(&instance(), &calls, &seen, 1);
    assert_eq!(
        send(&first, pay("acme", "order-42")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        send(&second, pay("acme", "order-42")).await.status,
        StatusCode::CREATED
    );
    let seen = seen.all();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], seen[1]);
}

#[tokio::test]
async fn a_tower_service_finds_the_operation_in_its_extensions() {
    let seen = Seen::default();
    let inner = {
        let seen = seen.clone();
        service_fn(move |request: Request<Body>| {
            let seen = seen.clone();
            async move {
                let operation = request.extensions().get::<Operation>().expect("lent");
                seen.push(operation);
                Ok::<_, Infallible>(Response::new(Body::from("made")))
            }
        })
    };
    let idem = handle();
    let layer = idem
        .layer_with_key("pay:{tenant}:{header:idempotency-key}")
        .unwrap();
    let service = tower::Layer::layer(&layer, inner);
    assert_eq!(
        send(&service, pay("acme", "order-42")).await.status,
        StatusCode::OK
    );
    // The same operation through an axum router on the same secret.
    let (calls, axum_seen) = (Calls::default(), Seen::default());
    let router = app(&handle(), &calls, &axum_seen, 0);
    send(&router, pay("acme", "order-42")).await;
    assert_eq!(seen.all(), axum_seen.all());
}

#[tokio::test]
async fn without_a_secret_the_extractor_refuses_and_the_handler_never_runs() {
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build();
    let (calls, seen) = (Calls::default(), Seen::default());
    let app = app(&idem, &calls, &seen, 0);
    let reply = send(&app, pay("acme", "order-42")).await;
    reply.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "misconfigured");
    assert!(
        reply.text().contains("outbound_key_secret"),
        "{}",
        reply.text()
    );
    assert_eq!(calls.get(), 0);
}

#[test]
#[should_panic(expected = "at least 32 bytes")]
fn a_short_secret_is_refused() {
    let _ = Idempotency::builder(MemoryStore::new()).outbound_key_secret(b"short");
}

/// A handler in one phase (a call out counted in `charges`), failing with
/// a 503 after it when told to: the retry of the same request resumes
/// after the phase; another request under the key, once the first's
/// attempt was released, has phases of its own.
#[tokio::test]
async fn phases_resume_a_retry_and_never_another_request() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use idem_tower::MemoryPoints;

    let (charges, points) = (Calls::default(), MemoryPoints::new());
    let fail = Arc::new(AtomicBool::new(true));
    let handler = {
        let (charges, points, fail) = (charges.clone(), points.clone(), fail.clone());
        move |operation: Operation| {
            let (charges, points, fail) = (charges.clone(), points.clone(), fail.clone());
            async move {
                let phases = operation.phases(&points);
                let charged: Result<usize, idem_tower::Error> = phases
                    .call("psp-charge", || async { Ok(charges.run()) })
                    .await;
                match charged {
                    Ok(_) if fail.swap(false, Ordering::SeqCst) => StatusCode::SERVICE_UNAVAILABLE,
                    Ok(_) => StatusCode::CREATED,
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
                }
            }
        }
    };
    let app = Router::new().route(
        "/pay",
        post(handler).layer(
            handle()
                .layer_with_key("pay:{header:idempotency-key}")
                .unwrap(),
        ),
    );

    let first = send(&app, post_request("/pay", Some("k-1"), ORDER)).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    let retry = send(&app, post_request("/pay", Some("k-1"), ORDER)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(charges.get(), 1, "the retry resumed after the charge");

    // Another body under a key whose only attempt was released: a new
    // request, which does not resume the first's phases.
    fail.store(true, Ordering::SeqCst);
    let other = send(&app, post_request("/pay", Some("k-2"), ORDER)).await;
    assert_eq!(other.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(charges.get(), 2);
    let reused = send(&app, post_request("/pay", Some("k-2"), OTHER_ORDER)).await;
    assert_eq!(reused.status, StatusCode::CREATED);
    assert_eq!(charges.get(), 3, "the other body's phase ran");
}
