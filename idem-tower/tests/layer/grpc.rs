//! gRPC calls through the layer: the outcome is the `grpc-status` (in the
//! trailers, or trailers-only), and the layer's own answers are gRPC
//! statuses, never problem+json a gRPC client would read as a message.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use idem_tower::{Idempotency, MemoryStore};
use tower::{Layer, ServiceExt};

use crate::fixtures::{counting, read, with_trailers};
use crate::support::{Calls, KEY_HEADER};

/// A gRPC reply, `grpc-status` in its trailers (or, trailers-only, in its
/// headers with no body).
fn grpc_reply(code: &'static str, trailers_only: bool) -> Response<Body> {
    let mut status = HeaderMap::new();
    status.insert("grpc-status", HeaderValue::from_static(code));
    let builder = Response::builder().header("content-type", "application/grpc");
    if trailers_only {
        let mut response = builder.body(Body::empty()).unwrap();
        response.headers_mut().extend(status);
        response
    } else {
        builder
            .body(Body::new(with_trailers("\0\0\0\0\x02ok", status)))
            .unwrap()
    }
}

fn grpc_call(key: &str) -> Request<Body> {
    Request::post("/payments.Payments/Charge")
        .header("content-type", "application/grpc")
        .header(KEY_HEADER, key)
        .body(Body::from(&b"\0\0\0\0\x03amt"[..]))
        .unwrap()
}

/// gRPC errors are HTTP 200: the outcome is the `grpc-status`. A transient
/// code, in the trailers or trailers-only, releases the key (the retry
/// runs); a deterministic one is kept and replayed with its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grpc_calls_outcome_is_its_grpc_status() {
    for trailers_only in [false, true] {
        let calls = Calls::default();
        let inner = counting(&calls, move |n, _| async move {
            // UNAVAILABLE, then INVALID_ARGUMENT, then (never reached) OK.
            let code = match n {
                1 => "14",
                2 => "3",
                _ => "0",
            };
            grpc_reply(code, trailers_only)
        });
        let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
        let status_of = |(_, _, _, trailers): &(StatusCode, bool, Bytes, Option<HeaderMap>),
                         headers: &HeaderMap| {
            trailers
                .as_ref()
                .and_then(|t| t.get("grpc-status"))
                .or_else(|| headers.get("grpc-status"))
                .cloned()
        };

        let response = service.clone().oneshot(grpc_call("k-grpc")).await.unwrap();
        let headers = response.headers().clone();
        let unavailable = read(response).await;
        assert_eq!(status_of(&unavailable, &headers).unwrap(), "14");
        assert!(!unavailable.1);

        for attempt in 0..3 {
            let response = service.clone().oneshot(grpc_call("k-grpc")).await.unwrap();
            let headers = response.headers().clone();
            let reply = read(response).await;
            assert_eq!(
                status_of(&reply, &headers).unwrap(),
                "3",
                "trailers-only {trailers_only}, attempt {attempt}"
            );
            assert_eq!(
                reply.1,
                attempt > 0,
                "the retry runs, its duplicates replay"
            );
        }
        assert_eq!(
            calls.get(),
            2,
            "UNAVAILABLE released the key, INVALID_ARGUMENT kept it"
        );
    }
}

/// The layer's own answers to a gRPC call, trailers-only statuses whose
/// `grpc-message` says why: a missing key, a call in flight, a key reused
/// for another message. None of them runs the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layers_own_answers_are_grpc_statuses() {
    let calls = Calls::default();
    let inner = counting(&calls, |_, _| async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        grpc_reply("0", false)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let status = |response: &Response<_>| {
        let h: &HeaderMap = response.headers();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(h["content-type"], "application/grpc");
        (
            h["grpc-status"].to_str().unwrap().to_owned(),
            h.get("grpc-message")
                .map(|m| m.to_str().unwrap().to_owned()),
        )
    };

    let mut unkeyed = grpc_call("x");
    unkeyed.headers_mut().remove(KEY_HEADER);
    let missing = service.clone().oneshot(unkeyed).await.unwrap();
    let (code, message) = status(&missing);
    assert_eq!(code, "3", "INVALID_ARGUMENT");
    assert!(message.unwrap().contains("missing"));

    let first = tokio::spawn(service.clone().oneshot(grpc_call("k-own")));
    calls.wait_for(1).await;
    let in_flight = service.clone().oneshot(grpc_call("k-own")).await.unwrap();
    assert_eq!(status(&in_flight).0, "10", "ABORTED while the first runs");
    assert!(in_flight.headers().contains_key("grpc-retry-pushback-ms"));
    let first = read(first.await.unwrap().unwrap()).await;
    assert_eq!(first.3.unwrap()["grpc-status"], "0");

    let mut other = grpc_call("k-own");
    *other.body_mut() = Body::from(&b"\0\0\0\0\x03xyz"[..]);
    let reused = service.clone().oneshot(other).await.unwrap();
    assert_eq!(status(&reused).0, "9", "FAILED_PRECONDITION");
    assert_eq!(calls.get(), 1, "only the first call ran");
}

/// `final_response` sees the whole response, trailers included: here gRPC's
/// `NOT_FOUND` (final by default) is made transient, so the retry with the
/// same key runs, and its `OK` is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_response_policy_sees_the_trailers() {
    fn not_found_is_transient(response: &idem_tower::FinishedResponse<'_>) -> bool {
        response.grpc_status() != Some(5) && idem_tower::final_by_default(response)
    }
    for trailers_only in [false, true] {
        let calls = Calls::default();
        let inner = counting(&calls, move |n, _| async move {
            grpc_reply(if n == 1 { "5" } else { "0" }, trailers_only)
        });
        let idem = Idempotency::builder(MemoryStore::new())
            .final_response(not_found_is_transient)
            .build();
        let service = idem.layer().layer(inner);
        let codes = [
            read(service.clone().oneshot(grpc_call("k-nf")).await.unwrap()).await,
            read(service.clone().oneshot(grpc_call("k-nf")).await.unwrap()).await,
            read(service.clone().oneshot(grpc_call("k-nf")).await.unwrap()).await,
        ];
        let replays: Vec<bool> = codes.iter().map(|c| c.1).collect();
        assert_eq!(
            replays,
            [false, false, true],
            "trailers-only {trailers_only}"
        );
        assert_eq!(calls.get(), 2, "NOT_FOUND released the key; OK was kept");
    }
}

/// Under the default policy, a gRPC reply over `max_stored_response` is
/// settled when the cap is reached, before its trailers: its final status
/// (here `UNAVAILABLE`, which would release a smaller reply's key) is not
/// read, and the key is completed as not replayable, as documented: the
/// retry gets `ALREADY_EXISTS` (6) and the method does not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grpc_reply_too_large_to_store_is_kept_whatever_its_final_status() {
    let calls = Calls::default();
    let inner = counting(&calls, |_, _| async move {
        let mut status = HeaderMap::new();
        status.insert("grpc-status", HeaderValue::from_static("14"));
        // One message of 64 bytes, in its 5-byte frame.
        let message = concat!(
            "\0\0\0\0\x40",
            "xxxxxxxxxxxxxxxx",
            "xxxxxxxxxxxxxxxx",
            "xxxxxxxxxxxxxxxx",
            "xxxxxxxxxxxxxxxx"
        );
        Response::builder()
            .header("content-type", "application/grpc")
            .body(Body::new(with_trailers(message, status)))
            .unwrap()
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_stored_response(16)
        .build();
    let service = idem.layer().layer(inner);
    let first = read(service.clone().oneshot(grpc_call("k-large")).await.unwrap()).await;
    assert_eq!(first.2.len(), 69, "sent whole");
    let trailers = first.3.expect("the reply's trailers");
    assert_eq!(trailers["grpc-status"], "14", "the client sees its status");
    let retry = service.clone().oneshot(grpc_call("k-large")).await.unwrap();
    assert_eq!(retry.headers()["grpc-status"], "6", "{retry:?}");
    assert_eq!(calls.get(), 1);
}

/// A response too large to store is decided on before its end, so a
/// whole-response policy sees no trailers: one it refuses is released (the
/// retry runs), not kept as "completed, not replayable".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_response_policy_also_decides_a_response_too_large_to_store() {
    fn only_created(response: &idem_tower::FinishedResponse<'_>) -> bool {
        response.status() == StatusCode::CREATED
    }
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        let status = if n == 1 {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        };
        let mut response = Response::new(Body::from("x".repeat(64)));
        *response.status_mut() = status;
        response
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_stored_response(16)
        .final_response(only_created)
        .build();
    let service = idem.layer().layer(inner);
    let first = read(service.clone().oneshot(grpc_call("k-big")).await.unwrap()).await;
    assert_eq!((first.0, first.2.len()), (StatusCode::OK, 64), "sent whole");
    let retry = service.clone().oneshot(grpc_call("k-big")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED, "the retry ran");
    assert_eq!(calls.get(), 2);
}
