//! Duplicates of a request, one after another or at once: one run, the
//! first response replayed (its headers, minus the never-replayed ones),
//! and the in-flight answer (409 with a short `Retry-After`, or a wait).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use idem_tower::{Idempotency, InFlightPolicy, MemoryStore};
use tower::{Layer, Service, ServiceExt};

use crate::fixtures::{ORDER, concurrently, counting, created, json, order_body};
use crate::support::{Calls, Reply, post, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequential_duplicates_execute_once_and_replay_the_first_response() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        Response::builder()
            .status(StatusCode::CREATED)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::LOCATION, format!("/orders/{n}"))
            .header(header::ETAG, format!("\"v{n}\""))
            .header(header::LINK, "</orders>; rel=\"collection\"")
            .header(header::LINK, "</users/7>; rel=\"author\"")
            .header(header::SET_COOKIE, format!("session=s{n}; HttpOnly"))
            .header(header::DATE, "Sun, 30 Nov 2025 12:00:00 GMT")
            .header("x-request-id", format!("req-{n}"))
            .body(Full::new(Bytes::from(order_body(n))))
            .expect("a valid response")
    });
    let mut service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let mut replies = Vec::new();
    for _ in 0..10 {
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(post("/orders", Some("k-sequential"), ORDER))
            .await
            .expect("the service answers");
        replies.push(Reply::read(response).await);
    }

    assert_eq!(calls.get(), 1, "ten identical requests, one execution");
    let first = &replies[0];
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.text(), order_body(1));
    assert!(first.headers.contains_key(header::SET_COOKIE));
    assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 9);
    for replay in &replies[1..] {
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(replay.status, first.status);
        assert_eq!(replay.body, first.body);
        for name in [header::CONTENT_TYPE, header::LOCATION, header::ETAG] {
            assert_eq!(
                replay.headers.get(&name),
                first.headers.get(&name),
                "{name}"
            );
        }
        let links: Vec<&str> = replay
            .headers
            .get_all(header::LINK)
            .iter()
            .map(|v| v.to_str().expect("ASCII"))
            .collect();
        assert_eq!(
            links,
            [
                "</orders>; rel=\"collection\"",
                "</users/7>; rel=\"author\""
            ],
            "repeated Link headers are replayed, in order"
        );
        assert!(
            !replay.headers.contains_key(header::SET_COOKIE),
            "{replay:?}"
        );
        assert!(!replay.headers.contains_key(header::DATE), "{replay:?}");
        assert!(!replay.headers.contains_key("x-request-id"), "{replay:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_replayed_headers_stay_out_even_when_configured() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        let mut response = created(n);
        let headers = response.headers_mut();
        headers.insert("x-order-version", HeaderValue::from(n));
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("session=abc"));
        response
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .replay_header(HeaderName::from_static("x-order-version"))
        .replay_header(header::SET_COOKIE)
        .build();
    let service = idem.layer().layer(inner);

    let first = send(&service, post("/orders", Some("k-headers"), ORDER)).await;
    let replay = send(&service, post("/orders", Some("k-headers"), ORDER)).await;

    assert_eq!(calls.get(), 1);
    assert_eq!(first.header(header::SET_COOKIE), Some("session=abc"));
    assert!(replay.replayed());
    assert_eq!(replay.header("x-order-version"), Some("1"));
    assert!(
        !replay.headers.contains_key(header::SET_COOKIE),
        "Set-Cookie would hand one client's session to another: {replay:?}"
    );
}

/// A body compressed inside the layer (tower-http's `CompressionLayer`)
/// is stored as the gzip bytes it is; its replays carry
/// `Content-Encoding: gzip` with them, though the allow-list does not name
/// it, or a client would read gzip bytes as the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compressed_body_replays_with_its_content_encoding() {
    let calls = Calls::default();
    // Long enough for the compression layer (it leaves bodies under 32
    // bytes alone).
    let body = |n: usize| format!(r#"{{"order_id":{n},"note":"{}"}}"#, "gift ".repeat(20));
    let inner = counting(&calls, move |n, _| async move {
        json(StatusCode::CREATED, body(n))
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(
        tower_http::compression::CompressionLayer::new()
            .gzip(true)
            .layer(inner),
    );
    let gzipped = || {
        let mut request = post("/orders", Some("k-gzip"), ORDER);
        request
            .headers_mut()
            .insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        request
    };

    let first = send(&service, gzipped()).await;
    let replay = send(&service, gzipped()).await;

    assert_eq!(calls.get(), 1);
    assert_eq!(first.header(header::CONTENT_ENCODING), Some("gzip"));
    assert_ne!(
        first.body,
        body(1).as_bytes(),
        "the body went out compressed"
    );
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.header(header::CONTENT_ENCODING),
        Some("gzip"),
        "{replay:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_execute_once() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        created(n)
    });
    let service = Idempotency::new(MemoryStore::new()).layer().layer(inner);

    let replies = concurrently(50, &service, || post("/orders", Some("k-burst"), ORDER)).await;

    assert_eq!(calls.get(), 1, "fifty concurrent copies, one execution");
    let originals = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .count();
    assert_eq!(originals, 1);
    for reply in &replies {
        match reply.status {
            StatusCode::CREATED => assert_eq!(reply.text(), order_body(1)),
            StatusCode::CONFLICT => {
                reply.assert_problem(StatusCode::CONFLICT, "in-flight");
                let after = reply.retry_after();
                assert!((1..=60).contains(&after), "Retry-After {after}");
            }
            _ => panic!("neither the first, a replay nor a 409: {reply:?}"),
        }
    }

    let later = send(&service, post("/orders", Some("k-burst"), ORDER)).await;
    assert!(later.replayed());
    assert_eq!(later.text(), order_body(1));
    assert_eq!(calls.get(), 1);
}

/// The in-flight 409 tells clients to come back soon (1 s by default, or as
/// configured), never later than the first request's lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_retry_after_is_short_and_never_past_the_lease() {
    for (idem, expected) in [
        (Idempotency::new(MemoryStore::new()), 1),
        (
            Idempotency::builder(MemoryStore::new())
                .in_flight_retry_after(Duration::from_secs(3))
                .build(),
            3,
        ),
        (
            Idempotency::builder(MemoryStore::new())
                .in_flight_retry_after(Duration::from_secs(30))
                .lease(Duration::from_millis(2500))
                .build(),
            2,
        ),
    ] {
        let calls = Calls::default();
        let release = Arc::new(tokio::sync::Notify::new());
        let inner = {
            let release = Arc::clone(&release);
            counting(&calls, move |n, _| {
                let release = Arc::clone(&release);
                async move {
                    release.notified().await;
                    created(n)
                }
            })
        };
        let service = idem.layer().layer(inner);
        let first = tokio::spawn({
            let service = service.clone();
            async move { send(&service, post("/orders", Some("k-slow"), ORDER)).await }
        });
        calls.wait_for(1).await;
        let duplicate = send(&service, post("/orders", Some("k-slow"), ORDER)).await;
        duplicate.assert_problem(StatusCode::CONFLICT, "in-flight");
        assert_eq!(duplicate.retry_after(), expected, "{idem:?}");
        release.notify_one();
        assert_eq!(
            first.await.expect("the first answers").status,
            StatusCode::CREATED
        );
        assert_eq!(calls.get(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_all_receive_the_replayed_success() {
    // A wait meant as forever (`Duration::MAX`) too: no deadline overflows.
    for wait in [Duration::from_secs(5), Duration::MAX] {
        let calls = Calls::default();
        let inner = counting(&calls, |n, _| async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            created(n)
        });
        let idem = Idempotency::builder(MemoryStore::new())
            .in_flight(InFlightPolicy::Wait(wait))
            .build();
        let service = idem.layer().layer(inner);

        let replies = concurrently(30, &service, || post("/orders", Some("k-wait"), ORDER)).await;

        assert_eq!(calls.get(), 1, "{wait:?}");
        for reply in &replies {
            assert_eq!(reply.status, StatusCode::CREATED, "{wait:?}: {reply:?}");
            assert_eq!(reply.text(), order_body(1));
        }
        assert_eq!(replies.iter().filter(|r| !r.replayed()).count(), 1);
        assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 29);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layer_in_flight_setting_overrides_the_handle() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        created(n)
    });
    // The handle rejects duplicates at once; this route waits instead.
    let service = Idempotency::new(MemoryStore::new())
        .layer()
        .in_flight(InFlightPolicy::Wait(Duration::from_secs(5)))
        .layer(inner);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post("/orders", Some("k-override"), ORDER)).await }
    });
    calls.wait_for(1).await;
    let duplicate = send(&service, post("/orders", Some("k-override"), ORDER)).await;
    let first = first.await.expect("no panic");

    assert_eq!(calls.get(), 1);
    assert!(!first.replayed());
    assert_eq!(duplicate.status, StatusCode::CREATED, "{duplicate:?}");
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, first.body);
}
