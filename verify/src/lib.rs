//! A model checker for idem's claim protocol, on [stateright]: every
//! interleaving of clients, two app instances, the Redis gate, the SQL store,
//! crashes, lost Redis keys and the clock, explored exhaustively within small
//! bounds, against the invariants of ARCHITECTURE.md.
//!
//! ```
//! use idem_verify::{Bug, Faults, IdemModel, Mode, AT_MOST_ONE_EFFECT};
//!
//! // The protocol as implemented holds every property...
//! let model = IdemModel::new(Mode::Plain).with_faults(Faults::default());
//! let verdict = idem_verify::check(model.clone());
//! assert!(verdict.passed(), "{verdict}");
//!
//! // ...and a seeded bug is caught, with the shortest path to it.
//! let verdict = idem_verify::hunt(model.with_bug(Bug::TakeoverIgnoresLease), AT_MOST_ONE_EFFECT);
//! assert!(verdict.counterexamples.contains_key(AT_MOST_ONE_EFFECT), "{verdict}");
//! ```
//!
//! # What is modelled
//!
//! - **Clients** ([`ClientSpec`]): each sends one request under a key with a
//!   fingerprint and retries it (same key, same fingerprint) until a final
//!   answer (the first's response, a replay, 422) or its tries run out; a
//!   retry may go out while an earlier attempt still runs. A second client
//!   may reuse a key for another request (another fingerprint).
//! - **Two app instances**, each serving one attempt at a time, one atomic
//!   store operation per step, as the layer drives the tiered store: the
//!   gate's `SET NX PX GET`; the SQL claim; the gate brought in line with SQL
//!   (the `reconcile` of a claim the gate let through, the re-warming and
//!   the orphan takeover past the gate); the handler's effect; the completion
//!   or the commit; the gate's completion; the answer. The handler first
//!   calls a provider out (a charge), under the key derived from the
//!   operation; the provider deduplicates by key, as Stripe does. A failing
//!   handler releases (plain) or rolls back (transactional), then frees the
//!   gate. A phased handler ([`IdemModel::with_phases`]) first creates an
//!   order in a local phase (its recovery point committed with it, in a
//!   transaction of its own, refused by the points' unique key if another
//!   run's is there), then charges in a call-out phase whose point is
//!   recorded after the call; each phase is skipped when its point is
//!   there, and the points outlive a released record.
//! - **Both modes** ([`Mode`]). Plain: an in-flight row with an owner and a
//!   lease, renewed while the handler runs, the effect written outside the
//!   record, then the record completed. Transactional, in PostgreSQL's form:
//!   the key held by the open transaction's lock, the effect and the
//!   completed row committed together (the unique index refusing the row,
//!   and so the whole commit, over a live one), everything rolled back by a
//!   crash.
//! - **Redis** as a map of records with `PX` expiries, whose `complete`,
//!   `release` and `renew` are fenced by the owner token (the Lua scripts),
//!   which may lose any key at any time (eviction, failover, restart), and
//!   whose commands may fail, a failed `SET NX` having possibly run all the
//!   same: the gate then degrades to SQL.
//! - **SQL** as the unique-indexed map of records: the plain claim's upsert
//!   (absent, or in flight past its lease), and `complete`, `release` and
//!   `renew` fenced by the owner token and the record's state, with every
//!   lease judged by the store's clock.
//! - **A logical clock** that ticks nondeterministically up to a horizon; a
//!   lease runs out when the clock passes it. A live owner's renewals land
//!   in time, unless the run allows *stalls* ([`Faults::stalls`]: a process
//!   paused for a whole lease).
//! - **Crashes** at any step ([`Faults::crashes`]): the instance restarts
//!   with nothing in memory; its plain claim stays until its lease runs
//!   out, its transaction ends with its session, and its gate record stays
//!   until Redis expires it.
//!
//! The state space is finite (the clock and the owner tokens only grow, and
//! every fault has a budget), so each [`check`] explores all of it.
//!
//! # What is abstracted away, and why
//!
//! - **Values.** Fingerprints are small integers, a response is named by the
//!   attempt whose handler produced it, and an effect is a
//!   count per key: the properties look at nothing else.
//! - **One clock for both stores.** A gate record that Redis expires before
//!   the SQL row it fronts is a lost key, which the model has; one that
//!   outlives it only answers "in flight" longer, within its own lease.
//! - **Retention.** A completed record outlives the run (a day against a
//!   lease of seconds); a key whose record has expired is a new key.
//! - **SQL errors.** A SQL store that does not answer makes the layer answer
//!   503 without calling the handler; a claim that landed unheard is a
//!   claim whose owner went away, as after a crash, which the model has.
//! - **In-process machinery** that changes no stored state: the open-claims
//!   map answering duplicates from memory, SQLite's turns and batches, the
//!   bound on open transactions, the in-process cache, the breaker (whose
//!   skipping the gate is a failed gate command), `InFlightPolicy::Wait`
//!   (a wait is a retry).
//! - **MySQL/MariaDB and SQLite's transactional form** (the claim's row
//!   written first in the transaction, completed at commit): to every other
//!   session an uncommitted row holds the key exactly as PostgreSQL's lock
//!   does, and is gone with a rollback.
//! - **Plain and transactional claims of one key.** A route is one or the
//!   other, and the key names its route; each run is one mode.
//! - **A renewal** updates SQL and then the gate in one step: the gate's half
//!   only moves the expiry of a record that is still ours.
//! - **A crashed process's session** ends with the crash: the database
//!   notices a dead connection in its own time, which only delays the end of
//!   the transaction that property 4 is about.
//!
//! # The properties, and the invariants they check
//!
//! | ARCHITECTURE.md | property | seeded bug it catches |
//! |---|---|---|
//! | "Records": every transition a compare-and-set on the owner token, expiry judged by the store's clock | 1, [`AT_MOST_ONE_EFFECT`]; 3, [`REPLAY_IS_COMMITTED_RESPONSE`] | [`Bug::TakeoverIgnoresLease`] (1), [`Bug::CompleteWithoutOwnerCheck`] (3) |
//! | "Records": a failed attempt releases its key; a completed one keeps it | 1 | [`Bug::ReleaseAfterCommit`] |
//! | "The claim's transaction belongs to idem": a handler's nested transaction is a savepoint of the claim's | 1 | [`Bug::HandlerEndsTransaction`] |
//! | "The three layers": the claim, the handler's writes and the response one transaction; the unique index the last word at commit | 1 (no exception in transactional mode); 2, [`ACKNOWLEDGED_EFFECT_EXISTS`] | |
//! | "The three layers", failure policy: Redis down degrades to SQL, still exactly once; a key Redis lost is a duplicate SQL catches | 1, 3 under [`Faults::redis_errors`] and [`Faults::redis_losses`]; reached: [`SQL_CATCHES_LOST_KEY`] | |
//! | "The three layers", liveness: a transactional claim lives as long as its transaction, a plain one by its lease; a crashed request's key frees with its session, behind the gate too | 4, [`NO_KEY_HELD_BY_THE_DEAD`]; reached: [`TAKEOVER_AFTER_CRASH`] | [`Bug::GateTrustedWithoutSqlOnTxClaim`] |
//! | "The three layers": SQL is the truth, the gate answers only what it can know (a replay of a completed record, a claim in flight) | 5, [`COMMITTED_NEVER_REFUSED`] | [`Bug::GateTrustsMismatch`] (found in the real code by this model, fixed in `idem-redis/src/tiered/mod.rs`) |
//! | "Calls out of a handler": every run of an operation calls out under the key derived from it, which a deduplicating provider replays | 6, [`AT_MOST_ONE_CHARGE`] (no plain-mode exception) | [`Bug::ChildKeyPerRun`] |
//! | "Recovery points": a local phase's writes and its point commit together under the points' unique key; a run resumes after the phases another run finished | 7, [`PHASE_WRITES_ONCE`] (with [`IdemModel::with_phases`]); 6 with the charge a phase; reached: [`RESUMED`] | [`Bug::PointAfterPhaseCommit`] |
//! | docs/leases-and-crashes.md, "Without transactional mode, know the limit" | property 1's one exception; reached: [`PLAIN_EFFECT_MADE_AGAIN`] | |
//! | "The five rounds" | reached: [`REPLAYED`] (1); concurrent copies and retries (2); a failing or crashed first attempt, then a retry (3); Redis failing and losing keys (4); two instances (5) | |
//!
//! Property 1 has one exception, in plain mode only, which
//! docs/leases-and-crashes.md states:
//! a plain claim abandoned past its effect (its owner crashed between the
//! effect and the completion, or outlived its lease) is taken over once its
//! lease runs out, and the retry makes the effect again. The exception is
//! not vacuous: [`PLAIN_EFFECT_MADE_AGAIN`] shows that path is reached.

mod attempt;
mod bugs;
mod check;
mod config;
mod model;
mod properties;
mod state;
mod stores;

pub use bugs::Bug;
pub use check::{Trace, Verdict, check, hunt};
pub use config::{ClientSpec, Faults, IdemModel, Mode};
pub use model::Action;
pub use properties::{
    ACKNOWLEDGED_EFFECT_EXISTS, AT_MOST_ONE_CHARGE, AT_MOST_ONE_EFFECT, COMMITTED_NEVER_REFUSED,
    NO_KEY_HELD_BY_THE_DEAD, PHASE_WRITES_ONCE, PLAIN_EFFECT_MADE_AGAIN,
    REPLAY_IS_COMMITTED_RESPONSE, REPLAYED, RESUMED, SQL_CATCHES_LOST_KEY, TAKEOVER_AFTER_CRASH,
};
pub use state::State;
