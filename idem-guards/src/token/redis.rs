//! One-time tokens in Redis: `SET NX PX` issues, a Lua compare-and-delete
//! consumes.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use super::{ConsumedToken, OneTimeToken, TokenUse, ttl_from_ms};
use idem_core::Error;
use idem_core::expiry_millis;

/// Compare-and-delete: deletes KEYS[1] if it holds ARGV[1] (the subject)
/// and answers the milliseconds it had left; nil otherwise.
static CONSUME: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
            local left = redis.call('PTTL', KEYS[1])
            redis.call('DEL', KEYS[1])
            return left
        end
        return false
        ",
    )
});

/// One-time tokens in Redis, on your connection (a
/// `redis::aio::ConnectionManager` or a
/// `redis::cluster_async::ClusterConnection`, as for
/// idem-redis's `RedisStore`): `SET NX PX` to issue, a Lua
/// compare-and-delete (`EVALSHA`) to consume.
///
/// Redis may lose a token (eviction, failover): the user then sees
/// "invalid" and reloads the form. That is the right way to fail for a
/// token, but it also means a token is no dedup record: put the
/// idempotency layer or a state-machine guard behind it for anything
/// that moves money.
///
/// ```no_run
/// # async fn run(conn: redis::aio::ConnectionManager) -> Result<(), idem_core::Error> {
/// use std::time::Duration;
/// use idem_guards::{RedisTokens, TokenUse};
///
/// let tokens = RedisTokens::new(conn);
/// let token = tokens.issue("acme:alice:checkout", Duration::from_secs(900)).await?;
/// if let TokenUse::Consumed(consumed) = tokens.consume("acme:alice:checkout", &token).await? {
///     let placed: Result<(), ()> = Err(()); // the business step failed...
///     if placed.is_err() {
///         tokens.restore(&consumed).await?; // ...so the user may submit again
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisTokens<C> {
    conn: C,
    namespace: String,
}

impl<C> fmt::Debug for RedisTokens<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTokens")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<C> RedisTokens<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Tokens under keys `idem:token:{HASH}`.
    pub fn new(conn: C) -> Self {
        Self {
            conn,
            namespace: idem_core::DEFAULT_NAMESPACE.to_owned(),
        }
    }

    /// Keys under `namespace` instead of `idem:`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self
    }

    /// The key of a token: its hash, hash-tagged so it has one slot.
    fn key(&self, token: &OneTimeToken) -> String {
        let hash = token.hash();
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}token:{{{hex}}}", self.namespace)
    }

    /// Issues a token for `subject`, valid for `ttl` by Redis's clock.
    pub async fn issue(&self, subject: &str, ttl: Duration) -> Result<OneTimeToken, Error> {
        let token = OneTimeToken::generate();
        self.set_if_absent(&token, subject, ttl).await?;
        Ok(token)
    }

    async fn set_if_absent(
        &self,
        token: &OneTimeToken,
        subject: &str,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let set: Option<String> = ::redis::cmd("SET")
            .arg(self.key(token))
            .arg(subject)
            .arg("NX")
            .arg("PX")
            .arg(expiry_millis(ttl))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(Error::unavailable)?;
        Ok(set.is_some())
    }

    /// Consumes `token` for `subject`: [`TokenUse::Consumed`] for exactly
    /// one caller, however many submit it at once.
    pub async fn consume(&self, subject: &str, token: &OneTimeToken) -> Result<TokenUse, Error> {
        let left: Option<i64> = CONSUME
            .key(self.key(token))
            .arg(subject)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(Error::unavailable)?;
        Ok(match left {
            Some(ms) => TokenUse::Consumed(ConsumedToken {
                token: token.clone(),
                subject: subject.to_owned(),
                ttl_left: ttl_from_ms(ms),
            }),
            None => TokenUse::Invalid,
        })
    }

    /// Puts a consumed token back, with the time it had left, so the user
    /// can submit again after a business failure. `false` if it is
    /// already back.
    pub async fn restore(&self, consumed: &ConsumedToken) -> Result<bool, Error> {
        self.set_if_absent(&consumed.token, &consumed.subject, consumed.ttl_left)
            .await
    }
}
