//! 200 operations through a fault proxy: a small TCP proxy in front of the
//! server that closes some connections before forwarding anything and
//! drops others after forwarding the request, once the answer has started
//! (the server committed, the caller never hears). With the client layer
//! in front, every operation still ends with its own order's 201, and the
//! server made exactly one order per operation.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_tower::client::{IdempotentClientLayer, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tower::{Layer, ServiceExt};

use super::{Server, order, read};

/// What the proxy did, by fate.
#[derive(Default)]
struct Faults {
    closed: AtomicUsize,
    lost: AtomicUsize,
    passed: AtomicUsize,
}

/// Proxies to `upstream`; of every ten connections, two are closed before
/// anything is forwarded and two lose their answer.
async fn fault_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Faults>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let faults = Arc::new(Faults::default());
    let counts = Arc::clone(&faults);
    tokio::spawn(async move {
        for n in 0usize.. {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                match n % 10 {
                    1 | 6 => {
                        counts.closed.fetch_add(1, Ordering::SeqCst);
                        // Closed at once: nothing reaches the server.
                        drop(client);
                    }
                    3 | 8 => {
                        counts.lost.fetch_add(1, Ordering::SeqCst);
                        lose_answer(client, upstream).await;
                    }
                    _ => {
                        counts.passed.fetch_add(1, Ordering::SeqCst);
                        let Ok(mut server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let mut client = client;
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }
            });
        }
    });
    (addr, faults)
}

/// Forwards the request, waits for the first bytes of the answer (the
/// server has settled it), then closes both sides without passing it on.
async fn lose_answer(client: TcpStream, upstream: SocketAddr) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let forward = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    let mut first = [0u8; 1];
    let _ = tokio::time::timeout(Duration::from_secs(5), server_read.read(&mut first)).await;
    // The answer goes nowhere: both halves of the caller's connection
    // close (the read half with the aborted task).
    forward.abort();
    drop(client_write);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_operations_through_a_fault_proxy_make_two_hundred_orders() {
    let server = Server::default();
    let upstream = server.start().await;
    let (proxy, faults) = fault_proxy(upstream).await;

    // No pooled connections: every attempt meets the proxy's next fate.
    let http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let client = IdempotentClientLayer::new(
        RetryPolicy::default()
            .max_attempts(20)
            .backoff(Duration::from_millis(2), Duration::from_millis(20))
            .max_retry_after(Duration::from_millis(50))
            .attempt_timeout(Duration::from_secs(5))
            .deadline(Duration::from_secs(30)),
    )
    .layer(http);

    let mut operations = JoinSet::new();
    for op in 0..200 {
        let client = client.clone();
        operations.spawn(async move {
            let body = format!(r#"{{"sku":"op-{op}"}}"#);
            let response = client
                .oneshot(order(proxy, None, &body))
                .await
                .unwrap_or_else(|e| panic!("operation {op}: {e}"));
            let (status, delivery, answer) = read(response).await;
            assert_eq!(status, StatusCode::CREATED, "operation {op}: {answer}");
            assert!(answer.contains(&body), "operation {op} got {answer}");
            delivery
        });
    }
    let mut replays = 0;
    let mut retried = 0;
    while let Some(delivery) = operations.join_next().await {
        let delivery = delivery.expect("an operation");
        replays += usize::from(delivery.replayed);
        retried += usize::from(delivery.attempts > 1);
    }

    assert_eq!(server.runs(), 200, "one order per operation");
    assert!(faults.closed.load(Ordering::SeqCst) > 0);
    assert!(faults.lost.load(Ordering::SeqCst) > 0);
    assert!(replays > 0, "lost answers were replayed");
    assert!(retried >= replays);
}
