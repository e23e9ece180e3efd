//! How a guard's statement is run and read back, the same Rust on every
//! database: written once here, expanded in each database's `GuardDb` impl.

use idem_sql::sqlx;

/// The statements the SQL guards run, written once and expanded in each
/// database's `impl GuardDb` with its concrete connection type (no
/// higher-ranked bounds over `sqlx::Executor`) and the function that makes
/// a runnable statement of SQL text and its values: bound parameters, or
/// on PostgreSQL values written into a simple query (`db/postgres.rs`).
macro_rules! guard_statements {
    ($conn:ty, $statement:path) => {
        async fn execute(
            conn: &mut $conn,
            sql: String,
            args: &[Value<'_>],
        ) -> Result<u64, sqlx::Error> {
            let query = $statement(sql, args)?;
            Ok(query.execute(&mut *conn).await?.rows_affected())
        }

        async fn fetch_text(
            conn: &mut $conn,
            sql: String,
            args: &[Value<'_>],
        ) -> Result<Option<Option<String>>, sqlx::Error> {
            let query = $statement(sql, args)?;
            match query.fetch_optional(&mut *conn).await? {
                Some(row) => sqlx::Row::try_get(&row, 0).map(Some),
                None => Ok(None),
            }
        }

        async fn fetch_events(
            conn: &mut $conn,
            sql: String,
            args: &[Value<'_>],
        ) -> Result<Vec<EventRow>, sqlx::Error> {
            let query = $statement(sql, args)?;
            query
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(event_row)
                .collect()
        }

        async fn fetch_ints(
            conn: &mut $conn,
            sql: String,
            args: &[Value<'_>],
        ) -> Result<Option<Vec<Option<i64>>>, sqlx::Error> {
            let query = $statement(sql, args)?;
            match query.fetch_optional(&mut *conn).await? {
                Some(row) => int_columns(&row).map(Some),
                None => Ok(None),
            }
        }

        async fn read_then_delete(
            conn: &mut $conn,
            select: String,
            delete: String,
            args: &[Value<'_>],
        ) -> Result<Option<Vec<Option<i64>>>, sqlx::Error> {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            let read = $statement(select, args)?.fetch_optional(&mut *tx).await?;
            let Some(row) = read else {
                tx.rollback().await?;
                return Ok(None);
            };
            let ints = int_columns(&row)?;
            let deleted = $statement(delete, args)?
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok((deleted == 1).then_some(ints))
        }
    };
}
pub(crate) use guard_statements;

/// Every column of `row` as a nullable `i64`.
pub(crate) fn int_columns<R>(row: &R) -> Result<Vec<Option<i64>>, sqlx::Error>
where
    R: sqlx::Row,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    usize: sqlx::ColumnIndex<R>,
{
    (0..row.len()).map(|i| row.try_get(i)).collect()
}

/// An outbox row as the relay reads it: `seq, event_id, topic, event_key,
/// payload, headers, attempts`.
#[doc(hidden)]
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: in GuardDb's signatures, named only inside the crate
pub struct EventRow {
    pub seq: i64,
    pub id: String,
    pub topic: String,
    pub key: String,
    pub payload: Vec<u8>,
    pub headers: String,
    pub attempts: i64,
}

/// Reads `row` as an [`EventRow`], its columns in that order.
pub(crate) fn event_row<R>(row: &R) -> Result<EventRow, sqlx::Error>
where
    R: sqlx::Row,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    usize: sqlx::ColumnIndex<R>,
{
    Ok(EventRow {
        seq: row.try_get(0)?,
        id: row.try_get(1)?,
        topic: row.try_get(2)?,
        key: row.try_get(3)?,
        payload: row.try_get(4)?,
        headers: row.try_get(5)?,
        attempts: row.try_get(6)?,
    })
}
