//! A network hop in front of PostgreSQL and Redis (`--net-delay`): a TCP
//! proxy that holds every chunk of bytes for a fixed delay in each
//! direction before passing it on, as a link with that one-way latency
//! would, without bounding throughput (chunks in flight overlap).
//!
//! It runs on threads of its own rather than on a runtime: tokio's timer
//! counts whole milliseconds, too coarse for a delay of half of one. Each
//! direction of each connection has a reader, which stamps a chunk with
//! the time it is due, and a writer, which sleeps until then and sends it.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A delay proxy listening on a port of its own; it runs until the process
/// ends.
pub(crate) struct DelayProxy {
    addr: SocketAddr,
}

impl DelayProxy {
    /// Proxies to `upstream` (`host:port`), holding bytes for `delay` each
    /// way.
    pub(crate) fn start(upstream: &str, delay: Duration) -> Result<Self, String> {
        let upstream = upstream
            .to_socket_addrs()
            .map_err(|e| format!("{upstream}: {e}"))?
            .next()
            .ok_or_else(|| format!("{upstream}: no address"))?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                for client in listener.incoming().map_while(Result::ok) {
                    if let Ok(server) = TcpStream::connect(upstream) {
                        let _ = pipe(client.try_clone(), server.try_clone(), delay);
                        let _ = pipe(Ok(server), Ok(client), delay);
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Self { addr })
    }

    /// `url` with its host and port replaced by the proxy's.
    pub(crate) fn url(&self, url: &str) -> String {
        idem_test_support::urls::via(url, self.addr)
    }
}

pub(crate) use idem_test_support::urls::host_port;

/// Bytes from `from` to `to`, each chunk `delay` after it was read.
fn pipe(
    from: std::io::Result<TcpStream>,
    to: std::io::Result<TcpStream>,
    delay: Duration,
) -> std::io::Result<()> {
    let (mut from, mut to) = (from?, to?);
    to.set_nodelay(true)?;
    let (due, chunks) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                if due
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        })?;
    thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || {
            for (at, chunk) in chunks {
                let wait = at.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    thread::sleep(wait);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_point_at_the_proxy() {
        let proxy = DelayProxy {
            addr: "127.0.0.1:7000".parse().unwrap(),
        };
        assert_eq!(
            proxy.url("postgres://postgres@127.0.0.1:5432/idem_bench"),
            "postgres://postgres@127.0.0.1:7000/idem_bench"
        );
        assert_eq!(
            proxy.url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:7000"
        );
        assert_eq!(host_port("postgres://u@db/x", 5432), "db:5432");
        assert_eq!(host_port("redis://127.0.0.1:6380", 6379), "127.0.0.1:6380");
    }

    #[test]
    fn a_round_trip_takes_twice_the_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = echo.local_addr().unwrap().to_string();
        thread::spawn(move || {
            let (mut conn, _) = echo.accept().unwrap();
            let mut buf = [0; 16];
            while let Ok(n @ 1..) = conn.read(&mut buf) {
                conn.write_all(&buf[..n]).unwrap();
            }
        });
        let delay = Duration::from_millis(5);
        let proxy = DelayProxy::start(&upstream, delay).unwrap();
        let mut conn = TcpStream::connect(proxy.addr).unwrap();
        let started = Instant::now();
        conn.write_all(b"ping").unwrap();
        let mut buf = [0; 4];
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        assert!(started.elapsed() >= 2 * delay, "{:?}", started.elapsed());
    }
}
