//! What the layer leaves to stream and what it keeps beyond the body: a
//! request whose optional key is absent from its head passes through with
//! its body unread, and a final response's trailers are sent and replayed.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use idem_tower::{Idempotency, MemoryStore};
use tower::{Layer, ServiceExt};

use crate::fixtures::{counting, read, with_trailers};
use crate::support::{Calls, KEY_HEADER};

/// A request body that has sent `first` and stays open until the sender
/// returned with it is dropped.
async fn open_body(
    first: &'static [u8],
) -> (tokio::sync::mpsc::Sender<Result<Bytes, Infallible>>, Body) {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(4);
    sender.send(Ok(Bytes::from_static(first))).await.unwrap();
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    (sender, Body::from_stream(stream))
}

fn keyed(key: &str) -> Request<Body> {
    Request::post("/payments.Payments/Charge")
        .header(KEY_HEADER, key)
        .body(Body::from("charge 500"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_final_responses_trailers_are_sent_and_replayed() {
    let calls = Calls::default();
    let inner = counting(&calls, |_, _| async move {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("grpc-message", HeaderValue::from_static("charged"));
        trailers.insert("x-debug-trace", HeaderValue::from_static("internal"));
        Response::new(with_trailers("charge-1", trailers))
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let first = read(service.clone().oneshot(keyed("k-trailers")).await.unwrap()).await;
    let (status, replayed, body, trailers) = first;
    assert_eq!(
        (status, replayed, &body[..]),
        (StatusCode::OK, false, &b"charge-1"[..])
    );
    let trailers = trailers.expect("the first response keeps its trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(
        trailers["x-debug-trace"], "internal",
        "sent as the service sent them"
    );

    for _ in 0..3 {
        let (status, replayed, again, trailers) =
            read(service.clone().oneshot(keyed("k-trailers")).await.unwrap()).await;
        assert_eq!(
            (status, replayed, &again[..]),
            (StatusCode::OK, true, &body[..])
        );
        let trailers = trailers.expect("a replay sends the stored trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["grpc-message"], "charged");
        assert!(
            !trailers.contains_key("x-debug-trace"),
            "trailers follow the headers' allow-list: {trailers:?}"
        );
    }
    assert_eq!(calls.get(), 1, "the service ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_response_without_trailers_is_replayed_without_them() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        Response::new(http_body_util::Full::new(Bytes::from(format!("n={n}"))))
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);
    let first = read(service.clone().oneshot(keyed("k-plain")).await.unwrap()).await;
    let again = read(service.clone().oneshot(keyed("k-plain")).await.unwrap()).await;
    assert_eq!((first.3, again.3), (None, None));
    assert!(again.1, "replayed");
    assert_eq!(again.2, first.2);
    assert_eq!(calls.get(), 1);
}

/// An optional route's request without its key is decided from the head:
/// its body is never buffered, so a body that is still streaming (a client
/// stream, a long upload) reaches the service as it comes. Buffering it
/// first would wait for an end that does not come before the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unkeyed_request_on_an_optional_route_streams_its_body_unread() {
    let calls = Calls::default();
    let inner = counting(&calls, |_, request: Request<Body>| async move {
        let mut body = request.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        let data = first.into_data().expect("a data frame");
        Response::new(http_body_util::Full::new(data))
    });
    let layer = Idempotency::new(MemoryStore::new())
        .layer_with_key("upload:{header:idempotency-key}")
        .unwrap()
        .required(false);
    let service = layer.layer(inner);

    let (sender, body) = open_body(b"chunk-1").await;
    let request = Request::post("/uploads").body(body).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), service.oneshot(request))
        .await
        .expect("answered while the request body is still open")
        .unwrap();
    let (status, replayed, body, _) = read(response).await;
    assert_eq!(
        (status, replayed, &body[..]),
        (StatusCode::OK, false, &b"chunk-1"[..])
    );
    assert_eq!(calls.get(), 1);
    drop(sender);
}

/// A layer limited to some paths lets every other request through from its
/// head: no key asked of it, its body streaming unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_path_the_layer_is_not_limited_to_passes_through_unread() {
    let calls = Calls::default();
    let inner = counting(&calls, |_, request: Request<Body>| async move {
        let mut body = request.into_body();
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        Response::new(http_body_util::Full::new(data))
    });
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .only(["/payments.Payments/Charge"])
        .layer(inner);

    let (sender, body) = open_body(b"watching").await;
    let watch = Request::post("/grpc.health.v1.Health/Watch")
        .body(body)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), service.clone().oneshot(watch))
        .await
        .expect("answered while the request stream is open")
        .unwrap();
    let (status, _, body, _) = read(response).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"watching"[..]));
    drop(sender);

    let unkeyed_charge = Request::post("/payments.Payments/Charge")
        .body(Body::from("charge"))
        .unwrap();
    let refused = service.oneshot(unkeyed_charge).await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::BAD_REQUEST,
        "a selected path needs its key"
    );
    assert_eq!(calls.get(), 1, "only the unselected call ran");
}
