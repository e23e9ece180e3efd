//! Compression never changes the outcome, over real HTTP on loopback (an
//! axum server on 127.0.0.1:0, hyper-util's client, which neither
//! compresses nor decompresses on its own): a gzip request and its
//! identity retry are one request; a replay stored compressed is decoded for
//! a client that does not accept its encoding; a body that decodes past the
//! cap is 413 and one that does not decode is 400, nothing run. And the
//! recommended wiring, tower-http's compression layers outside idem's,
//! works (`Wiring::Outside`), as docs/operations.md recommends.

use std::io::{Read, Write};
use std::net::SocketAddr;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_tower::{Idempotency, IdempotencyLayer, MemoryStore};
use tower_http::compression::CompressionLayer;
use tower_http::decompression::RequestDecompressionLayer;

use crate::support::Calls;

const ORDER: &str =
    r#"{"sku":"book","qty":1,"note":"a note long enough to be worth compressing, twice over"}"#;

/// Where tower-http's compression sits relative to idem's layer.
#[derive(Clone, Copy, Debug)]
enum Wiring {
    /// Request decompression and response compression inside idem's layer
    /// (as a handler that does its own would have them).
    Inside,
    /// Both outside: the recommended order.
    Outside,
}

/// Serves `POST /orders` (an order per run, its body echoed) on a loopback
/// port.
async fn serve(calls: &Calls, wiring: Wiring) -> SocketAddr {
    let idem = Idempotency::new(MemoryStore::new());
    let layer: IdempotencyLayer = idem.layer_with_key("o:{header:idempotency-key}").unwrap();
    let calls = calls.clone();
    let handler = post(move |body: Bytes| {
        let calls = calls.clone();
        async move {
            let run = calls.run();
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                format!(
                    r#"{{"order":{run},"request":{}}}"#,
                    String::from_utf8_lossy(&body)
                ),
            )
        }
    });
    // A layer added later wraps those added before it.
    let app = match wiring {
        Wiring::Inside => Router::new()
            .route("/orders", handler)
            .layer(RequestDecompressionLayer::new())
            .layer(CompressionLayer::new())
            .layer(layer),
        Wiring::Outside => Router::new()
            .route("/orders", handler)
            .layer(layer)
            .layer(CompressionLayer::new())
            .layer(RequestDecompressionLayer::new()),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("gzip");
    out
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers.contains_key("idempotent-replayed")
    }

    /// The body as the client reads it, decoded if the server said gzip.
    fn text(&self) -> String {
        let bytes = match self.headers.get(header::CONTENT_ENCODING) {
            Some(v) if v == "gzip" => gunzip(&self.body),
            _ => self.body.to_vec(),
        };
        String::from_utf8(bytes).expect("UTF-8")
    }
}

/// One `POST /orders` with `key`; `gzip` compresses the body; `accept`, if
/// any, is the `Accept-Encoding`.
async fn order(
    addr: SocketAddr,
    key: &str,
    body: &[u8],
    gzipped: bool,
    accept: Option<&str>,
) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json");
    let body = if gzipped {
        request = request.header(header::CONTENT_ENCODING, "gzip");
        gzip(body)
    } else {
        body.to_vec()
    };
    if let Some(accept) = accept {
        request = request.header(header::ACCEPT_ENCODING, accept);
    }
    let response = client
        .request(request.body(Full::from(body)).unwrap())
        .await
        .expect("an answer");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gzip_request_and_its_identity_retry_are_one_request() {
    for wiring in [Wiring::Inside, Wiring::Outside] {
        let calls = Calls::default();
        let addr = serve(&calls, wiring).await;
        let first = order(addr, "k-1", ORDER.as_bytes(), true, None).await;
        assert_eq!(first.status, StatusCode::CREATED, "{wiring:?}");
        let retry = order(addr, "k-1", ORDER.as_bytes(), false, None).await;
        assert_eq!(
            retry.status,
            StatusCode::CREATED,
            "{wiring:?}: {}",
            retry.text()
        );
        assert!(retry.replayed(), "{wiring:?}");
        assert_eq!(retry.text(), first.text());
        // And the other way round.
        order(addr, "k-2", ORDER.as_bytes(), false, None).await;
        let gzipped = order(addr, "k-2", ORDER.as_bytes(), true, None).await;
        assert!(gzipped.replayed(), "{wiring:?}");
        assert_eq!(calls.get(), 2, "{wiring:?}: one run per key");
    }
}

/// The first client accepts gzip, so the response is compressed; a retry
/// from a client that does not is sent the replay decoded, without
/// `Content-Encoding`. With compression outside idem's layer the stored
/// response is plain and each answer is compressed for its own client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_is_sent_in_an_encoding_its_client_accepts() {
    for wiring in [Wiring::Inside, Wiring::Outside] {
        let calls = Calls::default();
        let addr = serve(&calls, wiring).await;
        let first = order(addr, "k-1", ORDER.as_bytes(), false, Some("gzip")).await;
        assert_eq!(
            first.headers[header::CONTENT_ENCODING],
            "gzip",
            "{wiring:?}"
        );
        let expected = first.text();
        assert!(expected.contains(r#""order":1"#), "{expected}");

        let plain = order(addr, "k-1", ORDER.as_bytes(), false, None).await;
        assert!(plain.replayed(), "{wiring:?}");
        assert!(
            !plain.headers.contains_key(header::CONTENT_ENCODING),
            "{wiring:?}"
        );
        assert_eq!(String::from_utf8(plain.body.to_vec()).unwrap(), expected);

        let identity_only = order(addr, "k-1", ORDER.as_bytes(), false, Some("br, gzip;q=0")).await;
        assert!(!identity_only.headers.contains_key(header::CONTENT_ENCODING));
        assert_eq!(identity_only.text(), expected);

        let gzipped = order(addr, "k-1", ORDER.as_bytes(), false, Some("gzip")).await;
        assert!(gzipped.replayed());
        assert_eq!(
            gzipped.headers[header::CONTENT_ENCODING],
            "gzip",
            "{wiring:?}"
        );
        assert_eq!(gzipped.text(), expected);
        assert_eq!(calls.get(), 1, "{wiring:?}");
    }
}

/// With the decompression inside idem's layer, the layer decodes the body
/// itself, under the body cap: 10 MiB of zeros in a few kilobytes of gzip
/// is 413; bytes that are not gzip are 400. Neither runs the handler or
/// holds the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gzip_bomb_is_413_and_a_broken_body_400_running_nothing() {
    let calls = Calls::default();
    let addr = serve(&calls, Wiring::Inside).await;
    let bomb = vec![b' '; 10 << 20];
    let refused = order(addr, "k-bomb", &bomb, true, None).await;
    assert_eq!(
        refused.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        refused.text()
    );
    assert!(refused.text().contains("body-too-large"));

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let broken = Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", "k-broken")
        .header(header::CONTENT_ENCODING, "gzip")
        .body(Full::from("this is not gzip"))
        .unwrap();
    let response = client.request(broken).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("urn:idem:problem:body-undecodable"),
        "{body:?}"
    );
    assert_eq!(calls.get(), 0);

    // The key is free: the same key with a good body runs.
    let good = order(addr, "k-broken", ORDER.as_bytes(), true, None).await;
    assert_eq!(good.status, StatusCode::CREATED);
    assert_eq!(calls.get(), 1);
}
