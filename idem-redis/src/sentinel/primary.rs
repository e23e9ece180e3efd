//! The primary connection the clones of a
//! [`SentinelConnection`](super::SentinelConnection) share: asking the
//! sentinels for it one lookup at a time, dropping it when a command's error
//! says the primary is gone, and probing it when a command is given up.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use ::redis::sentinel::SentinelClient;
use ::redis::{AsyncConnectionConfig, ErrorKind, RedisError, RedisResult, ServerErrorKind};

/// How long after a failed lookup the sentinels are not asked again: the
/// commands in between get that lookup's error.
const LOOKUP_BACKOFF: Duration = Duration::from_millis(100);

/// What the clones share.
pub(super) struct Shared {
    /// The connection to the current primary, if one is known.
    current: RwLock<Option<Current>>,
    /// The sentinels, asked by one command at a time.
    lookup: Arc<tokio::sync::Mutex<Lookup>>,
    /// The last generation given out.
    generations: AtomicU64,
    /// Whether a `PING` left behind by an abandoned command is running.
    probing: AtomicBool,
    /// The database the primary connection uses.
    pub(super) db: i64,
}

/// One primary connection and its generation: a failure drops it only if it
/// is still the current one.
#[derive(Clone)]
pub(super) struct Current {
    conn: MultiplexedConnection,
    pub(super) generation: u64,
}

/// The sentinels, and the last lookup's failure.
struct Lookup {
    client: SentinelClient,
    config: AsyncConnectionConfig,
    failed: Option<(Instant, RedisError)>,
}

impl Shared {
    /// The state of a new connection: the sentinels of `client`, the primary
    /// connection's `config`, and `conn` if the primary is already found.
    pub(super) fn new(
        client: SentinelClient,
        config: AsyncConnectionConfig,
        conn: Option<MultiplexedConnection>,
        db: i64,
    ) -> Self {
        Self {
            current: RwLock::new(conn.map(|conn| Current {
                conn,
                generation: 1,
            })),
            lookup: Arc::new(tokio::sync::Mutex::new(Lookup {
                client,
                config,
                failed: None,
            })),
            generations: AtomicU64::new(1),
            probing: AtomicBool::new(false),
            db,
        }
    }

    /// The current primary's connection, if one is known.
    pub(super) fn current(&self) -> Option<Current> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `command` on the current primary's connection (found first if
    /// none is known) and drops that connection if the error says the
    /// primary is gone.
    pub(super) async fn run<T, F, Fut>(self: &Arc<Self>, command: F) -> RedisResult<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let Current { conn, generation } = self.connection().await?;
        let mut pending = Pending {
            shared: self,
            generation,
            done: false,
        };
        let result = command(conn).await;
        pending.done = true;
        if let Err(err) = &result
            && primary_gone(err)
        {
            self.discard(generation, err);
        }
        result
    }

    /// The current primary's connection, asking the sentinels if none is
    /// known.
    async fn connection(self: &Arc<Self>) -> RedisResult<Current> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let mut lookup = Arc::clone(&self.lookup).lock_owned().await;
        // Whoever held the lookup before us may have just connected, or
        // just failed: their answer is ours.
        if let Some(current) = self.current() {
            return Ok(current);
        }
        if let Some((at, err)) = &lookup.failed
            && at.elapsed() < LOOKUP_BACKOFF
        {
            return Err(err.clone());
        }
        // On a task of its own, so that a caller giving up (a timeout
        // around the command) does not cut the lookup short.
        let shared = Arc::clone(self);
        let task = tokio::spawn(async move {
            let Lookup { client, config, .. } = &mut *lookup;
            match find_primary(client, config).await {
                Ok(conn) => {
                    lookup.failed = None;
                    Ok(shared.install(conn))
                }
                Err(err) => {
                    tracing::warn!(error = %err, "no Redis primary from the sentinels");
                    lookup.failed = Some((Instant::now(), err.clone()));
                    Err(err)
                }
            }
        });
        task.await.unwrap_or_else(|err| {
            Err(RedisError::from((
                ErrorKind::Client,
                "the sentinel lookup failed",
                err.to_string(),
            )))
        })
    }

    /// Makes `conn` the current primary's connection, under a new
    /// generation.
    fn install(&self, conn: MultiplexedConnection) -> Current {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let current = Current { conn, generation };
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(current.clone());
        current
    }

    /// Drops the connection of `generation` if it is still the current one.
    fn discard(&self, generation: u64, why: &RedisError) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current
            .as_ref()
            .is_some_and(|current| current.generation == generation)
        {
            *current = None;
            tracing::warn!(error = %why, "Redis primary connection lost; asking the sentinels again");
        }
    }

    /// A command on `generation` was given up before its answer: a `PING`
    /// finds out whether the primary still answers within the response
    /// timeout. One at a time.
    fn probe(self: &Arc<Self>, generation: u64) {
        let Some(current) = self
            .current()
            .filter(|current| current.generation == generation)
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = Arc::clone(self);
        runtime.spawn(async move {
            let Current {
                mut conn,
                generation,
            } = current;
            if let Err(err) = ::redis::cmd("PING").exec_async(&mut conn).await
                && primary_gone(&err)
            {
                shared.discard(generation, &err);
            }
            shared.probing.store(false, Ordering::Release);
        });
    }
}

/// A command in flight: if it is dropped before its answer, the primary is
/// probed.
struct Pending<'a> {
    shared: &'a Arc<Shared>,
    generation: u64,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.shared.probe(self.generation);
        }
    }
}

/// Asks the sentinels for the primary (redis-rs checks its `ROLE`) and
/// connects to it.
pub(super) async fn find_primary(
    client: &mut SentinelClient,
    config: &AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    let primary = client.async_get_client().await?;
    let conn = primary
        .get_multiplexed_async_connection_with_config(config)
        .await?;
    tracing::info!(primary = %primary.get_connection_info().addr(), "connected to the Redis primary named by the sentinels");
    Ok(conn)
}

/// Whether `err` means the primary is gone or is no longer the primary, so
/// its connection must be dropped.
fn primary_gone(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_unrecoverable_error()
        || matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_errors_mean_the_primary_is_gone() {
        use ::redis::Value;
        use std::io;
        let server = |reply: &[u8]| {
            ::redis::parse_redis_value(reply)
                .and_then(Value::extract_error)
                .expect_err("a server error")
        };
        for gone in [
            RedisError::from(io::Error::from(io::ErrorKind::BrokenPipe)),
            RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused)),
            RedisError::from(io::Error::from(io::ErrorKind::TimedOut)),
            server(b"-READONLY You can't write against a read only replica.\r\n"),
            server(b"-MASTERDOWN Link with MASTER is down\r\n"),
        ] {
            assert!(primary_gone(&gone), "{gone}");
        }
        for kept in [
            server(b"-NOSCRIPT No matching script\r\n"),
            server(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            server(b"-ERR unknown command\r\n"),
            server(b"-LOADING Redis is loading the dataset in memory\r\n"),
        ] {
            assert!(!primary_gone(&kept), "{kept}");
        }
    }
}
