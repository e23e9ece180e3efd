//! Redis behind Sentinel: [`SentinelConnection`], a connection that follows
//! a failover. What it promises is on the type.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, Value,
};

/// How long after a failed lookup the sentinels are not asked again: the
/// commands in between get that lookup's error.
const LOOKUP_BACKOFF: Duration = Duration::from_millis(100);

/// The sentinels' port when a URL gives none.
const SENTINEL_PORT: u16 = 26379;

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
///   may have applied `SET NX` before it died) must not be sent again and
///   have its second answer read as the first. The
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

/// What the clones share.
struct Shared {
    /// The connection to the current primary, if one is known.
    current: RwLock<Option<Current>>,
    /// The sentinels, asked by one command at a time.
    lookup: Arc<tokio::sync::Mutex<Lookup>>,
    /// The last generation given out.
    generations: AtomicU64,
    /// Whether a `PING` left behind by an abandoned command is running.
    probing: AtomicBool,
    /// The database the primary connection uses.
    db: i64,
}

/// One primary connection and its generation: a failure drops it only if it
/// is still the current one.
#[derive(Clone)]
struct Current {
    conn: MultiplexedConnection,
    generation: u64,
}

/// The sentinels, and the last lookup's failure.
struct Lookup {
    client: SentinelClient,
    config: AsyncConnectionConfig,
    failed: Option<(Instant, RedisError)>,
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
    /// [`SentinelClientBuilder`] and [`SentinelServerType::Master`]. `config`
    /// is the primary connection's, as in [`open_with`](Self::open_with).
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
        Ok(Self::with(client, config, Some(conn), db))
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
        Ok(Self::with(url.client()?, config, None, db))
    }

    fn with(
        client: SentinelClient,
        config: AsyncConnectionConfig,
        conn: Option<MultiplexedConnection>,
        db: i64,
    ) -> Self {
        let shared = Shared {
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
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Runs `command` on the current primary's connection (found first if
    /// none is known) and drops that connection if the error says the
    /// primary is gone.
    async fn run<T, F, Fut>(&self, command: F) -> RedisResult<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let Current { conn, generation } = self.shared.connection().await?;
        let mut pending = Pending {
            shared: &self.shared,
            generation,
            done: false,
        };
        let result = command(conn).await;
        pending.done = true;
        if let Err(err) = &result
            && primary_gone(err)
        {
            self.shared.discard(generation, err);
        }
        result
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
        Box::pin(self.run(move |mut conn| async move { conn.req_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.run(move |mut conn| async move {
            conn.req_packed_commands(pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}

impl Shared {
    fn current(&self) -> Option<Current> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
async fn find_primary(
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

/// A `redis+sentinel://` URL, parsed.
#[derive(Debug, PartialEq, Eq)]
struct SentinelUrl {
    sentinels: Vec<(String, u16)>,
    service: String,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

const SCHEME: &str = "redis+sentinel://";

impl SentinelUrl {
    fn parse(url: &str) -> RedisResult<Self> {
        Self::parse_parts(url).map_err(|detail| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "invalid redis+sentinel URL",
                detail,
            ))
        })
    }

    fn parse_parts(url: &str) -> Result<Self, String> {
        let rest = url
            .get(..SCHEME.len())
            .filter(|scheme| scheme.eq_ignore_ascii_case(SCHEME))
            .map(|_| &url[SCHEME.len()..])
            .ok_or_else(|| {
                "expected redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE_NAME[/DB]"
                    .to_owned()
            })?;
        if rest.contains(['?', '#']) {
            return Err("query parameters and fragments are not supported".to_owned());
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let decode = |part: &str, what: &str| -> Result<Option<String>, String> {
                    match percent_decode(part) {
                        Some(decoded) if decoded.is_empty() => Ok(None),
                        Some(decoded) => Ok(Some(decoded)),
                        None => Err(format!("the {what} is not valid percent-encoded UTF-8")),
                    }
                };
                (
                    decode(user, "user name")?,
                    password
                        .map(|p| decode(p, "password"))
                        .transpose()?
                        .flatten(),
                )
            }
        };
        if hosts.is_empty() {
            return Err("no sentinel host".to_owned());
        }
        let sentinels = hosts
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>, _>>()?;
        let mut segments = path.split('/');
        let service = segments.next().unwrap_or_default();
        if service.is_empty() {
            return Err("no service name (the primary's name in the sentinels' \
                        configuration, after the hosts: .../mymaster)"
                .to_owned());
        }
        let service = percent_decode(service)
            .ok_or_else(|| "the service name is not valid percent-encoded UTF-8".to_owned())?;
        let db = match segments.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| format!("bad db {db:?}: a database number is expected"))?,
        };
        if let Some(extra) = segments.find(|segment| !segment.is_empty()) {
            return Err(format!(
                "unexpected {extra:?} after the database: the path is /SERVICE_NAME[/DB]"
            ));
        }
        Ok(Self {
            sentinels,
            service,
            db,
            username,
            password,
        })
    }

    /// The sentinels, `host:port,host:port`, for messages.
    fn addresses(&self) -> String {
        let addresses: Vec<String> = self
            .sentinels
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        addresses.join(",")
    }

    fn client(self) -> RedisResult<SentinelClient> {
        let sentinels = self
            .sentinels
            .into_iter()
            .map(|(host, port)| ConnectionAddr::Tcp(host, port));
        let mut builder =
            SentinelClientBuilder::new(sentinels, &self.service, SentinelServerType::Master)?;
        if let Some(username) = self.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if self.db != 0 {
            builder = builder.set_client_to_redis_db(self.db);
        }
        builder.build()
    }
}

/// `host[:port]` or `[ipv6][:port]`.
fn parse_host(address: &str) -> Result<(String, u16), String> {
    if address.is_empty() {
        return Err("an empty sentinel address (a stray comma?)".to_owned());
    }
    let (host, port) = if let Some(bracketed) = address.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("no closing ] in sentinel address {address:?}"))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("bad sentinel address {address:?}")),
            },
        }
    } else {
        match address.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err(format!(
                    "sentinel address {address:?}: an IPv6 address goes in brackets, [::1]:26379"
                ));
            }
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        }
    };
    if host.is_empty() {
        return Err(format!("no host in sentinel address {address:?}"));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| format!("bad port {port:?} in sentinel address {address:?}"))?,
    };
    Ok((host.to_owned(), port))
}

/// `%XX` decoded; `None` if an escape is malformed or the result is not
/// UTF-8.
fn percent_decode(input: &str) -> Option<String> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> SentinelUrl {
        SentinelUrl::parse(url).unwrap_or_else(|err| panic!("{url}: {err}"))
    }

    /// The error's detail, which must name what is wrong.
    fn refused(url: &str) -> String {
        let err = SentinelUrl::parse(url).expect_err(url);
        assert_eq!(err.kind(), ErrorKind::InvalidClientConfig, "{url}");
        err.to_string()
    }

    #[test]
    fn one_sentinel_and_a_service() {
        assert_eq!(
            parsed("redis+sentinel://127.0.0.1:26379/mymaster"),
            SentinelUrl {
                sentinels: vec![("127.0.0.1".to_owned(), 26379)],
                service: "mymaster".to_owned(),
                db: 0,
                username: None,
                password: None,
            }
        );
    }

    #[test]
    fn several_sentinels_credentials_and_a_db() {
        assert_eq!(
            parsed("redis+sentinel://app:s%40cret%3A1@a:1,b,[::1]:3,[fe80::1]/orders/2"),
            SentinelUrl {
                sentinels: vec![
                    ("a".to_owned(), 1),
                    ("b".to_owned(), SENTINEL_PORT),
                    ("::1".to_owned(), 3),
                    ("fe80::1".to_owned(), SENTINEL_PORT),
                ],
                service: "orders".to_owned(),
                db: 2,
                username: Some("app".to_owned()),
                password: Some("s@cret:1".to_owned()),
            }
        );
    }

    #[test]
    fn a_password_alone_or_a_trailing_slash() {
        let url = parsed("REDIS+SENTINEL://:pw@h:1/svc/");
        assert_eq!((url.username, url.password), (None, Some("pw".to_owned())));
        assert_eq!((url.service.as_str(), url.db), ("svc", 0));
    }

    #[test]
    fn what_is_wrong_is_named() {
        for (url, says) in [
            ("redis://127.0.0.1:6379", "expected redis+sentinel://"),
            ("", "expected redis+sentinel://"),
            ("redis+sentinel://", "no sentinel host"),
            ("redis+sentinel:///mymaster", "no sentinel host"),
            ("redis+sentinel://user:pw@/mymaster", "no sentinel host"),
            ("redis+sentinel://h:1", "no service name"),
            ("redis+sentinel://h:1/", "no service name"),
            ("redis+sentinel://h:1//0", "no service name"),
            ("redis+sentinel://h:port/m", "bad port \"port\""),
            ("redis+sentinel://h:70000/m", "bad port \"70000\""),
            ("redis+sentinel://h:0/m", "bad port \"0\""),
            ("redis+sentinel://h:/m", "bad port \"\""),
            ("redis+sentinel://:1/m", "no host"),
            ("redis+sentinel://a:1,,b:2/m", "empty sentinel address"),
            ("redis+sentinel://::1:5/m", "IPv6"),
            ("redis+sentinel://[::1/m", "no closing ]"),
            ("redis+sentinel://[::1]x/m", "bad sentinel address"),
            ("redis+sentinel://h:1/m/x", "bad db \"x\""),
            ("redis+sentinel://h:1/m/-1", "bad db \"-1\""),
            ("redis+sentinel://h:1/m/1/x", "unexpected \"x\""),
            ("redis+sentinel://h:1/m?db=1", "query parameters"),
            ("redis+sentinel://u:%zz@h:1/m", "password"),
            ("redis+sentinel://u%:p@h:1/m", "user name"),
            ("redis+sentinel://h:1/%ff", "service name"),
        ] {
            let message = refused(url);
            assert!(message.contains(says), "{url}: {message}");
        }
    }

    #[test]
    fn a_password_is_not_repeated_in_an_error() {
        let message = refused("redis+sentinel://user:hunter2@h:notaport/m");
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn no_input_panics() {
        for url in [
            "redis+sentinel://%",
            "redis+sentinel://[",
            "redis+sentinel://]:",
            "redis+sentinel://é:1/é/é",
            "redis+sentinel\u{e9}",
            "redis+sentine",
        ] {
            let _ = SentinelUrl::parse(url);
        }
    }

    #[test]
    fn which_errors_mean_the_primary_is_gone() {
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
