//! The seeded bugs: each a small change to one step of the protocol, which
//! the checker must catch as a counterexample to the property it breaks. A
//! model checker that finds none of them checks nothing.

use crate::properties;

/// A bug seeded into the model, one at a time ([`IdemModel::bug`](crate::IdemModel::bug)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The protocol as implemented.
    None,
    /// `complete` without the owner check, in both stores (the SQL
    /// `UPDATE ... WHERE state = 'I'` without `AND owner = ?`, `complete.lua`
    /// without its token comparison): an attempt completes a record another
    /// attempt holds. The completed record keeps the holder's fingerprint,
    /// so the holder's request is replayed another request's response.
    CompleteWithoutOwnerCheck,
    /// A plain claim takes over an in-flight row whatever its lease (the
    /// upsert's `WHERE r.expires_at <= now()` gone): a live first attempt
    /// loses its key to a duplicate, and both run the effect.
    TakeoverIgnoresLease,
    /// On a transactional claim the gate's "in flight" is answered as it is,
    /// without asking SQL whether a transaction still holds the key (no
    /// `past_gate_in_flight`): a crashed first attempt's key stays blocked
    /// for the gate record's whole lease although its transaction, and so
    /// its claim, ended with its process.
    GateTrustedWithoutSqlOnTxClaim,
    /// The attempt's release still runs after its outcome was committed
    /// (the release-on-drop guard left armed), and the release deletes the
    /// attempt's record even once completed (a release fenced by the owner
    /// alone, on a record that keeps its owner when completed): the key is
    /// free again, and a retry runs the effect a second time.
    ReleaseAfterCommit,
    /// The gate's 422 answered as it is, without SQL (as the tiered store
    /// did before the model found it): a request reusing the key with
    /// another body holds the gate once the first's gate record is gone, and
    /// the first's retry is refused although SQL committed it.
    GateTrustsMismatch,
    /// The handler's call out carries a key made for this run (a fresh
    /// UUID per handler call) instead of one derived from the operation
    /// (`Operation::key_for`): a run after a crash between the call and the
    /// commit, or after a plain claim abandoned past its effect, calls the
    /// provider under a key it has not seen, and it charges again.
    ChildKeyPerRun,
    /// A phased handler's local phase commits its writes, then records its
    /// recovery point in a transaction of its own (instead of in the
    /// phase's, under the points' unique key): a run cut between the two,
    /// or a concurrent run that read no point yet, makes the phase's
    /// writes again, and the order is created twice.
    PointAfterPhaseCommit,
    /// In transactional mode the handler groups its writes in a nested
    /// transaction (`begin()` and `commit()` on the connection it was
    /// lent) that commits the claim's transaction instead of being a
    /// savepoint of it, and the store settles without checking that its
    /// transaction is still the claim's (as idem did before the claim's
    /// transaction was lent counted open): the effect is durable and the
    /// key's lock let go while the handler runs, so another instance runs
    /// the effect meanwhile, or a failing handler's rollback keeps it and
    /// the retry makes it again.
    HandlerEndsTransaction,
}

impl Bug {
    /// Every seeded bug, [`Bug::None`] excepted.
    pub const SEEDED: [Self; 8] = [
        Self::CompleteWithoutOwnerCheck,
        Self::TakeoverIgnoresLease,
        Self::GateTrustedWithoutSqlOnTxClaim,
        Self::ReleaseAfterCommit,
        Self::GateTrustsMismatch,
        Self::ChildKeyPerRun,
        Self::PointAfterPhaseCommit,
        Self::HandlerEndsTransaction,
    ];

    /// The property this bug breaks, or `None` for [`Bug::None`].
    pub fn breaks(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::CompleteWithoutOwnerCheck => Some(properties::REPLAY_IS_COMMITTED_RESPONSE),
            Self::TakeoverIgnoresLease
            | Self::ReleaseAfterCommit
            | Self::HandlerEndsTransaction => Some(properties::AT_MOST_ONE_EFFECT),
            Self::GateTrustedWithoutSqlOnTxClaim => Some(properties::NO_KEY_HELD_BY_THE_DEAD),
            Self::GateTrustsMismatch => Some(properties::COMMITTED_NEVER_REFUSED),
            Self::ChildKeyPerRun => Some(properties::AT_MOST_ONE_CHARGE),
            Self::PointAfterPhaseCommit => Some(properties::PHASE_WRITES_ONCE),
        }
    }
}
