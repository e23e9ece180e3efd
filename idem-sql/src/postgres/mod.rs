//! PostgreSQL: one statement reads the key's live row and, only if there is
//! none, claims or takes over with `INSERT ... ON CONFLICT DO UPDATE ...
//! WHERE expired RETURNING`; a transactional claim holds the key by an
//! advisory lock and inserts its completed row at commit; the clock is
//! `now()`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgRow, PgValueFormat};
use sqlx::{AssertSqlSafe, Postgres, Row, ValueRef};

mod literal;
mod script;
mod session;

pub use literal::inline;

use super::ClaimTx;
use super::claim_tx::{EndTx, end_transaction};
use super::dialect::{
    ClaimArgs, ClaimStep, Dialect, Queries, RecordRow, Settled, Value, has_code, run_migrations,
    sealed,
};
use idem_core::OwnerToken;
use session::Statement;

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../migrations/postgres/0001_create_records.sql"),
    ),
    (
        2,
        include_str!("../../migrations/postgres/0002_create_recovery_points.sql"),
    ),
];

impl sealed::Sealed for Postgres {}

impl Dialect for Postgres {
    fn placeholder(n: usize) -> String {
        format!("${n}")
    }

    const NOW: &'static str = "now()";

    fn now_plus_ms(ms: &str) -> String {
        format!("{} + {ms}::bigint * interval '1 millisecond'", Self::NOW)
    }

    fn ms_until(column: &str) -> String {
        format!(
            "(EXTRACT(EPOCH FROM ({column} - {})) * 1000)::int8",
            Self::NOW
        )
    }

    fn int(expr: &str) -> String {
        format!("CAST({expr} AS BIGINT)")
    }

    fn insert_or_skip(into: &str, values: &str) -> String {
        // With no conflict target: any unique key.
        format!("INSERT INTO {into} VALUES ({values}) ON CONFLICT DO NOTHING")
    }

    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const FOR_SHARE: &'static str = " FOR SHARE";
    const TIMESTAMP: &'static str = "TIMESTAMPTZ";
    const SHORT_TEXT: &'static str = "TEXT";
    const HASH: &'static str = "BYTEA";
    const TABLE_OPTIONS: &'static str = "";

    fn queries(table: &str) -> Queries {
        let (now, left) = (Self::NOW, Self::ms_until("expires_at"));
        let expires = Self::now_plus_ms;
        Queries {
            // Without a live row, `turn` first waits out a transactional
            // claim of the key, which holds the key's advisory lock
            // (exclusive) and has written no row yet; plain claims share the
            // lock and never wait for each other, and a duplicate of a live
            // row takes no lock at all. `live` and the insert see one
            // snapshot: with a live row the
            // insert has nothing to insert, so it neither locks the row nor
            // writes, and the row is returned to answer from. Without one,
            // the upsert arbitrates as the unique index decides; a claim
            // that committed after the snapshot makes it return nothing, and
            // the caller reads that row.
            claim: format!(
                "WITH live AS ( \
                   SELECT state::text AS state, owner, fingerprint, outcome, {left} AS ms_left \
                   FROM {table} WHERE key_hash = $1 AND expires_at > {now} \
                 ), turn AS MATERIALIZED ( \
                   SELECT CASE WHEN EXISTS (SELECT 1 FROM live) THEN NULL \
                     ELSE pg_advisory_xact_lock_shared($6) END \
                 ), claimed AS ( \
                   INSERT INTO {table} AS r \
                     (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
                   SELECT $1, $2, 'I', $3, $4, NULL, {lease_end} \
                   WHERE EXISTS (SELECT 1 FROM turn) AND NOT EXISTS (SELECT 1 FROM live) \
                   ON CONFLICT (key_hash) DO UPDATE SET \
                     idem_key = EXCLUDED.idem_key, state = 'I', owner = EXCLUDED.owner, \
                     fingerprint = EXCLUDED.fingerprint, outcome = NULL, \
                     expires_at = EXCLUDED.expires_at, created_at = {now} \
                   WHERE r.expires_at <= {now} \
                   RETURNING 1 \
                 ) \
                 SELECT EXISTS (SELECT 1 FROM claimed), \
                   live.state, live.owner, live.fingerprint, live.outcome, live.ms_left \
                 FROM (SELECT 1) AS one LEFT JOIN live ON true",
                // From when the row is written, after `turn` may have
                // waited: `now()` is the statement's start, and a lease
                // counted from it would lose the wait (all of it, after a
                // long one, and a duplicate could take the key at once).
                lease_end = "clock_timestamp() + $5::bigint * interval '1 millisecond'",
            )
            .into(),
            select: format!(
                "SELECT state::text, owner, fingerprint, outcome, {left} \
                 FROM {table} WHERE key_hash = $1"
            )
            .into(),
            complete: format!(
                "UPDATE {table} SET state = 'C', owner = NULL, outcome = $1, expires_at = {} \
                 WHERE key_hash = $3 AND state = 'I' AND owner = $4",
                expires("$2"),
            )
            .into(),
            release: format!(
                "DELETE FROM {table} WHERE key_hash = $1 AND state = 'I' AND owner = $2"
            )
            .into(),
            renew: format!(
                "UPDATE {table} SET expires_at = {} \
                 WHERE key_hash = $2 AND state = 'I' AND owner = $3 AND expires_at > {now}",
                expires("$1"),
            )
            .into(),
            purge: format!(
                "DELETE FROM {table} WHERE key_hash IN ( \
                   SELECT key_hash FROM {table} WHERE expires_at < {now} \
                   LIMIT $1 FOR UPDATE SKIP LOCKED)"
            )
            .into(),
            table: table.into(),
            mariadb: std::sync::OnceLock::new(),
        }
    }

    async fn migrate(pool: &sqlx::Pool<Self>, table: &str) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin().await?;
        lock_until_commit(&mut tx, format!("idem-migrate:{table}")).await?;
        run_migrations::<Self>(
            &mut tx,
            table,
            MIGRATIONS,
            format!(
                "CREATE TABLE IF NOT EXISTS {table}_schema ( \
                   version BIGINT PRIMARY KEY, applied_at {} NOT NULL DEFAULT {})",
                Self::TIMESTAMP,
                Self::NOW,
            ),
            format!("SELECT max(version) FROM {table}_schema"),
        )
        .await?;
        tx.commit().await
    }

    const CLAIM_READS_FIRST: bool = true;
    const ONE_WRITER: bool = false;
    const OWN_BEGIN: Option<EndTx<Self>> = Some(end_transaction::<Self>);

    async fn claim(
        conn: &mut PgConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
    ) -> Result<ClaimStep, sqlx::Error> {
        let [hash, key, owner, fingerprint, lease] = args.values();
        let values = [
            hash,
            key,
            owner,
            fingerprint,
            lease,
            Value::Int(advisory_key(args.key_hash)),
        ];
        let answered = session::run(conn, q, Statement::Claim, &values).await?;
        let row = answered
            .rows
            .first()
            .ok_or_else(|| sqlx::Error::RowNotFound)?;
        if row.try_get::<bool, _>(0)? {
            return Ok(ClaimStep::Acquired);
        }
        if let Some(state) = row.try_get::<Option<String>, _>(1)? {
            return Ok(ClaimStep::Existing(RecordRow {
                state,
                owner: row.try_get(2)?,
                fingerprint: row.try_get(3)?,
                outcome: row.try_get(4)?,
                ms_left: row.try_get(5)?,
            }));
        }
        Ok(ClaimStep::found(Self::read(conn, q, args.key_hash).await?))
    }

    async fn read(
        conn: &mut PgConnection,
        q: &Queries,
        key_hash: &[u8; 32],
    ) -> Result<Option<RecordRow>, sqlx::Error> {
        let answered = session::run(conn, q, Statement::Read, &[Value::Bytes(key_hash)]).await?;
        answered.rows.first().map(pg_record_row).transpose()
    }

    async fn complete(
        conn: &mut PgConnection,
        q: &Queries,
        key_hash: &[u8; 32],
        owner: &OwnerToken,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let values = [
            Value::Bytes(outcome),
            Value::Int(ttl_ms),
            Value::Bytes(key_hash),
            Value::Bytes(owner.as_bytes()),
        ];
        let answered = session::run(conn, q, Statement::Complete, &values).await?;
        Ok(answered.changed == 1)
    }

    async fn release(
        conn: &mut PgConnection,
        q: &Queries,
        key_hash: &[u8; 32],
        owner: &OwnerToken,
    ) -> Result<bool, sqlx::Error> {
        let values = [Value::Bytes(key_hash), Value::Bytes(owner.as_bytes())];
        let answered = session::run(conn, q, Statement::Release, &values).await?;
        Ok(answered.changed == 1)
    }

    async fn renew(
        conn: &mut PgConnection,
        q: &Queries,
        key_hash: &[u8; 32],
        owner: &OwnerToken,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let values = [
            Value::Int(lease_ms),
            Value::Bytes(key_hash),
            Value::Bytes(owner.as_bytes()),
        ];
        let answered = session::run(conn, q, Statement::Renew, &values).await?;
        Ok(answered.changed == 1)
    }

    async fn purge(
        conn: &mut PgConnection,
        q: &Queries,
        _table: &str,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let answered = session::run(conn, q, Statement::Purge, &[Value::Int(batch)]).await?;
        Ok(answered.changed)
    }

    async fn tx_claim(
        conn: &mut PgConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
        lock_timeout: Duration,
    ) -> Result<ClaimStep, sqlx::Error> {
        // The key's advisory lock holds it until the transaction ends,
        // against every other transactional claim; so the claim only reads,
        // in a statement after the lock's (its snapshot sees whatever the
        // lock's last holder committed), and the row is written once, at
        // commit, completed. No row to update, no dead version of it left
        // behind, and a crash leaves nothing to clean up. BEGIN, lock and
        // read go in one round trip (`script.rs`): the transaction is the
        // claim's own (`OWN_BEGIN`).
        let (table, lock_id) = (&*q.table, advisory_key(args.key_hash));
        let timeout_ms = lock_timeout.as_millis();
        let script = script::claim(table, lock_id, args.key_hash, timeout_ms);
        let rows = match sqlx::raw_sql(AssertSqlSafe(script))
            .fetch_all(&mut *conn)
            .await
        {
            Err(err) if has_code(&err, &[script::NOT_PREPARED]) => {
                let script = script::prepare_and_claim(table, lock_id, args.key_hash, timeout_ms);
                match sqlx::raw_sql(AssertSqlSafe(script))
                    .fetch_all(&mut *conn)
                    .await
                {
                    // An earlier prepare on this connection failed partway.
                    Err(err) if has_code(&err, &[script::ALREADY_PREPARED]) => {
                        let prepared = sqlx::raw_sql(AssertSqlSafe(script::which_prepared(table)))
                            .fetch_all(&mut *conn)
                            .await?
                            .iter()
                            .map(|row| row.try_get::<String, _>(0))
                            .collect::<Result<Vec<_>, _>>()?;
                        let script = script::prepare_missing_and_claim(
                            table,
                            &prepared,
                            lock_id,
                            args.key_hash,
                            timeout_ms,
                        );
                        sqlx::raw_sql(AssertSqlSafe(script))
                            .fetch_all(&mut *conn)
                            .await?
                    }
                    rows => rows?,
                }
            }
            rows => rows?,
        };
        let locked = rows
            .first()
            .map(|row| row.try_get::<bool, _>(0))
            .transpose()?;
        let record = rows.get(1).map(pg_record_row).transpose()?;
        if locked != Some(true) {
            // Another transaction holds the key's lock; the read went on
            // without it.
            return Ok(ClaimStep::held_elsewhere(record));
        }
        Ok(ClaimStep::under_lock(record))
    }

    fn lend_statement(owner: &OwnerToken, lease: Duration) -> Option<String> {
        Some(script::lend(owner.as_bytes(), idle_bound_ms(lease)))
    }

    async fn tx_commit(
        mut tx: ClaimTx<Self>,
        q: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> Result<Settled, sqlx::Error> {
        let script = script::commit(
            &q.table,
            &completed(&args, outcome, ttl_ms),
            args.owner.as_bytes(),
        );
        match sqlx::raw_sql(AssertSqlSafe(script)).execute(&mut *tx).await {
            // Committed: the transaction is over.
            Ok(_) => {
                tx.ended();
                Ok(Settled::Done)
            }
            // A live row in the way: the insert failed, nothing after it
            // ran.
            Err(err) if has_code(&err, &["23505"]) => {
                tx.rollback().await?;
                Ok(Settled::Fenced)
            }
            Err(err) if is_ended(&err) => {
                // Whatever the handler began after it ended ours is
                // rolled back.
                tx.rollback().await?;
                Ok(Settled::Ended)
            }
            Err(err) => Err(err),
        }
    }

    async fn tx_rollback(tx: ClaimTx<Self>, args: ClaimArgs<'_>) -> Result<Settled, sqlx::Error> {
        let script = script::rollback(args.owner.as_bytes());
        let ended = tx.rollback_checked(script, is_ended).await?;
        Ok(Settled::ended_if(ended))
    }

    async fn tx_keep_ended(
        pool: &sqlx::Pool<Self>,
        q: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let script = script::tombstone(&q.table, &completed(&args, outcome, ttl_ms));
        sqlx::raw_sql(AssertSqlSafe(script)).execute(pool).await?;
        Ok(true)
    }

    fn is_lock_timeout(err: &sqlx::Error) -> bool {
        // lock_not_available, deadlock_detected
        has_code(err, &["55P03", "40P01"])
    }

    fn purge_points(points: &str) -> String {
        format!(
            "DELETE FROM {points} WHERE (operation, phase) IN ( \
               SELECT operation, phase FROM {points} WHERE expires_at < {} \
               LIMIT $1 FOR UPDATE SKIP LOCKED)",
            Self::NOW
        )
    }

    // The points' statements go as simple queries, their values written
    // into the text: one message, answered by one server session, in a
    // transaction (a phase's) or outside one (ARCHITECTURE.md, "Behind a
    // pooler").

    async fn point_read(
        conn: &mut PgConnection,
        sql: &Arc<str>,
        args: &[Value<'_>],
    ) -> Result<Option<(Vec<u8>, i64)>, sqlx::Error> {
        let row = sqlx::raw_sql(AssertSqlSafe(inline(sql, args)?))
            .fetch_optional(&mut *conn)
            .await?;
        row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .transpose()
    }

    async fn point_execute(
        conn: &mut PgConnection,
        sql: &Arc<str>,
        args: &[Value<'_>],
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::raw_sql(AssertSqlSafe(inline(sql, args)?))
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn point_count(
        conn: &mut PgConnection,
        sql: &Arc<str>,
        args: &[Value<'_>],
    ) -> Result<i64, sqlx::Error> {
        let row = sqlx::raw_sql(AssertSqlSafe(inline(sql, args)?))
            .fetch_one(&mut *conn)
            .await?;
        row.try_get(0)
    }
}

/// Takes the advisory lock `name` in the transaction on `conn`, waiting for
/// it: one holder at a time, until the transaction ends.
async fn lock_until_commit(conn: &mut PgConnection, name: String) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        // Unnamed: a named statement would outlive the transaction on a
        // server session a pooler shares (ARCHITECTURE.md, "Behind a
        // pooler"); in the transaction, parse and run reach one session.
        .persistent(false)
        .bind(name)
        .execute(&mut *conn)
        .await
        .map(drop)
}

/// A claim's row as the other databases' `record_row` reads it, its bytes
/// decoded here:
/// a simple query answers `bytea` as text, `\\x` and two hexadecimal
/// digits a byte (`hex_digits::decode`).
fn pg_record_row(row: &PgRow) -> Result<RecordRow, sqlx::Error> {
    Ok(RecordRow {
        state: row.try_get(0)?,
        owner: bytes(row, 1)?,
        fingerprint: bytes(row, 2)?.ok_or_else(|| decode_error(2, "NULL"))?,
        outcome: bytes(row, 3)?,
        ms_left: row.try_get(4)?,
    })
}

/// Column `index` of `row`, a `bytea` in either format; `None` if NULL.
fn bytes(row: &PgRow, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
    let value = row.try_get_raw(index)?;
    if value.is_null() {
        return Ok(None);
    }
    let raw = value
        .as_bytes()
        .map_err(|e| decode_error(index, &e.to_string()))?;
    match value.format() {
        PgValueFormat::Binary => Ok(Some(raw.to_vec())),
        PgValueFormat::Text => raw
            .strip_prefix(b"\\x")
            .and_then(crate::hex_digits::decode)
            .map(Some)
            .ok_or_else(|| decode_error(index, "not a bytea's hexadecimal text")),
    }
}

fn decode_error(index: usize, what: &str) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: index.to_string(),
        source: what.into(),
    }
}

/// How long a lent transaction may sit idle (between statements) before
/// PostgreSQL ends it with its session: the claim's `lease`, in whole
/// milliseconds, at least [`MIN_IDLE_BOUND`] and at most what
/// `idle_in_transaction_session_timeout` takes (`i32::MAX`).
fn idle_bound_ms(lease: Duration) -> u128 {
    lease.as_millis().clamp(
        MIN_IDLE_BOUND.as_millis(),
        u128::from(i32::MAX.unsigned_abs()),
    )
}

/// The least bound on a lent transaction's idle time, whatever the lease:
/// a lease shorter than the store's own round trips (a nanosecond, zero:
/// a plain claim takes them) would end the transaction between the
/// lending and the handler's first statement. A second, MariaDB's
/// granularity (`mysql.rs`).
const MIN_IDLE_BOUND: Duration = Duration::from_secs(1);

/// The completed record of a transactional claim's `args`, with `outcome`
/// kept for `ttl_ms`.
fn completed<'a>(args: &ClaimArgs<'a>, outcome: &'a [u8], ttl_ms: i64) -> script::Completed<'a> {
    script::Completed {
        key_hash: args.key_hash,
        key: args.key,
        fingerprint: args.fingerprint.as_bytes(),
        outcome,
        ttl_ms,
    }
}

/// Whether `err` is the failure of the check a settling script begins
/// with (`script.rs`, `push_check`): the transaction was not the claim's.
fn is_ended(err: &sqlx::Error) -> bool {
    err.as_database_error().is_some_and(|e| {
        e.code().as_deref() == Some("22P02") && e.message().contains(script::ENDED)
    })
}

/// The advisory lock id of a key: the first 8 bytes of its hash.
fn advisory_key(key_hash: &[u8; 32]) -> i64 {
    let mut id = [0; 8];
    id.copy_from_slice(&key_hash[..8]);
    i64::from_be_bytes(id)
}
