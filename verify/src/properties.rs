//! What the checker holds the model to: six `always` properties (seven
//! with a phased handler), the
//! invariants of ARCHITECTURE.md ("Records", "The three layers"), and the
//! `sometimes` properties that show the paths worth checking are reached,
//! so that a model that cannot get there fails instead of passing vacuously.

use stateright::Property;

use crate::config::{IdemModel, Mode};
use crate::state::{Record, Reply, State, bit};

/// Property 1: at most one committed effect per key, ever. In plain mode a
/// claim abandoned past its effect is the one exception, which
/// docs/leases-and-crashes.md states ("Without transactional mode, know the
/// limit"): its owner crashed
/// between the effect and the completion, or outlived its lease, and a
/// retry that takes the key over makes the effect again.
pub const AT_MOST_ONE_EFFECT: &str = "at most one committed effect per key";
/// Property 2: a client answered with success (its handler's response or a
/// replay) has its key's effect committed.
pub const ACKNOWLEDGED_EFFECT_EXISTS: &str = "an acknowledged operation's effect is committed";
/// Property 3: a replay is a response committed for the same key and the
/// same fingerprint: never one of another request, never one that did not
/// commit.
pub const REPLAY_IS_COMMITTED_RESPONSE: &str =
    "a replay is the committed response of its key and fingerprint";
/// Property 4: no key is held by a dead owner past its lease (plain) or its
/// session (transactional): every "in flight" answer is given while a live
/// hold exists (a lease not run out, an open transaction, or a running
/// attempt on its way from the gate to SQL), and no open transaction
/// belongs to a crashed attempt.
pub const NO_KEY_HELD_BY_THE_DEAD: &str =
    "no key is held by a dead owner past its lease or session";
/// Property 5: a request whose response SQL has committed is never
/// refused as a reuse of its key with another body (422): its retries are
/// replayed, whatever another body's attempt left in the gate.
pub const COMMITTED_NEVER_REFUSED: &str =
    "a request SQL committed is never refused as another request (422)";
/// Property 6: at most one charge per key at the provider a handler calls
/// out to, in both modes, without property 1's plain-mode exception: every
/// run of an operation calls it under the key derived from the operation,
/// and the provider replays a key it has seen (docs/outbound.md).
pub const AT_MOST_ONE_CHARGE: &str = "at most one charge per key at the provider called out to";
/// Property 7 (a phased handler): a local phase's writes commit at most
/// once per request (key and fingerprint), in both modes, without property
/// 1's plain-mode exception: its recovery point commits with them, under
/// the points' unique key, and a run that finds the point goes on from
/// its output (docs/outbound.md, "Phases").
pub const PHASE_WRITES_ONCE: &str = "a local phase's writes commit at most once per request";

/// Reached: a duplicate is replayed the stored response.
pub const REPLAYED: &str = "a duplicate is replayed";
/// Reached: a key a crashed attempt held is taken over (plain: its lease ran
/// out; transactional: the gate's orphan, past the gate).
pub const TAKEOVER_AFTER_CRASH: &str = "a crashed owner's key is taken over";
/// Reached: Redis lost a key, and SQL caught the duplicate the gate let
/// through (*fallback caught*).
pub const SQL_CATCHES_LOST_KEY: &str = "SQL catches a duplicate of a key Redis lost";
/// Reached (a phased handler): a run goes on past a phase an earlier or
/// concurrent run finished, from its recovery point.
pub const RESUMED: &str = "a phased run resumes after a phase another run finished";
/// Reached (plain mode): a claim abandoned past its effect is taken over and
/// the effect made again: the exception to property 1 is not vacuous.
pub const PLAIN_EFFECT_MADE_AGAIN: &str = "plain mode: an abandoned claim's effect is made again (docs/leases-and-crashes.md: know the limit)";

/// The properties of `model`: the six invariants, and the `sometimes` ones
/// its configuration can reach (a takeover needs a crash, a catch needs a
/// lost key).
pub(crate) fn of(model: &IdemModel) -> Vec<Property<IdemModel>> {
    let mut properties = vec![
        Property::always(AT_MOST_ONE_EFFECT, at_most_one_effect),
        Property::always(ACKNOWLEDGED_EFFECT_EXISTS, acknowledged_effect_exists),
        Property::always(REPLAY_IS_COMMITTED_RESPONSE, replay_is_committed_response),
        Property::always(NO_KEY_HELD_BY_THE_DEAD, no_key_held_by_the_dead),
        Property::always(COMMITTED_NEVER_REFUSED, committed_never_refused),
        Property::always(AT_MOST_ONE_CHARGE, at_most_one_charge),
        Property::sometimes(REPLAYED, replayed),
    ];
    if model.faults.crashes > 0 {
        properties.push(Property::sometimes(
            TAKEOVER_AFTER_CRASH,
            takeover_after_crash,
        ));
        if model.mode == Mode::Plain {
            properties.push(Property::sometimes(
                PLAIN_EFFECT_MADE_AGAIN,
                effect_made_again,
            ));
        }
    }
    if model.phases {
        properties.push(Property::always(PHASE_WRITES_ONCE, phase_writes_once));
        if model.faults.crashes > 0 || model.faults.handler_failures > 0 {
            properties.push(Property::sometimes(RESUMED, resumed));
        }
    }
    if model.faults.redis_losses > 0 {
        properties.push(Property::sometimes(
            SQL_CATCHES_LOST_KEY,
            sql_catches_lost_key,
        ));
    }
    properties
}

fn at_most_one_effect(model: &IdemModel, state: &State) -> bool {
    (0..usize::from(model.keys)).all(|k| {
        state.ghost.effects[k] <= 1
            || (model.mode == Mode::Plain && state.ghost.abandoned & (1 << k) != 0)
    })
}

fn acknowledged_effect_exists(model: &IdemModel, state: &State) -> bool {
    model
        .clients
        .iter()
        .zip(&state.clients)
        .all(|(spec, client)| {
            !client
                .replies()
                .any(|r| matches!(r, Reply::First(_) | Reply::Replay(_)))
                || state.ghost.effects[usize::from(spec.key)] > 0
        })
}

fn replay_is_committed_response(model: &IdemModel, state: &State) -> bool {
    model
        .clients
        .iter()
        .zip(&state.clients)
        .all(|(spec, client)| {
            client.replies().all(|reply| match reply {
                Reply::Replay(response) => {
                    response.key == spec.key
                        && response.fingerprint == spec.fingerprint
                        && state.ghost.committed & bit(response.token) != 0
                }
                _ => true,
            })
        })
}

fn no_key_held_by_the_dead(model: &IdemModel, state: &State) -> bool {
    !state.ghost.stuck
        && state.keys[..usize::from(model.keys)]
            .iter()
            .all(|key| key.tx.is_none_or(|owner| !state.dead(owner)))
}

fn committed_never_refused(_: &IdemModel, state: &State) -> bool {
    !state.ghost.refused_committed
}

fn replayed(_: &IdemModel, state: &State) -> bool {
    state
        .clients
        .iter()
        .any(|c| c.replies().any(|r| matches!(r, Reply::Replay(_))))
}

fn takeover_after_crash(_: &IdemModel, state: &State) -> bool {
    state.ghost.orphan_taken
}

fn effect_made_again(_: &IdemModel, state: &State) -> bool {
    state.ghost.effects.iter().any(|&n| n > 1)
}

fn sql_catches_lost_key(_: &IdemModel, state: &State) -> bool {
    state.ghost.caught
}

/// Whether something live holds key `k`, so that "in flight" is a true
/// answer: plain, a record in flight whose lease has not run out (in SQL, or
/// the gate's, which the plain path trusts); transactional, an open
/// transaction, or the gate's record of a running attempt that has not yet
/// reached SQL.
pub(crate) fn held_by_the_living(model: &IdemModel, state: &State, k: usize) -> bool {
    let key = state.keys[k];
    match model.mode {
        Mode::Plain => [key.sql, key.gate]
            .into_iter()
            .flatten()
            .any(|record| matches!(record, Record::InFlight { .. }) && record.live(state.now)),
        Mode::Transactional => {
            key.tx.is_some()
                || key
                    .gate
                    .and_then(Record::owner)
                    .is_some_and(|owner| state.running(owner))
        }
    }
}

fn phase_writes_once(_: &IdemModel, state: &State) -> bool {
    state
        .ghost
        .orders
        .iter()
        .flatten()
        .all(|&orders| orders <= 1)
}

fn resumed(_: &IdemModel, state: &State) -> bool {
    state.ghost.resumed
}

fn at_most_one_charge(_: &IdemModel, state: &State) -> bool {
    state.ghost.charges.iter().all(|&charges| charges <= 1)
}
