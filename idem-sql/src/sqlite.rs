//! SQLite: `INSERT ... ON CONFLICT DO UPDATE ... WHERE expired RETURNING`
//! claims or takes over; the clock is SQLite's `julianday('now')` in Unix
//! milliseconds. One writer at a time: a transactional claim takes the
//! database's write lock at its start (BEGIN IMMEDIATE), which holds its
//! key, reads under it, and writes its record completed at commit
//! (`sqlite/script.rs`), where it may start the next waiting claim and
//! hand it the lock (`relay.rs`); the store's writes in this process take
//! turns (`writer.rs`), its plain writes in batches of many per statement
//! (`batch.rs`, `sqlite/many.rs`), and those of other processes wait for
//! the pool's `busy_timeout` (duplicates of a live key only read).

use std::time::Duration;

use futures_util::StreamExt;
use sqlx::Executor;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{AssertSqlSafe, Either, Sqlite};

use super::batch::{Write, Written};
use super::dialect::bound_point_statements;
use super::dialect::{
    ClaimArgs, ClaimStep, Dialect, Queries, RecordRow, Settled, Started, bind_all, has_code,
    record_row, run_migrations, sealed, shared_statements,
};
use super::{ClaimTx, SqlStore, unavailable};
use idem_core::{Error, OwnerToken};

mod lent;
mod many;
mod script;

pub(crate) use lent::Lent;

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../migrations/sqlite/0001_create_records.sql"),
    ),
    (
        2,
        include_str!("../migrations/sqlite/0002_create_recovery_points.sql"),
    ),
];

impl sealed::Sealed for Sqlite {}

impl Dialect for Sqlite {
    fn placeholder(n: usize) -> String {
        format!("?{n}")
    }

    /// Unix milliseconds.
    const NOW: &'static str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

    fn now_plus_ms(ms: &str) -> String {
        format!("{} + {ms}", Self::NOW)
    }

    fn ms_until(column: &str) -> String {
        format!("{column} - {}", Self::NOW)
    }

    fn int(expr: &str) -> String {
        expr.to_owned()
    }

    fn insert_or_skip(into: &str, values: &str) -> String {
        // With no conflict target: any unique key.
        format!("INSERT INTO {into} VALUES ({values}) ON CONFLICT DO NOTHING")
    }

    // No row locks: a writer holds the whole database's write lock.
    const FOR_UPDATE: &'static str = "";
    const FOR_SHARE: &'static str = "";
    const TIMESTAMP: &'static str = "INTEGER";
    const SHORT_TEXT: &'static str = "TEXT";
    const HASH: &'static str = "BLOB";
    const TABLE_OPTIONS: &'static str = "";

    fn queries(table: &str) -> Queries {
        let (now, left) = (Self::NOW, Self::ms_until("expires_at"));
        let expires = Self::now_plus_ms;
        Queries {
            claim: format!(
                "INSERT INTO {table} AS r \
                   (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
                 VALUES (?1, ?2, 'I', ?3, ?4, NULL, {lease_end}) {take_over} \
                 RETURNING 1",
                lease_end = expires("?5"),
                take_over = take_over_expired(),
            )
            .into(),
            select: format!(
                "SELECT state, owner, fingerprint, outcome, {left} FROM {table} WHERE key_hash = ?1"
            )
            .into(),
            complete: format!(
                "UPDATE {table} SET state = 'C', owner = NULL, outcome = ?1, expires_at = {} \
                 WHERE key_hash = ?3 AND state = 'I' AND owner = ?4",
                expires("?2"),
            )
            .into(),
            release: format!(
                "DELETE FROM {table} WHERE key_hash = ?1 AND state = 'I' AND owner = ?2"
            )
            .into(),
            renew: format!(
                "UPDATE {table} SET expires_at = {} \
                 WHERE key_hash = ?2 AND state = 'I' AND owner = ?3 AND expires_at > {now}",
                expires("?1"),
            )
            .into(),
            purge: format!(
                "DELETE FROM {table} WHERE key_hash IN ( \
                   SELECT key_hash FROM {table} WHERE expires_at < {now} LIMIT ?1)"
            )
            .into(),
            table: table.into(),
            mariadb: std::sync::OnceLock::new(),
        }
    }

    async fn migrate(pool: &sqlx::Pool<Self>, table: &str) -> Result<(), sqlx::Error> {
        // BEGIN IMMEDIATE takes the write lock first: one migrator at a time.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        run_migrations::<Self>(
            &mut tx,
            table,
            MIGRATIONS,
            format!(
                "CREATE TABLE IF NOT EXISTS {table}_schema ( \
                   version INTEGER PRIMARY KEY, \
                   applied_at {} NOT NULL DEFAULT ({}))",
                Self::TIMESTAMP,
                Self::NOW,
            ),
            format!("SELECT max(version) FROM {table}_schema"),
        )
        .await?;
        tx.commit().await
    }

    const CLAIM_READS_FIRST: bool = false;
    const ONE_WRITER: bool = true;
    const TX_BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");

    /// A returned row means the claim inserted or took over the record;
    /// otherwise read what is in the way.
    async fn claim(
        conn: &mut SqliteConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
    ) -> Result<ClaimStep, sqlx::Error> {
        let inserted = bind_all(sqlx::query(AssertSqlSafe(q.claim.clone())), &args.values())
            .fetch_optional(&mut *conn)
            .await?;
        if inserted.is_some() {
            return Ok(ClaimStep::Acquired);
        }
        Ok(ClaimStep::found(Self::read(conn, q, args.key_hash).await?))
    }
    shared_statements!(SqliteConnection);

    fn purge_points(points: &str) -> String {
        format!(
            "DELETE FROM {points} WHERE (operation, phase) IN ( \
               SELECT operation, phase FROM {points} WHERE expires_at < {} LIMIT ?1)",
            Self::NOW
        )
    }

    bound_point_statements!(SqliteConnection);

    /// Every completion in one statement, then every claim in another
    /// (`sqlite/many.rs`), the rest one at a time: a claim the statement
    /// did not acquire, to read what is in the way; a release or renewal;
    /// a second write of a key already in the statement.
    async fn run_writes(
        store: &SqlStore<Self>,
        conn: &mut SqliteConnection,
        writes: &[&Write],
    ) -> Vec<Result<Written, Error>> {
        let mut written: Vec<Option<Result<Written, Error>>> =
            writes.iter().map(|_| None).collect();
        many::complete(conn, store.table(), writes, &mut written).await;
        many::claim(conn, store.table(), writes, &mut written).await;
        for (answer, write) in written.iter_mut().zip(writes) {
            if answer.is_none() {
                *answer = Some(store.run_write(conn, write).await.map_err(unavailable));
            }
        }
        written.into_iter().flatten().collect()
    }

    async fn tx_claim(
        conn: &mut SqliteConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
        lock_timeout: Duration,
    ) -> Result<ClaimStep, sqlx::Error> {
        // The write lock, taken by the transaction's BEGIN IMMEDIATE
        // (`TX_BEGIN`) and held to the commit, holds the key; the claim
        // only reads under it. Nothing waits longer than the connection's
        // busy timeout.
        let _ = lock_timeout;
        Ok(ClaimStep::under_lock(
            Self::read(conn, q, args.key_hash).await?,
        ))
    }

    async fn tx_lend(
        tx: &mut ClaimTx<Self>,
        _: &OwnerToken,
        _: Duration,
    ) -> Result<(), sqlx::Error> {
        let lent = Lent::hook(tx).await?;
        tx.watch(lent);
        Ok(())
    }

    async fn tx_commit(
        mut tx: ClaimTx<Self>,
        q: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> Result<Settled, sqlx::Error> {
        if tx.settle_lent() {
            end_ended(tx).await?;
            return Ok(Settled::Ended);
        }
        let commit = script::commit(&q.table, Self::NOW);
        match completion(commit, &args, outcome, ttl_ms)
            .execute(&mut *tx)
            .await
        {
            // Committed; dropping `tx` rolls back the empty transaction
            // the query began (`script::commit`).
            Ok(_) => Ok(Settled::Done),
            Err(err) => {
                tx.rollback().await?;
                Err(err)
            }
        }
    }

    async fn tx_commit_and_claim(
        mut tx: ClaimTx<Self>,
        q: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
        next_hash: &[u8; 32],
    ) -> Result<(Settled, Option<Started<Self>>), sqlx::Error> {
        if tx.settle_lent() {
            end_ended(tx).await?;
            return Ok((Settled::Ended, None));
        }
        let commit = script::commit_and_claim(&q.table, Self::NOW, &Self::ms_until("expires_at"));
        let query = completion(commit, &args, outcome, ttl_ms).bind(&next_hash[..]);
        let ran = run(&mut tx, query).await;
        let Some(err) = ran.failed else {
            // Committed, and the next claim's transaction holds the lock.
            match ran.row.as_ref().map(record_row).transpose() {
                Ok(found) => {
                    return Ok((Settled::Done, Some((tx, ClaimStep::under_lock(found)))));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reading the next transactional claim's record failed");
                    end_started(tx, true).await;
                    return Ok((Settled::Done, None));
                }
            }
        };
        if ran.statements < script::NEXT_BEGINS_AT {
            tx.rollback().await?;
            return Err(err);
        }
        // Committed; the next claim did not start: BEGIN IMMEDIATE met
        // another process's writer past the busy timeout (no transaction
        // is open), or the read failed in the transaction it began.
        tracing::debug!(error = %err, "the next transactional claim did not start with the commit");
        end_started(tx, ran.statements > script::NEXT_BEGINS_AT).await;
        Ok((Settled::Done, None))
    }

    async fn tx_rollback(tx: ClaimTx<Self>, _: ClaimArgs<'_>) -> Result<Settled, sqlx::Error> {
        let ended = tx.settle_lent();
        if ended {
            end_ended(tx).await?;
        } else {
            tx.rollback().await?;
        }
        Ok(Settled::ended_if(ended))
    }

    async fn tx_keep_ended(
        _: &sqlx::Pool<Self>,
        _: &Queries,
        _: ClaimArgs<'_>,
        _: &[u8],
        _: i64,
    ) -> Result<bool, sqlx::Error> {
        // The commit hook refused every commit while it was lent
        // (`sqlite/lent.rs`): nothing of it committed.
        Ok(false)
    }

    fn is_lock_timeout(err: &sqlx::Error) -> bool {
        // SQLITE_BUSY and its extended codes
        has_code(err, &["5", "261", "517"])
    }
}

/// What a claim's insert does on meeting the key's row (`r`): takes it over
/// if it expired, else nothing.
fn take_over_expired() -> String {
    let now = Sqlite::NOW;
    format!(
        "ON CONFLICT (key_hash) DO UPDATE SET \
           idem_key = excluded.idem_key, state = 'I', owner = excluded.owner, \
           fingerprint = excluded.fingerprint, outcome = NULL, \
           expires_at = excluded.expires_at, created_at = {now} \
         WHERE r.expires_at <= {now}"
    )
}

/// `sql` (`script::commit` or `commit_and_claim`) with the completed
/// record's values bound.
fn completion<'q>(
    sql: String,
    args: &ClaimArgs<'q>,
    outcome: &'q [u8],
    ttl_ms: i64,
) -> sqlx::query::Query<'q, Sqlite, SqliteArguments> {
    sqlx::query(AssertSqlSafe(sql))
        .bind(&args.key_hash[..])
        .bind(args.key)
        .bind(&args.fingerprint.as_bytes()[..])
        .bind(outcome)
        .bind(ttl_ms)
}

/// How far a query of several statements went: the statements that ran to
/// their end, the last row read, and the error that stopped it, if one
/// did.
struct Ran {
    statements: usize,
    row: Option<SqliteRow>,
    failed: Option<sqlx::Error>,
}

/// Runs `query`, of several statements, on `conn` in one call to its
/// worker thread. Each statement answers once when done (a `Left`), a
/// read's rows before it.
async fn run<'q>(
    conn: &mut SqliteConnection,
    query: sqlx::query::Query<'q, Sqlite, SqliteArguments>,
) -> Ran {
    let mut ran = Ran {
        statements: 0,
        row: None,
        failed: None,
    };
    let mut answers = conn.fetch_many(query);
    while let Some(answer) = answers.next().await {
        match answer {
            Ok(Either::Left(_)) => ran.statements += 1,
            Ok(Either::Right(row)) => ran.row = Some(row),
            Err(err) => {
                ran.failed = Some(err);
                break;
            }
        }
    }
    ran
}

/// Ends a claim's transaction that ended while lent to the handler
/// (`sqlite/lent.rs`): nothing of it committed, and sqlx still counts it
/// open. A transaction opened for sqlx's ROLLBACK to end (or the one the
/// handler began after, if it did), so that the connection goes back to
/// the pool with none open and none counted.
async fn end_ended(mut tx: ClaimTx<Sqlite>) -> Result<(), sqlx::Error> {
    // Fails if the handler left a transaction open; ROLLBACK ends either.
    let _ = reopen(&mut tx).await;
    tx.rollback().await
}

/// Opens the deferred transaction sqlx counts as open on `conn`, after a
/// script committed the one it had and failed to begin the next.
async fn reopen(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("BEGIN").execute(conn).await.map(drop)
}

/// Ends what a commit that went through began for the next claim, that is
/// not to be handed on: rolls back its transaction if `begun` (it holds
/// the write lock), else opens the deferred one sqlx counts as open.
async fn end_started(mut tx: ClaimTx<Sqlite>, begun: bool) {
    let ended = if begun {
        tx.rollback().await
    } else {
        reopen(&mut tx).await
    };
    if let Err(err) = ended {
        tracing::warn!(error = %err, "ending the next transactional claim's start failed");
    }
}
