//! A TCP fault proxy for client tests: of every ten connections, two are
//! closed before anything is forwarded and two lose their answer after the
//! server has settled it (the server committed, the caller never hears).
//! The client tests' proxy (idem-tower's and idem-tests').

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy did, by fate.
#[derive(Debug, Default)]
pub struct Faults {
    /// Connections closed before anything reached the server.
    pub closed: AtomicUsize,
    /// Connections whose answer was dropped after the server sent it.
    pub lost: AtomicUsize,
    /// Connections passed through untouched.
    pub passed: AtomicUsize,
}

/// Proxies to `upstream`; of every ten connections, two are closed before
/// anything is forwarded and two lose their answer.
pub async fn fault_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Faults>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let faults = Arc::new(Faults::default());
    let counts = faults.clone();
    tokio::spawn(async move {
        for n in 0usize.. {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let counts = counts.clone();
            tokio::spawn(async move {
                match n % 10 {
                    1 | 6 => {
                        counts.closed.fetch_add(1, Ordering::SeqCst);
                        drop(client); // nothing reaches the server
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
    forward.abort();
    drop(client_write);
}
