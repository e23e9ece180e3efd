//! The reference model of the record state machine, and the property
//! runner that checks a store against it: random interleavings of claim,
//! complete, release, concurrent claim races and lease / ttl expiry, across
//! several owners and keys, each step checked against the model. idem-core's
//! `tests/state_machine.rs` says which properties and how time is judged;
//! it and idem-sql's run this on their stores, and a store of your own can
//! too:
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_core::MemoryStore;
//! use idem_core::conformance::model::{CONTENDED, run, runtime};
//!
//! let seen = run(&runtime(), Arc::new(MemoryStore::new()), CONTENDED);
//! assert!(seen.replays > 0, "the cases met replays");
//! ```
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::{
    Claim, ErrorKind, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken,
    StoredResponse,
};
use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// A lease or ttl that the [`Op::Wait`] step outlasts.
pub(crate) const SHORT: Duration = Duration::from_millis(50);
/// A lease or ttl no test case outlives.
pub(crate) const LONG: Duration = Duration::from_secs(300);
/// How long [`Op::Wait`] sleeps: past [`SHORT`] with room to spare.
pub(crate) const WAIT: Duration = Duration::from_millis(90);
/// How far a store's clock may judge a deadline from where the model's
/// clock puts it (SQL stores round to milliseconds, and their clock is not
/// this process's).
pub(crate) const SLACK: Duration = Duration::from_millis(15);

/// A lease or ttl, as a test step asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    Short,
    Long,
}

impl Span {
    fn duration(self) -> Duration {
        match self {
            Self::Short => SHORT,
            Self::Long => LONG,
        }
    }
}

/// One step of a test case. Owners and keys are small indices.
#[derive(Debug, Clone)]
enum Op {
    /// `owner` claims `key` for the request `fp` with a fresh token.
    Claim {
        owner: usize,
        key: usize,
        fp: u8,
        lease: Span,
    },
    /// `owner` completes `key` with the last token it acquired for it (or
    /// one it never acquired, if it has none).
    Complete {
        owner: usize,
        key: usize,
        replayable: bool,
        ttl: Span,
    },
    /// `owner` releases `key` with the last token it acquired for it.
    Release { owner: usize, key: usize },
    /// Several owners claim `key` at once, with long leases.
    Race {
        key: usize,
        claims: Vec<(usize, u8)>,
    },
    /// Sleep past [`SHORT`].
    Wait,
}

fn ops(owners: usize, keys: usize, max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    let owner = 0..owners;
    let key = 0..keys;
    // Mostly the same request, sometimes another one under the same key.
    let fp = prop_oneof![4 => Just(0u8), 1 => Just(1u8)];
    let span = prop_oneof![Just(Span::Short), Just(Span::Long)];
    let op = prop_oneof![
        6 => (owner.clone(), key.clone(), fp.clone(), span.clone())
            .prop_map(|(owner, key, fp, lease)| Op::Claim { owner, key, fp, lease }),
        4 => (owner.clone(), key.clone(), any::<bool>(), span)
            .prop_map(|(owner, key, replayable, ttl)| Op::Complete {
                owner,
                key,
                replayable,
                ttl,
            }),
        3 => (owner.clone(), key.clone()).prop_map(|(owner, key)| Op::Release { owner, key }),
        1 => (key, proptest::collection::vec((owner, fp), 2..=owners)).prop_map(
            |(key, mut claims)| {
                claims.sort_unstable();
                claims.dedup_by_key(|(owner, _)| *owner);
                Op::Race { key, claims }
            }
        ),
        2 => Just(Op::Wait),
    ];
    proptest::collection::vec(op, 1..=max_len)
}

/// When a store call ran, by this process's clock.
#[derive(Debug, Clone, Copy)]
struct Call {
    start: Instant,
    end: Instant,
}

/// Where a store put a deadline: `span` after some instant of the call that
/// set it.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    earliest: Instant,
    latest: Instant,
    span: Duration,
}

impl Deadline {
    fn after(call: Call, span: Duration) -> Self {
        Self {
            earliest: call.start + span,
            latest: call.end + span,
            span,
        }
    }

    /// Whether the deadline had passed when the store looked during `call`.
    fn passed(&self, call: Call) -> Passed {
        if call.end + SLACK < self.earliest {
            Passed::No
        } else if self.latest + SLACK <= call.start {
            Passed::Yes
        } else {
            Passed::Maybe
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Passed {
    No,
    Yes,
    Maybe,
}

#[derive(Debug, Clone)]
enum State {
    InFlight {
        owner: usize,
        token: OwnerToken,
        fp: u8,
        lease: Deadline,
    },
    Completed {
        fp: u8,
        outcome: Outcome,
        ttl: Deadline,
    },
}

impl State {
    fn deadline(&self) -> &Deadline {
        match self {
            Self::InFlight { lease, .. } => lease,
            Self::Completed { ttl, .. } => ttl,
        }
    }

    fn fp(&self) -> u8 {
        match self {
            Self::InFlight { fp, .. } | Self::Completed { fp, .. } => *fp,
        }
    }

    /// Whether `claim` for `fp` is what a live record answers, and why not.
    fn live_answer(&self, fp: u8, claim: &Claim) -> Result<(), String> {
        match (self, claim) {
            (Self::InFlight { owner, .. }, Claim::Acquired(_)) => Err(format!(
                "ONE OWNER violated: acquired while owner {owner}'s lease still runs"
            )),
            (Self::Completed { .. }, Claim::Acquired(_)) => {
                Err("NO LOST RESPONSE violated: a completed key was acquired within its ttl".into())
            }
            (_, Claim::Mismatch) if self.fp() != fp => Ok(()),
            (_, _) if self.fp() != fp => Err("another request's key must be a mismatch".into()),
            (Self::InFlight { lease, .. }, Claim::InFlight { retry_after }) => {
                if *retry_after <= lease.span {
                    Ok(())
                } else {
                    Err(format!("retry_after {retry_after:?} beyond the lease"))
                }
            }
            (Self::Completed { outcome, .. }, Claim::Replay(replayed)) if replayed == outcome => {
                Ok(())
            }
            (Self::Completed { .. }, _) => {
                Err("NO LOST RESPONSE violated: a completed key within its ttl \
                 must replay its own outcome"
                    .into())
            }
            (Self::InFlight { .. }, _) => Err("an in-flight key must answer in flight".into()),
        }
    }
}

/// The model of one key.
#[derive(Debug, Default)]
struct KeyModel {
    state: Option<State>,
    /// The store was seen to count the state's deadline as passed.
    passed: bool,
}

impl KeyModel {
    fn passed(&self, call: Call) -> Passed {
        match &self.state {
            None => Passed::Yes,
            Some(_) if self.passed => Passed::Yes,
            Some(state) => state.deadline().passed(call),
        }
    }

    fn set(&mut self, state: Option<State>) {
        self.state = state;
        self.passed = false;
    }
}

/// How often a run met the situations the properties are about, so that a
/// change to the generators cannot quietly make them vacuous.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    /// A key acquired over another owner's expired lease.
    pub takeovers: u32,
    /// A key acquired again after its ttl ran out.
    pub reacquired: u32,
    /// A completed outcome replayed.
    pub replays: u32,
    /// A complete or release by a token that does not hold the key, refused.
    pub stale_refused: u32,
    /// A complete or release by the holder, refused once its lease ran out.
    pub expired_refused: u32,
    /// A race of concurrent claims that one of them won.
    pub races_won: u32,
    /// Deadlines that fell within a call, settled by the store's answer.
    pub unsure: u32,
}

impl Seen {
    fn add(&mut self, other: Self) {
        self.takeovers += other.takeovers;
        self.reacquired += other.reacquired;
        self.replays += other.replays;
        self.stale_refused += other.stale_refused;
        self.expired_refused += other.expired_refused;
        self.races_won += other.races_won;
        self.unsure += other.unsure;
    }
}

/// The model of a whole test case, beside the store it checks.
struct Model<'s, S> {
    store: &'s Arc<S>,
    keys: Vec<(IdempotencyKey, KeyModel)>,
    /// The last token each owner acquired, per key.
    tokens: HashMap<(usize, usize), OwnerToken>,
    /// Outcomes get distinct bodies, so a replay of the wrong one shows.
    completions: usize,
    seen: Seen,
}

async fn timed<T>(f: impl Future<Output = T>) -> (T, Call) {
    let start = Instant::now();
    let out = f.await;
    (
        out,
        Call {
            start,
            end: Instant::now(),
        },
    )
}

fn fingerprint(fp: u8) -> Fingerprint {
    Fingerprint::from_bytes([fp; 32])
}

fn fail(message: String, step: &str) -> TestCaseError {
    TestCaseError::fail(format!("{step}: {message}"))
}

impl<'s, S: IdempotencyStore> Model<'s, S> {
    fn new(store: &'s Arc<S>, keys: usize) -> Self {
        let case: u64 = rand::random();
        Self {
            store,
            keys: (0..keys)
                .map(|k| {
                    let key = IdempotencyKey::new("idem-prop:", &format!("{case:016x}:{k}"));
                    (key, KeyModel::default())
                })
                .collect(),
            tokens: HashMap::new(),
            completions: 0,
            seen: Seen::default(),
        }
    }

    fn outcome(&mut self, owner: usize, replayable: bool) -> Outcome {
        self.completions += 1;
        if !replayable {
            return Outcome::NotReplayable;
        }
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("link", HeaderValue::from_static("</a>; rel=a"));
        headers.append("link", HeaderValue::from_static("</b>; rel=b"));
        headers.insert("x-raw", HeaderValue::from_bytes(b"\xfe\xffok").unwrap());
        let body = format!(r#"{{"owner":{owner},"completion":{}}}"#, self.completions);
        Outcome::Response(StoredResponse::new(StatusCode::CREATED, headers, body))
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let step = format!("{op:?}");
        match *op {
            Op::Claim {
                owner,
                key,
                fp,
                lease,
            } => self.claim(owner, key, fp, lease.duration()).await,
            Op::Complete {
                owner,
                key,
                replayable,
                ttl,
            } => {
                let outcome = self.outcome(owner, replayable);
                self.finish(owner, key, Some((outcome, ttl.duration())))
                    .await
            }
            Op::Release { owner, key } => self.finish(owner, key, None).await,
            Op::Race { key, ref claims } => self.race(key, claims).await,
            Op::Wait => {
                tokio::time::sleep(WAIT).await;
                Ok(())
            }
        }
        .map_err(|message| fail(message, &step))
    }

    async fn claim(
        &mut self,
        owner: usize,
        k: usize,
        fp: u8,
        lease: Duration,
    ) -> Result<(), String> {
        let token = OwnerToken::generate();
        let (key, _) = &self.keys[k];
        let (claim, call) = timed(self.store.claim(key, &fingerprint(fp), lease, token)).await;
        let claim = claim.map_err(|err| format!("claim failed: {err:?}"))?;
        let model = &mut self.keys[k].1;
        let passed = model.passed(call);
        self.seen.unsure += u32::from(passed == Passed::Maybe);
        match (&model.state, passed, &claim) {
            (previous, Passed::Yes | Passed::Maybe, Claim::Acquired(acquired)) => {
                if *acquired != token {
                    return Err(format!(
                        "acquired with {acquired:?}, not the claimant's token"
                    ));
                }
                match previous {
                    Some(State::InFlight { .. }) => self.seen.takeovers += 1,
                    Some(State::Completed { .. }) => self.seen.reacquired += 1,
                    None => {}
                }
                model.set(Some(State::InFlight {
                    owner,
                    token,
                    fp,
                    lease: Deadline::after(call, lease),
                }));
                self.tokens.insert((owner, k), token);
            }
            (None, _, other) => return Err(format!("a free key answered {other:?}")),
            (Some(_), Passed::Yes, other) => {
                return Err(format!("a key past its deadline answered {other:?}"));
            }
            (Some(state), Passed::No | Passed::Maybe, claim) => {
                state
                    .live_answer(fp, claim)
                    .map_err(|why| format!("{why} (got {claim:?})"))?;
                self.seen.replays += u32::from(matches!(claim, Claim::Replay(_)));
            }
        }
        Ok(())
    }

    /// Completes (with `outcome` kept for its ttl) or releases.
    async fn finish(
        &mut self,
        owner: usize,
        k: usize,
        complete: Option<(Outcome, Duration)>,
    ) -> Result<(), String> {
        let token = self
            .tokens
            .get(&(owner, k))
            .copied()
            .unwrap_or_else(OwnerToken::generate);
        let (key, _) = &self.keys[k];
        let (result, call) = match &complete {
            Some((outcome, ttl)) => timed(self.store.complete(key, &token, outcome, *ttl)).await,
            None => timed(self.store.release(key, &token)).await,
        };
        let verb = if complete.is_some() {
            "complete"
        } else {
            "release"
        };
        let model = &mut self.keys[k].1;
        let holds = matches!(&model.state, Some(State::InFlight { token: t, .. }) if *t == token);
        let passed = model.passed(call);
        self.seen.unsure += u32::from(passed == Passed::Maybe);
        match (holds, passed, result) {
            (true, _, Ok(())) => {
                let fp = model.state.as_ref().map(State::fp).unwrap_or_default();
                model.set(complete.map(|(outcome, ttl)| State::Completed {
                    fp,
                    outcome,
                    ttl: Deadline::after(call, ttl),
                }));
            }
            (true, Passed::No, Err(err)) => {
                return Err(format!(
                    "the owner's {verb} failed within its lease: {err:?}"
                ));
            }
            (true, Passed::Yes | Passed::Maybe, Err(err)) => {
                if err.kind() != ErrorKind::LeaseLost {
                    return Err(format!("{verb} past the lease failed with {err:?}"));
                }
                model.passed = true;
                self.seen.expired_refused += 1;
            }
            (false, _, Ok(())) => {
                return Err(format!(
                    "NO STALE WRITE violated: owner {owner} could {verb} a key it does not hold"
                ));
            }
            (false, _, Err(err)) => {
                if err.kind() != ErrorKind::LeaseLost {
                    return Err(format!("a stale {verb} failed with {err:?}, not LeaseLost"));
                }
                self.seen.stale_refused += 1;
                // ... and changed nothing: the next claim must see the record
                // as it was. A probe that acquires a free key lets it go again.
                self.probe(k)
                    .await
                    .map_err(|why| format!("after owner {owner}'s refused {verb}: {why}"))?;
            }
        }
        Ok(())
    }

    /// Claims `k` as a passer-by would, and releases it again if that
    /// acquired it (a free key stays free, as far as the model goes).
    async fn probe(&mut self, k: usize) -> Result<(), String> {
        const PROBER: usize = usize::MAX;
        let fp = self.keys[k].1.state.as_ref().map(State::fp).unwrap_or(0);
        self.claim(PROBER, k, fp, LONG).await?;
        if matches!(
            self.keys[k].1.state,
            Some(State::InFlight { owner: PROBER, .. })
        ) {
            let token = self.tokens[&(PROBER, k)];
            self.store
                .release(&self.keys[k].0, &token)
                .await
                .map_err(|err| format!("the probe could not release: {err:?}"))?;
            self.keys[k].1.set(None);
        }
        Ok(())
    }

    async fn race(&mut self, k: usize, claims: &[(usize, u8)]) -> Result<(), String>
    where
        S: 'static,
    {
        let key = Arc::new(self.keys[k].0.clone());
        // A start line: every task checks in, then all claim together.
        let ready = Arc::new(AtomicUsize::new(0));
        let racers = claims.len();
        let start = Instant::now();
        let tasks: Vec<_> = claims
            .iter()
            .map(|&(owner, fp)| {
                let (store, key, ready) = (self.store.clone(), key.clone(), ready.clone());
                let token = OwnerToken::generate();
                let task = tokio::spawn(async move {
                    ready.fetch_add(1, Ordering::SeqCst);
                    while ready.load(Ordering::SeqCst) < racers {
                        tokio::task::yield_now().await;
                    }
                    store.claim(&key, &fingerprint(fp), LONG, token).await
                });
                (owner, fp, token, task)
            })
            .collect();
        let mut results = Vec::new();
        for (owner, fp, token, task) in tasks {
            let claim = task
                .await
                .map_err(|err| format!("a racing claim panicked: {err}"))?
                .map_err(|err| format!("a racing claim failed: {err:?}"))?;
            results.push((owner, fp, token, claim));
        }
        let call = Call {
            start,
            end: Instant::now(),
        };

        let winners: Vec<_> = results
            .iter()
            .filter(|(.., claim)| matches!(claim, Claim::Acquired(_)))
            .collect();
        if winners.len() > 1 {
            return Err(format!(
                "ONE OWNER violated: {} concurrent claims acquired: {results:?}",
                winners.len()
            ));
        }
        let model = &mut self.keys[k].1;
        let passed = model.passed(call);
        self.seen.unsure += u32::from(passed == Passed::Maybe);
        let winner = winners.first().map(|w| (w.0, w.1, w.2, w.3.clone()));
        match (&winner, passed) {
            (None, Passed::Yes) => {
                return Err(format!("no racing claim acquired a free key: {results:?}"));
            }
            (Some(_), Passed::No) => {
                return Err(format!(
                    "ONE OWNER violated: a racing claim acquired a held key: {results:?}"
                ));
            }
            _ => {}
        }
        for (_, fp, _, claim) in &results {
            if matches!(claim, Claim::Acquired(_)) {
                continue;
            }
            // Before the winner (if the old record may still be live), the
            // old record answers; after it, the winner's.
            let before = match (&model.state, passed) {
                (Some(state), Passed::No | Passed::Maybe) => state.live_answer(*fp, claim),
                _ => Err("the key was free".into()),
            };
            let after = match &winner {
                Some((_, winner_fp, ..)) if winner_fp != fp => {
                    if *claim == Claim::Mismatch {
                        Ok(())
                    } else {
                        Err("another request's key must be a mismatch".to_owned())
                    }
                }
                Some(_) => match claim {
                    Claim::InFlight { retry_after } if *retry_after <= LONG => Ok(()),
                    _ => Err("the winner holds the key".to_owned()),
                },
                None => Err("no claim won".to_owned()),
            };
            if let (Err(before), Err(after)) = (before, after) {
                return Err(format!(
                    "racing claim for request {fp} got {claim:?}: {before}; {after}; all: {results:?}"
                ));
            }
        }
        if let Some((owner, fp, token, claim)) = winner {
            if claim != Claim::Acquired(token) {
                return Err(format!("acquired with {claim:?}, not the claimant's token"));
            }
            model.set(Some(State::InFlight {
                owner,
                token,
                fp,
                lease: Deadline::after(call, LONG),
            }));
            self.tokens.insert((owner, k), token);
            self.seen.races_won += 1;
        }
        Ok(())
    }
}

async fn check<S: IdempotencyStore>(
    store: &Arc<S>,
    keys: usize,
    ops: &[Op],
) -> Result<Seen, TestCaseError> {
    let mut model = Model::new(store, keys);
    for op in ops {
        model.step(op).await?;
    }
    Ok(model.seen)
}

/// What a run covers: how many cases, how many owners contend for how many
/// keys, and how long a case may get.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Random cases (`PROPTEST_CASES` overrides it).
    pub cases: u32,
    /// Owners contending.
    pub owners: usize,
    /// Keys they contend for.
    pub keys: usize,
    /// The most steps in one case.
    pub max_len: usize,
}

/// Runs random cases of `shape` against `store`, and tells what they met.
///
/// # Panics
///
/// On the first case the store fails, with the shrunk sequence of steps.
pub fn run<S: IdempotencyStore>(
    runtime: &tokio::runtime::Runtime,
    store: Arc<S>,
    shape: Shape,
) -> Seen {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(shape.cases);
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_time: 60_000,
        // Each case runs against a live clock, so a failure is not replayed
        // byte for byte; the shrunk case is printed instead.
        failure_persistence: None,
        ..Config::default()
    });
    let seen = std::cell::Cell::new(Seen::default());
    let result = runner.run(&ops(shape.owners, shape.keys, shape.max_len), |ops| {
        let case = runtime.block_on(check(&store, shape.keys, &ops))?;
        let mut total = seen.get();
        total.add(case);
        seen.set(total);
        Ok(())
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    let seen = seen.get();
    eprintln!("{shape:?}: {seen:?}");
    seen
}

/// A runtime for [`run`]: two workers, so that races really race.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Five owners contending for one key: takeovers, stale owners and replays.
pub const CONTENDED: Shape = Shape {
    cases: 40,
    owners: 5,
    keys: 1,
    max_len: 40,
};

/// Three owners on three keys: keys must not see each other's records.
pub const SPREAD: Shape = Shape {
    cases: 40,
    owners: 3,
    keys: 3,
    max_len: 40,
};
