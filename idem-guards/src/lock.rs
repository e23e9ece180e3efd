//! A Redis lock with an owner token and a lease, for the rare work that must
//! be serialised: not idempotency (see [`RedisLock`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use idem_core::Error;
use idem_core::{expiry_after, expiry_millis};

/// Compare-and-delete: deletes KEYS[1] only if it still holds ARGV[1].
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
            return redis.call('DEL', KEYS[1])
        end
        return 0
        ",
    )
});

/// Compare-and-pexpire: extends KEYS[1]'s lease to ARGV[2] ms only if it
/// still holds ARGV[1].
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
            return redis.call('PEXPIRE', KEYS[1], ARGV[2])
        end
        return 0
        ",
    )
});

/// A named lock in Redis, on your connection (a
/// `redis::aio::ConnectionManager` or a
/// `redis::cluster_async::ClusterConnection`, as for
/// idem-redis's `RedisStore`): `SET key owner NX PX lease` to
/// take it, Lua compare-and-delete to release it, Lua compare-and-pexpire to
/// renew it.
///
/// **A lock is not idempotency.** It keeps two duplicates from running *at
/// the same time*, not one *after* the other: the second waits, then takes
/// the lock and does the work again. It remembers nothing. Pair it with a
/// record of what was done (the idempotency layer, a state-machine
/// transition, an inbox row) whenever the work has an effect; use the lock
/// only to keep concurrent work apart (one rebuild of a cache, one run of a
/// settlement job, one call into a provider that cannot take two at once).
///
/// A lease can also run out while the holder still works (a GC pause, a slow
/// call): another holder then takes the lock, and the first one's release
/// or renewal fails, as it must ([`LockGuard::release`] and
/// [`LockGuard::renew`] answer `false`). Work whose correctness depends on
/// exclusivity must check that answer, or better, write through a fencing
/// check of its own (a version column, a state-machine transition).
///
/// ```no_run
/// # async fn run(conn: redis::aio::ConnectionManager) -> Result<(), idem_core::Error> {
/// use std::time::Duration;
/// use idem_guards::RedisLock;
///
/// let lock = RedisLock::new(conn, "settlement:2026-11-30", Duration::from_secs(30));
/// if let Some(guard) = lock.acquire(Duration::from_secs(5)).await? {
///     let keep_alive = guard.keep_alive(); // renews every 10 s while the work runs
///     // ... the work ...
///     drop(keep_alive);
///     if !guard.release().await? {
///         // the lease ran out and someone else holds the lock now
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLock<C> {
    conn: C,
    key: String,
    lease: Duration,
}

impl<C> std::fmt::Debug for RedisLock<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLock")
            .field("key", &self.key)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<C> RedisLock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The lock `name`, kept at `idem:lock:{name}` for `lease` at a time.
    pub fn new(conn: C, name: &str, lease: Duration) -> Self {
        Self::with_namespace(conn, idem_core::DEFAULT_NAMESPACE, name, lease)
    }

    /// The lock `name` under `namespace` instead of `idem:`.
    pub fn with_namespace(conn: C, namespace: &str, name: &str, lease: Duration) -> Self {
        Self {
            conn,
            key: format!("{namespace}lock:{{{name}}}"),
            lease,
        }
    }

    /// Takes the lock if it is free, for one lease; `None` if someone holds
    /// it.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard<C>>, Error> {
        let owner = format!("{:032x}", rand::random::<u128>());
        let sent = Instant::now();
        let set: Option<String> = ::redis::cmd("SET")
            .arg(&self.key)
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(expiry_millis(self.lease))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(Error::unavailable)?;
        Ok(set.map(|_| LockGuard {
            inner: Arc::new(GuardInner {
                conn: self.conn.clone(),
                key: self.key.clone(),
                owner,
                lease: self.lease,
                held_until: Mutex::new(expiry_after(sent, self.lease)),
            }),
        }))
    }

    /// Takes the lock, polling (with a growing pause, at most 200 ms) for up
    /// to `wait`; `None` if it stayed taken.
    pub async fn acquire(&self, wait: Duration) -> Result<Option<LockGuard<C>>, Error> {
        let deadline = expiry_after(tokio::time::Instant::now(), wait);
        let mut pause = Duration::from_millis(10);
        loop {
            if let Some(guard) = self.try_acquire().await? {
                return Ok(Some(guard));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// A held lock. Release it with [`LockGuard::release`]; dropping it without
/// releasing leaves the lock taken until its lease ends.
pub struct LockGuard<C> {
    inner: Arc<GuardInner<C>>,
}

struct GuardInner<C> {
    conn: C,
    key: String,
    owner: String,
    lease: Duration,
    /// When the lease ends at the latest, from the sending of the last
    /// command that set it (the acquisition or a renewal Redis confirmed).
    held_until: Mutex<Instant>,
}

impl<C> std::fmt::Debug for LockGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.inner.key)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone> GuardInner<C> {
    fn held_until(&self) -> Instant {
        *self
            .held_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn renew(&self) -> Result<bool, Error> {
        let sent = Instant::now();
        let renewed: i64 = RENEW
            .key(&self.key)
            .arg(&self.owner)
            .arg(expiry_millis(self.lease))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(Error::unavailable)?;
        if renewed == 1 {
            let mut held_until = self
                .held_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *held_until = (*held_until).max(expiry_after(sent, self.lease));
        }
        Ok(renewed == 1)
    }
}

impl<C> LockGuard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// This holder's owner token.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// Extends the lease to a full lease from now, if the lock is still
    /// this holder's; `false` if the lease ran out and it is not.
    pub async fn renew(&self) -> Result<bool, Error> {
        self.inner.renew().await
    }

    /// Releases the lock if it is still this holder's; `false` if the lease
    /// ran out (and the lock may now be someone else's, which this leaves
    /// untouched).
    pub async fn release(self) -> Result<bool, Error> {
        let inner = &self.inner;
        let released: i64 = RELEASE
            .key(&inner.key)
            .arg(&inner.owner)
            .invoke_async(&mut inner.conn.clone())
            .await
            .map_err(Error::unavailable)?;
        Ok(released == 1)
    }

    /// Renews the lease every third of it in a background task until the
    /// returned handle is dropped, or the lock is lost ([`KeepAlive::lost`]
    /// then says so): a renewal finds it no longer this holder's, or the
    /// lease ran out with no renewal confirmed (Redis unreachable or not
    /// answering: another holder may have it by then). Needs a tokio
    /// runtime.
    pub fn keep_alive(&self) -> KeepAlive {
        let inner = self.inner.clone();
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        let task = tokio::spawn(async move {
            let period =
                (inner.lease / 3).clamp(Duration::from_millis(1), Duration::from_secs(86_400));
            loop {
                tokio::time::sleep(period).await;
                // A renewal not confirmed by the lease's end is too late.
                let deadline = tokio::time::Instant::from_std(inner.held_until());
                match tokio::time::timeout_at(deadline, inner.renew()).await {
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) | Err(_) => break,
                    // Redis unreachable: keep trying while the lease may
                    // still be running.
                    Ok(Err(err)) => {
                        tracing::warn!(%err, key = %inner.key, "lock renewal failed");
                        if Instant::now() >= inner.held_until() {
                            break;
                        }
                    }
                }
            }
            flag.store(true, Ordering::SeqCst);
        });
        KeepAlive { task, lost }
    }
}

/// Background renewal of a [`LockGuard`]'s lease; stops when dropped.
#[derive(Debug)]
pub struct KeepAlive {
    task: tokio::task::JoinHandle<()>,
    lost: Arc<AtomicBool>,
}

impl KeepAlive {
    /// Whether the lock is lost: a renewal found it no longer this
    /// holder's, or its lease ran out with no renewal confirmed. Stop the
    /// work: its exclusivity is gone.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}
