//! The values bound to the stores' and the guards' statements, and how they
//! are bound: the same Rust on every database.

/// A value bound to a statement, of the three types every [`Dialect`]'s
/// statements take: what the stores bind, and what idem-guards' statements
/// bind through [`bind_all`].
///
/// [`Dialect`]: crate::Dialect
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// Text.
    Text(&'a str),
    /// A 64-bit integer.
    Int(i64),
    /// Bytes.
    Bytes(&'a [u8]),
}

/// Binds `args` to a query, in order.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem_sql::__guards::{Value, bind_all};
/// use idem_sql::sqlx;
///
/// let query = bind_all(
///     sqlx::query::<sqlx::Sqlite>("SELECT ?1, ?2"),
///     &[Value::Text("acme"), Value::Int(7)],
/// );
/// # let _ = query; }
/// ```
pub fn bind_all<'q, DB>(
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
