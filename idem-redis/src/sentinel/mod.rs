//! Redis behind Sentinel: [`SentinelConnection`], a connection that follows
//! a failover. What it promises is on the type.
//!
//! - [`primary`]: the primary connection the clones share, how the
//!   sentinels are asked for it, and when it is dropped.
//! - [`url`]: `redis+sentinel://` URLs.

mod primary;
mod url;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::sentinel::SentinelClient;
use ::redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value,
};

use self::primary::{Shared, find_primary};
use self::url::SentinelUrl;

/// A connection to the primary of a Redis Sentinel service that follows a
/// failover.
///
/// It asks the sentinels which server is the primary of a service, connects
/// to it, and keeps that one multiplexed connection for every clone. When a command fails in a way that means the primary is gone
/// or is no longer the primary (an I/O error, a dropped or refused
/// connection, a response timeout, `READONLY`, `MASTERDOWN`), the connection
/// is dropped and the next command asks the sentinels again: redis-rs checks
/// with `ROLE` that the server they name really is a primary before it is
/// used.
///
/// ```no_run
/// # async fn run() -> redis::RedisResult<()> {
/// use idem_redis::{RedisStore, SentinelConnection};
///
/// let store = RedisStore::new(
///     SentinelConnection::open("redis+sentinel://127.0.0.1:26379/mymaster").await?,
/// );
/// # let _ = store; Ok(()) }
/// ```
///
/// The URL names the sentinels and the service:
/// `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE_NAME[/DB]`
/// ([`open`](Self::open)); [`connect`](Self::connect) takes a redis-rs
/// sentinel client for what a URL cannot say.
///
/// What a failover looks like from here:
///
/// - The command that meets the failure returns its error; it is not
///   retried, not even a read. A write whose outcome is unknown (the primary
///   may have applied a completion before it died) must not be sent again
///   and have its second answer read as the first. The
///   [`TieredStore`](crate::TieredStore) in front of SQL already
///   degrades to SQL on errors, and its circuit breaker probes the gate until
///   it answers again.
/// - Commands keep failing until the sentinels name a new primary (their
///   `down-after-milliseconds`, then the failover itself), then succeed on
///   the new primary without anything being reopened.
/// - One lookup at a time: commands that arrive while no primary is known
///   wait for the lookup in progress and share its answer; a failed lookup
///   is not repeated for 100 ms. A lookup runs to its end even if the command
///   that started it is given up, so a caller's short timeout (the tiered
///   store's gate timeout) cannot keep it from ever finishing.
/// - A primary that stops answering without closing its connections counts
///   as gone after the response timeout
///   ([`DEFAULT_RESPONSE_TIMEOUT`](SentinelConnection::DEFAULT_RESPONSE_TIMEOUT)
///   unless configured). A command whose caller gives up before that leaves a
///   `PING` behind to find out.
/// - Only a connection that is still the one that failed is dropped: a slow
///   command that fails late never throws away the new primary's connection.
///
/// A failover can lose the last writes the old primary had not replicated:
/// in front of SQL that is a duplicate SQL's unique index catches, never a
/// lost one (counted as *fallback caught*).
///
/// Cheap to clone; clones share one connection to the current primary, so a
/// failover seen by one is followed by all.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

impl SentinelConnection {
    /// The response timeout of [`open`](Self::open): a primary that does not
    /// answer a command within it counts as gone.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

    /// Asks the sentinels of `url` for the primary and connects to it.
    ///
    /// `url` is `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE_NAME[/DB]`:
    /// the hosts are the sentinels (port 26379 if none is given), the user
    /// and password (percent-encoded) those of the Redis primary, `DB` its
    /// database (0 if none). Commands time out after
    /// [`DEFAULT_RESPONSE_TIMEOUT`](Self::DEFAULT_RESPONSE_TIMEOUT).
    ///
    /// # Errors
    ///
    /// A malformed URL, as [`ErrorKind::InvalidClientConfig`] naming what is
    /// wrong; no sentinel answering, the service unknown to them, or its
    /// primary unreachable, as redis-rs reports it.
    pub async fn open(url: &str) -> RedisResult<Self> {
        let config =
            AsyncConnectionConfig::new().set_response_timeout(Some(Self::DEFAULT_RESPONSE_TIMEOUT));
        Self::open_with(url, config).await
    }

    /// [`open`](Self::open), with the primary connection's settings (its
    /// response timeout, connection timeout, ...) from `config`. Without a
    /// response timeout, a primary that stops answering is never given up.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub async fn open_with(url: &str, config: AsyncConnectionConfig) -> RedisResult<Self> {
        let url = SentinelUrl::parse(url)?;
        let sentinels = url.addresses();
        Self::connect(url.client()?, config).await.map_err(|err| {
            // redis-rs says only "Connection refused": say whom we asked.
            if err.is_io_error() {
                RedisError::from((
                    ErrorKind::Io,
                    "no answer from the sentinels, or from the primary they name",
                    format!("sentinels {sentinels}: {err}"),
                ))
            } else {
                err
            }
        })
    }

    /// Connects through a sentinel client of your own, for what a URL cannot
    /// say (TLS, the sentinels' own password): built with
    /// [`SentinelClientBuilder`](::redis::sentinel::SentinelClientBuilder) and
    /// [`SentinelServerType::Master`](::redis::sentinel::SentinelServerType::Master).
    /// `config` is the primary connection's, as in
    /// [`open_with`](Self::open_with).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), but for the URL.
    pub async fn connect(
        mut client: SentinelClient,
        config: AsyncConnectionConfig,
    ) -> RedisResult<Self> {
        let conn = find_primary(&mut client, &config).await?;
        let db = conn.get_db();
        Ok(Self {
            shared: Arc::new(Shared::new(client, config, Some(conn), db)),
        })
    }

    /// [`open`](Self::open) without asking the sentinels yet: only the URL
    /// is checked, and the first command finds the primary. For a service
    /// that must start while Redis has no primary (mid-failover, or down):
    /// in front of SQL, the [`TieredStore`](crate::TieredStore)
    /// serves from SQL alone until the gate answers.
    ///
    /// ```no_run
    /// # fn run() -> redis::RedisResult<()> {
    /// use idem_redis::{RedisStore, SentinelConnection};
    ///
    /// let store = RedisStore::new(SentinelConnection::open_lazy(
    ///     "redis+sentinel://127.0.0.1:26379/mymaster",
    /// )?);
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A malformed URL, as [`ErrorKind::InvalidClientConfig`].
    pub fn open_lazy(url: &str) -> RedisResult<Self> {
        let url = SentinelUrl::parse(url)?;
        let db = url.db;
        let config =
            AsyncConnectionConfig::new().set_response_timeout(Some(Self::DEFAULT_RESPONSE_TIMEOUT));
        Ok(Self {
            shared: Arc::new(Shared::new(url.client()?, config, None, db)),
        })
    }
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("db", &self.shared.db)
            .field(
                "generation",
                &self.shared.current().map(|current| current.generation),
            )
            .finish_non_exhaustive()
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(
            self.shared
                .run(move |mut conn| async move { conn.req_packed_command(cmd).await }),
        )
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.shared.run(move |mut conn| async move {
            conn.req_packed_commands(pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}
