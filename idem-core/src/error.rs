//! The error every store operation returns.

use std::fmt;

/// A boxed error from a backend, kept whole so its source chain survives.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in a store operation.
///
/// The idempotency layer maps each kind to a response: [`ErrorKind::Unavailable`]
/// becomes `503` with `Retry-After` and the handler is never called;
/// [`ErrorKind::LeaseLost`] means another owner took the key over and this
/// attempt's result must not be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The backend could not be reached or did not answer in time. Nothing is
    /// known about the record; the caller must not assume a claim was made.
    Unavailable,
    /// The caller no longer owns the record: its lease expired and another
    /// attempt claimed the key, or the record was released or completed.
    LeaseLost,
    /// The backend returned a record this version cannot decode.
    Corrupt,
    /// Something was configured that cannot work: a table name that is not
    /// an identifier, an unsupported server version, a key template that
    /// does not parse or names a part nothing supplies, transactional mode
    /// on a store without transactions. The source says which.
    Config,
    /// A transactional claim's database transaction was no longer the one
    /// the claim began when the store came to commit or roll it back: the
    /// handler ended it (a raw `COMMIT` or `ROLLBACK` on the connection it
    /// was lent), so some of its writes may have committed without the
    /// record. The store kept the key from running again (a record that
    /// is not replayable); the request fails as a server error.
    TransactionEnded,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unavailable => "idempotency store unavailable",
            Self::LeaseLost => "idempotency lease lost to another owner",
            Self::Corrupt => "idempotency record could not be decoded",
            Self::Config => "idempotency misconfigured",
            Self::TransactionEnded => {
                "the idempotency transaction was ended before idem settled it"
            }
        })
    }
}

/// The one error of idem: from a store operation (an
/// [`IdempotencyStore`](crate::IdempotencyStore), `migrate`, `purge_expired`)
/// and from building a route's idempotency (`layer_with_key` and
/// `transactional` in idem-tower, [`ErrorKind::Config`]), so an app's setup
/// has one error type to `?` through (`idem_tower::Error` is this type).
///
/// Opaque by design: match on [`Error::kind`], and walk
/// [`std::error::Error::source`] for the backend's own error.
///
/// ```
/// use idem_core::{Error, ErrorKind};
///
/// let err = Error::new(ErrorKind::Unavailable, std::io::Error::other("connection refused"));
/// assert_eq!(err.kind(), ErrorKind::Unavailable);
/// assert!(std::error::Error::source(&err).is_some());
/// ```
pub struct Error {
    kind: ErrorKind,
    source: Option<BoxError>,
}

impl Error {
    /// An error of `kind` caused by `source`.
    pub fn new(kind: ErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// An error of `kind` with no underlying cause.
    pub fn from_kind(kind: ErrorKind) -> Self {
        Self { kind, source: None }
    }

    /// An [`ErrorKind::Unavailable`] error caused by `source`.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::new(ErrorKind::Unavailable, source)
    }

    /// An [`ErrorKind::LeaseLost`] error.
    pub fn lease_lost() -> Self {
        Self::from_kind(ErrorKind::LeaseLost)
    }

    /// The answer to an owner-fenced write (complete, release, renew):
    /// `Ok` if it happened, [`ErrorKind::LeaseLost`] if the record was no
    /// longer the owner's. For store authors: `done` is whether the
    /// backend's compare-and-set found the owner and wrote.
    ///
    /// ```
    /// use idem_core::{Error, ErrorKind};
    ///
    /// assert!(Error::fenced(true).is_ok());
    /// assert_eq!(Error::fenced(false).unwrap_err().kind(), ErrorKind::LeaseLost);
    /// ```
    pub fn fenced(done: bool) -> Result<(), Self> {
        if done {
            Ok(())
        } else {
            Err(Self::lease_lost())
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind);
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.kind, f)?;
        // A configuration error is read by whoever wrote the configuration:
        // say what is wrong, not only that something is.
        match (&self.kind, &self.source) {
            (ErrorKind::Config, Some(source)) => write!(f, ": {source}"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Self::from_kind(kind)
    }
}

impl From<crate::TemplateError> for Error {
    /// A key template that does not parse is a configuration error.
    fn from(err: crate::TemplateError) -> Self {
        Self::new(ErrorKind::Config, err)
    }
}
