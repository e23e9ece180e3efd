//! Request and response bodies: the fingerprint (the same key with
//! another body is a 422, a reserialized JSON body is the same request),
//! the request body cap (413, nothing claimed) and the stored response cap
//! (the first client gets it whole, duplicates a 409 not-replayable).

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use idem_tower::{Idempotency, MemoryStore};
use tower::Layer;

use crate::fixtures::{ORDER, OTHER_ORDER, counting, created, json, streamed};
use crate::support::{Calls, KEY_HEADER, post, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_with_a_different_body_is_422_and_does_not_rerun() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let first = send(&service, post("/orders", Some("k-mismatch"), ORDER)).await;
    let other = send(&service, post("/orders", Some("k-mismatch"), OTHER_ORDER)).await;
    let again = send(&service, post("/orders", Some("k-mismatch"), ORDER)).await;

    assert_eq!(first.status, StatusCode::CREATED);
    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "fingerprint-mismatch");
    assert!(again.replayed(), "the mismatch left the record alone");
    assert_eq!(again.body, first.body);
    assert_eq!(calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reserialized_json_body_is_the_same_request() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let first = send(&service, post("/orders", Some("k-json"), ORDER)).await;
    let reformatted = "{\n  \"qty\" : 2,\n  \"sku\" : \"A-1\"\n}\n";
    let retry = send(&service, post("/orders", Some("k-json"), reformatted)).await;

    assert_eq!(calls.get(), 1);
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mismatch_is_reported_before_the_in_flight_conflict() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        created(n)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post("/orders", Some("k-early"), ORDER)).await }
    });
    calls.wait_for(1).await;
    let other = send(&service, post("/orders", Some("k-early"), OTHER_ORDER)).await;
    let same = send(&service, post("/orders", Some("k-early"), ORDER)).await;
    let first = first.await.expect("no panic");

    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "fingerprint-mismatch");
    same.assert_problem(StatusCode::CONFLICT, "in-flight");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_over_the_cap_with_content_length_is_413_and_claims_nothing() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_body(64)
        .build();
    let service = idem.layer().layer(inner);
    let big = format!(r#"{{"sku":"A-1","note":"{}"}}"#, "x".repeat(200));

    let mut oversize = post("/orders", Some("k-big"), &big);
    oversize
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(big.len()));
    let rejected = send(&service, oversize).await;
    rejected.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large");
    assert_eq!(calls.get(), 0);

    // Nothing was claimed: the same key with a small body runs, and is not
    // a fingerprint mismatch against the rejected request.
    let small = send(&service, post("/orders", Some("k-big"), ORDER)).await;
    assert_eq!(small.status, StatusCode::CREATED, "{small:?}");
    assert!(!small.replayed());
    assert_eq!(calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_body_over_the_cap_without_content_length_is_413_and_claims_nothing() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move { created(n) });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_body(64)
        .build();
    let service = idem.layer().layer(inner);

    let chunks = (0..4).map(|i| Bytes::from(vec![b'a' + i; 32])).collect();
    let oversize = Request::post("/orders")
        .header(KEY_HEADER, "k-stream-big")
        .body(streamed(chunks))
        .expect("a valid request");
    assert!(!oversize.headers().contains_key(header::CONTENT_LENGTH));
    assert_eq!(http_body::Body::size_hint(oversize.body()).upper(), None);
    let rejected = send(&service, oversize).await;
    rejected.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large");
    assert_eq!(calls.get(), 0);

    let small = send(&service, post("/orders", Some("k-stream-big"), ORDER)).await;
    assert_eq!(small.status, StatusCode::CREATED, "{small:?}");
    assert!(!small.replayed());
    assert_eq!(calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_body_under_the_cap_reaches_the_handler_whole() {
    let calls = Calls::default();
    let inner = counting(&calls, |_, request: Request<Body>| async move {
        let received = request
            .into_body()
            .collect()
            .await
            .expect("the buffered body")
            .to_bytes();
        json(
            StatusCode::CREATED,
            String::from_utf8(received.to_vec()).expect("UTF-8"),
        )
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let chunks = [&ORDER[..5], &ORDER[5..12], &ORDER[12..]]
        .into_iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect();
    let request = Request::post("/orders")
        .header(KEY_HEADER, "k-stream")
        .body(streamed(chunks))
        .expect("a valid request");
    let first = send(&service, request).await;
    // The same bytes sent whole are the same request.
    let again = send(&service, post("/orders", Some("k-stream"), ORDER)).await;

    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.text(), ORDER, "the handler saw the whole body");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(calls.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn response_too_large_to_store_reaches_the_first_client_whole_and_is_not_replayable() {
    let calls = Calls::default();
    let big: Bytes = (0..4096u32).map(|i| b'a' + (i % 26) as u8).collect();
    let inner = counting(&calls, {
        let big = big.clone();
        move |_, _| {
            let big = big.clone();
            async move {
                Response::builder()
                    .status(StatusCode::OK)
                    .body(Full::new(big))
                    .expect("a valid response")
            }
        }
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_stored_response(1024)
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/reports", Some("k-big-response"), ORDER);

    let first = send(&service, request()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, big, "the first client gets the whole body");

    for _ in 0..2 {
        let duplicate = send(&service, request()).await;
        duplicate.assert_problem(StatusCode::CONFLICT, "not-replayable");
    }
    assert_eq!(calls.get(), 1, "not replayable is not a re-run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_response_too_large_to_store_reaches_the_first_client_in_order() {
    let calls = Calls::default();
    let chunks: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![b'a' + i; 512])).collect();
    let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let inner = counting(&calls, {
        let chunks = chunks.clone();
        move |_, _| {
            let chunks = chunks.clone();
            async move {
                Response::builder()
                    .status(StatusCode::OK)
                    .body(streamed(chunks))
                    .expect("a valid response")
            }
        }
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .max_stored_response(1024)
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/reports", Some("k-big-stream"), ORDER);

    let first = send(&service, request()).await;
    let duplicate = send(&service, request()).await;

    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, expected, "every chunk, in order");
    duplicate.assert_problem(StatusCode::CONFLICT, "not-replayable");
    assert_eq!(calls.get(), 1);
}
