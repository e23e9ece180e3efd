//! When the attempt fails: the handler's 5xx, 429 and 409, service errors
//! and panics release the key for a retry, deterministic 4xx are kept, an
//! attempt whose handler started runs and is settled even if its client is
//! gone (ARCHITECTURE.md, "Records"). When the store fails:
//! `store_failures.rs`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use futures_util::{FutureExt, StreamExt};
use http::{Request, Response, StatusCode};
use idem_tower::{Idempotency, InFlightPolicy, MemoryStore};
use tower::{Layer, ServiceExt, service_fn};

use crate::fixtures::{ORDER, WatchedStore, counting, created, json, order_body, past_in_flight};
use crate::support::{Calls, Reply, post, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_error_releases_the_key_so_the_retry_runs_and_its_success_is_replayed() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            json(
                StatusCode::INTERNAL_SERVER_ERROR,
                r#"{"error":"boom"}"#.into(),
            )
        } else {
            created(n)
        }
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-5xx"), ORDER);

    let failed = send(&service, request()).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!failed.replayed());

    let retry = send(&service, request()).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed(), "the retry ran: {retry:?}");
    assert_eq!(retry.text(), order_body(2));
    assert_eq!(calls.get(), 2);

    let replay = send(&service, request()).await;
    assert!(replay.replayed());
    assert_eq!(replay.text(), order_body(2));
    assert_eq!(calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn too_many_requests_and_conflict_from_the_handler_release_the_key() {
    for status in [StatusCode::TOO_MANY_REQUESTS, StatusCode::CONFLICT] {
        let calls = Calls::default();
        let inner = counting(&calls, move |n, _| async move {
            if n == 1 {
                json(status, r#"{"error":"not now"}"#.into())
            } else {
                created(n)
            }
        });
        let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
        let request = || post("/orders", Some("k-transient"), ORDER);

        let refused = send(&service, request()).await;
        let retry = send(&service, request()).await;
        let replay = send(&service, request()).await;

        assert_eq!(refused.status, status);
        assert_eq!(retry.status, StatusCode::CREATED, "{status}: {retry:?}");
        assert!(!retry.replayed(), "{status}: the retry ran");
        assert!(replay.replayed());
        assert_eq!(replay.text(), order_body(2));
        assert_eq!(calls.get(), 2, "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deterministic_client_errors_from_the_handler_are_stored_and_replayed() {
    for status in [StatusCode::NOT_FOUND, StatusCode::UNPROCESSABLE_ENTITY] {
        let calls = Calls::default();
        let inner = counting(&calls, move |n, _| async move {
            json(
                status,
                format!(r#"{{"error":"no such sku","attempt":{n}}}"#),
            )
        });
        let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
        let request = || post("/orders", Some("k-4xx"), ORDER);

        let first = send(&service, request()).await;
        let again = send(&service, request()).await;

        assert_eq!(first.status, status);
        assert_eq!(again.status, status);
        assert!(again.replayed(), "{status}: {again:?}");
        assert_eq!(again.body, first.body);
        assert_eq!(calls.get(), 1, "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_error_releases_the_key() {
    let calls = Calls::default();
    let inner = {
        let calls = calls.clone();
        service_fn(move |_: Request<Body>| {
            let n = calls.run();
            async move {
                if n == 1 {
                    Err(std::io::Error::other("connection reset"))
                } else {
                    Ok(created(n))
                }
            }
        })
    };
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-err"), ORDER);

    let failed = service.clone().oneshot(request()).await;
    assert!(failed.is_err(), "the service error is passed on");
    let retry = Reply::read(service.clone().oneshot(request()).await.expect("ok")).await;

    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(calls.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panicking_handler_propagates_the_panic_and_releases_the_key() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            panic!("handler blew up on its first call");
        }
        created(n)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-panic"), ORDER);

    let panicked = tokio::spawn(service.clone().oneshot(request()))
        .await
        .expect_err("the panic propagates");
    assert!(panicked.is_panic());
    assert_eq!(calls.get(), 1);

    let retry = send(&service, request()).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(retry.text(), order_body(2));
    let replay = send(&service, request()).await;
    assert!(replay.replayed());
    assert_eq!(calls.get(), 2);
}

/// A client that gives up while the handler runs does not cancel it: the
/// handler's effect may be half made, and a retry must not make it again.
/// The handler runs to its end on a task of its own, its outcome is stored,
/// and the retry gets 409 while it runs, then the replay (ARCHITECTURE.md,
/// "Records").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_gone_mid_handler_does_not_cancel_it_and_the_retry_gets_the_replay() {
    let calls = Calls::default();
    let effects = Calls::default();
    let inner = counting(&calls, {
        let effects = effects.clone();
        move |n, _| {
            let effects = effects.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                effects.run();
                created(n)
            }
        }
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-gone"), ORDER);

    let cut_off = tokio::time::timeout(Duration::from_millis(100), send(&service, request())).await;
    assert!(cut_off.is_err(), "the first request was cut off");
    assert_eq!(calls.get(), 1);

    let while_running = send(&service, request()).await;
    while_running.assert_problem(StatusCode::CONFLICT, "in-flight");

    let retry = past_in_flight(&service, request, Duration::from_secs(5)).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.text(), order_body(1));
    assert_eq!(calls.get(), 1, "the retry ran the handler again");
    assert_eq!(effects.get(), 1, "the abandoned handler did not finish");
}

/// The abandoned handler's outcome is settled like any other: a non-final
/// one (here a 503 after the client left) releases the key at once, and the
/// retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_gone_mid_handler_whose_outcome_is_not_final_frees_the_key_at_its_end() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"error":"busy"}"#.into(),
            );
        }
        created(n)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-gone-503"), ORDER);

    let cut_off = tokio::time::timeout(Duration::from_millis(100), send(&service, request())).await;
    assert!(cut_off.is_err(), "the first request was cut off");

    // The lease is the default minute: only the release frees the key
    // this soon.
    let retry = past_in_flight(&service, request, Duration::from_secs(2)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(retry.text(), order_body(2));
    assert_eq!(calls.get(), 2);
}

/// A client that gives up before its key is claimed (here, while its body
/// is still arriving) takes its request with it: nothing is finished on its
/// behalf, nothing holds the key, and the retry runs as a first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_gone_before_the_claim_leaves_nothing_behind() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let slow_body = || {
        let chunks = futures_util::stream::iter([ORDER]).then(|chunk| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, Infallible>(chunk)
        });
        Request::post("/orders")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", "k-gone-early")
            .body(Body::from_stream(chunks))
            .expect("a valid request")
    };

    let cut_off =
        tokio::time::timeout(Duration::from_millis(50), send(&service, slow_body())).await;
    assert!(cut_off.is_err(), "the first request was cut off");
    // Past the moment the body would have arrived, had anything kept
    // reading it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(calls.get(), 0, "the abandoned request ran the handler");

    let retry = send(&service, post("/orders", Some("k-gone-early"), ORDER)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(calls.get(), 1);
}

/// A duplicate waiting for the first attempt (`InFlightPolicy::Wait`) whose
/// client goes away stops trying the store: its attempt goes on on a task
/// (its claim may already be on its way), but waits no longer for a
/// client that is not there. The store's claims are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_whose_client_left_stops_trying_the_store() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        created(n)
    });
    let store = WatchedStore::default();
    let claims = store.claims.clone();
    let service = Idempotency::builder(store)
        .in_flight(InFlightPolicy::Wait(Duration::from_secs(5)))
        .build()
        .layer()
        .layer(inner);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post("/orders", Some("k-left"), ORDER)).await }
    });
    calls.wait_for(1).await;
    let cut_off = tokio::time::timeout(
        Duration::from_millis(100),
        send(&service, post("/orders", Some("k-left"), ORDER)),
    )
    .await;
    assert!(
        cut_off.is_err(),
        "the duplicate was answered while it waited"
    );
    // Past the try the duplicate had begun when its client left.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let settled = claims.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        claims.load(Ordering::SeqCst),
        settled,
        "the duplicate kept trying the store after its client left"
    );

    let first = first.await.expect("no panic");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(calls.get(), 1);
}

/// Once the handler has returned a final response its effect has happened;
/// a client disconnecting while the layer reads that response for storage
/// must not free the key for a second execution (ARCHITECTURE.md,
/// "Records": a consumed key after a failed attempt is the opposite
/// mistake; this is the "effect applied twice" one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancellation_after_the_handler_returned_does_not_run_it_again() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        let chunks = futures_util::stream::iter([
            (Duration::ZERO, format!(r#"{{"order_id":{n},"#)),
            (Duration::from_millis(500), r#""state":"paid"}"#.to_owned()),
        ])
        .then(|(delay, chunk)| async move {
            tokio::time::sleep(delay).await;
            Ok::<_, Infallible>(chunk)
        });
        Response::builder()
            .status(StatusCode::CREATED)
            .body(Body::from_stream(chunks))
            .expect("a valid response")
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let request = || post("/orders", Some("k-late-cancel"), ORDER);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    calls.wait_for(1).await;
    // The handler has returned; the layer is reading its body.
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    assert!(first.await.expect_err("aborted").is_cancelled());
    tokio::time::sleep(Duration::from_millis(100)).await;

    let retry = send(&service, request()).await;
    assert_eq!(
        calls.get(),
        1,
        "the handler completed once; the retry ran it again: {retry:?}"
    );
    assert!(
        retry.status == StatusCode::CONFLICT || retry.replayed(),
        "{retry:?}"
    );
    // The work the aborted request left (reading the body, storing it) went
    // on without it: once the body is complete, retries replay it whole.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = send(&service, request()).await;
    assert!(later.replayed(), "{later:?}");
    assert_eq!(later.text(), r#"{"order_id":1,"state":"paid"}"#);
    assert_eq!(calls.get(), 1);
}

/// On a store that answers at once, a first request settles inside its own
/// future: no task is spawned for it. Polled once, with no tokio runtime to
/// spawn on, it is done, and its response is stored.
#[test]
fn a_first_request_settles_in_place_without_a_task() {
    let calls = Calls::default();
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .layer(counting(&calls, |n, _| async move { created(n) }));
    let poll_once = |request| {
        service
            .clone()
            .oneshot(request)
            .now_or_never()
            .expect("the request waited on something")
            .expect("the service answers")
    };

    let first = poll_once(post("/orders", Some("k-in-place"), ORDER));
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = poll_once(post("/orders", Some("k-in-place"), ORDER));
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.get(), 1);
}
