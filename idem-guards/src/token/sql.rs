//! One-time tokens in a SQL table: `DELETE ... RETURNING` consumes, or a
//! locked read and a delete where the server has no `RETURNING`.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::{ConsumedToken, OneTimeToken, TokenUse, ttl_from_ms};
use crate::GuardDb;
use crate::sql::{Ident, Params, Value, check_short_text, create_table, db_error};
use idem_core::Error;
use idem_core::expiry_millis;

/// The table [`SqlTokens`] keeps tokens in unless told otherwise.
pub const DEFAULT_TOKEN_TABLE: &str = "idem_tokens";

/// One-time tokens in a SQL table: the hash as primary key, the subject,
/// and an expiry judged by the database's clock.
///
/// Consume in the transaction of the business step it guards and a
/// rollback puts the token back by itself; consume on its own and call
/// [`SqlTokens::restore`] when the step fails.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(pool: idem_sql::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem_guards::{SqlTokens, TokenUse};
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

impl<DB: GuardDb> fmt::Debug for SqlTokens<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
    /// [`ErrorKind::Config`](idem_core::ErrorKind::Config) error).
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
        let columns = format!(
            "token_hash {hash} NOT NULL PRIMARY KEY, \
             subject {text} NOT NULL, \
             expires_at {ts} NOT NULL",
            hash = DB::HASH,
            text = DB::SHORT_TEXT,
            ts = DB::TIMESTAMP,
        );
        create_table(&self.inner.pool, &self.inner.table, &columns).await
    }

    /// Issues a token for `subject`, valid for `ttl` by the database's
    /// clock.
    pub async fn issue(&self, subject: &str, ttl: Duration) -> Result<OneTimeToken, Error> {
        check_short_text("a token subject", subject)?;
        let token = OneTimeToken::generate();
        let mut conn = self.inner.pool.acquire().await.map_err(db_error)?;
        self.insert(&mut *conn, &token, subject, expiry_millis(ttl))
            .await?;
        Ok(token)
    }

    /// Inserts the row of `token`, or takes over the row of the same hash if
    /// it expired (it is dead); `false` if a live row is in the way.
    async fn insert(
        &self,
        conn: &mut DB::Connection,
        token: &OneTimeToken,
        subject: &str,
        ttl_ms: i64,
    ) -> Result<bool, Error> {
        let t = &self.inner.table;
        let hash = token.hash();
        let mut p = Params::<DB>::new();
        let insert = DB::insert_or_skip(
            &format!("{t} (token_hash, subject, expires_at)"),
            &format!("{}, {}, {}", p.next(), p.next(), DB::now_plus_ms(&p.next())),
        );
        let args = [
            Value::Bytes(&hash),
            Value::Text(subject),
            Value::Int(ttl_ms),
        ];
        if DB::execute(conn, insert, &args).await.map_err(db_error)? > 0 {
            return Ok(true);
        }
        // Not an upsert: MySQL counts a row found but left as it was as
        // affected (sqlx sets CLIENT_FOUND_ROWS), so an upsert could not
        // tell "taken over" from "kept".
        let mut p = Params::<DB>::new();
        let take_over = format!(
            "UPDATE {t} SET subject = {}, expires_at = {} \
             WHERE token_hash = {} AND expires_at <= {}",
            p.next(),
            DB::now_plus_ms(&p.next()),
            p.next(),
            DB::NOW,
        );
        let args = [
            Value::Text(subject),
            Value::Int(ttl_ms),
            Value::Bytes(&hash),
        ];
        Ok(DB::execute(conn, take_over, &args)
            .await
            .map_err(db_error)?
            > 0)
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
        let returning = match self.inner.returning.get() {
            Some(returning) => *returning,
            None => {
                let found = DB::delete_returning(conn).await.map_err(db_error)?;
                *self.inner.returning.get_or_init(|| found)
            }
        };
        let t = &self.inner.table;
        let mut p = Params::<DB>::new();
        let condition = format!(
            "token_hash = {} AND subject = {} AND expires_at > {}",
            p.next(),
            p.next(),
            DB::NOW
        );
        let hash = token.hash();
        let args = [Value::Bytes(&hash), Value::Text(subject)];
        let ms_left = DB::ms_until("expires_at");
        let left = if returning {
            let sql = format!("DELETE FROM {t} WHERE {condition} RETURNING {ms_left}");
            DB::fetch_ints(conn, sql, &args).await.map_err(db_error)?
        } else {
            let select = format!(
                "SELECT {ms_left} FROM {t} WHERE {condition}{}",
                DB::FOR_UPDATE
            );
            let delete = format!("DELETE FROM {t} WHERE {condition}");
            DB::read_then_delete(conn, select, delete, &args)
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
            expiry_millis(consumed.ttl_left),
        )
        .await
    }
}
