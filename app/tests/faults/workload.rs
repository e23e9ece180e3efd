//! The workload: operations sent by workers for a set time, each retried
//! through idem's client middleware and, when an instance stops answering,
//! at the next instance with the same key, until a final answer.
//!
//! Three operations in four are orders (`POST /orders`, a key of their own;
//! one in ten of those arrives as three copies at once, at three
//! instances: a retry storm). One in four is a payment: created, then its
//! provider's `PAID` callback pushed twice at once, at two instances, each
//! push retried until a 2xx (the callback's key is the payment number).
//! Every attempt is tallied: its status, transport errors, and the seconds
//! in which something failed.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Extensions, StatusCode};
use idem_tower::client::{IdempotencyMiddleware, RetryPolicy, RetryReport};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use serde_json::{Value, json};

use crate::apps::Apps;

/// Users per run: orders of one user contend for its balance row.
const USERS: usize = 8;
/// Give up on an operation after this long without a final answer (the
/// checker then reports it unanswered).
const PATIENCE: Duration = Duration::from_secs(120);

/// One logical operation, sent until it gets a final answer.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    pub(crate) n: usize,
    pub(crate) kind: Kind,
    pub(crate) amount_cents: i64,
}

/// What an operation does.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// `POST /orders` as `user` with `key`; the order's sku is `op-N`, how
    /// the checker finds its row.
    Order {
        key: String,
        user: String,
        sku: String,
    },
    /// `POST /payments`, then its `PAID` callback.
    Payment { payment_no: String },
}

impl Operation {
    fn new(run: &str, n: usize) -> Self {
        let kind = if n % 4 == 1 {
            Kind::Payment {
                payment_no: format!("{run}-pay-{n}"),
            }
        } else {
            Kind::Order {
                key: format!("{run}-op-{n}"),
                user: format!("u{}", n % USERS),
                sku: format!("op-{n}"),
            }
        };
        Self {
            n,
            kind,
            amount_cents: 100 + (n % 50) as i64,
        }
    }

    /// Copies sent at once: three for one order in ten, two pushes of
    /// every payment's callback.
    fn copies(&self) -> usize {
        match self.kind {
            Kind::Order { .. } if self.n.is_multiple_of(10) => 3,
            Kind::Order { .. } => 1,
            Kind::Payment { .. } => 2,
        }
    }

    /// For messages: the key or the payment number.
    pub(crate) fn name(&self) -> &str {
        match &self.kind {
            Kind::Order { key, .. } => key,
            Kind::Payment { payment_no } => payment_no,
        }
    }
}

/// A final answer.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
    pub(crate) replayed: bool,
    /// When it came.
    pub(crate) at: Instant,
}

/// An operation and the final answer of each copy sent (`None`: none came
/// within [`PATIENCE`]).
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) op: Operation,
    pub(crate) answers: Vec<Option<Answer>>,
}

/// What every attempt met.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) attempts: AtomicU64,
    /// Attempts answered 5xx.
    pub(crate) five_xx: AtomicU64,
    /// Of those, 503s that carried `Retry-After`.
    pub(crate) unavailable_with_retry_after: AtomicU64,
    /// Attempts that got no answer (refused, reset, timed out).
    pub(crate) transport_errors: AtomicU64,
    /// Seconds (from the start of the run) spanned by attempts that failed.
    degraded: Mutex<BTreeSet<u64>>,
    started: Instant,
}

impl Tally {
    fn new() -> Self {
        Self {
            attempts: AtomicU64::new(0),
            five_xx: AtomicU64::new(0),
            unavailable_with_retry_after: AtomicU64::new(0),
            transport_errors: AtomicU64::new(0),
            degraded: Mutex::default(),
            started: Instant::now(),
        }
    }

    /// How many distinct seconds saw a failed attempt.
    pub(crate) fn degraded_seconds(&self) -> usize {
        self.degraded.lock().expect("degraded").len()
    }

    /// An attempt begun at `since` failed now: every second it spanned was
    /// degraded (a request held 3 s before its 503 was 3 s of outage).
    fn failed(&self, since: Instant) {
        let first = since.saturating_duration_since(self.started).as_secs();
        let last = self.started.elapsed().as_secs();
        self.degraded.lock().expect("degraded").extend(first..=last);
    }
}

/// Counts every attempt the idempotent middleware makes (it sits inside
/// it, so it sees each one).
struct Recorder(Arc<Tally>);

#[async_trait::async_trait]
impl Middleware for Recorder {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let tally = &self.0;
        tally.attempts.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let result = next.run(request, extensions).await;
        match &result {
            Ok(response) if response.status().is_server_error() => {
                tally.five_xx.fetch_add(1, Ordering::Relaxed);
                if response.status() == StatusCode::SERVICE_UNAVAILABLE
                    && response.headers().contains_key(http::header::RETRY_AFTER)
                {
                    tally
                        .unavailable_with_retry_after
                        .fetch_add(1, Ordering::Relaxed);
                }
                tally.failed(began);
            }
            Ok(_) => {}
            Err(_) => {
                tally.transport_errors.fetch_add(1, Ordering::Relaxed);
                tally.failed(began);
            }
        }
        result
    }
}

/// Sends operations to the apps of a run.
#[derive(Clone)]
pub(crate) struct Workload {
    run: String,
    /// The tenant of every operation: one per run, so the checker reads
    /// this run's rows only.
    pub(crate) tenant: String,
    apps: Arc<Apps>,
    client: ClientWithMiddleware,
    pub(crate) tally: Arc<Tally>,
}

impl Workload {
    pub(crate) fn new(run: &str, apps: Arc<Apps>) -> Self {
        let tally = Arc::new(Tally::new());
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(4)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("an HTTP client");
        let policy = RetryPolicy::default()
            .max_attempts(4)
            .deadline(Duration::from_secs(15))
            .attempt_timeout(Duration::from_secs(5))
            .backoff(Duration::from_millis(20), Duration::from_millis(300))
            .max_retry_after(Duration::from_millis(500));
        let client = ClientBuilder::new(http)
            .with(IdempotencyMiddleware::new(policy))
            .with(Recorder(tally.clone()))
            .build();
        Self {
            tenant: format!("{run}-tenant"),
            run: run.to_owned(),
            apps,
            client,
            tally,
        }
    }

    /// Sends new operations from `workers` workers until `stop` is set;
    /// returns every operation with its answers.
    pub(crate) async fn run(&self, workers: usize, stop: Arc<AtomicBool>) -> Vec<Sent> {
        let next = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..workers)
            .map(|_| {
                let (this, next, stop, sent) =
                    (self.clone(), next.clone(), stop.clone(), sent.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let op = Operation::new(&this.run, n);
                        let answers = futures_util::future::join_all(
                            (0..op.copies()).map(|copy| this.settle(&op, n + copy)),
                        )
                        .await;
                        sent.lock().expect("sent").push(Sent { op, answers });
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a worker");
        }
        let mut sent = std::mem::take(&mut *sent.lock().expect("sent"));
        sent.sort_by_key(|s| s.op.n);
        sent
    }

    /// Sends every operation once more, `workers` at a time: an order must
    /// be answered with its first answer, replayed; a payment's callback
    /// with the payment, paid.
    pub(crate) async fn resend(&self, ops: &[Operation], workers: usize) -> Vec<Option<Answer>> {
        let mut answers = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(workers) {
            let settled =
                futures_util::future::join_all(chunk.iter().map(|op| self.settle(op, op.n + 1)))
                    .await;
            answers.extend(settled);
        }
        answers
    }

    /// Sends `op` until a final answer, starting at the instance `turn`
    /// picks and moving on to the next when one gives none. A payment is
    /// created first (201, or 409 if an earlier attempt or copy did), and
    /// its callback's answer is the operation's.
    async fn settle(&self, op: &Operation, turn: usize) -> Option<Answer> {
        let deadline = Instant::now() + PATIENCE;
        match &op.kind {
            Kind::Order { key, user, sku } => {
                let body = json!({ "sku": sku, "qty": 1, "amount_cents": op.amount_cents });
                let send = |base: &str| {
                    self.client
                        .post(format!("{base}/orders"))
                        .header("idempotency-key", key)
                        .header("x-tenant-id", &self.tenant)
                        .header("authorization", format!("Bearer {user}"))
                };
                self.until_final(send, &body, turn, deadline).await
            }
            Kind::Payment { payment_no } => {
                let body = json!({ "payment_no": payment_no, "amount_cents": op.amount_cents });
                let create = |base: &str| self.client.post(format!("{base}/payments"));
                let created = self.until_final(create, &body, turn, deadline).await?;
                if created.status != StatusCode::CREATED && created.status != StatusCode::CONFLICT {
                    return Some(created);
                }
                let body = json!({ "status": "PAID", "amount_cents": op.amount_cents });
                let delay = self.apps.callback_delay_ms.load(Ordering::Relaxed);
                let push = |base: &str| {
                    let push = self
                        .client
                        .post(format!("{base}/payments/{payment_no}/callback"));
                    if delay > 0 {
                        push.header("x-chaos-delay-ms", delay)
                    } else {
                        push
                    }
                };
                self.until_final(push, &body, turn, deadline).await
            }
        }
    }

    /// Sends `body` with the request `build` makes for an instance until a
    /// final answer (not a 5xx, a 429, or a 409 with `Retry-After`, and
    /// read whole), moving to the next instance after each failure.
    async fn until_final(
        &self,
        build: impl Fn(&str) -> reqwest_middleware::RequestBuilder,
        body: &Value,
        mut turn: usize,
        deadline: Instant,
    ) -> Option<Answer> {
        let body = body.to_string();
        loop {
            let base = self.apps.base(turn);
            turn += 1;
            let began = Instant::now();
            let sent = build(&base)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            if let Ok(response) = sent {
                let status = response.status();
                let again = status.is_server_error()
                    || status == StatusCode::TOO_MANY_REQUESTS
                    || (status == StatusCode::CONFLICT
                        && response.headers().contains_key(http::header::RETRY_AFTER));
                if !again {
                    let replayed = response
                        .extensions()
                        .get::<RetryReport>()
                        .is_some_and(|d| d.replayed);
                    match response.json().await {
                        Ok(body) => {
                            return Some(Answer {
                                status,
                                body,
                                replayed,
                                at: Instant::now(),
                            });
                        }
                        // The answer was cut off: ask again.
                        Err(_) => {
                            self.tally.transport_errors.fetch_add(1, Ordering::Relaxed);
                            self.tally.failed(began);
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
