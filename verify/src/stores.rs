//! The two stores' atomic operations on one key's record: the Redis gate
//! (`store.rs`: `SET NX PX GET`, the Lua scripts, `put_*`) and the SQL table
//! (`plain.rs`, `transactional.rs`, the dialects' statements). Each function
//! is one command or one statement, so one step of the model; each is fenced
//! exactly as its real counterpart (by the owner token, the record's state
//! and, in SQL, the lease judged by the store's clock), less what a seeded
//! bug takes away.

use crate::bugs::Bug;
use crate::state::{Duplicate, Record, Response, Token};

/// What a claim with `fingerprint` finds in a live record (idem-core's
/// `Record::claim_answer`): the mismatch check first, then in flight or
/// the replay.
pub(crate) fn answer(record: Record, fingerprint: u8) -> Duplicate {
    match record {
        Record::InFlight {
            fingerprint: held, ..
        }
        | Record::Completed {
            fingerprint: held, ..
        } if held != fingerprint => Duplicate::Mismatch,
        Record::InFlight { .. } => Duplicate::InFlight,
        Record::Completed { response, .. } => Duplicate::Replay(response),
    }
}

/// The gate's `SET key value NX PX lease GET`: sets our in-flight record if
/// the key is free and returns nothing, or returns the record there.
/// Redis's expiry has already removed a record whose lease ran out.
pub(crate) fn gate_claim(
    slot: &mut Option<Record>,
    now: u8,
    lease: u8,
    owner: Token,
    fingerprint: u8,
) -> Option<Record> {
    match *slot {
        Some(record) if record.live(now) => Some(record),
        _ => {
            *slot = Some(Record::InFlight {
                owner,
                fingerprint,
                expires: now + lease,
            });
            None
        }
    }
}

/// Whether SQL's claim may write over `row`: absent, or in flight with its
/// lease run out (the upsert's `WHERE r.expires_at <= now()`).
fn free(row: Option<Record>, now: u8, bug: Bug) -> bool {
    match row {
        None => true,
        Some(Record::InFlight { .. }) if bug == Bug::TakeoverIgnoresLease => true,
        Some(record) => !record.live(now),
    }
}

/// SQL's read of the key for a claim: the answer of a live row, or `None`
/// when the key is free for the claim to take.
pub(crate) fn sql_read(
    row: Option<Record>,
    now: u8,
    fingerprint: u8,
    bug: Bug,
) -> Option<Duplicate> {
    match row {
        Some(record) if !free(row, now, bug) => Some(answer(record, fingerprint)),
        _ => None,
    }
}

/// SQL's plain claim (the read, then the upsert that inserts the row or
/// takes over an expired one): `Ok` with the row it replaced, if any, or the
/// answer of the live row in the way.
pub(crate) fn sql_claim(
    row: &mut Option<Record>,
    now: u8,
    lease: u8,
    owner: Token,
    fingerprint: u8,
    bug: Bug,
) -> Result<Option<Record>, Duplicate> {
    if let Some(duplicate) = sql_read(*row, now, fingerprint, bug) {
        return Err(duplicate);
    }
    Ok(row.replace(Record::InFlight {
        owner,
        fingerprint,
        expires: now + lease,
    }))
}

/// `complete` in either store: the record in flight under `owner` becomes
/// completed with `response`, keeping its fingerprint (SQL's `UPDATE ...
/// WHERE state = 'I' AND owner = ?`, `complete.lua`); whether it did.
/// Redis has already expired a gate record whose lease ran out; SQL's
/// statement does not look at the lease, and needs not: no other attempt
/// can have taken the row over while it is still `owner`'s.
pub(crate) fn complete(
    slot: &mut Option<Record>,
    owner: Token,
    response: Response,
    bug: Bug,
) -> bool {
    match *slot {
        Some(Record::InFlight {
            owner: holder,
            fingerprint,
            ..
        }) if holder == owner || bug == Bug::CompleteWithoutOwnerCheck => {
            *slot = Some(Record::Completed {
                fingerprint,
                response,
            });
            true
        }
        _ => false,
    }
}

/// `release` in either store: the record in flight under `owner` is deleted
/// (`DELETE ... WHERE state = 'I' AND owner = ?`, `release.lua`); whether it
/// was.
pub(crate) fn release(slot: &mut Option<Record>, owner: Token, bug: Bug) -> bool {
    let ours = match *slot {
        Some(Record::InFlight { owner: holder, .. }) => holder == owner,
        Some(Record::Completed { response, .. }) => {
            bug == Bug::ReleaseAfterCommit && response.token == owner
        }
        None => false,
    };
    if ours {
        *slot = None;
    }
    ours
}

/// `renew` in either store: the record in flight under `owner`, whose lease
/// has not run out, gets a lease of `lease` from `now`; whether it did.
pub(crate) fn renew(slot: &mut Option<Record>, owner: Token, now: u8, lease: u8) -> bool {
    match slot {
        Some(Record::InFlight {
            owner: holder,
            expires,
            ..
        }) if *holder == owner && now <= *expires => {
            *expires = now + lease;
            true
        }
        _ => false,
    }
}

/// The transactional commit on PostgreSQL: the completed row is inserted,
/// or takes over an expired one; a live row in the way (only a write past
/// the store could put one there while the transaction holds the key's
/// lock) makes the insert find it, the commit fail and nothing commit.
/// Whether it committed.
pub(crate) fn commit(
    row: &mut Option<Record>,
    now: u8,
    fingerprint: u8,
    response: Response,
) -> bool {
    if row.is_some_and(|record| record.live(now)) {
        return false;
    }
    *row = Some(Record::Completed {
        fingerprint,
        response,
    });
    true
}

/// The handler of `token`'s attempt on key `k` calls the provider: under
/// the key derived from the operation (the same for every run of `k`), or,
/// with [`Bug::ChildKeyPerRun`], one made for this run. The provider
/// charges a key it has not seen and replays one it has.
pub(crate) fn charge(state: &mut crate::state::State, k: usize, token: Token, bug: Bug) {
    let provider = &mut state.provider;
    let new = if bug == Bug::ChildKeyPerRun {
        let seen = provider.runs & crate::state::bit(token) != 0;
        provider.runs |= crate::state::bit(token);
        !seen
    } else {
        let seen = provider.operations & (1 << k) != 0;
        provider.operations |= 1 << k;
        !seen
    };
    if new {
        state.ghost.charges[k] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESPONSE: Response = Response {
        key: 0,
        fingerprint: 0,
        token: 1,
    };

    fn in_flight(owner: Token, expires: u8) -> Option<Record> {
        Some(Record::InFlight {
            owner,
            fingerprint: 0,
            expires,
        })
    }

    #[test]
    fn a_plain_claim_takes_a_row_over_only_past_its_lease() {
        let mut row = in_flight(1, 1);
        assert_eq!(
            sql_claim(&mut row, 1, 1, 2, 0, Bug::None),
            Err(Duplicate::InFlight)
        );
        assert_eq!(
            sql_claim(&mut row, 1, 1, 2, 1, Bug::None),
            Err(Duplicate::Mismatch),
            "the mismatch check first"
        );
        assert_eq!(
            sql_claim(&mut row, 2, 1, 2, 1, Bug::None),
            Ok(in_flight(1, 1))
        );
        assert_eq!(row.and_then(Record::owner), Some(2));
    }

    #[test]
    fn transitions_are_fenced_by_the_owner_and_the_state() {
        let mut row = in_flight(1, 1);
        assert!(!complete(&mut row, 2, RESPONSE, Bug::None));
        assert!(!release(&mut row, 2, Bug::None));
        assert!(!renew(&mut row, 2, 0, 1));
        assert_eq!(row, in_flight(1, 1));
        assert!(complete(&mut row, 1, RESPONSE, Bug::None));
        assert!(!release(&mut row, 1, Bug::None), "a completed record stays");
        assert!(!renew(&mut row, 1, 0, 1));
        assert_eq!(
            row,
            Some(Record::Completed {
                fingerprint: 0,
                response: RESPONSE
            })
        );
    }

    #[test]
    fn a_lease_that_ran_out_is_not_renewed() {
        let mut row = in_flight(1, 1);
        assert!(!renew(&mut row, 1, 2, 1));
        assert!(renew(&mut row, 1, 1, 1));
        assert_eq!(row, in_flight(1, 2));
    }

    #[test]
    fn a_commit_over_a_live_row_commits_nothing() {
        let mut row = in_flight(1, 1);
        assert!(!commit(&mut row, 1, 0, RESPONSE));
        assert!(commit(&mut row, 2, 0, RESPONSE), "over an expired row");
    }

    #[test]
    fn the_gate_sets_its_record_only_on_a_free_key() {
        let mut slot = None;
        assert_eq!(gate_claim(&mut slot, 0, 1, 1, 0), None);
        assert_eq!(gate_claim(&mut slot, 0, 1, 2, 0), in_flight(1, 1));
        assert_eq!(slot, in_flight(1, 1));
    }
}
