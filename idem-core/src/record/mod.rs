//! The record state machine of one key (see [`Record`]), and what a claim
//! can find.

mod codec;

use std::fmt;
use std::time::Duration;

pub use codec::DecodeError;

use crate::{Fingerprint, StoredResponse};

/// The random token that names the current owner of an in-flight record.
/// Every transition out of `InFlight`, and every renewal, compares it, so an
/// attempt whose lease expired cannot complete, release or renew over its
/// successor.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// A fresh random token.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// The token from its 16 stored bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes to store.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken(")?;
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// What a completed request left for its duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The response, replayed to every duplicate.
    Response(StoredResponse),
    /// The request ran, but its response was not kept (too large to
    /// store; or, in transactional mode, its handler ended the claim's
    /// transaction, so what it committed is unknown):
    /// duplicates get a 409 rather than a second execution.
    NotReplayable,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Claim {
    /// The key was free (or its lease had expired): the caller owns it now and
    /// must complete or release it with this token.
    Acquired(OwnerToken),
    /// The key was completed with the same fingerprint: replay this.
    Replay(Outcome),
    /// Another attempt with the same fingerprint holds the key.
    InFlight {
        /// How long until its lease runs out, by the store's clock.
        retry_after: Duration,
    },
    /// The key is held or completed by a request with another fingerprint.
    Mismatch,
}

/// What a claim finds when the key is not free: everything but
/// [`Claim::Acquired`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Duplicate {
    /// The key was completed with the same fingerprint: replay this.
    Replay(Outcome),
    /// Another attempt with the same fingerprint holds the key.
    InFlight {
        /// How long until its lease runs out, by the store's clock.
        retry_after: Duration,
    },
    /// The key is held or completed by a request with another fingerprint.
    Mismatch,
}

impl Claim {
    /// The owner token if the key was acquired, else what the claim found.
    ///
    /// ```
    /// use idem_core::{Claim, Duplicate};
    ///
    /// assert_eq!(Claim::Mismatch.acquired(), Err(Duplicate::Mismatch));
    /// ```
    #[allow(clippy::result_large_err)] // no larger than the claim it takes apart
    pub fn acquired(self) -> Result<OwnerToken, Duplicate> {
        match self {
            Self::Acquired(owner) => Ok(owner),
            Self::Replay(outcome) => Err(Duplicate::Replay(outcome)),
            Self::InFlight { retry_after } => Err(Duplicate::InFlight { retry_after }),
            Self::Mismatch => Err(Duplicate::Mismatch),
        }
    }
}

impl From<Duplicate> for Claim {
    fn from(duplicate: Duplicate) -> Self {
        match duplicate {
            Duplicate::Replay(outcome) => Self::Replay(outcome),
            Duplicate::InFlight { retry_after } => Self::InFlight { retry_after },
            Duplicate::Mismatch => Self::Mismatch,
        }
    }
}

/// A record's stored state: one key's state machine.
///
/// ```text
/// (absent) --claim--> InFlight{owner, lease, fingerprint}
/// InFlight --complete(owner)--> Completed{fingerprint, outcome}   (ttl)
/// InFlight --release(owner)---> (absent)                          (retry allowed)
/// InFlight --lease expired, claim--> InFlight{new owner}          (takeover)
/// InFlight --renew(owner)---> InFlight{same owner, lease from now}
/// ```
///
/// A plain (non-transactional) claim lives by its lease, which its owner
/// renews while the handler runs: a claim whose process died frees within
/// about one lease.
///
/// Stores that keep a record as one value (Redis) store [`Record::encode`];
/// stores with columns may keep the parts apart. Lease and ttl are the
/// store's to keep, by its own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Claimed and not yet finished.
    InFlight {
        /// Who may complete or release it.
        owner: OwnerToken,
        /// The request that claimed it.
        fingerprint: Fingerprint,
    },
    /// Finished; replayed until ttl runs out.
    Completed {
        /// The request that completed it.
        fingerprint: Fingerprint,
        /// What duplicates get.
        outcome: Outcome,
    },
}

impl Record {
    /// The fingerprint of the request that claimed or completed the record.
    pub fn fingerprint(&self) -> &Fingerprint {
        match self {
            Self::InFlight { fingerprint, .. } | Self::Completed { fingerprint, .. } => fingerprint,
        }
    }

    /// What a claim with `fingerprint` finds in this live record (an in-flight
    /// one whose lease still runs): the mismatch check comes first, so a
    /// different request is told 422 even while the first is in flight.
    pub fn claim_answer(&self, fingerprint: &Fingerprint, lease_left: Duration) -> Claim {
        if self.fingerprint() != fingerprint {
            return Claim::Mismatch;
        }
        match self {
            Self::InFlight { .. } => Claim::InFlight {
                retry_after: lease_left,
            },
            Self::Completed { outcome, .. } => Claim::Replay(outcome.clone()),
        }
    }
}
