//! Round trips to a database server (PostgreSQL, MySQL/MariaDB), counted
//! on the wire: a TCP proxy between the app and the server that counts the
//! times the client speaks after the server has answered. What a client
//! sends without waiting in between (a simple query of several statements,
//! or a queued ROLLBACK sent with the next Sync) is one round trip, however
//! many answers come back. The first bytes the client sends in each round
//! trip are kept, so that a test can tell them apart (MySQL's command
//! packets name their command in clear).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::urls::{host_port, via};

/// How many bytes of each round trip's first send are kept.
const KEPT: usize = 96;

/// A proxy in front of a database server, counting round trips.
#[derive(Debug, Clone)]
pub struct RoundTrips {
    addr: SocketAddr,
    count: Arc<AtomicU64>,
    sends: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl RoundTrips {
    /// Proxies to the server of `url` (a `postgres://` or `mysql://` URL).
    pub async fn proxy(url: &str) -> Self {
        let port = if url.starts_with("mysql") { 3306 } else { 5432 };
        let upstream = host_port(url, port);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("an address");
        let count = Arc::new(AtomicU64::new(0));
        let sends: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let (counted, kept) = (count.clone(), sends.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let (count, sends) = (counted.clone(), kept.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        forward(client, server, count, sends).await;
                    }
                });
            }
        });
        Self { addr, count, sends }
    }

    /// The first bytes (up to 96) the client sent in each round trip so
    /// far, in order.
    pub fn sends(&self) -> Vec<Vec<u8>> {
        self.sends.lock().expect("the sends").clone()
    }

    /// `url` with its host and port replaced by the proxy's, and TLS off
    /// (so that what the client sends can be read).
    pub fn url(&self, url: &str) -> String {
        let url = via(url, self.addr);
        let separator = if url.contains('?') { '&' } else { '?' };
        let no_tls = if url.starts_with("mysql") {
            "ssl-mode=disabled"
        } else {
            "sslmode=disable"
        };
        format!("{url}{separator}{no_tls}")
    }

    /// Round trips so far, once the count has been still for a while (a
    /// connection given back to the pool is checked in a task of its own,
    /// just after the request that used it has been answered).
    pub async fn settled(&self) -> u64 {
        let mut last = self.count.load(Ordering::SeqCst);
        loop {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let now = self.count.load(Ordering::SeqCst);
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

/// Copies both ways, counting the client's sends that follow an answer and
/// keeping the first bytes of each.
async fn forward(
    client: TcpStream,
    server: TcpStream,
    count: Arc<AtomicU64>,
    sends: Arc<Mutex<Vec<Vec<u8>>>>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Whether the server has sent anything since the client last did.
    let answered = Arc::new(AtomicBool::new(true));
    let heard = answered.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if heard.swap(false, Ordering::SeqCst) {
                let first = buf[..n.min(KEPT)].to_vec();
                sends.lock().expect("the sends").push(first);
                count.fetch_add(1, Ordering::SeqCst);
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    });
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Before the client can see the answer and speak again.
        answered.store(true, Ordering::SeqCst);
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_url_keeps_user_and_database() {
        let trips = RoundTrips {
            addr: "127.0.0.1:7000".parse().unwrap(),
            count: Arc::default(),
            sends: Arc::default(),
        };
        assert_eq!(
            trips.url("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:7000/test?sslmode=disable"
        );
        assert_eq!(
            trips.url("mysql://root@127.0.0.1:3306/test"),
            "mysql://root@127.0.0.1:7000/test?ssl-mode=disabled"
        );
    }
}
