//! Recovery points: a handler made of phases (a local transaction, a call
//! out, a local transaction) records each finished phase with its output,
//! and a later run of the same operation resumes after the last one
//! instead of starting over ([`Phases`]). The store author's side is
//! [`RecoveryPoints`]. docs/outbound.md, "Phases", is the guide;
//! ARCHITECTURE.md, "Recovery points", the invariants.

#[cfg(feature = "memory")]
mod memory;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, ErrorKind};

#[cfg(feature = "memory")]
pub use memory::MemoryPoints;

/// The longest phase name, in bytes: what every store's key column holds.
pub const MAX_PHASE_NAME_LEN: usize = 255;

/// One finished phase, as a store records it: the operation it belongs to,
/// the phase's name, its output (JSON) and how long to keep it.
#[derive(Debug, Clone, Copy)]
pub struct RecoveryPoint<'a> {
    /// The operation's identity: 32 bytes, the same on every run of it.
    pub operation: &'a [u8; 32],
    /// The phase's name, at most [`MAX_PHASE_NAME_LEN`] bytes.
    pub phase: &'a str,
    /// What the phase produced, serialised as JSON.
    pub output: &'a [u8],
    /// How long the point counts from now; past that it is absent.
    pub keep: Duration,
}

/// What [`RecoveryPoints::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The transaction committed, its writes and the point together.
    Committed,
    /// A live point of the phase was there already (another run finished
    /// it meanwhile): the transaction was rolled back, nothing of it
    /// written, and this is the stored output.
    Existing(Vec<u8>),
}

/// Where recovery points are kept: the store author's side of [`Phases`].
///
/// A point is unique per (operation, phase): the store's unique index (or
/// its equivalent) is what decides which of two runs finished a phase.
/// Points expire by the store's own clock and count as absent once
/// expired. idem-sql's stores keep them in a table of their own beside the
/// records; [`MemoryPoints`] keeps them in this process, for tests.
///
/// ```
/// use idem_core::{Phases, RecoveryPoints};
///
/// fn phases_on<P: RecoveryPoints>(points: &P, operation: [u8; 32]) -> Phases<'_, P> {
///     Phases::new(points, operation, std::time::Duration::from_secs(86_400))
/// }
/// # let _ = phases_on::<idem_core::MemoryPoints>;
/// ```
pub trait RecoveryPoints: Send + Sync {
    /// What a local phase's closure gets, owned: its handle on the open
    /// transaction its writes go in (idem-sql's `PhaseTx`, which derefs to
    /// the connection; `()` on [`MemoryPoints`]).
    type Transaction: Send;

    /// What the store keeps of the open transaction while the phase runs,
    /// to commit it with the point.
    type Open: Send;

    /// The output recorded for `phase` of `operation`, if a live point has
    /// it.
    fn point(
        &self,
        operation: &[u8; 32],
        phase: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, Error>> + Send;

    /// Begins the transaction a phase's writes go in: the handle the phase
    /// gets, and what [`commit`](Self::commit) takes once the phase has
    /// dropped its handle.
    fn begin(&self) -> impl Future<Output = Result<(Self::Transaction, Self::Open), Error>> + Send;

    /// Records `point` in the transaction `open` and commits it: the
    /// phase's writes and its point together, or neither. If a live point
    /// of the phase is there (its unique key refuses the insert), rolls the
    /// transaction back and answers the stored output. An error leaves
    /// nothing of the transaction committed, unless the commit's own answer
    /// was lost on its way back.
    fn commit(
        &self,
        open: Self::Open,
        point: RecoveryPoint<'_>,
    ) -> impl Future<Output = Result<Recorded, Error>> + Send;

    /// How many live points `operation` has.
    fn finished(&self, operation: &[u8; 32]) -> impl Future<Output = Result<u64, Error>> + Send;
}

/// The phases of one operation: each finished phase recorded with its
/// output, so that a run after a crash, a failure or a released attempt
/// resumes after the last finished phase instead of starting over (Stripe's
/// "atomic phases" and "recovery points").
///
/// A phase is memoised by its name: running a phase whose point exists
/// returns the stored output without running it. There are two kinds:
///
/// - [`transaction`](Self::transaction), local writes: the closure gets
///   the open transaction, and its writes and the phase's point commit
///   together, or neither does. If another run finished the phase
///   meanwhile, the point's unique key refuses this one, the transaction is
///   rolled back and the stored output is returned: the phase's writes are
///   made once.
/// - [`call`](Self::call), a call out with no local writes: its output is
///   recorded after the call returns. A crash between the two repeats the
///   call on the next run, which is safe only because the call carries a
///   key that is the same on every run (idem-tower's
///   `Operation::key_for`), and the provider answers a repeat with its
///   first answer.
///
/// Outputs are stored as JSON (serde), so a phase's output type must
/// read back what it wrote. Points are kept for `keep` from when they are
/// recorded (idem-tower's `Operation::phases` takes the route's ttl), then
/// expire, and the store's purge deletes them. Name phases by what they
/// do, and never reuse a name for another step: a renamed phase runs again.
///
/// idem-tower's `Operation::phases` makes one for a handler:
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Error, MemoryPoints, Phases};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let points = MemoryPoints::new();
/// let phases = Phases::new(&points, [7; 32], Duration::from_secs(3600));
/// let order: u64 = phases
///     .transaction("create-order", |_tx| async { Ok::<_, Error>(42) })
///     .await?;
/// let charge: String = phases
///     .call("charge", || async move { Ok::<_, Error>(format!("ch_{order}")) })
///     .await?;
///
/// // Another run of the same operation: both phases are finished, and
/// // neither closure runs again.
/// let again = Phases::new(&points, [7; 32], Duration::from_secs(3600));
/// assert_eq!(again.finished().await?, 2);
/// let same: String = again
///     .call("charge", || async { Err::<String, _>(Error::unavailable("not called")) })
///     .await?;
/// assert_eq!(same, charge);
/// # Ok::<(), Error>(()) }).unwrap();
/// ```
pub struct Phases<'p, P: ?Sized> {
    points: &'p P,
    operation: [u8; 32],
    keep: Duration,
}

impl<P: ?Sized> Clone for Phases<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: ?Sized> Copy for Phases<'_, P> {}

impl<P: ?Sized> fmt::Debug for Phases<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Phases")
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}

impl<'p, P: RecoveryPoints + ?Sized> Phases<'p, P> {
    /// The phases of the operation whose identity is `operation` (32 bytes,
    /// the same on every run of it, different for every other operation),
    /// their points kept in `points` for `keep` from when each is recorded.
    /// Keep them at least as long as a retry of the operation may come:
    /// the route's ttl.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::{MemoryPoints, Phases};
    ///
    /// let points = MemoryPoints::new();
    /// let phases = Phases::new(&points, [1; 32], Duration::from_secs(86_400));
    /// # let _ = phases;
    /// ```
    pub fn new(points: &'p P, operation: [u8; 32], keep: Duration) -> Self {
        Self {
            points,
            operation,
            keep,
        }
    }

    /// Runs the local phase `name`, unless it is finished: the stored
    /// output then, without running `phase`. Otherwise `phase` gets a
    /// transaction of its own ([`RecoveryPoints::begin`]), owned: on a SQL
    /// store a `PhaseTx` that derefs to the connection (`&mut *tx`). Once
    /// its future returns the output (and has dropped the handle), the
    /// output is recorded in that same transaction and committed with its
    /// writes. If `phase` fails, its transaction is
    /// rolled back: no writes, no point, and the error returned as it
    /// came. If another run finished the phase meanwhile, this run's
    /// transaction is rolled back and the other's output returned.
    ///
    /// `E: From<Error>`, as sqlx's `Connection::transaction` asks: a
    /// store's failure (or a stored output that no longer reads as `T`,
    /// [`ErrorKind::Corrupt`]) comes back as your error.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idem_core::{Error, MemoryPoints, Phases};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let points = MemoryPoints::new();
    /// # let phases = Phases::new(&points, [2; 32], Duration::from_secs(60));
    /// let order_id: i64 = phases
    ///     .transaction("create-order", |_tx| async move {
    ///         // On a SQL store, `tx` derefs to the connection:
    ///         // sqlx::query("INSERT ...").execute(&mut *tx).await?;
    ///         Ok::<_, Error>(1001)
    ///     })
    ///     .await?;
    /// # assert_eq!(order_id, 1001);
    /// # Ok::<(), Error>(()) }).unwrap();
    /// ```
    pub async fn transaction<T, E, F, Fut>(&self, name: &str, phase: F) -> Result<T, E>
    where
        F: FnOnce(P::Transaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        check_name(name)?;
        if let Some(output) = self.points.point(&self.operation, name).await? {
            return Ok(read_output(&output)?);
        }
        let (tx, open) = self.points.begin().await?;
        // On an error `open` is dropped here: rolled back, writes and all.
        let output = phase(tx).await?;
        self.record(open, name, output).await
    }

    /// Runs the call-out phase `name` (no local writes), unless it is
    /// finished: the stored output then, without calling. Otherwise `call`
    /// runs, and its output is recorded once it returns; if `call` fails,
    /// nothing is recorded and the error is returned as it came. If another
    /// run recorded the phase meanwhile, its output is returned, so that
    /// every run goes on from the same answer.
    ///
    /// A crash after the call returns and before its point is recorded
    /// makes the next run call again: safe only if the call carries a key
    /// that is the same on every run (`operation.key_for("psp-charge")`
    /// in idem-tower) to a provider that answers a repeated key with its
    /// first answer. Without such a key, the point narrows the window of a
    /// double call but cannot close it (docs/outbound.md).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idem_core::{Error, MemoryPoints, Phases};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let points = MemoryPoints::new();
    /// # let phases = Phases::new(&points, [3; 32], Duration::from_secs(60));
    /// let charge: String = phases
    ///     .call("charge", || async {
    ///         // psp.charge(amount, operation.key_for("psp-charge")).await
    ///         Ok::<_, Error>("ch_1".to_owned())
    ///     })
    ///     .await?;
    /// # assert_eq!(charge, "ch_1");
    /// # Ok::<(), Error>(()) }).unwrap();
    /// ```
    pub async fn call<T, E, F, Fut>(&self, name: &str, call: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        check_name(name)?;
        if let Some(output) = self.points.point(&self.operation, name).await? {
            return Ok(read_output(&output)?);
        }
        let output = call().await?;
        let (tx, open) = self.points.begin().await?;
        drop(tx);
        self.record(open, name, output).await
    }

    /// How many of this operation's phases are finished (have a live
    /// point), by this run or earlier ones.
    ///
    /// Asked before the first phase runs, it says how many phases earlier
    /// runs finished: more than 0 means this run follows an earlier attempt
    /// that got at least that far. 0 does not mean there was no earlier
    /// attempt: one that failed or crashed before finishing a phase leaves
    /// nothing behind.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idem_core::{Error, MemoryPoints, Phases};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let points = MemoryPoints::new();
    /// let phases = Phases::new(&points, [4; 32], Duration::from_secs(60));
    /// if phases.finished().await? > 0 {
    ///     // resuming: an earlier run finished a phase
    /// }
    /// # Ok::<(), Error>(()) }).unwrap();
    /// ```
    pub async fn finished(&self) -> Result<u64, Error> {
        self.points.finished(&self.operation).await
    }

    /// Records `output` as phase `name`'s in the transaction `open` and
    /// commits: `output`, or the one another run recorded first.
    async fn record<T, E>(&self, open: P::Open, name: &str, output: T) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        let bytes =
            serde_json::to_vec(&output).map_err(|err| Error::new(ErrorKind::Config, err))?;
        let point = RecoveryPoint {
            operation: &self.operation,
            phase: name,
            output: &bytes,
            keep: self.keep,
        };
        match self.points.commit(open, point).await? {
            Recorded::Committed => Ok(output),
            Recorded::Existing(stored) => Ok(read_output(&stored)?),
        }
    }
}

/// A phase's name, refused if no store could key it.
fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_PHASE_NAME_LEN {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "a phase name has 1 to {MAX_PHASE_NAME_LEN} bytes, not {}",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// A stored output, read back as the phase's output type.
fn read_output<T: DeserializeOwned>(stored: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(stored).map_err(|err| Error::new(ErrorKind::Corrupt, err))
}
