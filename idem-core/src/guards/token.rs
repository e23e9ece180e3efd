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
/// use idem_core::guards::OneTimeToken;
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

/// A TTL as whole milliseconds, at least 1.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

fn ttl_from_ms(ms: i64) -> Duration {
    Duration::from_millis(ms.max(1).unsigned_abs())
}

#[cfg(feature = "sql")]
pub use self::sql_tokens::{DEFAULT_TOKEN_TABLE, SqlTokens};

#[cfg(feature = "sql")]
mod sql_tokens {
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use super::{ConsumedToken, OneTimeToken, TokenUse, millis, ttl_from_ms};
    use crate::Error;
    use crate::guards::sql::{GuardConn, GuardDb, Ident, Kind, Value, config, db_error};

    /// The table [`SqlTokens`] keeps tokens in unless told otherwise.
    pub const DEFAULT_TOKEN_TABLE: &str = "idem_tokens";

    /// A subject fits the table's key column: 1 to 255 bytes.
    fn check_subject(subject: &str) -> Result<(), Error> {
        if subject.is_empty() || subject.len() > 255 {
            return Err(config(format!(
                "a token subject must be 1 to 255 bytes, not {}",
                subject.len()
            )));
        }
        Ok(())
    }

    /// One-time tokens in a SQL table: the hash as primary key, the subject,
    /// and an expiry judged by the database's clock.
    ///
    /// Consume in the transaction of the business step it guards and a
    /// rollback puts the token back by itself; consume on its own and call
    /// [`SqlTokens::restore`] when the step fails.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn run(pool: idem_core::sql::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use idem_core::guards::{SqlTokens, TokenUse};
    ///
    /// let tokens = SqlTokens::new(pool.clone());
    /// tokens.migrate().await?;
    /// // rendering the form:
    /// let token = tokens.issue("acme:alice:checkout", Duration::from_secs(900)).await?;
    /// // on submit, in the transaction that places the order:
    /// let mut tx = pool.begin().await?;
    /// match tokens.consume(&mut *tx, "acme:alice:checkout", &token).await? {
    ///     TokenUse::Consumed(_) => { /* place the order in `tx` */ tx.commit().await? }
    ///     TokenUse::Invalid => { /* a double submit: show the order already placed */ }
    /// }
    /// # Ok(()) }
    /// ```
    pub struct SqlTokens<DB: GuardDb> {
        inner: Arc<Inner<DB>>,
    }

    struct Inner<DB: GuardDb> {
        pool: sqlx::Pool<DB>,
        table: Ident,
        /// Whether the server has `DELETE ... RETURNING`, learnt on first use.
        returning: OnceLock<bool>,
    }

    impl<DB: GuardDb> Clone for SqlTokens<DB> {
        fn clone(&self) -> Self {
            Self {
                inner: self.inner.clone(),
            }
        }
    }

    impl<DB: GuardDb> std::fmt::Debug for SqlTokens<DB> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SqlTokens")
                .field("database", &<DB as sqlx::Database>::NAME)
                .field("table", &self.inner.table)
                .finish_non_exhaustive()
        }
    }

    impl<DB: GuardDb> SqlTokens<DB> {
        /// Tokens in [`DEFAULT_TOKEN_TABLE`] on `pool`.
        pub fn new(pool: sqlx::Pool<DB>) -> Self {
            Self::build(pool, Ident::known(DEFAULT_TOKEN_TABLE), None)
        }

        /// Tokens in `table`, an [`Ident`] (else an
        /// [`ErrorKind::Config`](crate::ErrorKind::Config) error).
        pub fn with_table(pool: sqlx::Pool<DB>, table: &str) -> Result<Self, Error> {
            Ok(Self::build(pool, Ident::new(table)?, None))
        }

        /// Consumes with a locked read and a delete in a transaction even
        /// where `DELETE ... RETURNING` exists: the path MySQL takes. For
        /// tests of that path on other servers.
        #[doc(hidden)]
        pub fn without_delete_returning(self) -> Self {
            let inner = &self.inner;
            Self::build(inner.pool.clone(), inner.table.clone(), Some(false))
        }

        fn build(pool: sqlx::Pool<DB>, table: Ident, returning: Option<bool>) -> Self {
            let cell = OnceLock::new();
            if let Some(returning) = returning {
                let _ = cell.set(returning);
            }
            Self {
                inner: Arc::new(Inner {
                    pool,
                    table,
                    returning: cell,
                }),
            }
        }

        /// Creates the table if missing. Safe to run at every start.
        pub async fn migrate(&self) -> Result<(), Error> {
            let k = <DB::Connection as GuardConn>::KIND;
            let table = &self.inner.table;
            let ddl = format!(
                "CREATE TABLE IF NOT EXISTS {table} ( \
                   token_hash {hash} NOT NULL PRIMARY KEY, \
                   subject {text} NOT NULL, \
                   expires_at {ts} NOT NULL){options}",
                hash = k.hash_type(),
                text = k.key_type(),
                ts = k.timestamp_type(),
                options = k.table_options(),
            );
            DB::create_table(&self.inner.pool, table.as_str(), ddl)
                .await
                .map_err(db_error)
        }

        /// Issues a token for `subject`, valid for `ttl` by the database's
        /// clock.
        pub async fn issue(&self, subject: &str, ttl: Duration) -> Result<OneTimeToken, Error> {
            check_subject(subject)?;
            let token = OneTimeToken::generate();
            let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
            self.insert(&mut *conn, &token, subject, millis(ttl))
                .await?;
            Ok(token)
        }

        async fn insert(
            &self,
            conn: &mut DB::Connection,
            token: &OneTimeToken,
            subject: &str,
            ttl_ms: i64,
        ) -> Result<bool, Error> {
            let k = <DB::Connection as GuardConn>::KIND;
            let mut p = k.params();
            let (hash_p, subject_p, ttl_p) = (p.next(), p.next(), p.next());
            // A row left behind expired is dead: replace it.
            let sql = match k {
                Kind::Postgres | Kind::Sqlite => format!(
                    "INSERT INTO {t} AS t (token_hash, subject, expires_at) \
                     VALUES ({hash_p}, {subject_p}, {expires}) \
                     ON CONFLICT (token_hash) DO UPDATE SET \
                       subject = excluded.subject, expires_at = excluded.expires_at \
                     WHERE t.expires_at <= {now}",
                    t = self.inner.table,
                    expires = k.now_plus_ms(&ttl_p),
                    now = k.now(),
                ),
                // MySQL counts a row found but left as it was as affected
                // (sqlx sets CLIENT_FOUND_ROWS), so an upsert could not tell
                // "inserted" from "kept": insert, else take over if expired.
                Kind::MySql => format!(
                    "INSERT IGNORE INTO {t} (token_hash, subject, expires_at) \
                     VALUES ({hash_p}, {subject_p}, {expires})",
                    t = self.inner.table,
                    expires = k.now_plus_ms(&ttl_p),
                ),
            };
            let hash = token.hash();
            let args = [
                Value::Bytes(&hash),
                Value::Text(subject),
                Value::Int(ttl_ms),
            ];
            if conn.execute(sql, &args).await.map_err(db_error)? > 0 {
                return Ok(true);
            }
            if k != Kind::MySql {
                return Ok(false);
            }
            let take_over = format!(
                "UPDATE {t} SET subject = ?, expires_at = {expires} \
                 WHERE token_hash = ? AND expires_at <= {now}",
                t = self.inner.table,
                expires = k.now_plus_ms("?"),
                now = k.now(),
            );
            let args = [
                Value::Text(subject),
                Value::Int(ttl_ms),
                Value::Bytes(&hash),
            ];
            Ok(conn.execute(take_over, &args).await.map_err(db_error)? > 0)
        }

        /// Consumes `token` for `subject` on `conn` (your transaction, if it
        /// is in one): [`TokenUse::Consumed`] for exactly one caller, however
        /// many submit it at once.
        pub async fn consume(
            &self,
            conn: &mut DB::Connection,
            subject: &str,
            token: &OneTimeToken,
        ) -> Result<TokenUse, Error> {
            let k = <DB::Connection as GuardConn>::KIND;
            let returning = match self.inner.returning.get() {
                Some(returning) => *returning,
                None => {
                    let found = conn.delete_returning().await.map_err(db_error)?;
                    *self.inner.returning.get_or_init(|| found)
                }
            };
            let t = &self.inner.table;
            let mut p = k.params();
            let condition = format!(
                "token_hash = {} AND subject = {} AND expires_at > {}",
                p.next(),
                p.next(),
                k.now()
            );
            let hash = token.hash();
            let args = [Value::Bytes(&hash), Value::Text(subject)];
            let ms_left = k.int(&k.ms_until("expires_at"));
            let left = if returning {
                let sql = format!("DELETE FROM {t} WHERE {condition} RETURNING {ms_left}");
                conn.fetch_ints(sql, &args).await.map_err(db_error)?
            } else {
                let select = format!("SELECT {ms_left} FROM {t} WHERE {condition}{}", k.lock());
                let delete = format!("DELETE FROM {t} WHERE {condition}");
                conn.read_then_delete(select, delete, &args)
                    .await
                    .map_err(db_error)?
            };
            Ok(match left {
                Some(cols) => TokenUse::Consumed(ConsumedToken {
                    token: token.clone(),
                    subject: subject.to_owned(),
                    ttl_left: ttl_from_ms(cols.first().copied().flatten().unwrap_or(1)),
                }),
                None => TokenUse::Invalid,
            })
        }

        /// Puts a consumed token back, with the time it had left, so the user
        /// can submit again after a business failure. `false` if it is
        /// already back.
        pub async fn restore(&self, consumed: &ConsumedToken) -> Result<bool, Error> {
            let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
            self.insert(
                &mut *conn,
                &consumed.token,
                &consumed.subject,
                millis(consumed.ttl_left),
            )
            .await
        }
    }
}

#[cfg(feature = "redis")]
pub use self::redis_tokens::RedisTokens;

#[cfg(feature = "redis")]
mod redis_tokens {
    use std::sync::LazyLock;
    use std::time::Duration;

    use redis::Script;
    use redis::aio::ConnectionManager;

    use super::{ConsumedToken, OneTimeToken, TokenUse, millis, ttl_from_ms};
    use crate::Error;

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

    /// One-time tokens in Redis: `SET NX PX` to issue, a Lua
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
    /// use idem_core::guards::{RedisTokens, TokenUse};
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
    pub struct RedisTokens {
        conn: ConnectionManager,
        namespace: String,
    }

    impl std::fmt::Debug for RedisTokens {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("RedisTokens")
                .field("namespace", &self.namespace)
                .finish_non_exhaustive()
        }
    }

    impl RedisTokens {
        /// Tokens under keys `idem:token:{HASH}`.
        pub fn new(conn: ConnectionManager) -> Self {
            Self {
                conn,
                namespace: crate::DEFAULT_NAMESPACE.to_owned(),
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
            let set: Option<String> = redis::cmd("SET")
                .arg(self.key(token))
                .arg(subject)
                .arg("NX")
                .arg("PX")
                .arg(millis(ttl))
                .query_async(&mut self.conn.clone())
                .await
                .map_err(Error::unavailable)?;
            Ok(set.is_some())
        }

        /// Consumes `token` for `subject`: [`TokenUse::Consumed`] for exactly
        /// one caller, however many submit it at once.
        pub async fn consume(
            &self,
            subject: &str,
            token: &OneTimeToken,
        ) -> Result<TokenUse, Error> {
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
}
