//! The correctness check: rounds of simultaneous copies of one fresh
//! request, and how many times the handler ran for each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use tokio::sync::Barrier;

use crate::Ctx;
use crate::apps::{Kind, Server};
use crate::client::{bodies, key, peer_session, replay_header};
use crate::load::{connect, exchange, order_request};
use crate::report::BurstRow;

/// Checks `kind`'s app with a handler as measured (no work), then with
/// `--burst-delay` of work.
pub(crate) async fn check(
    ctx: &Ctx,
    label: &'static str,
    kind: Kind,
) -> Result<Vec<BurstRow>, String> {
    let mut rows = Vec::new();
    for delay in [Duration::ZERO, ctx.args.burst_delay] {
        rows.push(rounds(ctx, label, kind.clone(), delay).await?);
    }
    Ok(rows)
}

/// `--burst-rounds` rounds of `--burst` simultaneous copies of a fresh
/// request, on a server whose handler takes `delay`.
async fn rounds(
    ctx: &Ctx,
    label: &'static str,
    kind: Kind,
    delay: Duration,
) -> Result<BurstRow, String> {
    let peer = matches!(kind, Kind::Peer);
    let replay_header = replay_header(&kind);
    let (_, body) = bodies(ctx, &kind);
    let server = Server::start(&ctx.server_rt, kind, ctx.env.clone(), delay).await?;
    let addr = server.addr;
    let tag = label.replace(|c: char| !c.is_ascii_alphanumeric(), "");
    let result = async {
        // The same client retrying: for the peer, one session.
        let cookie = if peer {
            Some(peer_session(addr, format!("login-{}-{tag}-{delay:?}", ctx.nonce)).await?)
        } else {
            None
        };
        let mut runs = Vec::new();
        let mut seen = Burst::default();
        for round in 0..ctx.args.burst_rounds {
            let before = server.calls.load(Ordering::Relaxed);
            let one = burst(
                addr,
                ctx.args.burst,
                key(format!("burst-{}-{tag}-{delay:?}-{round}", ctx.nonce)),
                cookie.clone(),
                body.clone(),
                replay_header.clone(),
            )
            .await;
            runs.push(server.calls.load(Ordering::Relaxed) - before);
            seen.add(&one);
        }
        Ok::<_, String>((seen, runs))
    }
    .await;
    server.stop().await;
    let (seen, runs) = result?;
    Ok(BurstRow {
        scenario: label,
        delay,
        copies: ctx.args.burst,
        handler_runs: runs,
        seen,
    })
}

/// What `copies` simultaneous copies of one request got.
#[derive(Debug, Default, Clone)]
pub(crate) struct Burst {
    pub(crate) created: u64,
    pub(crate) replayed: u64,
    pub(crate) conflict: u64,
    pub(crate) other: u64,
    pub(crate) errors: u64,
}

impl Burst {
    pub(crate) fn add(&mut self, other: &Self) {
        self.created += other.created;
        self.replayed += other.replayed;
        self.conflict += other.conflict;
        self.other += other.other;
        self.errors += other.errors;
    }
}

/// Sends `copies` copies of one request (`body`) at once, each on a
/// connection of its own, opened beforehand so that they leave together.
pub(crate) async fn burst(
    addr: SocketAddr,
    copies: usize,
    key: HeaderValue,
    cookie: Option<HeaderValue>,
    body: Bytes,
    replay_header: HeaderName,
) -> Burst {
    let barrier = Arc::new(Barrier::new(copies));
    let tasks: Vec<_> = (0..copies)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            let key = key.clone();
            let cookie = cookie.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let sender = connect(addr).await;
                barrier.wait().await;
                let mut sender = sender?;
                exchange(&mut sender, order_request(key, cookie.as_ref(), body)).await
            })
        })
        .collect();
    let mut seen = Burst::default();
    for task in tasks {
        match task.await.expect("a burst task panicked") {
            Ok(response) => {
                let replay = response
                    .headers()
                    .get(&replay_header)
                    .is_some_and(|v| v == "true");
                match response.status() {
                    StatusCode::CREATED if replay => seen.replayed += 1,
                    StatusCode::CREATED => seen.created += 1,
                    StatusCode::CONFLICT => seen.conflict += 1,
                    _ => seen.other += 1,
                }
            }
            Err(_) => seen.errors += 1,
        }
    }
    seen
}
