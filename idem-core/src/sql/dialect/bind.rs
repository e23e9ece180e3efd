//! The values bound to the stores' and the guards' statements, and how they
//! are bound: the same Rust on every database.

/// A value bound to a statement.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: named only inside the crate
pub enum Value<'a> {
    Text(&'a str),
    Int(i64),
    Bytes(&'a [u8]),
}

/// Binds `args` to a query, in order.
pub(crate) fn bind_all<'q, DB>(
    mut query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    args: &[Value<'q>],
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    for arg in args {
        query = match *arg {
            Value::Text(s) => query.bind(s),
            Value::Int(i) => query.bind(i),
            Value::Bytes(b) => query.bind(b),
        };
    }
    query
}
