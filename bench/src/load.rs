//! The load generator: closed-loop HTTP/1.1 keep-alive connections over
//! loopback, one request in flight per connection (no pipelining), latency
//! recorded per request in an HDR histogram; optionally paced to a total
//! rate, so that rows at the same throughput compare their CPU per request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The request body every scenario sends but the orders endpoint's.
pub(crate) const ORDER: &str = r#"{"sku":"SKU-0042","qty":2,"amount_cents":1299}"#;

/// The orders endpoint's body: [`ORDER`] for one account.
pub(crate) fn account_order(account: u32) -> Bytes {
    Bytes::from(format!(
        r#"{{"account":{account},"sku":"SKU-0042","qty":2,"amount_cents":1299}}"#
    ))
}

/// Which body one connection's requests carry.
#[derive(Debug, Clone)]
pub(crate) enum Bodies {
    /// [`ORDER`] on every request.
    Order,
    /// The same body on every request.
    Fixed(Bytes),
    /// Orders spread over `accounts` accounts: request `n` (from 1) of
    /// connection `c` of `conns` is for account `(n * conns + c) % accounts`,
    /// so the requests in flight at once are for different accounts while
    /// the connections keep about the same pace.
    Spread { accounts: u32, conns: u32 },
}

impl Bodies {
    fn body(&self, conn: usize, seq: u64) -> Bytes {
        match self {
            Self::Order => Bytes::from_static(ORDER.as_bytes()),
            Self::Fixed(body) => body.clone(),
            Self::Spread { accounts, conns } => {
                let n = seq * u64::from(*conns) + conn as u64;
                // The remainder is below `accounts`, a u32.
                account_order((n % u64::from((*accounts).max(1))) as u32)
            }
        }
    }
}

/// Where one connection's `Idempotency-Key` values come from.
#[derive(Debug, Clone)]
pub(crate) enum Keys {
    /// A fresh key per request: `{prefix}-{connection}-{sequence}`.
    Unique(String),
    /// The same key on every request (a completed key: replays).
    Fixed(HeaderValue),
}

impl Keys {
    /// The key of request `seq` (from 1) of connection `conn`.
    fn key(&self, conn: usize, seq: u64) -> HeaderValue {
        match self {
            Self::Unique(prefix) => HeaderValue::try_from(format!("{prefix}-{conn}-{seq}"))
                .expect("a visible-ASCII key"),
            Self::Fixed(key) => key.clone(),
        }
    }
}

/// What a response must be to count as expected.
#[derive(Debug, Clone)]
pub(crate) enum Expect {
    /// `201`, not marked as a replay by `replay_header`.
    Created { replay_header: HeaderName },
    /// `201`, marked as a replay: `replay_header: true`.
    Replayed { replay_header: HeaderName },
}

impl Expect {
    fn replay_header(&self) -> &HeaderName {
        match self {
            Self::Created { replay_header } | Self::Replayed { replay_header } => replay_header,
        }
    }

    fn accepts(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        match self {
            Self::Created { replay_header } => {
                status == StatusCode::CREATED && !headers.contains_key(replay_header)
            }
            Self::Replayed { replay_header } => {
                status == StatusCode::CREATED
                    && headers.get(replay_header).is_some_and(|v| v == "true")
            }
        }
    }
}

/// What one connection sends.
#[derive(Debug, Clone)]
pub(crate) struct ConnSpec {
    pub(crate) keys: Keys,
    pub(crate) bodies: Bodies,
    /// A `Cookie` header (the peer crate's session).
    pub(crate) cookie: Option<HeaderValue>,
}

/// One measurement.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) addr: SocketAddr,
    pub(crate) conns: Vec<ConnSpec>,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    /// Stop after this many requests in all (warm-up included).
    pub(crate) max_requests: u64,
    /// Requests per second in all, spread evenly over the connections;
    /// `None`: each connection sends its next request as soon as the last
    /// is answered.
    pub(crate) rate: Option<u32>,
    pub(crate) expect: Expect,
}

/// What a measurement saw.
#[derive(Debug)]
pub(crate) struct Measured {
    /// Requests completed inside the measured window.
    pub(crate) requests: u64,
    /// The measured window (shorter than asked if the request cap was hit).
    pub(crate) elapsed: Duration,
    /// Latency of the measured requests, in microseconds.
    pub(crate) latency: Histogram<u64>,
    /// Responses completed in all, warm-up included.
    pub(crate) total: u64,
    /// Responses that were not what the plan expected (all phases).
    pub(crate) unexpected: u64,
    /// Their statuses, with a `+r` for those marked as replays.
    pub(crate) unexpected_by: BTreeMap<String, u64>,
    /// Connection or protocol errors.
    pub(crate) errors: u64,
}

impl Measured {
    pub(crate) fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// A `POST /orders` with `body`.
pub(crate) fn order_request(
    key: HeaderValue,
    cookie: Option<&HeaderValue>,
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut request = Request::post("/orders")
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Full::new(body))
        .expect("a valid request");
    if let Some(cookie) = cookie {
        request.headers_mut().insert(header::COOKIE, cookie.clone());
    }
    request
}

/// A keep-alive HTTP/1.1 connection to `addr` (loopback only).
pub(crate) async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    if !addr.ip().is_loopback() {
        return Err(format!("{addr} is not a loopback address"));
    }
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Sends one request on `sender` and reads the whole answer.
pub(crate) async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<Response<Bytes>, String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Response::from_parts(parts, body))
}

/// One request on a connection of its own.
pub(crate) async fn send_once(
    addr: SocketAddr,
    request: Request<Full<Bytes>>,
) -> Result<Response<Bytes>, String> {
    let mut sender = connect(addr).await?;
    exchange(&mut sender, request).await
}

/// Runs `plan` and returns what it measured.
pub(crate) async fn run(plan: Plan) -> Measured {
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let deadline = measure_from + plan.duration;
    let budget = Arc::new(AtomicU64::new(plan.max_requests));
    let expect = Arc::new(plan.expect);
    let conns = plan.conns.len().max(1);
    let tasks: Vec<_> = plan
        .conns
        .into_iter()
        .enumerate()
        .map(|(index, spec)| {
            let budget = Arc::clone(&budget);
            let expect = Arc::clone(&expect);
            let clock = Clock {
                pace: plan.rate.map(|rate| pace(start, rate, index, conns)),
                measure_from,
                deadline,
            };
            tokio::spawn(connection(plan.addr, index, spec, expect, budget, clock))
        })
        .collect();
    let mut total = Measured {
        requests: 0,
        elapsed: Duration::ZERO,
        latency: histogram(),
        total: 0,
        unexpected: 0,
        unexpected_by: BTreeMap::new(),
        errors: 0,
    };
    let mut last_done = measure_from;
    for task in tasks {
        let one = task.await.expect("a load connection panicked");
        total.requests += one.requests;
        total.total += one.total;
        total.unexpected += one.unexpected;
        for (status, n) in one.unexpected_by {
            *total.unexpected_by.entry(status).or_default() += n;
        }
        total.errors += one.errors;
        total
            .latency
            .add(&one.latency)
            .expect("histograms with the same bounds");
        last_done = last_done.max(one.last_measured);
    }
    // The window ends at the deadline, or earlier if the request cap
    // stopped every connection before it.
    total.elapsed = last_done
        .min(deadline)
        .saturating_duration_since(measure_from);
    if total.elapsed.is_zero() {
        total.elapsed = Duration::from_micros(1);
    }
    total
}

/// Connection `index` of `conns`'s share of `rate` requests per second: a
/// tick every `conns / rate` seconds, the connections' ticks staggered
/// evenly over one period. Late ticks are caught up, so the rate holds on
/// average while the server keeps up.
fn pace(start: Instant, rate: u32, index: usize, conns: usize) -> tokio::time::Interval {
    let period = Duration::from_secs_f64(conns as f64 / f64::from(rate.max(1)));
    let offset = period.mul_f64(index as f64 / conns as f64);
    tokio::time::interval_at((start + offset).into(), period)
}

/// When one connection sends, and which of its requests count.
struct Clock {
    /// Its share of a paced load's rate, if paced.
    pace: Option<tokio::time::Interval>,
    /// Requests sent from here on are measured...
    measure_from: Instant,
    /// ...if answered by here, when the connection stops.
    deadline: Instant,
}

/// What one connection saw.
struct ConnResult {
    requests: u64,
    total: u64,
    unexpected: u64,
    unexpected_by: BTreeMap<String, u64>,
    errors: u64,
    latency: Histogram<u64>,
    last_measured: Instant,
}

impl ConnResult {
    /// Counts `response` (to a request sent at `began`, answered at
    /// `ended`), and records its latency if it fell inside `clock`'s
    /// measured window.
    fn record(
        &mut self,
        response: &Response<Bytes>,
        expect: &Expect,
        (began, ended): (Instant, Instant),
        clock: &Clock,
    ) {
        self.total += 1;
        if !expect.accepts(response.status(), response.headers()) {
            self.unexpected += 1;
            let replay = response.headers().contains_key(expect.replay_header());
            let status = format!(
                "{}{}",
                response.status().as_u16(),
                if replay { "+r" } else { "" }
            );
            *self.unexpected_by.entry(status).or_default() += 1;
        }
        if began >= clock.measure_from && ended <= clock.deadline {
            self.requests += 1;
            let micros = u64::try_from((ended - began).as_micros()).unwrap_or(u64::MAX);
            self.latency.saturating_record(micros.max(1));
            self.last_measured = ended;
        }
    }
}

/// Connection `index`: sends `spec`'s requests one at a time, on a
/// keep-alive connection reopened after an error, until `clock`'s deadline
/// or the shared request budget runs out.
async fn connection(
    addr: SocketAddr,
    index: usize,
    spec: ConnSpec,
    expect: Arc<Expect>,
    budget: Arc<AtomicU64>,
    mut clock: Clock,
) -> ConnResult {
    let mut result = ConnResult {
        requests: 0,
        total: 0,
        unexpected: 0,
        unexpected_by: BTreeMap::new(),
        errors: 0,
        latency: histogram(),
        last_measured: clock.measure_from,
    };
    let mut sender = None;
    let mut seq: u64 = 0;
    while Instant::now() < clock.deadline {
        if let Some(pace) = &mut clock.pace {
            pace.tick().await;
        }
        if budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
        {
            break;
        }
        let conn = match &mut sender {
            Some(conn) => conn,
            None => match connect(addr).await {
                Ok(conn) => sender.insert(conn),
                Err(_) => {
                    result.errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        seq += 1;
        let request = order_request(
            spec.keys.key(index, seq),
            spec.cookie.as_ref(),
            spec.bodies.body(index, seq),
        );
        let began = Instant::now();
        match exchange(conn, request).await {
            Ok(response) => {
                let ended = Instant::now();
                result.record(&response, &expect, (began, ended), &clock);
            }
            Err(_) => {
                result.errors += 1;
                sender = None;
            }
        }
    }
    if Instant::now() >= clock.deadline {
        result.last_measured = clock.deadline;
    }
    result
}
