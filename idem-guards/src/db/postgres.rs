//! The guards on PostgreSQL.

use idem_sql::__guards::{Value, inline};
use idem_sql::sqlx::postgres::PgConnection;
use idem_sql::sqlx::{self, AssertSqlSafe, Postgres};

use super::{EventRow, GuardDb, event_row, guard_statements, int_columns, sealed};

impl sealed::Sealed for Postgres {}

impl GuardDb for Postgres {
    const BLOB: &'static str = "BYTEA";
    const LONG_TEXT: &'static str = "TEXT";
    const SERIAL_KEY: &'static str = "BIGSERIAL PRIMARY KEY";
    const NEXT_TRANSACTION_READ_COMMITTED: Option<&'static str> = None;
    const SKIP_LOCKED: Option<&'static str> = Some(" FOR UPDATE SKIP LOCKED");

    fn short_text(column: &str) -> String {
        column.to_owned()
    }

    guard_statements!(PgConnection, simple);

    async fn delete_returning(_: &mut PgConnection) -> Result<bool, sqlx::Error> {
        Ok(true)
    }

    async fn create_table(
        pool: &sqlx::Pool<Self>,
        table: &str,
        ddl: String,
    ) -> Result<(), sqlx::Error> {
        // Concurrent CREATE TABLE IF NOT EXISTS can collide in pg_type: one
        // process at a time, by an advisory lock held until commit.
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .persistent(false)
            .bind(format!("idem-guards:{table}"))
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
        tx.commit().await
    }
}

/// `sql` with `args` written into its text, as one simple query: the
/// guards' statements run in the caller's transaction or on their own, and
/// through a pooler in transaction pooling sqlx's prepared statements,
/// named or not, are safe in neither case (idem-sql's ARCHITECTURE.md
/// section "Behind a pooler").
fn simple(sql: String, args: &[Value<'_>]) -> Result<sqlx::RawSql, sqlx::Error> {
    Ok(sqlx::raw_sql(AssertSqlSafe(inline(&sql, args)?)))
}
