//! MySQL and MariaDB: `INSERT ... ON DUPLICATE KEY UPDATE` takes over an
//! expired row in the same statement; since the affected-row count cannot
//! tell an insert from a no-op (sqlx sets `CLIENT_FOUND_ROWS`), the claim
//! reads the row back and owns it if the owner token is its own. The clock
//! is `UTC_TIMESTAMP(6)`, independent of the session time zone.

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Connection, MySql};

use super::ClaimTx;
use super::claim_tx::{EndTx, uncount};
use super::dialect::bound_point_statements;
use super::dialect::{
    ClaimArgs, ClaimStep, Dialect, Queries, RecordRow, Settled, bind_all, has_code, record_row,
    run_migrations, sealed, shared_statements,
};
use idem_core::{BoxFuture, OwnerToken};

mod script;

use script::Server;

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../migrations/mysql/0001_create_records.sql"),
    ),
    (
        2,
        include_str!("../migrations/mysql/0002_create_recovery_points.sql"),
    ),
];

impl sealed::Sealed for MySql {}

/// `IF(the row expired, new, old)` for one column. `expires_at` must be
/// assigned last: MySQL evaluates assignments left to right, and later ones
/// would see the new expiry.
fn take_over(column: &str, new: &str) -> String {
    format!(
        "{column} = IF(expires_at <= {}, {new}, {column})",
        MySql::NOW
    )
}

/// The claim's upsert on `table`, its values (key hash, key, owner,
/// fingerprint, lease in milliseconds) given as SQL: parameters (`?`) in
/// the prepared claim, literals in the transactional claim's script.
fn upsert(table: &str, [hash, key, owner, fingerprint, lease_ms]: [&str; 5]) -> String {
    let now = MySql::NOW;
    let expires = MySql::now_plus_ms(lease_ms);
    let updates = [
        take_over("idem_key", "VALUES(idem_key)"),
        take_over("state", "'I'"),
        take_over("owner", "VALUES(owner)"),
        take_over("fingerprint", "VALUES(fingerprint)"),
        take_over("outcome", "NULL"),
        take_over("created_at", now),
        take_over("expires_at", "VALUES(expires_at)"),
    ]
    .join(", ");
    format!(
        "INSERT INTO {table} \
           (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at, created_at) \
         VALUES ({hash}, {key}, 'I', {owner}, {fingerprint}, NULL, {expires}, {now}) \
         ON DUPLICATE KEY UPDATE {updates}"
    )
}

/// The columns of a claim's row as a claim reads it (`RecordRow`): state,
/// owner, fingerprint, outcome, milliseconds left.
fn record_columns() -> String {
    format!(
        "state, owner, fingerprint, outcome, {}",
        MySql::ms_until("expires_at")
    )
}

/// MariaDB's claim (`mysql/script.rs`): the store's upsert with no lock
/// wait of its own, answering the key's row as it stands after it (the
/// row inserted, taken over or left alone), as the store's `select` would
/// read it.
pub(crate) fn claim_returning(q: &Queries) -> String {
    format!(
        "SET STATEMENT innodb_lock_wait_timeout = 0 FOR {} RETURNING {}",
        q.claim,
        record_columns()
    )
}

impl crate::SqlStore<MySql> {
    /// Writes this store's transactional scripts for MySQL whatever the
    /// server is, so that the portable scripts are tested on MariaDB too.
    /// No effect once the store has run a transactional claim.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn portable_scripts_for_tests(&self) {
        let _ = self.inner.queries.mariadb.set(false);
    }
}

/// The server `q`'s store writes its scripts for, asked on `conn` at its
/// first transactional claim.
async fn server(conn: &mut MySqlConnection, q: &Queries) -> Result<Server, sqlx::Error> {
    if let Some(&mariadb) = q.mariadb.get() {
        return Ok(if mariadb {
            Server::MariaDb
        } else {
            Server::MySql
        });
    }
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await?;
    let server = Server::of(&version);
    let _ = q.mariadb.set(server == Server::MariaDb);
    Ok(server)
}

/// What the claim's row, read back, says of a claim by `args`: ours
/// (acquired) or another's; a lease cut short by a wait on another
/// transaction's row lock is renewed first.
async fn owned(
    conn: &mut MySqlConnection,
    q: &Queries,
    args: &ClaimArgs<'_>,
    row: RecordRow,
) -> Result<ClaimStep, sqlx::Error> {
    let ours = row.state == "I" && row.owner.as_deref() == Some(&args.owner.as_bytes()[..]);
    if !ours {
        return Ok(ClaimStep::Existing(row));
    }
    // The row is ours: this claim's statement wrote it, whatever its
    // lease says by now. `UTC_TIMESTAMP` is the statement's start, so a
    // claim that waited on another transaction's row lock got a lease
    // short by the wait (over by now, after a long one, and a duplicate
    // could take the key at once); and a lease shorter than the claim's
    // own round trips is over before the row is read back, however often
    // the claim is tried (a renewal, refused past the lease, sent it
    // round again until it reported the store unavailable). A lease short
    // by more than the third the layer renews within is stamped again
    // from now, by owner alone: a row still ours was taken over by no
    // other claim, so no one else holds the key. If it went meanwhile
    // (taken over, or purged), the claim is tried again.
    if row.ms_left < args.lease_ms / 3 * 2 && !restamp(conn, q, args).await? {
        return Ok(ClaimStep::Vanished);
    }
    Ok(ClaimStep::Acquired)
}

impl Dialect for MySql {
    fn placeholder(_: usize) -> String {
        "?".to_owned()
    }

    const NOW: &'static str = "UTC_TIMESTAMP(6)";

    fn now_plus_ms(ms: &str) -> String {
        format!("{} + INTERVAL ({ms} * 1000) MICROSECOND", Self::NOW)
    }

    fn ms_until(column: &str) -> String {
        Self::int(&format!(
            "TIMESTAMPDIFF(MICROSECOND, {}, {column}) DIV 1000",
            Self::NOW
        ))
    }

    fn int(expr: &str) -> String {
        format!("CAST({expr} AS SIGNED)")
    }

    fn insert_or_skip(into: &str, values: &str) -> String {
        format!("INSERT IGNORE INTO {into} VALUES ({values})")
    }

    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const FOR_SHARE: &'static str = " LOCK IN SHARE MODE";
    const TIMESTAMP: &'static str = "DATETIME(6)";
    // Bytes, not `VARCHAR(255)`: a character column compares by the
    // server's default collation (MariaDB's `utf8mb4_general_ci`, MySQL 8's
    // `utf8mb4_0900_ai_ci`), which takes ids differing only by case or an
    // accent for one, and MariaDB's (PAD SPACE) ids differing by trailing
    // spaces too. No byte-for-byte NO PAD collation is named alike on both
    // (MariaDB's `utf8mb4_bin` pads); a binary string compares every byte
    // on both.
    const SHORT_TEXT: &'static str = "VARBINARY(255)";
    const HASH: &'static str = "VARBINARY(32)";
    const TABLE_OPTIONS: &'static str = " ENGINE = InnoDB";

    fn queries(table: &str) -> Queries {
        let now = Self::NOW;
        let expires = Self::now_plus_ms("?");
        Queries {
            claim: upsert(table, ["?"; 5]).into(),
            select: format!(
                "SELECT {} FROM {table} WHERE key_hash = ?",
                record_columns()
            )
            .into(),
            complete: format!(
                "UPDATE {table} SET state = 'C', owner = NULL, outcome = ?, expires_at = {expires} \
                 WHERE key_hash = ? AND state = 'I' AND owner = ?"
            )
            .into(),
            release: format!(
                "DELETE FROM {table} WHERE key_hash = ? AND state = 'I' AND owner = ?"
            )
            .into(),
            renew: format!(
                "UPDATE {table} SET expires_at = {expires} \
                 WHERE key_hash = ? AND state = 'I' AND owner = ? AND expires_at > {now}"
            )
            .into(),
            // The rows a purge deletes (`purge` below), locked in the order
            // of the expiry index without waiting: a row another purge or a
            // claim holds is skipped.
            purge: format!(
                "SELECT key_hash FROM {table} WHERE expires_at < {now} \
                 ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
            )
            .into(),
            table: table.into(),
            mariadb: std::sync::OnceLock::new(),
        }
    }

    async fn migrate(pool: &sqlx::Pool<Self>, table: &str) -> Result<(), sqlx::Error> {
        // DDL commits implicitly in MySQL, so the lock is a named lock held by
        // one connection rather than a transaction.
        let mut conn = pool.acquire().await?;
        let lock = format!("idem-migrate:{table}");
        sqlx::query("SELECT GET_LOCK(?, 30)")
            .bind(&lock)
            .execute(&mut *conn)
            .await?;
        let result = run_migrations::<Self>(
            &mut conn,
            table,
            MIGRATIONS,
            format!(
                "CREATE TABLE IF NOT EXISTS {table}_schema ( \
                   version BIGINT NOT NULL PRIMARY KEY, \
                   applied_at {} NOT NULL DEFAULT CURRENT_TIMESTAMP(6)){}",
                Self::TIMESTAMP,
                Self::TABLE_OPTIONS,
            ),
            format!("SELECT {} FROM {table}_schema", Self::int("MAX(version)")),
        )
        .await;
        sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await?;
        result
    }

    const CLAIM_READS_FIRST: bool = false;
    const ONE_WRITER: bool = false;
    const OWN_BEGIN: Option<EndTx<Self>> = Some(end_transaction);

    async fn claim(
        conn: &mut MySqlConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
    ) -> Result<ClaimStep, sqlx::Error> {
        bind_all(sqlx::query(AssertSqlSafe(q.claim.clone())), &args.values())
            .execute(&mut *conn)
            .await?;
        let Some(row) = Self::read(conn, q, args.key_hash).await? else {
            return Ok(ClaimStep::Vanished);
        };
        owned(conn, q, &args, row).await
    }

    shared_statements!(MySqlConnection, own purge);

    fn purge_points(points: &str) -> String {
        // Few rows and rarely contended, unlike the records: the expiry
        // index bounds what the delete locks.
        format!(
            "DELETE FROM {points} WHERE expires_at < {} ORDER BY expires_at LIMIT ?",
            Self::NOW
        )
    }

    bound_point_statements!(MySqlConnection);

    async fn purge(
        conn: &mut MySqlConnection,
        q: &Queries,
        table: &str,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        // Not `DELETE ... WHERE expired LIMIT n`: that waits on every
        // expired row another transaction holds (two purges queue behind
        // each other, and behind an open transactional claim that took an
        // expired row over), holding the rows it deleted meanwhile. Here the
        // rows are locked first without waiting (SKIP LOCKED), then deleted
        // in the same short transaction, each by its own `key_hash = ...`,
        // all in one round trip: an `IN (...)` list of them is planned as a
        // scan of the whole table while the table is small (MariaDB 10.11,
        // ten rows), which locks every row, waits on those others hold, and
        // deadlocked with claims and with other purges
        // (`idem-sql/tests/stores/purge.rs`). READ COMMITTED locks the rows alone,
        // not the gaps of the expiry index, which under REPEATABLE READ keep
        // claims from inserting rows there until the purge commits.
        let mut tx = conn
            .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
            .await?;
        let expired: Vec<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(q.purge.clone()))
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
        if expired.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        // Hashes read back from the table, written as hex literals.
        let deletes: String = expired
            .iter()
            .map(|hash| {
                let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
                format!("DELETE FROM {table} WHERE key_hash = X'{hex}';")
            })
            .collect();
        let done = sqlx::raw_sql(AssertSqlSafe(deletes))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn tx_claim(
        conn: &mut MySqlConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
        lock_timeout: Duration,
    ) -> Result<ClaimStep, sqlx::Error> {
        // The claim's row written with no lock wait: a claim that meets
        // another transaction's uncommitted claim row fails at once with a
        // lock wait timeout, read as "in flight". MariaDB takes 0 as "do
        // not wait"; MySQL's least is 1 s, so there a duplicate waits up to
        // a second. Then the handler's lock wait (whole seconds, at least
        // 1), and the row read back: one round trip, of statements prepared
        // once per connection (`mysql/script.rs`). The lock wait is a
        // session variable: it stays on the pooled connection, so it is set
        // back on every path. On MariaDB the upsert's own no-wait is the
        // statement's alone (`SET STATEMENT`), the session's lock wait is
        // set to the handler's first, and the upsert answers the row. The
        // transaction is the claim's own (`OWN_BEGIN`): its BEGIN goes
        // first in the same round trip.
        let secs = lock_timeout.as_secs().max(1);
        let server = server(conn, q).await?;
        let script = match server {
            Server::MySql => script::claim(q, &args, secs),
            Server::MariaDb => script::claim_mariadb(q, &args, secs),
        };
        let rows = match run_prepared(conn, q, server, script, "", |sql, conn| {
            Box::pin(sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(conn))
        })
        .await
        {
            Ok(rows) => rows,
            // MariaDB's upsert waits for no lock by itself: the session's
            // lock wait is the handler's already.
            Err(err) if server == Server::MariaDb && Self::is_lock_timeout(&err) => {
                return locked(conn, q, args.key_hash).await;
            }
            Err(err) if server == Server::MariaDb => return Err(err),
            Err(err) => {
                // The script stopped at the upsert or before it, with the
                // lock wait still 0.
                sqlx::raw_sql(AssertSqlSafe(script::lock_wait(secs)))
                    .execute(&mut *conn)
                    .await?;
                return if Self::is_lock_timeout(&err) {
                    locked(conn, q, args.key_hash).await
                } else {
                    Err(err)
                };
            }
        };
        let Some(row) = rows.first() else {
            return Ok(ClaimStep::Vanished);
        };
        owned(conn, q, &args, record_row(row)?).await
    }

    fn lend_statement(_: &OwnerToken, lease: Duration) -> Option<String> {
        // Whole seconds, rounded up; at least 1 (0 is no bound, and a
        // lease shorter than a round trip must not end the transaction
        // before the handler's first statement: `postgres/mod.rs`).
        let idle_secs = (lease.as_secs() + u64::from(lease.subsec_nanos() > 0)).max(1);
        Some(script::lend(idle_secs))
    }

    async fn tx_commit(
        mut tx: ClaimTx<Self>,
        q: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> Result<Settled, sqlx::Error> {
        let record = script::Completed {
            key_hash: args.key_hash,
            owner: args.owner.as_bytes(),
            outcome,
            ttl_ms,
        };
        let server = server(&mut tx, q).await?;
        let script = match server {
            Server::MySql => script::commit(q, &record),
            Server::MariaDb => script::commit_mariadb(q, &record),
        };
        let again = script::remark();
        let committed = run_prepared(&mut tx, q, server, script, &again, |sql, conn| {
            Box::pin(sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn))
        })
        .await;
        match committed {
            // Committed: the transaction is over.
            Ok(_) => {
                tx.ended();
                Ok(Settled::Done)
            }
            // The row was not the claim's to complete: the check failed,
            // and the COMMIT after it did not run.
            Err(err) if error_number(&err) == Some(script::NOT_COMPLETED) => {
                tx.rollback().await?;
                Ok(Settled::Fenced)
            }
            // The claim's savepoint is gone with the transaction it was
            // set in: nothing after its release ran.
            Err(err) if no_savepoint(&err) => {
                tx.rollback().await?;
                Ok(Settled::Ended)
            }
            Err(err) => Err(err),
        }
    }

    async fn tx_rollback(tx: ClaimTx<Self>, _: ClaimArgs<'_>) -> Result<Settled, sqlx::Error> {
        let ended = tx
            .rollback_checked(script::rollback(), no_savepoint)
            .await?;
        Ok(Settled::ended_if(ended))
    }

    fn is_lock_timeout(err: &sqlx::Error) -> bool {
        // ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK (SQLSTATE HY000 / 40001)
        matches!(error_number(err), Some(1205 | 1213)) || has_code(err, &["40001"])
    }
}

/// What a transactional claim whose upsert met another transaction's lock
/// on its key's row answers: the row as last committed, read without a
/// lock ([`ClaimStep::held_elsewhere`]). The upsert locks the row even
/// where it changes nothing, so the lock may be a duplicate's of another
/// process (this process's duplicates wait for one claim of the key,
/// `open.rs`).
/// Ends the claim's own transaction with COMMIT or ROLLBACK (the
/// [`EndTx`] of `OWN_BEGIN`), and, if it was `lent`, sets the session
/// back to autocommit, which lending turned off (`script::lend`), and
/// sqlx's count of it back as after a script of ours ended it. A claim
/// that was never lent (a duplicate's) ends with its ROLLBACK alone.
fn end_transaction(
    conn: &mut MySqlConnection,
    commit: bool,
    lent: bool,
) -> BoxFuture<'_, Result<(), sqlx::Error>> {
    Box::pin(async move {
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        if !lent {
            return sqlx::raw_sql(end).execute(&mut *conn).await.map(drop);
        }
        let statement = format!("{end}; {}", script::AUTOCOMMIT);
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await?;
        uncount::<MySql>(conn);
        Ok(())
    })
}

async fn locked(
    conn: &mut MySqlConnection,
    q: &Queries,
    key_hash: &[u8; 32],
) -> Result<ClaimStep, sqlx::Error> {
    Ok(ClaimStep::held_elsewhere(
        MySql::read(conn, q, key_hash).await?,
    ))
}

/// Stamps the lease of a claim's own row again, from now, whether or not
/// it ran out: whether the row is still the claim's (in flight, its
/// owner's) is all that counts.
async fn restamp(
    conn: &mut MySqlConnection,
    q: &Queries,
    args: &ClaimArgs<'_>,
) -> Result<bool, sqlx::Error> {
    let restamp = format!(
        "UPDATE {} SET expires_at = {} WHERE key_hash = ? AND state = 'I' AND owner = ?",
        q.table,
        MySql::now_plus_ms("?"),
    );
    let done = sqlx::query(AssertSqlSafe(restamp))
        .bind(args.lease_ms)
        .bind(&args.key_hash[..])
        .bind(&args.owner.as_bytes()[..])
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Runs `script` (of `mysql/script.rs`, whose `EXECUTE`s name the
/// statements it prepares) on `conn` with `run`; on a connection that has
/// not prepared them (the script stopped at its first `EXECUTE`, with only
/// its BEGIN, `SET` or release of the claim's savepoint run), runs it again
/// after their `PREPARE`s, and after `again`, which sets back what the
/// first run's statements before the `EXECUTE` used up (a commit's
/// release of the savepoint, `script::remark`).
async fn run_prepared<T>(
    conn: &mut MySqlConnection,
    q: &Queries,
    server: Server,
    script: String,
    again: &str,
    run: impl for<'c> Fn(String, &'c mut MySqlConnection) -> BoxFuture<'c, Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    let prepare = match run(script.clone(), conn).await {
        Err(err) if error_number(&err) == Some(script::NOT_PREPARED) => {
            format!("{again}{}", script::prepare(q, server, &script))
        }
        done => return done,
    };
    run(prepare, conn).await
}

/// Whether `err` is the release of the claim's savepoint failing: the
/// transaction it was set in has ended (`script::lend`).
fn no_savepoint(err: &sqlx::Error) -> bool {
    error_number(err) == Some(script::NO_SAVEPOINT)
}

/// MySQL's error number of `err`, if it is a database error.
fn error_number(err: &sqlx::Error) -> Option<u32> {
    err.as_database_error()
        .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|e| u32::from(e.number()))
}
