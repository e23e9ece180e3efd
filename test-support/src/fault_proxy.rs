//! A TCP proxy that misbehaves on command, in front of PostgreSQL or Redis
//! (or of a Redis primary, for its replica's link): it passes bytes through,
//! adds latency, resets connections, drops an answer and closes, or cuts
//! everything (open connections closed, new ones refused).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How the proxy treats traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Bytes pass untouched.
    Pass,
    /// Open connections are closed and new ones refused.
    Cut,
    /// Every chunk, either way, is delayed by `latency`; a chunk from the
    /// client is, with probability `reset`, not forwarded and the connection
    /// reset instead; a chunk from the server (an answer) is, with
    /// probability `drop_answer`, swallowed and the connection closed: the
    /// server did the work, the client never hears.
    Faulty {
        /// The delay of every chunk.
        latency: Duration,
        /// The chance a client's chunk resets the connection instead.
        reset: f64,
        /// The chance a server's chunk is swallowed, the connection closed.
        drop_answer: f64,
    },
}

/// What the proxy did.
#[derive(Debug, Default)]
pub struct Counts {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections reset instead of a client's chunk.
    pub resets: AtomicU64,
    /// Answers swallowed.
    pub dropped_answers: AtomicU64,
    /// Connections refused while cut.
    pub refused: AtomicU64,
}

/// A running proxy; it stops with the test's runtime.
#[derive(Clone)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    /// Bumped by every change of mode: open connections made under an
    /// earlier mode that is now `Cut` close.
    epoch: watch::Sender<u64>,
    /// What it did so far.
    pub counts: Arc<Counts>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::start_on(([127, 0, 0, 1], 0).into(), upstream).await
    }

    /// Listens on `listen` (port 0: a free one), forwarding to `upstream`.
    pub async fn start_on(listen: SocketAddr, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(listen).await.expect("a port");
        let proxy = Self {
            addr: listener.local_addr().expect("an address"),
            mode: Arc::new(Mutex::new(Mode::Pass)),
            epoch: watch::Sender::new(0),
            counts: Arc::default(),
        };
        let accepting = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accepting.counts.connections.fetch_add(1, Ordering::Relaxed);
                if accepting.mode() == Mode::Cut {
                    accepting.counts.refused.fetch_add(1, Ordering::Relaxed);
                    reset(client);
                    continue;
                }
                tokio::spawn(accepting.clone().relay(client, upstream));
            }
        });
        proxy
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.lock().expect("mode")
    }

    /// Changes the mode; `Cut` closes every open connection.
    pub fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
        self.epoch.send_modify(|epoch| *epoch += 1);
    }

    async fn relay(self, client: TcpStream, upstream: SocketAddr) {
        let Ok(server) = TcpStream::connect(upstream).await else {
            reset(client);
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let (mut cut, mode) = (self.epoch.subscribe(), self.mode.clone());
        let cut = async move {
            while cut.changed().await.is_ok() {
                if *mode.lock().expect("mode") == Mode::Cut {
                    return;
                }
            }
        };
        let this = self.clone();
        tokio::select! {
            _ = this.pump(client_read, server_write, Direction::Request) => {}
            _ = self.pump(server_read, client_write, Direction::Answer) => {}
            _ = cut => {}
        }
        // Dropping both halves of both sockets closes them.
    }

    /// Copies `from` to `to` chunk by chunk, as the mode says, until either
    /// side closes or a fault ends the connection.
    async fn pump(&self, mut from: OwnedReadHalf, mut to: OwnedWriteHalf, direction: Direction) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Mode::Faulty {
                latency,
                reset,
                drop_answer,
            } = self.mode()
            {
                tokio::time::sleep(latency).await;
                let roll: f64 = rand::rng().random();
                match direction {
                    Direction::Request if roll < reset => {
                        self.counts.resets.fetch_add(1, Ordering::Relaxed);
                        let _ = to.as_ref().set_zero_linger();
                        return;
                    }
                    Direction::Answer if roll < drop_answer => {
                        self.counts.dropped_answers.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    _ => {}
                }
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    /// Client to server.
    Request,
    /// Server to client.
    Answer,
}

/// Closes `stream` with a reset rather than a clean end.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// The counters, for a report line.
impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} connections, {} reset, {} answers dropped, {} refused",
            self.connections.load(Ordering::Relaxed),
            self.resets.load(Ordering::Relaxed),
            self.dropped_answers.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed)
        )
    }
}
