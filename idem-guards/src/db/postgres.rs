//! The guards on PostgreSQL.

use idem_sql::sqlx::postgres::PgConnection;
use idem_sql::sqlx::{self, AssertSqlSafe, Postgres};
use idem_sql::{Value, bind_all};

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

    guard_statements!(PgConnection);

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
            .bind(format!("idem-guards:{table}"))
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
        tx.commit().await
    }
}
