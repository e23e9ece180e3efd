//! One-time tokens: handed out with a form, consumed atomically on submit,
//! restored if the business step then fails so the user can submit again.
//!
//! A token is 128 random bits, shown to the client as 32 hex characters and
//! stored only as its blake3 hash, bound to a *subject* (who and what it was
//! issued for, e.g. `"acme:alice:checkout"`): a token consumed under another
//! subject is [`TokenUse::Invalid`]. Consuming is one atomic step (a Lua
//! compare-and-delete in Redis, `DELETE ... RETURNING` in SQL), so of twenty
//! concurrent submits exactly one gets [`TokenUse::Consumed`].

use std::fmt;
use std::time::Duration;

/// A one-time token, as handed to the client. Its `Debug` hides the value.
///
/// ```
/// use idem_guards::OneTimeToken;
///
/// let token = OneTimeToken::generate();
/// assert_eq!(token.as_str().len(), 32);
/// assert_eq!(OneTimeToken::from(token.as_str().to_owned()), token);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OneTimeToken(String);

impl OneTimeToken {
    /// A fresh token: 128 random bits as 32 lower-case hex characters.
    pub fn generate() -> Self {
        Self(format!("{:032x}", rand::random::<u128>()))
    }

    /// The token as the client sends it back.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What is stored: the token's blake3 hash, never the token.
    pub(crate) fn hash(&self) -> [u8; 32] {
        *blake3::hash(self.0.as_bytes()).as_bytes()
    }
}

impl From<String> for OneTimeToken {
    /// A token as received from a client (any text; an unknown one is
    /// simply [`TokenUse::Invalid`]).
    fn from(token: String) -> Self {
        Self(token)
    }
}

impl From<&str> for OneTimeToken {
    fn from(token: &str) -> Self {
        Self(token.to_owned())
    }
}

impl fmt::Debug for OneTimeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OneTimeToken(..)")
    }
}

impl fmt::Display for OneTimeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A token this call consumed: the proof needed to restore it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedToken {
    /// The token.
    pub token: OneTimeToken,
    /// The subject it was issued for.
    pub subject: String,
    /// How long it had left when consumed; a restore gives it that back.
    pub ttl_left: Duration,
}

/// What consuming a token found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "only a consumed token lets the submit through"]
pub enum TokenUse {
    /// This call consumed it: go ahead, exactly once.
    Consumed(ConsumedToken),
    /// Unknown, expired, already consumed, or issued for another subject:
    /// the submit is a duplicate (or forged). Nothing was changed.
    Invalid,
}

impl TokenUse {
    /// The consumed token, if this call consumed it.
    pub fn consumed(self) -> Option<ConsumedToken> {
        match self {
            Self::Consumed(token) => Some(token),
            Self::Invalid => None,
        }
    }
}

/// A time left as the database or Redis reports it, in milliseconds: at
/// least 1 ms (a token about to expire still has some).
fn ttl_from_ms(ms: i64) -> Duration {
    Duration::from_millis(ms.max(1).unsigned_abs())
}

#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sql")]
mod sql;

#[cfg(feature = "redis")]
pub use self::redis::RedisTokens;
#[cfg(feature = "sql")]
pub use self::sql::{DEFAULT_TOKEN_TABLE, SqlTokens};
