//! The layer on a real tonic server over HTTP/2 on loopback, wired as
//! tonic users wire layers: around the whole server
//! (`Server::builder().layer(...)`) and around one service (its
//! `NamedService` kept). A hand-written unary `payments.Payments/Charge`
//! (what tonic's code generator would write) counts its runs.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use idem_tower::{Idempotency, InFlightPolicy, MemoryStore, Resolver};
use tonic::codec::CompressionEncoding;
use tonic::server::{NamedService, UnaryService};
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower::Layer;

use crate::support::Calls;

#[derive(Clone, PartialEq, prost::Message)]
struct ChargeRequest {
    #[prost(int64, tag = "1")]
    amount_cents: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ChargeReply {
    #[prost(uint64, tag = "1")]
    charge_id: u64,
}

/// The server: a charge is its run number; a negative amount is
/// `INVALID_ARGUMENT`; an amount of 503 is `UNAVAILABLE` the first time.
/// With `gzip`, it compresses its replies for clients that accept gzip.
#[derive(Clone)]
struct Payments {
    calls: Calls,
    flaked: Arc<AtomicBool>,
    gzip: bool,
}

impl NamedService for Payments {
    const NAME: &'static str = "payments.Payments";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Payments {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let charge = Charge(self.calls.clone(), self.flaked.clone());
        let gzip = self.gzip;
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<ChargeReply, ChargeRequest>::default());
            if gzip {
                grpc = grpc
                    .send_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Gzip);
            }
            Ok(grpc.unary(charge, request).await)
        })
    }
}

struct Charge(Calls, Arc<AtomicBool>);

impl UnaryService<ChargeRequest> for Charge {
    type Response = ChargeReply;
    type Future = BoxFuture<Result<tonic::Response<ChargeReply>, Status>>;

    fn call(&mut self, request: tonic::Request<ChargeRequest>) -> Self::Future {
        let calls = self.0.clone();
        let flaked = self.1.clone();
        Box::pin(async move {
            let run = calls.run();
            let amount = request.into_inner().amount_cents;
            tokio::time::sleep(Duration::from_millis(200)).await;
            match amount {
                a if a < 0 => Err(Status::invalid_argument("amount must be positive")),
                503 if !flaked.swap(true, Ordering::SeqCst) => {
                    Err(Status::unavailable("ledger restarting"))
                }
                _ => Ok(tonic::Response::new(ChargeReply {
                    charge_id: run as u64,
                })),
            }
        })
    }
}

/// How the layer is put on the server.
#[derive(Clone, Copy, Debug)]
enum Wiring {
    ServerWide,
    OneService,
    /// Around one service, duplicates of a running call waiting for it.
    Waiting,
    /// Around one service that compresses its replies with gzip.
    Gzip,
}

/// Serves `Payments` behind the layer on a loopback port; a channel to it.
async fn serve(wiring: Wiring, calls: &Calls) -> Channel {
    let idem = Idempotency::builder(MemoryStore::new())
        .tenant(Resolver::header("x-tenant-id"))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let payments = Payments {
        calls: calls.clone(),
        flaked: Arc::default(),
        gzip: matches!(wiring, Wiring::Gzip),
    };
    tokio::spawn(async move {
        match wiring {
            Wiring::ServerWide => Server::builder()
                .layer(idem.layer().only(["/payments.Payments/Charge"]))
                .add_service(payments)
                .serve_with_incoming(incoming)
                .await
                .unwrap(),
            Wiring::OneService | Wiring::Gzip => Server::builder()
                .add_service(idem.layer().layer(payments))
                .serve_with_incoming(incoming)
                .await
                .unwrap(),
            Wiring::Waiting => Server::builder()
                .add_service(
                    idem.layer()
                        .in_flight(InFlightPolicy::Wait(Duration::from_secs(5)))
                        .layer(payments),
                )
                .serve_with_incoming(incoming)
                .await
                .unwrap(),
        }
    });
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("the server accepts")
}

/// One `Charge` call, with `key` as its `idempotency-key` metadata.
async fn charge(
    channel: &Channel,
    key: Option<&str>,
    amount_cents: i64,
) -> Result<tonic::Response<ChargeReply>, Status> {
    call(channel, "/payments.Payments/Charge", key, amount_cents).await
}

/// One call to `method` (the test server answers every method as `Charge`).
async fn call(
    channel: &Channel,
    method: &'static str,
    key: Option<&str>,
    amount_cents: i64,
) -> Result<tonic::Response<ChargeReply>, Status> {
    call_with(
        tonic::client::Grpc::new(channel.clone()),
        method,
        key,
        amount_cents,
    )
    .await
}

/// One `Charge` call from a client that sends gzip and accepts it.
async fn charge_gzip(
    channel: &Channel,
    key: &str,
    amount_cents: i64,
) -> Result<tonic::Response<ChargeReply>, Status> {
    let grpc = tonic::client::Grpc::new(channel.clone())
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    call_with(grpc, "/payments.Payments/Charge", Some(key), amount_cents).await
}

async fn call_with(
    mut grpc: tonic::client::Grpc<Channel>,
    method: &'static str,
    key: Option<&str>,
    amount_cents: i64,
) -> Result<tonic::Response<ChargeReply>, Status> {
    grpc.ready().await.expect("the channel is ready");
    let mut request = tonic::Request::new(ChargeRequest { amount_cents });
    request
        .metadata_mut()
        .insert("x-tenant-id", "acme".parse().unwrap());
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    let path = PathAndQuery::from_static(method);
    grpc.unary(request, path, ProstCodec::default()).await
}

fn replayed(response: &tonic::Response<ChargeReply>) -> bool {
    response.metadata().get("idempotent-replayed").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_call_runs_once_and_its_replays_carry_its_status_and_reply() {
    for wiring in [Wiring::ServerWide, Wiring::OneService] {
        let calls = Calls::default();
        let channel = serve(wiring, &calls).await;
        let first = charge(&channel, Some("k-1"), 500).await.expect("OK");
        assert!(!replayed(&first), "{wiring:?}");
        for _ in 0..3 {
            let again = charge(&channel, Some("k-1"), 500)
                .await
                .expect("OK, replayed");
            assert!(replayed(&again), "{wiring:?}");
            assert_eq!(again.get_ref(), first.get_ref());
        }
        assert_eq!(calls.get(), 1, "{wiring:?}: the handler ran once");
    }
}

/// `idempotency-key` metadata is read as the IETF draft writes the
/// header: a quoted String and its bare form are one key, a String may hold
/// spaces, and parameters are `INVALID_ARGUMENT` (nothing runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quoted_and_a_bare_key_are_one_call() {
    let calls = Calls::default();
    let channel = serve(Wiring::OneService, &calls).await;
    let first = charge(&channel, Some("\"k-quoted\""), 500)
        .await
        .expect("OK");
    assert!(!replayed(&first));
    let bare = charge(&channel, Some("k-quoted"), 500).await.expect("OK");
    assert!(replayed(&bare), "the bare form is the same key");
    assert_eq!(bare.get_ref(), first.get_ref());
    assert_eq!(calls.get(), 1, "one run for both forms");

    let spaced = charge(&channel, Some("\"order 7 of 9\""), 500)
        .await
        .expect("OK");
    let again = charge(&channel, Some("\"order 7 of 9\""), 500)
        .await
        .expect("OK");
    assert!(!replayed(&spaced) && replayed(&again));
    assert_eq!(calls.get(), 2);

    let with_params = charge(&channel, Some("\"k-quoted\";x=1"), 500)
        .await
        .unwrap_err();
    assert_eq!(with_params.code(), Code::InvalidArgument, "{with_params:?}");
    assert!(
        with_params.message().contains("parameters"),
        "{with_params:?}"
    );
    assert_eq!(calls.get(), 2);
}

/// A reply compressed with gzip is stored as sent, its message flagged
/// compressed; its replays carry `grpc-encoding` with it, or the client
/// could not read them ("received message with compressed-flag but no
/// grpc-encoding was specified").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compressed_reply_replays_with_its_encoding() {
    let calls = Calls::default();
    let channel = serve(Wiring::Gzip, &calls).await;
    let first = charge_gzip(&channel, "k-gzip", 500).await.expect("OK");
    assert_eq!(
        first
            .metadata()
            .get("grpc-encoding")
            .map(|v| v.to_str().unwrap()),
        Some("gzip"),
        "the server compressed its reply"
    );
    for _ in 0..2 {
        let again = charge_gzip(&channel, "k-gzip", 500)
            .await
            .expect("OK, replayed and readable");
        assert!(replayed(&again));
        assert_eq!(again.get_ref(), first.get_ref());
    }
    assert_eq!(calls.get(), 1, "the handler ran once");
}

/// One `Charge` call that sends its message gzip-compressed or not, from
/// a client that accepts gzip replies or not.
async fn charge_encoded(
    channel: &Channel,
    key: &str,
    amount_cents: i64,
    send_gzip: bool,
    accept_gzip: bool,
) -> Result<tonic::Response<ChargeReply>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    if send_gzip {
        grpc = grpc.send_compressed(CompressionEncoding::Gzip);
    }
    if accept_gzip {
        grpc = grpc.accept_compressed(CompressionEncoding::Gzip);
    }
    call_with(grpc, "/payments.Payments/Charge", Some(key), amount_cents).await
}

/// The fingerprint is taken on the decompressed message: a call sent
/// gzip-compressed and its retry sent plain (or the other way round) are
/// one call, whatever else the clients accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gzip_call_and_its_plain_retry_are_one_call() {
    let calls = Calls::default();
    let channel = serve(Wiring::Gzip, &calls).await;
    let first = charge_encoded(&channel, "k-z1", 500, true, true)
        .await
        .expect("OK");
    let retry = charge_encoded(&channel, "k-z1", 500, false, true)
        .await
        .expect("the same call, replayed");
    assert!(replayed(&retry));
    assert_eq!(retry.get_ref(), first.get_ref());

    charge_encoded(&channel, "k-z2", 500, false, false)
        .await
        .expect("OK");
    let gzipped = charge_encoded(&channel, "k-z2", 500, true, false)
        .await
        .expect("the same call, replayed");
    assert!(replayed(&gzipped));
    assert_eq!(calls.get(), 2, "one run per key");
}

/// A reply stored gzip-compressed (its first client accepted gzip) is
/// replayed decompressed, without `grpc-encoding`, to a client that does
/// not accept gzip; as stored to one that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compressed_reply_is_replayed_decoded_to_a_client_without_gzip() {
    let calls = Calls::default();
    let channel = serve(Wiring::Gzip, &calls).await;
    let first = charge_encoded(&channel, "k-z3", 500, false, true)
        .await
        .expect("OK");
    assert_eq!(first.metadata().get("grpc-encoding").unwrap(), "gzip");
    let plain = charge_encoded(&channel, "k-z3", 500, false, false)
        .await
        .expect("a reply the client can read");
    assert!(replayed(&plain));
    assert!(plain.metadata().get("grpc-encoding").is_none());
    assert_eq!(plain.get_ref(), first.get_ref());
    let gzipped = charge_encoded(&channel, "k-z3", 500, false, true)
        .await
        .expect("OK");
    assert_eq!(gzipped.metadata().get("grpc-encoding").unwrap(), "gzip");
    assert_eq!(gzipped.get_ref(), first.get_ref());
    assert_eq!(calls.get(), 1);
}

#[derive(Clone, PartialEq, prost::Message)]
struct PaddedChargeRequest {
    #[prost(int64, tag = "1")]
    amount_cents: i64,
    /// Unknown to the server's `ChargeRequest`.
    #[prost(bytes = "vec", tag = "2")]
    padding: Vec<u8>,
}

/// A message of 10 MiB of zeros, a few kilobytes gzip-compressed, is over
/// the layer's 1 MiB body cap once decompressed: `RESOURCE_EXHAUSTED`, the
/// handler not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gzip_bomb_is_resource_exhausted_and_runs_nothing() {
    let calls = Calls::default();
    let channel = serve(Wiring::Gzip, &calls).await;
    let mut grpc =
        tonic::client::Grpc::new(channel.clone()).send_compressed(CompressionEncoding::Gzip);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(PaddedChargeRequest {
        amount_cents: 500,
        padding: vec![0; 10 << 20],
    });
    request
        .metadata_mut()
        .insert("idempotency-key", "k-bomb".parse().unwrap());
    let path = PathAndQuery::from_static("/payments.Payments/Charge");
    let refused = grpc
        .unary::<_, ChargeReply, _>(request, path, ProstCodec::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(calls.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_errors_are_kept_or_released_by_their_code() {
    let calls = Calls::default();
    let channel = serve(Wiring::ServerWide, &calls).await;

    // INVALID_ARGUMENT is the call's answer: kept and replayed.
    for _ in 0..2 {
        let refused = charge(&channel, Some("k-bad"), -5).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert_eq!(refused.message(), "amount must be positive");
    }
    assert_eq!(calls.get(), 1);
    // The corrected call, with a new key, runs.
    assert_eq!(
        charge(&channel, Some("k-good"), 5)
            .await
            .unwrap()
            .get_ref()
            .charge_id,
        2
    );

    // UNAVAILABLE releases the key: the retry with the same key runs.
    let flaky = charge(&channel, Some("k-flaky"), 503).await.unwrap_err();
    assert_eq!(flaky.code(), Code::Unavailable);
    let retried = charge(&channel, Some("k-flaky"), 503)
        .await
        .expect("the retry runs");
    assert!(!replayed(&retried));
    assert_eq!(calls.get(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layers_answers_reach_a_tonic_client_as_statuses() {
    let calls = Calls::default();
    let channel = serve(Wiring::OneService, &calls).await;

    let missing = charge(&channel, None, 500).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    assert!(missing.message().contains("missing"), "{missing:?}");

    // 20 concurrent calls with one key: one runs, the others are told it is
    // in flight (ABORTED) while it runs.
    let racing: Vec<_> = (0..20)
        .map(|_| {
            let channel = channel.clone();
            tokio::spawn(async move { charge(&channel, Some("k-race"), 700).await })
        })
        .collect();
    let mut ok = 0;
    let mut aborted = 0;
    for call in racing {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(status) if status.code() == Code::Aborted => {
                // gRPC's words for gRPC callers: the pushback, no HTTP header.
                assert!(
                    status.message().contains("grpc-retry-pushback-ms"),
                    "{status:?}"
                );
                assert!(!status.message().contains("Retry-After"), "{status:?}");
                assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
                aborted += 1;
            }
            Err(status) => panic!("unexpected {status:?}"),
        }
    }
    assert_eq!(calls.get(), 1, "one run for 20 calls");
    assert_eq!(ok + aborted, 20);
    assert!(ok >= 1 && aborted >= 1, "ok {ok}, aborted {aborted}");

    let reused = charge(&channel, Some("k-race"), 800).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert_eq!(calls.get(), 1);
}

/// Behind a server-wide layer limited to `Charge`, another method (here
/// `Status`, standing for a read, the health service or reflection) needs
/// no key and is not deduplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_wide_layer_leaves_the_other_methods_alone() {
    let calls = Calls::default();
    let channel = serve(Wiring::ServerWide, &calls).await;
    for _ in 0..2 {
        let checked = call(&channel, "/payments.Payments/Status", None, 1)
            .await
            .expect("no key asked");
        assert!(!replayed(&checked));
    }
    assert_eq!(calls.get(), 2, "each ran: not deduplicated");
    let missing = charge(&channel, None, 500).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert_eq!(calls.get(), 2);
}

/// Under `InFlightPolicy::Wait`, 20 concurrent calls with one key run once,
/// and every one of them gets its reply: the first's, replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_of_a_running_call_all_get_its_reply() {
    let calls = Calls::default();
    let channel = serve(Wiring::Waiting, &calls).await;
    let racing: Vec<_> = (0..20)
        .map(|_| {
            let channel = channel.clone();
            tokio::spawn(async move { charge(&channel, Some("k-wait"), 900).await })
        })
        .collect();
    let mut replies = Vec::new();
    for call in racing {
        let reply = call.await.unwrap().expect("every caller gets the reply");
        replies.push((reply.get_ref().charge_id, replayed(&reply)));
    }
    assert_eq!(calls.get(), 1, "one run for 20 calls");
    assert!(replies.iter().all(|(id, _)| *id == 1), "{replies:?}");
    assert_eq!(replies.iter().filter(|(_, r)| !r).count(), 1, "{replies:?}");
}
