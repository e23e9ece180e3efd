//! The guards on MySQL and MariaDB.

use idem_sql::__guards::{Value, bind_all};
use idem_sql::sqlx::mysql::MySqlConnection;
use idem_sql::sqlx::{self, AssertSqlSafe, MySql};

use super::{EventRow, GuardDb, event_row, guard_statements, int_columns, sealed};

impl sealed::Sealed for MySql {}

impl GuardDb for MySql {
    const BLOB: &'static str = "LONGBLOB";
    // Up to 4 GiB, past what a statement can carry (`max_allowed_packet`,
    // at most 1 GiB: a longer one fails, it is not cut short); UTF-8 whatever
    // the database's default character set, which could turn characters
    // into '?' with a warning alone under `INSERT IGNORE`.
    const LONG_TEXT: &'static str = "LONGTEXT CHARACTER SET utf8mb4";
    const SERIAL_KEY: &'static str = "BIGINT AUTO_INCREMENT PRIMARY KEY";
    const NEXT_TRANSACTION_READ_COMMITTED: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED");
    const SKIP_LOCKED: Option<&'static str> = Some(" FOR UPDATE SKIP LOCKED");

    // `SHORT_TEXT` is `VARBINARY`, which sqlx reads as bytes alone.
    fn short_text(column: &str) -> String {
        format!("CONVERT({column} USING utf8mb4)")
    }

    guard_statements!(MySqlConnection, bound);

    async fn delete_returning(conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut *conn)
            .await?;
        Ok(mariadb_has_delete_returning(&version))
    }

    async fn create_table(
        pool: &sqlx::Pool<Self>,
        _table: &str,
        ddl: String,
    ) -> Result<(), sqlx::Error> {
        // DDL commits by itself; CREATE TABLE IF NOT EXISTS is safe to race.
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(pool)
            .await
            .map(drop)
    }
}

/// Whether a MySQL-protocol server takes `DELETE ... RETURNING`: MariaDB
/// 10.5 and later (it appeared in 10.0.5, but no release line before 10.5 is
/// still supported, so the floor costs nothing); MySQL has none.
fn mariadb_has_delete_returning(version: &str) -> bool {
    if !version.to_ascii_lowercase().contains("mariadb") {
        return false;
    }
    let mut parts = version.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (10, 5),
        _ => false,
    }
}

/// `sql` with `args` bound to its parameters.
fn bound<'q>(
    sql: String,
    args: &[Value<'q>],
) -> Result<sqlx::query::Query<'q, MySql, <MySql as sqlx::Database>::Arguments>, sqlx::Error> {
    Ok(bind_all(sqlx::query(AssertSqlSafe(sql)), args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_returning_by_server_version() {
        assert!(mariadb_has_delete_returning("10.11.19-MariaDB-0+deb12u1"));
        assert!(mariadb_has_delete_returning("11.4.2-MariaDB"));
        assert!(!mariadb_has_delete_returning("10.4.30-MariaDB"));
        assert!(!mariadb_has_delete_returning("8.0.36"));
    }
}
