//! MySQL and MariaDB: `INSERT ... ON DUPLICATE KEY UPDATE` takes over an
//! expired row in the same statement; since the affected-row count cannot
//! tell an insert from a no-op (sqlx sets `CLIENT_FOUND_ROWS`), the claim
//! reads the row back and owns it if the owner token is its own. The clock
//! is `UTC_TIMESTAMP(6)`, independent of the session time zone.

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, MySql};

use super::dialect::{
    ClaimArgs, ClaimStep, Dialect, Queries, RecordRow, bind_claim, has_code, record_row, render,
    sealed, shared_statements,
};
use crate::OwnerToken;

const MIGRATIONS: &[(i64, &str)] = &[(
    1,
    include_str!("../../migrations/mysql/0001_create_records.sql"),
)];

impl sealed::Sealed for MySql {}

/// `IF(the row expired, new, old)` for one column. `expires_at` must be
/// assigned last: MySQL evaluates assignments left to right, and later ones
/// would see the new expiry.
fn take_over(column: &str, new: &str) -> String {
    format!("{column} = IF(expires_at <= UTC_TIMESTAMP(6), {new}, {column})")
}

impl Dialect for MySql {
    fn queries(table: &str) -> Queries {
        let updates = [
            take_over("idem_key", "VALUES(idem_key)"),
            take_over("state", "'I'"),
            take_over("owner", "VALUES(owner)"),
            take_over("fingerprint", "VALUES(fingerprint)"),
            take_over("outcome", "NULL"),
            take_over("created_at", "UTC_TIMESTAMP(6)"),
            take_over("expires_at", "VALUES(expires_at)"),
        ]
        .join(", ");
        Queries {
            claim: render(
                &format!(
                    "INSERT INTO {{table}} \
                       (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at, created_at) \
                     VALUES (?, ?, 'I', ?, ?, NULL, \
                       UTC_TIMESTAMP(6) + INTERVAL (? * 1000) MICROSECOND, UTC_TIMESTAMP(6)) \
                     ON DUPLICATE KEY UPDATE {updates}"
                ),
                table,
            ),
            select: render(
                "SELECT state, owner, fingerprint, outcome, \
                   CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000 AS SIGNED) \
                 FROM {table} WHERE key_hash = ?",
                table,
            ),
            complete: render(
                "UPDATE {table} SET state = 'C', owner = NULL, outcome = ?, \
                   expires_at = UTC_TIMESTAMP(6) + INTERVAL (? * 1000) MICROSECOND \
                 WHERE key_hash = ? AND state = 'I' AND owner = ?",
                table,
            ),
            release: render(
                "DELETE FROM {table} WHERE key_hash = ? AND state = 'I' AND owner = ?",
                table,
            ),
            renew: render(
                "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL (? * 1000) MICROSECOND \
                 WHERE key_hash = ? AND state = 'I' AND owner = ? \
                   AND expires_at > UTC_TIMESTAMP(6)",
                table,
            ),
            purge: render(
                "DELETE FROM {table} WHERE expires_at < UTC_TIMESTAMP(6) LIMIT ?",
                table,
            ),
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
        let result = async {
            sqlx::raw_sql(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {table}_schema ( \
                   version BIGINT NOT NULL PRIMARY KEY, \
                   applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB"
            )))
            .execute(&mut *conn)
            .await?;
            let applied: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT CAST(MAX(version) AS SIGNED) FROM {table}_schema"
            )))
            .fetch_one(&mut *conn)
            .await?;
            for (version, sql) in MIGRATIONS {
                if applied.is_some_and(|a| a >= *version) {
                    continue;
                }
                sqlx::raw_sql(AssertSqlSafe(sql.replace("{table}", table)))
                    .execute(&mut *conn)
                    .await?;
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT IGNORE INTO {table}_schema (version) VALUES (?)"
                )))
                .bind(version)
                .execute(&mut *conn)
                .await?;
            }
            Ok(())
        }
        .await;
        sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await?;
        result
    }

    const CLAIM_READS_FIRST: bool = false;

    async fn claim(
        conn: &mut MySqlConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
    ) -> Result<ClaimStep, sqlx::Error> {
        bind_claim(sqlx::query(AssertSqlSafe(q.claim.clone())), &args)
            .execute(&mut *conn)
            .await?;
        let Some(row) = Self::read(conn, q, args.key_hash).await? else {
            return Ok(ClaimStep::Vanished);
        };
        let ours = row.state == "I" && row.owner.as_deref() == Some(&args.owner.as_bytes()[..]);
        Ok(if ours {
            ClaimStep::Acquired
        } else {
            ClaimStep::Existing(row)
        })
    }

    shared_statements!(MySqlConnection);

    async fn begin_claim(
        conn: &mut MySqlConnection,
        _: &[u8; 32],
        _: Duration,
    ) -> Result<bool, sqlx::Error> {
        // No lock wait for the claim statement: a claim that meets another
        // transaction's uncommitted claim row fails at once with a lock wait
        // timeout, read as "in flight". MariaDB takes 0 as "do not wait";
        // MySQL's least is 1 s, so there a duplicate waits up to a second.
        sqlx::query("SET SESSION innodb_lock_wait_timeout = 0")
            .execute(&mut *conn)
            .await
            .map(|_| true)
    }

    async fn end_claim(conn: &mut MySqlConnection, timeout: Duration) -> Result<(), sqlx::Error> {
        // Whole seconds, at least 1. It is a session variable: it stays on
        // the pooled connection, so it is set back on every path.
        sqlx::query("SET SESSION innodb_lock_wait_timeout = ?")
            .bind(timeout.as_secs().max(1))
            .execute(&mut *conn)
            .await
            .map(drop)
    }

    fn is_lock_timeout(err: &sqlx::Error) -> bool {
        // ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK (SQLSTATE HY000 / 40001)
        err.as_database_error()
            .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
            .is_some_and(|e| matches!(e.number(), 1205 | 1213))
            || has_code(err, &["40001"])
    }

    fn handle(slot: super::TxSlot<Self>) -> crate::store::TxHandle {
        crate::store::TxHandle::MySql(slot)
    }
}
