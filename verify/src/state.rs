//! The checker's state: the clock, the two stores' records of each key, the
//! open transactions, the app instances' attempts, what the clients were
//! answered, and the ghost variables the properties read (history that the
//! system itself does not keep).
//!
//! Everything is a small fixed-size `Copy` value, so that a state costs no
//! allocation to copy and little to hash.

use std::fmt;

/// The app instances sharing the stores.
pub(crate) const INSTANCES: usize = 2;
/// Keys a model may use.
pub(crate) const MAX_KEYS: usize = 2;
/// Clients a model may have.
pub(crate) const MAX_CLIENTS: usize = 3;
/// Attempts a client may send.
pub(crate) const MAX_TRIES: usize = 3;
/// Owner tokens one run may generate: bits of a `u16`.
pub(crate) const MAX_TOKENS: usize = 16;
/// Fingerprints a phased model's requests may have: a key's recovery
/// points are bits of a `u8`, two phases per fingerprint.
pub(crate) const MAX_FINGERPRINTS: usize = 4;

/// An owner token: the number of the attempt that generated it, so that no
/// two attempts ever share one (`OwnerToken::generate`).
pub(crate) type Token = u8;

/// A stored response, named by the attempt whose handler produced it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Response {
    /// The key the attempt claimed.
    pub(crate) key: u8,
    /// The fingerprint of the attempt's request.
    pub(crate) fingerprint: u8,
    /// The attempt's owner token.
    pub(crate) token: Token,
}

impl fmt::Debug for Response {
    /// Short, for traces: `response(key 0, fp 1, token 2)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "response(key {}, fp {}, token {})",
            self.key, self.fingerprint, self.token
        )
    }
}

/// A record, as the gate and the SQL table both hold one per key
/// (idem-core's `Record`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Record {
    /// Claimed by `owner` for a request with `fingerprint`, until the clock
    /// passes `expires`.
    InFlight {
        /// The claiming attempt.
        owner: Token,
        /// Its request's fingerprint.
        fingerprint: u8,
        /// The last tick of its lease.
        expires: u8,
    },
    /// Completed with `response` for requests with `fingerprint`. Kept for
    /// the whole run: the retention (a day by default) outlasts the horizon.
    Completed {
        /// The fingerprint the record was claimed with.
        fingerprint: u8,
        /// The response a duplicate is replayed.
        response: Response,
    },
}

impl Record {
    /// Whether the record still counts at `now`: a completed one always,
    /// an in-flight one until the clock passes its lease.
    pub(crate) fn live(self, now: u8) -> bool {
        match self {
            Self::InFlight { expires, .. } => now <= expires,
            Self::Completed { .. } => true,
        }
    }

    /// The owner of an in-flight record.
    pub(crate) fn owner(self) -> Option<Token> {
        match self {
            Self::InFlight { owner, .. } => Some(owner),
            Self::Completed { .. } => None,
        }
    }
}

/// One key in both stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct KeyState {
    /// The Redis gate's record (`SET NX PX`): Redis's own clock expires it,
    /// and Redis may lose it at any time.
    pub(crate) gate: Option<Record>,
    /// The SQL row, under the table's unique index.
    pub(crate) sql: Option<Record>,
    /// The open transaction holding the key (transactional mode): on
    /// PostgreSQL the key's advisory lock, held until the transaction ends.
    pub(crate) tx: Option<Token>,
    /// The recovery points of the key's requests (a phased handler): one
    /// bit per request's fingerprint and phase ([`Phase::bit`]), under the
    /// points table's unique key, outside the record: a release leaves
    /// them.
    pub(crate) points: u8,
}

/// A phase of a phased handler (`idem_core::Phases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// A local transaction: the order created, its point committed with it.
    Order,
    /// The call out (the charge), its point recorded after it returns.
    Charge,
}

impl Phase {
    /// The bit of this phase of the request with `fingerprint` among a
    /// key's points.
    pub(crate) fn bit(self, fingerprint: u8) -> u8 {
        1 << (fingerprint * 2 + self as u8)
    }
}

/// What a claim that did not acquire its key answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Duplicate {
    /// The key is completed for this fingerprint: its response.
    Replay(Response),
    /// The key is held by a running attempt (409).
    InFlight,
    /// The key is held or completed for another fingerprint (422).
    Mismatch,
}

/// What a client is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Reply {
    /// The handler ran for this attempt: its response.
    First(Response),
    /// A duplicate, replayed the stored response.
    Replay(Response),
    /// A duplicate of a running attempt: 409, retry later.
    InFlight,
    /// The key was used for another request: 422.
    Mismatch,
    /// The attempt failed: the handler's 5xx, or a commit the unique index
    /// refused; the client may retry.
    Failed,
}

impl Step {
    /// Whether the attempt is in its handler (or a phase of it): a failure
    /// may cut it there, and its lease is renewed.
    pub(crate) fn in_handler(self) -> bool {
        matches!(
            self,
            Self::Handler | Self::OrderCommit | Self::OrderPoint | Self::Charge | Self::ChargePoint
        )
    }
}

impl Reply {
    /// Whether the client stops retrying on this answer.
    pub(crate) fn is_final(self) -> bool {
        matches!(self, Self::First(_) | Self::Replay(_) | Self::Mismatch)
    }
}

impl From<Duplicate> for Reply {
    fn from(duplicate: Duplicate) -> Self {
        match duplicate {
            Duplicate::Replay(response) => Self::Replay(response),
            Duplicate::InFlight => Self::InFlight,
            Duplicate::Mismatch => Self::Mismatch,
        }
    }
}

/// What the gate made of an attempt's claim, for the SQL claim that follows
/// (idem-redis `tiered::GateStep`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Gate {
    /// Our `SET NX` set the gate's record: SQL decides, and the gate is
    /// brought in line with SQL's answer.
    Held,
    /// The gate's record is another claim's (a mismatch): SQL alone
    /// decides.
    Skipped,
    /// Redis failed: SQL alone decides, and our `SET NX` may have landed
    /// all the same; if SQL does not give us the key, our record is
    /// released under our token.
    Unknown,
    /// Transactional mode: the gate holds the key in flight, and SQL is
    /// asked whether a transaction still holds it (`past_gate_in_flight`).
    PastInFlight,
}

/// A write to the gate that follows a step, fenced or not as the real one
/// is; its result is ignored, as the tiered store ignores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum GateWrite {
    /// `complete.lua` with our token: completing the record we hold.
    Complete(Response),
    /// `release.lua` with our token: deleting the record we hold.
    Release,
    /// `put_completed`: the record set to SQL's completed one, whatever
    /// the gate held (re-warming).
    PutCompleted(Response),
    /// `put_in_flight`: the record set to our claim, whatever the gate held
    /// (the orphan takeover of a transactional claim).
    PutInFlight,
}

/// Where an attempt goes after a gate write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Then {
    /// Runs the handler (the key is ours).
    Handler,
    /// Answers the client.
    Answer(Reply),
    /// Releases the SQL claim, then answers (after a commit: [`Bug::ReleaseAfterCommit`](crate::Bug::ReleaseAfterCommit)).
    SqlRelease(Reply),
    /// Nothing: the attempt was answered before its gate write, which ran
    /// on a task of its own (a transactional commit's gate completion).
    Done,
}

/// The next step of an attempt: each one atomic step against one store, or
/// the handler, or the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// The gate's `SET NX PX GET`.
    GateClaim,
    /// The SQL claim: plain, or in a new transaction.
    SqlClaim(Gate),
    /// A write to the gate, then what follows it.
    GateWrite(GateWrite, Then),
    /// The handler: its effect, written at once (plain) or in the
    /// transaction (transactional). A phased handler reads its first
    /// phase's point here, and goes on past it if it is there.
    Handler,
    /// A phased handler's first phase commits: the order and its point in
    /// one transaction, rolled back if the point's unique key finds
    /// another run's.
    OrderCommit,
    /// The first phase's point recorded in a transaction of its own, after
    /// the order's commit ([`Bug::PointAfterPhaseCommit`](crate::Bug::PointAfterPhaseCommit) only).
    OrderPoint,
    /// A phased handler's call out: skipped if its point is there, else the
    /// charge under the derived key.
    Charge,
    /// The charge's point recorded, after the call returned; then the
    /// handler's own effect.
    ChargePoint,
    /// The SQL `complete` (plain) or the commit with the completed record
    /// (transactional).
    Complete,
    /// The SQL `release` of a plain claim, then the gate's, then the answer.
    SqlRelease(Reply),
    /// The transaction's rollback, then the gate's release, then `Failed`.
    Rollback,
    /// The answer to the client.
    Answer(Reply),
    /// The answer to the client, then a write to the gate that the instance
    /// makes on a task (the gate's completion after a transactional commit:
    /// `idem-redis/src/tiered/transactional.rs`). The attempt keeps its
    /// instance until that write is made, fails or the instance crashes.
    AnswerThen(Reply, GateWrite),
}

/// An attempt an instance is serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Attempt {
    /// The client that sent it.
    pub(crate) client: u8,
    /// Its owner token.
    pub(crate) token: Token,
    /// Its next step.
    pub(crate) step: Step,
}

/// A client's progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Client {
    /// Attempts sent so far.
    pub(crate) sent: u8,
    /// The answers received, in order.
    pub(crate) replies: [Option<Reply>; MAX_TRIES],
}

impl Client {
    /// The answers received.
    pub(crate) fn replies(&self) -> impl Iterator<Item = Reply> + '_ {
        self.replies.iter().flatten().copied()
    }

    /// Whether the client got a final answer and stopped retrying.
    pub(crate) fn done(&self) -> bool {
        self.replies().any(Reply::is_final)
    }

    /// Records an answer.
    pub(crate) fn deliver(&mut self, reply: Reply) {
        let slot = self
            .replies
            .iter_mut()
            .find(|slot| slot.is_none())
            .expect("one answer per attempt at most");
        *slot = Some(reply);
    }
}

/// The faults injected so far, against [`Faults`](crate::Faults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Used {
    /// Crashes.
    pub(crate) crashes: u8,
    /// Keys Redis lost.
    pub(crate) redis_losses: u8,
    /// Redis commands that failed.
    pub(crate) redis_errors: u8,
    /// Handlers that failed.
    pub(crate) handler_failures: u8,
    /// Ticks past a live owner's lease.
    pub(crate) stalls: u8,
}

/// The provider a handler calls out to, which deduplicates by the call's
/// key, as Stripe does: what keys it has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Provider {
    /// Keys derived from the operation (`operation.key_for`), one per
    /// record key: bit per key.
    pub(crate) operations: u8,
    /// Keys made per run ([`Bug::ChildKeyPerRun`](crate::Bug::ChildKeyPerRun)): bit per token.
    pub(crate) runs: u16,
}

/// History the properties read and the system does not keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Ghost {
    /// Committed effects per key: plain, written by the handler; transactional,
    /// made durable by the commit.
    pub(crate) effects: [u8; MAX_KEYS],
    /// Charges the provider made per key (each a call with a key it had
    /// not seen).
    pub(crate) charges: [u8; MAX_KEYS],
    /// The tokens whose response was ever committed to SQL (bit per token).
    pub(crate) committed: u16,
    /// The tokens whose attempt a crash cut short (bit per token).
    pub(crate) dead: u16,
    /// The keys (bit per key) of a plain claim abandoned past its effect:
    /// its owner crashed between the effect and the completion, or its live
    /// owner outlived its lease (a stall). docs/leases-and-crashes.md,
    /// "Without transactional mode, know the limit".
    pub(crate) abandoned: u8,
    /// The keys (bit per key) Redis lost at least once.
    pub(crate) lost: u8,
    /// Orders the phased handlers committed, per key and request
    /// fingerprint.
    pub(crate) orders: [[u8; MAX_FINGERPRINTS]; MAX_KEYS],
    /// A phased handler went on past a phase another run had finished.
    pub(crate) resumed: bool,
    /// An attempt was answered "in flight" while nothing live held the key.
    pub(crate) stuck: bool,
    /// A request was answered 422 although SQL had committed a response for
    /// its key and fingerprint.
    pub(crate) refused_committed: bool,
    /// A claim acquired a key a crashed attempt had held.
    pub(crate) orphan_taken: bool,
    /// SQL answered a replay to a claim the gate let through after Redis
    /// lost the key.
    pub(crate) caught: bool,
}

/// The state of the whole system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct State {
    /// The clock the stores judge leases by (the database's; Redis's is
    /// taken to agree, see the crate docs).
    pub(crate) now: u8,
    /// The next owner token.
    pub(crate) next_token: Token,
    /// The keys' records and locks.
    pub(crate) keys: [KeyState; MAX_KEYS],
    /// The attempt each instance serves, if any.
    pub(crate) instances: [Option<Attempt>; INSTANCES],
    /// The clients.
    pub(crate) clients: [Client; MAX_CLIENTS],
    /// The provider the handlers call out to.
    pub(crate) provider: Provider,
    /// The faults injected so far.
    pub(crate) used: Used,
    /// The properties' history.
    pub(crate) ghost: Ghost,
}

/// The bit of a token in a 16-bit set.
pub(crate) fn bit(token: Token) -> u16 {
    1 << token
}

impl State {
    /// Whether `token`'s attempt is running on an instance (not crashed, not
    /// answered yet).
    pub(crate) fn running(&self, token: Token) -> bool {
        self.instances.iter().flatten().any(|a| a.token == token)
    }

    /// Whether `token`'s attempt was cut short by a crash.
    pub(crate) fn dead(&self, token: Token) -> bool {
        self.ghost.dead & bit(token) != 0
    }
}
