//! The guards on SQLite.

use idem_sql::__guards::{Value, bind_all};
use idem_sql::sqlx::sqlite::SqliteConnection;
use idem_sql::sqlx::{self, AssertSqlSafe, Sqlite};

use super::{EventRow, GuardDb, event_row, guard_statements, int_columns, sealed};

impl sealed::Sealed for Sqlite {}

impl GuardDb for Sqlite {
    const BLOB: &'static str = "BLOB";
    const LONG_TEXT: &'static str = "TEXT";
    const SERIAL_KEY: &'static str = "INTEGER PRIMARY KEY AUTOINCREMENT";
    const NEXT_TRANSACTION_READ_COMMITTED: Option<&'static str> = None;
    const SKIP_LOCKED: Option<&'static str> = None;

    fn short_text(column: &str) -> String {
        column.to_owned()
    }

    guard_statements!(SqliteConnection, bound);

    async fn delete_returning(_: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
        // Since SQLite 3.35; the `sqlite` feature links sqlx's bundled
        // SQLite, which is later.
        Ok(true)
    }

    async fn create_table(
        pool: &sqlx::Pool<Self>,
        _table: &str,
        ddl: String,
    ) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
        tx.commit().await
    }
}

/// `sql` with `args` bound to its parameters.
fn bound<'q>(
    sql: String,
    args: &[Value<'q>],
) -> Result<sqlx::query::Query<'q, Sqlite, <Sqlite as sqlx::Database>::Arguments>, sqlx::Error> {
    Ok(bind_all(sqlx::query(AssertSqlSafe(sql)), args))
}
