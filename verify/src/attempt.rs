//! An attempt's way through an instance, one atomic step at a time, as the
//! layer (`idem-tower/src/layer/claim.rs`, `lease.rs`, `settle.rs`) drives
//! the tiered store (`idem-redis/src/tiered/`) over the SQL store:
//!
//! ```text
//! gate SET NX ─held, or Redis failed─> SQL claim ─acquired─> handler ─> complete or commit ─> gate complete ─> answer
//!  │                                      └─duplicate─> the gate follows SQL ─> answer
//!  ├─replay, 422 (and 409 in plain mode)─> answer
//!  └─in flight (transactional)─> SQL claim ─acquired─> the gate taken over ─> handler ...
//!                                    └─duplicate─> the gate re-warmed (a replay) ─> answer
//! ```
//!
//! The handler calls a provider out first, under a key derived from the
//! operation (`stores::charge`), then makes its own effect. A phased
//! handler (`IdemModel::phases`) first creates the order in a local phase,
//! its recovery point committed with it, then calls out as a phase whose
//! point is recorded after the call, then makes its effect; each phase is
//! skipped when its point is there.
//!
//! and the faults that cut into it: a Redis command failing, a handler
//! failing, a crash.

use crate::bugs::Bug;
use crate::config::{IdemModel, Mode};
use crate::properties;
use crate::state::{
    Attempt, Duplicate, Gate, GateWrite, Phase, Record, Reply, Response, State, Step, Then, bit,
};
use crate::stores;

impl IdemModel {
    /// The response `attempt`'s handler produces.
    fn response(&self, attempt: Attempt) -> Response {
        let client = self.clients[usize::from(attempt.client)];
        Response {
            key: client.key,
            fingerprint: client.fingerprint,
            token: attempt.token,
        }
    }

    /// Takes the next step of the attempt instance `i` serves.
    pub(crate) fn step(&self, state: &mut State, i: usize) {
        let attempt = state.instances[i].expect("an attempt to step");
        let client = self.clients[usize::from(attempt.client)];
        let (k, fingerprint, token) = (usize::from(client.key), client.fingerprint, attempt.token);
        let (now, lease, bug) = (state.now, self.lease, self.bug);
        let response = self.response(attempt);
        let next = match attempt.step {
            Step::GateClaim => {
                let found =
                    stores::gate_claim(&mut state.keys[k].gate, now, lease, token, fingerprint);
                match found.map(|record| stores::answer(record, fingerprint)) {
                    None => Step::SqlClaim(Gate::Held),
                    // A transactional claim lives as long as its transaction,
                    // which Redis cannot see: SQL is asked.
                    Some(Duplicate::InFlight)
                        if self.mode == Mode::Transactional
                            && bug != Bug::GateTrustedWithoutSqlOnTxClaim =>
                    {
                        Step::SqlClaim(Gate::PastInFlight)
                    }
                    // The gate's record of another fingerprint may be an
                    // attempt SQL refuses or rolled back: SQL decides.
                    Some(Duplicate::Mismatch) if bug != Bug::GateTrustsMismatch => {
                        Step::SqlClaim(Gate::Skipped)
                    }
                    Some(duplicate) => self.turn_away(state, k, fingerprint, duplicate),
                }
            }
            Step::SqlClaim(gate) => self.sql_claim(state, attempt, gate),
            Step::GateWrite(write, then) => {
                let slot = &mut state.keys[k].gate;
                match write {
                    GateWrite::Complete(response) => {
                        stores::complete(slot, token, response, bug);
                    }
                    GateWrite::Release => {
                        stores::release(slot, token, bug);
                    }
                    GateWrite::PutCompleted(response) => {
                        *slot = Some(Record::Completed {
                            fingerprint,
                            response,
                        });
                    }
                    GateWrite::PutInFlight => {
                        *slot = Some(Record::InFlight {
                            owner: token,
                            fingerprint,
                            expires: now + lease,
                        });
                    }
                }
                let Some(next) = then.step() else {
                    state.instances[i] = None;
                    return;
                };
                next
            }
            Step::Handler if self.phases => {
                // The first phase's point, read before it runs: there, the
                // phase is skipped and its output taken.
                if state.keys[k].points & Phase::Order.bit(fingerprint) != 0 {
                    state.ghost.resumed = true;
                    Step::Charge
                } else {
                    Step::OrderCommit
                }
            }
            Step::Handler => {
                // The handler's call out first (a charge at a provider that
                // deduplicates by key), then its own effect.
                stores::charge(state, k, token, bug);
                self.effect(state, k, token);
                Step::Complete
            }
            Step::OrderCommit => {
                let point = Phase::Order.bit(fingerprint);
                let key = &mut state.keys[k];
                if bug == Bug::PointAfterPhaseCommit {
                    state.ghost.orders[k][usize::from(fingerprint)] += 1;
                    Step::OrderPoint
                } else if key.points & point != 0 {
                    // Another run committed the phase since this one read:
                    // the unique key refuses this point, the transaction
                    // rolls back, and the other run's output is taken.
                    state.ghost.resumed = true;
                    Step::Charge
                } else {
                    key.points |= point;
                    state.ghost.orders[k][usize::from(fingerprint)] += 1;
                    Step::Charge
                }
            }
            Step::OrderPoint => {
                state.keys[k].points |= Phase::Order.bit(fingerprint);
                Step::Charge
            }
            Step::Charge => {
                if state.keys[k].points & Phase::Charge.bit(fingerprint) != 0 {
                    state.ghost.resumed = true;
                    self.effect(state, k, token);
                    Step::Complete
                } else {
                    stores::charge(state, k, token, bug);
                    Step::ChargePoint
                }
            }
            Step::ChargePoint => {
                state.keys[k].points |= Phase::Charge.bit(fingerprint);
                self.effect(state, k, token);
                Step::Complete
            }
            Step::Complete => match self.mode {
                Mode::Plain => {
                    if stores::complete(&mut state.keys[k].sql, token, response, bug) {
                        state.ghost.committed |= bit(token);
                        Step::GateWrite(GateWrite::Complete(response), self.after_commit(response))
                    } else {
                        // The lease ran out and the row was taken over: the
                        // outcome is not stored, the tiered store leaves the
                        // gate alone, and the client still gets its response
                        // (`lease::complete`).
                        Step::Answer(Reply::First(response))
                    }
                }
                Mode::Transactional if bug == Bug::HandlerEndsTransaction => {
                    // The transaction the handler ended is not checked: the
                    // record is inserted on its own, where no live row is.
                    if stores::commit(&mut state.keys[k].sql, now, fingerprint, response) {
                        state.ghost.committed |= bit(token);
                        self.after_transaction_commit(response)
                    } else {
                        Step::Answer(Reply::Failed)
                    }
                }
                Mode::Transactional => {
                    let key = &mut state.keys[k];
                    debug_assert_eq!(key.tx, Some(token), "a transaction holds its key");
                    key.tx = None;
                    if stores::commit(&mut key.sql, now, fingerprint, response) {
                        state.ghost.effects[k] += 1;
                        state.ghost.committed |= bit(token);
                        self.after_transaction_commit(response)
                    } else {
                        // Nothing committed, the effect included: 503.
                        Step::Answer(Reply::Failed)
                    }
                }
            },
            Step::SqlRelease(then) => {
                if stores::release(&mut state.keys[k].sql, token, bug) {
                    Step::GateWrite(GateWrite::Release, Then::Answer(then))
                } else {
                    // `LeaseLost`: the tiered store stops there, the gate
                    // untouched.
                    Step::Answer(then)
                }
            }
            Step::Rollback => {
                // Ours, unless the handler ended the transaction early
                // (`Bug::HandlerEndsTransaction`) and another claim took it.
                if state.keys[k].tx == Some(token) {
                    state.keys[k].tx = None;
                }
                Step::GateWrite(GateWrite::Release, Then::Answer(Reply::Failed))
            }
            Step::Answer(reply) => {
                state.clients[usize::from(attempt.client)].deliver(reply);
                state.instances[i] = None;
                return;
            }
            Step::AnswerThen(reply, write) => {
                state.clients[usize::from(attempt.client)].deliver(reply);
                Step::GateWrite(write, Then::Done)
            }
        };
        state.instances[i] = Some(Attempt {
            step: next,
            ..attempt
        });
    }

    /// The step after a transaction committed `response`: answered once
    /// committed, the gate completed after, on a task.
    fn after_transaction_commit(&self, response: Response) -> Step {
        match self.after_commit(response) {
            Then::Answer(reply) => Step::AnswerThen(reply, GateWrite::Complete(response)),
            then => Step::GateWrite(GateWrite::Complete(response), then),
        }
    }

    /// The handler's own effect on key `k`: written at once in plain mode;
    /// in transactional mode made durable by the commit. The handler groups
    /// its writes in a nested transaction, which is a savepoint of the
    /// claim's (idem-sql's `claim_tx.rs`); with
    /// [`Bug::HandlerEndsTransaction`] its commit commits the claim's
    /// transaction: the effect is durable at once, and the key's lock,
    /// `token`'s, is let go.
    fn effect(&self, state: &mut State, k: usize, token: u8) {
        match self.mode {
            Mode::Plain => state.ghost.effects[k] += 1,
            Mode::Transactional if self.bug == Bug::HandlerEndsTransaction => {
                state.ghost.effects[k] += 1;
                let key = &mut state.keys[k];
                if key.tx == Some(token) {
                    key.tx = None;
                }
            }
            Mode::Transactional => {}
        }
    }

    /// The SQL claim: plain (an upsert fenced by the lease), or in a new
    /// transaction (the key's lock, tried without waiting, then a read).
    fn sql_claim(&self, state: &mut State, attempt: Attempt, gate: Gate) -> Step {
        let client = self.clients[usize::from(attempt.client)];
        let (k, fingerprint, token) = (usize::from(client.key), client.fingerprint, attempt.token);
        let (now, lease, bug) = (state.now, self.lease, self.bug);
        let claimed = match self.mode {
            Mode::Plain => {
                stores::sql_claim(&mut state.keys[k].sql, now, lease, token, fingerprint, bug)
                    .map(|replaced| replaced.and_then(Record::owner))
            }
            Mode::Transactional => {
                let key = &mut state.keys[k];
                if key.tx.is_some() {
                    // Another transaction holds the key's lock.
                    Err(Duplicate::InFlight)
                } else if let Some(duplicate) = stores::sql_read(key.sql, now, fingerprint, bug) {
                    Err(duplicate)
                } else {
                    key.tx = Some(token);
                    // The gate's record, for an orphan taken over past it.
                    Ok(key
                        .gate
                        .and_then(Record::owner)
                        .filter(|_| gate == Gate::PastInFlight))
                }
            }
        };
        match claimed {
            Ok(previous) => {
                if previous.is_some_and(|owner| state.dead(owner)) {
                    state.ghost.orphan_taken = true;
                }
                if gate == Gate::PastInFlight {
                    Step::GateWrite(GateWrite::PutInFlight, Then::Handler)
                } else {
                    Step::Handler
                }
            }
            Err(duplicate) => {
                let lost = state.ghost.lost & (1 << k) != 0;
                match (gate, duplicate) {
                    (Gate::Held, Duplicate::Replay(response)) => {
                        state.ghost.caught |= lost;
                        Step::GateWrite(
                            GateWrite::Complete(response),
                            Then::Answer(Reply::Replay(response)),
                        )
                    }
                    (Gate::Held | Gate::Unknown, _) => {
                        self.note_turned_away(state, k, fingerprint, duplicate);
                        Step::GateWrite(GateWrite::Release, Then::Answer(duplicate.into()))
                    }
                    (Gate::PastInFlight, Duplicate::Replay(response)) => Step::GateWrite(
                        GateWrite::PutCompleted(response),
                        Then::Answer(Reply::Replay(response)),
                    ),
                    (Gate::PastInFlight | Gate::Skipped, _) => {
                        self.turn_away(state, k, fingerprint, duplicate)
                    }
                }
            }
        }
    }

    /// The answer to a duplicate of a request with `fingerprint`, noted.
    fn turn_away(
        &self,
        state: &mut State,
        k: usize,
        fingerprint: u8,
        duplicate: Duplicate,
    ) -> Step {
        self.note_turned_away(state, k, fingerprint, duplicate);
        Step::Answer(duplicate.into())
    }

    /// Notes an "in flight" answer given while nothing live holds the key
    /// (property 4), and a 422 given to a request whose response SQL has
    /// committed (property 5).
    fn note_turned_away(&self, state: &mut State, k: usize, fingerprint: u8, duplicate: Duplicate) {
        if duplicate == Duplicate::InFlight && !properties::held_by_the_living(self, state, k) {
            state.ghost.stuck = true;
        }
        let committed = matches!(
            state.keys[k].sql,
            Some(Record::Completed { fingerprint: f, .. }) if f == fingerprint
        );
        if duplicate == Duplicate::Mismatch && committed {
            state.ghost.refused_committed = true;
        }
    }

    /// What follows the gate's completion after a commit.
    fn after_commit(&self, response: Response) -> Then {
        if self.bug == Bug::ReleaseAfterCommit {
            Then::SqlRelease(Reply::First(response))
        } else {
            Then::Answer(Reply::First(response))
        }
    }

    /// The Redis command of instance `i`'s step fails (an error, a timeout,
    /// the breaker open): the gate is skipped. A `SET NX` that failed may
    /// have run all the same (`landed`), leaving our record in the gate
    /// unknown to us; if SQL then turns the claim away, our record is
    /// released under our token (`Gate::Unknown`).
    pub(crate) fn gate_error(&self, state: &mut State, i: usize, landed: bool) {
        let attempt = state.instances[i].expect("an attempt to fail");
        state.used.redis_errors += 1;
        let next = match attempt.step {
            Step::GateClaim => {
                if landed {
                    let client = self.clients[usize::from(attempt.client)];
                    let slot = &mut state.keys[usize::from(client.key)].gate;
                    stores::gate_claim(
                        slot,
                        state.now,
                        self.lease,
                        attempt.token,
                        client.fingerprint,
                    );
                }
                Step::SqlClaim(Gate::Unknown)
            }
            Step::GateWrite(_, then) => match then.step() {
                Some(next) => next,
                None => {
                    state.instances[i] = None;
                    return;
                }
            },
            step => unreachable!("no Redis command at {step:?}"),
        };
        state.instances[i] = Some(Attempt {
            step: next,
            ..attempt
        });
    }

    /// The handler of instance `i`'s attempt fails, with no effect: the
    /// claim is let go (plain: released; transactional: rolled back).
    pub(crate) fn handler_fails(&self, state: &mut State, i: usize) {
        let attempt = state.instances[i].expect("an attempt to fail");
        state.used.handler_failures += 1;
        let next = match self.mode {
            Mode::Plain => Step::SqlRelease(Reply::Failed),
            Mode::Transactional => Step::Rollback,
        };
        state.instances[i] = Some(Attempt {
            step: next,
            ..attempt
        });
    }

    /// The lease heartbeat of instance `i`'s plain claim while its handler
    /// runs: renewed in SQL, whose answer decides, then in the gate.
    pub(crate) fn renew(&self, state: &mut State, i: usize) {
        let attempt = state.instances[i].expect("an attempt to renew");
        let key = &mut state.keys[usize::from(self.clients[usize::from(attempt.client)].key)];
        if stores::renew(&mut key.sql, attempt.token, state.now, self.lease) {
            stores::renew(&mut key.gate, attempt.token, state.now, self.lease);
        }
    }

    /// Instance `i` crashes and restarts with nothing in memory: its
    /// transaction ends with its database session (rolled back, effect
    /// included), its plain claim stays until its lease runs out, and its
    /// gate record until Redis expires it.
    pub(crate) fn crash(&self, state: &mut State, i: usize) {
        let attempt = state.instances[i].take().expect("an attempt to crash");
        let k = usize::from(self.clients[usize::from(attempt.client)].key);
        state.used.crashes += 1;
        state.ghost.dead |= bit(attempt.token);
        match self.mode {
            Mode::Transactional => {
                if state.keys[k].tx == Some(attempt.token) {
                    state.keys[k].tx = None;
                }
            }
            Mode::Plain => {
                if attempt.step == Step::Complete {
                    state.ghost.abandoned |= 1 << k;
                }
            }
        }
    }

    /// Whether the clock's next tick would pass the lease of a live plain
    /// claim (a stall): `None` if not, else the keys (bit per key) of those
    /// whose handler runs or whose completion is pending, so whose effect
    /// may be made twice.
    pub(crate) fn overrun(&self, state: &State) -> Option<u8> {
        let next = state.now + 1;
        let mut overrun = None;
        for attempt in state.instances.iter().flatten() {
            let k = usize::from(self.clients[usize::from(attempt.client)].key);
            let held = state.keys[k]
                .sql
                .is_some_and(|row| row.owner() == Some(attempt.token) && !row.live(next));
            if held {
                let keys = overrun.get_or_insert(0);
                if attempt.step.in_handler() || attempt.step == Step::Complete {
                    *keys |= 1 << k;
                }
            }
        }
        overrun
    }
}

impl Then {
    /// The step this continuation is; `None` once the attempt is over.
    fn step(self) -> Option<Step> {
        match self {
            Self::Handler => Some(Step::Handler),
            Self::Answer(reply) => Some(Step::Answer(reply)),
            Self::SqlRelease(reply) => Some(Step::SqlRelease(reply)),
            Self::Done => None,
        }
    }
}
