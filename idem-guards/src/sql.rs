//! What the SQL guards share: identifiers and row ids, the values bound to
//! their statements, placeholders numbered in order, one-row updates and
//! errors. What differs per database is the [`GuardDb`](crate::GuardDb)'s.

use std::fmt;
use std::marker::PhantomData;

use crate::GuardDb;
use idem_core::{Error, ErrorKind};
pub(crate) use idem_sql::__guards::Value;

/// A validated SQL identifier: a table or column name made of ASCII letters,
/// digits and underscores, not starting with a digit, at most 48 bytes.
///
/// Identifiers are spliced into statements unquoted, so use the names as the
/// database folds them (lower case on PostgreSQL) and avoid reserved words.
///
/// ```
/// use idem_guards::Ident;
///
/// assert_eq!(Ident::new("orders_payments")?.as_str(), "orders_payments");
/// assert!(Ident::new("payments; DROP TABLE x").is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ident(String);

impl Ident {
    /// `name` if it is an identifier, else an [`ErrorKind::Config`] error.
    pub fn new(name: &str) -> Result<Self, Error> {
        idem_sql::__guards::validate_identifier(name)?;
        Ok(Self(name.to_owned()))
    }

    /// A name known at compile time to be an identifier.
    pub(crate) fn known(name: &'static str) -> Self {
        debug_assert!(
            idem_sql::__guards::validate_identifier(name).is_ok(),
            "{name}"
        );
        Self(name.to_owned())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key of the row a guard works on: text or an integer, always bound as
/// a parameter.
///
/// ```
/// use idem_guards::RowId;
///
/// assert_eq!(RowId::from("P-1"), RowId::Text("P-1"));
/// assert_eq!(RowId::from(42_i64), RowId::Int(42));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowId<'a> {
    /// A text key (`TEXT`, `VARCHAR`).
    Text(&'a str),
    /// An integer key (`INTEGER`, `BIGINT`).
    Int(i64),
}

impl<'a> From<&'a str> for RowId<'a> {
    fn from(id: &'a str) -> Self {
        Self::Text(id)
    }
}

impl<'a> From<&'a String> for RowId<'a> {
    fn from(id: &'a String) -> Self {
        Self::Text(id)
    }
}

impl From<i64> for RowId<'_> {
    fn from(id: i64) -> Self {
        Self::Int(id)
    }
}

impl From<i32> for RowId<'_> {
    fn from(id: i32) -> Self {
        Self::Int(id.into())
    }
}

impl<'a> RowId<'a> {
    pub(crate) fn value(self) -> Value<'a> {
        match self {
            Self::Text(s) => Value::Text(s),
            Self::Int(i) => Value::Int(i),
        }
    }
}

/// Hands out a statement's parameter placeholders in order.
pub(crate) struct Params<DB> {
    next: usize,
    db: PhantomData<fn() -> DB>,
}

impl<DB: GuardDb> Params<DB> {
    /// Placeholders from the first.
    pub(crate) fn new() -> Self {
        Self {
            next: 0,
            db: PhantomData,
        }
    }

    /// The next placeholder.
    pub(crate) fn next(&mut self) -> String {
        self.next += 1;
        DB::placeholder(self.next)
    }

    /// `n` placeholders, comma-separated.
    pub(crate) fn list(&mut self, n: usize) -> String {
        (0..n).map(|_| self.next()).collect::<Vec<_>>().join(", ")
    }
}

/// The longest value a guard keeps in a short text column
/// ([`GuardDb::SHORT_TEXT`]): a token's subject, the inbox's consumer
/// name, message id and business id.
const MAX_SHORT_TEXT: usize = 255;

/// `value` fits a short text column: 1 to [`MAX_SHORT_TEXT`] bytes; else an
/// [`ErrorKind::Config`] error saying that `what` does not.
pub(crate) fn check_short_text(what: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() || value.len() > MAX_SHORT_TEXT {
        return Err(config(format!(
            "{what} must be 1 to {MAX_SHORT_TEXT} bytes, not {}",
            value.len()
        )));
    }
    Ok(())
}

/// Whether `err` is a deadlock or serialization failure: the database rolled
/// the transaction back, and running it again from the start is safe.
pub(crate) fn is_retryable(err: &Error) -> bool {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .and_then(|err| err.as_database_error())
        .and_then(|err| err.code())
        .is_some_and(|code| matches!(code.as_ref(), "40001" | "40P01"))
}

/// Runs `update`, a conditional UPDATE of the one row whose `id_col` is the
/// id it binds: `true` if it moved that row, `false` if the condition kept
/// it (or there is none); a [`ErrorKind::Config`] error if it moved several,
/// as `{table}.{id_col}` is then not unique. `what` names the change.
pub(crate) async fn update_one<DB: GuardDb>(
    conn: &mut DB::Connection,
    update: &str,
    args: &[Value<'_>],
    (table, id_col): (&Ident, &Ident),
    what: &str,
) -> Result<bool, Error> {
    match DB::execute(conn, update.to_owned(), args)
        .await
        .map_err(db_error)?
    {
        0 => Ok(false),
        1 => Ok(true),
        rows => Err(config(format!(
            "{table}.{id_col} is not unique: {what} moved {rows} rows"
        ))),
    }
}

/// Creates a guard's `table` with `columns` if it is missing, one process
/// at a time ([`GuardDb::create_table`]).
pub(crate) async fn create_table<DB: GuardDb>(
    pool: &sqlx::Pool<DB>,
    table: &Ident,
    columns: &str,
) -> Result<(), Error> {
    let ddl = format!(
        "CREATE TABLE IF NOT EXISTS {table} ({columns}){}",
        DB::TABLE_OPTIONS
    );
    DB::create_table(pool, table.as_str(), ddl)
        .await
        .map_err(db_error)
}

/// A database error, kept whole as the source.
pub(crate) fn db_error(err: sqlx::Error) -> Error {
    Error::unavailable(err)
}

/// An [`ErrorKind::Config`] error saying `what`.
pub(crate) fn config(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, what.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        assert!(Ident::new("orders_payments").is_ok());
        for bad in ["", "1a", "a-b", "a;b", "a b", "é"] {
            assert_eq!(Ident::new(bad).unwrap_err().kind(), ErrorKind::Config);
        }
    }

    #[test]
    #[cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn placeholders_per_database() {
        let mut p = Params::<sqlx::Postgres>::new();
        assert_eq!((p.next(), p.list(2)), ("$1".into(), "$2, $3".into()));
        let mut p = Params::<sqlx::Sqlite>::new();
        assert_eq!((p.next(), p.list(2)), ("?1".into(), "?2, ?3".into()));
        let mut p = Params::<sqlx::MySql>::new();
        assert_eq!((p.next(), p.list(2)), ("?".into(), "?, ?".into()));
    }
}
