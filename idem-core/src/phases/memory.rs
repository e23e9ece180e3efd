//! Recovery points in this process's memory, for tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Recorded, RecoveryPoint, RecoveryPoints};
use crate::Error;
use crate::time::expiry_after;

type Points = HashMap<([u8; 32], String), (Vec<u8>, Instant)>;

/// Recovery points in this process's memory: for tests of a phased
/// handler's control flow (what runs again, what resumes), and for a
/// single process that accepts losing them on restart.
///
/// It has no transaction (`Transaction = ()`, `Open = ()`): a phase's own writes are
/// not committed with its point, so two concurrent runs of one phase may
/// both make their writes (one point is kept, and both runs go on from its
/// output). The SQL stores commit a phase's writes and its point together.
/// Clones share the points.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Error, MemoryPoints, Phases};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let points = MemoryPoints::new();
/// let phases = Phases::new(&points, [9; 32], Duration::from_secs(60));
/// let n: u32 = phases.call("count", || async { Ok::<_, Error>(1) }).await?;
/// assert_eq!(points.len(), 1);
/// # Ok::<(), Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryPoints {
    points: Arc<Mutex<Points>>,
}

impl MemoryPoints {
    /// No points.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many points are kept, expired ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no point is kept.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Drops the expired points; how many it dropped.
    pub fn purge_expired(&self) -> usize {
        let now = Instant::now();
        let mut points = self.lock();
        let before = points.len();
        points.retain(|_, (_, until)| *until > now);
        before - points.len()
    }

    /// A panic elsewhere never leaves a point half written: the map is
    /// whole after each statement.
    fn lock(&self) -> MutexGuard<'_, Points> {
        self.points.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn live(&self, operation: &[u8; 32], phase: &str) -> Option<Vec<u8>> {
        let points = self.lock();
        let (output, until) = points.get(&(*operation, phase.to_owned()))?;
        (*until > Instant::now()).then(|| output.clone())
    }
}

impl RecoveryPoints for MemoryPoints {
    type Transaction = ();
    type Open = ();

    async fn point(&self, operation: &[u8; 32], phase: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.live(operation, phase))
    }

    async fn begin(&self) -> Result<((), ()), Error> {
        Ok(((), ()))
    }

    async fn commit(&self, (): (), point: RecoveryPoint<'_>) -> Result<Recorded, Error> {
        let now = Instant::now();
        let mut points = self.lock();
        let key = (*point.operation, point.phase.to_owned());
        if let Some((output, until)) = points.get(&key)
            && *until > now
        {
            return Ok(Recorded::Existing(output.clone()));
        }
        let until = expiry_after(now, point.keep.max(Duration::from_millis(1)));
        points.insert(key, (point.output.to_vec(), until));
        Ok(Recorded::Committed)
    }

    async fn finished(&self, operation: &[u8; 32]) -> Result<u64, Error> {
        let now = Instant::now();
        let points = self.lock();
        let live = points
            .iter()
            .filter(|((op, _), (_, until))| op == operation && *until > now)
            .count();
        Ok(live as u64)
    }
}
