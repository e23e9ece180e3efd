//! Conditional updates of counters: take `n` only if `n` are there, and,
//! with a version column, only if nobody moved the row since it was read.

use std::fmt;

use super::sql::{Ident, Params, RowId, Value, config, db_error, update_one};
use crate::GuardDb;
use idem_core::{Error, ErrorKind};

/// How many times a decrement retries when the re-read finds the row able
/// to take it after all (it changed between the update and the re-read).
const ATTEMPTS: usize = 4;

/// What a [`Counter`] decrement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a decrement that did not apply must be answered"]
pub enum CounterUpdate {
    /// Taken: the counter went down by `n` in this call.
    Applied,
    /// The version column no longer holds the version the caller read:
    /// someone else moved the row. Safe to re-read and decide again.
    Conflict {
        /// The version now stored.
        current_version: i64,
    },
    /// Fewer than `n` left; nothing taken.
    Insufficient {
        /// What is left.
        available: i64,
    },
    /// No row has that id.
    NotFound,
}

/// A counter column (stock, seats, quota) decremented only while it stays
/// at or above zero, optionally under optimistic concurrency control.
///
/// A decrement is `UPDATE {table} SET {value} = {value} - :n WHERE {id} =
/// :id AND {value} >= :n`, plus `{version} = {version} + 1` and, for
/// [`Counter::decrement_if_version`], `AND {version} = :expected`. One row:
/// [`CounterUpdate::Applied`]. None: the row is re-read (locked, in your
/// transaction) to tell [`CounterUpdate::Conflict`] from
/// [`CounterUpdate::Insufficient`] and [`CounterUpdate::NotFound`], never
/// guessed. A hundred concurrent decrements of 1 on a stock of 50 give
/// exactly 50 `Applied` and a stock of 0, never below.
///
/// A decrement is a relative update: run it once per business event (behind
/// the idempotency layer, after a state-machine transition, or in an
/// [`Inbox`](super::Inbox)-guarded handler), never on a blind retry.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(pool: idem_sql::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_guards::{Counter, CounterUpdate};
///
/// let stock = Counter::new("inventory", "sku", "stock")?.versioned("version")?;
/// let mut tx = pool.begin().await?;
/// match stock.decrement(&mut *tx, "book", 2).await? {
///     CounterUpdate::Applied => { /* write the reservation in `tx` */ }
///     CounterUpdate::Insufficient { available } => return Err(format!("only {available} left").into()),
///     CounterUpdate::NotFound => return Err("no such sku".into()),
///     CounterUpdate::Conflict { .. } => unreachable!("decrement does not check the version"),
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Counter {
    table: Ident,
    id: Ident,
    value: Ident,
    version: Option<Ident>,
}

impl fmt::Debug for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counter")
            .field("table", &self.table)
            .field("id", &self.id)
            .field("value", &self.value)
            .field("version", &self.version)
            .finish()
    }
}

impl Counter {
    /// The integer column `value_column` of `table`, rows keyed by the
    /// unique `id_column`. Each name must be an [`Ident`], else an
    /// [`ErrorKind::Config`] error.
    pub fn new(table: &str, id_column: &str, value_column: &str) -> Result<Self, Error> {
        Ok(Self {
            table: Ident::new(table)?,
            id: Ident::new(id_column)?,
            value: Ident::new(value_column)?,
            version: None,
        })
    }

    /// Keeps an integer version column: every decrement bumps it, and
    /// [`Counter::decrement_if_version`] applies only at the version read.
    pub fn versioned(mut self, version_column: &str) -> Result<Self, Error> {
        self.version = Some(Ident::new(version_column)?);
        Ok(self)
    }

    /// Takes `n` (at least 1) from row `id` if at least `n` are left, on
    /// `conn` (your transaction, if it is in one). Never
    /// [`CounterUpdate::Conflict`].
    pub async fn decrement<C>(
        &self,
        conn: &mut C,
        id: impl Into<RowId<'_>>,
        n: i64,
    ) -> Result<CounterUpdate, Error>
    where
        C: sqlx::Connection<Database: GuardDb>,
    {
        self.run::<C::Database>(conn, id.into(), n, None).await
    }

    /// Takes `n` from row `id` if at least `n` are left *and* its version is
    /// still `expected_version`. On a counter without a version column this
    /// is an [`ErrorKind::Config`] error.
    pub async fn decrement_if_version<C>(
        &self,
        conn: &mut C,
        id: impl Into<RowId<'_>>,
        n: i64,
        expected_version: i64,
    ) -> Result<CounterUpdate, Error>
    where
        C: sqlx::Connection<Database: GuardDb>,
    {
        if self.version.is_none() {
            return Err(config(format!(
                "counter {}.{} has no version column",
                self.table, self.value
            )));
        }
        self.run::<C::Database>(conn, id.into(), n, Some(expected_version))
            .await
    }

    /// Reads row `id`: its value and, if the counter is versioned, its
    /// version; `None` if there is no such row.
    pub async fn read<C>(
        &self,
        conn: &mut C,
        id: impl Into<RowId<'_>>,
    ) -> Result<Option<(i64, Option<i64>)>, Error>
    where
        C: sqlx::Connection<Database: GuardDb>,
    {
        let select = self.select::<C::Database>("");
        let row = <C::Database as GuardDb>::fetch_ints(conn, select, &[id.into().value()])
            .await
            .map_err(db_error)?;
        row.map(|cols| self.columns(&cols)).transpose()
    }

    fn select<DB: GuardDb>(&self, lock: &str) -> String {
        let version = self
            .version
            .as_ref()
            .map(|v| format!(", {}", DB::int(v.as_str())))
            .unwrap_or_default();
        format!(
            "SELECT {}{version} FROM {} WHERE {} = {}{lock}",
            DB::int(self.value.as_str()),
            self.table,
            self.id,
            DB::placeholder(1)
        )
    }

    fn columns(&self, cols: &[Option<i64>]) -> Result<(i64, Option<i64>), Error> {
        let corrupt = || {
            Error::new(
                ErrorKind::Corrupt,
                format!("{}.{} is NULL", self.table, self.value),
            )
        };
        let value = cols.first().copied().flatten().ok_or_else(corrupt)?;
        Ok((value, cols.get(1).copied().flatten()))
    }

    async fn run<DB: GuardDb>(
        &self,
        conn: &mut DB::Connection,
        id: RowId<'_>,
        n: i64,
        expected: Option<i64>,
    ) -> Result<CounterUpdate, Error> {
        if n < 1 {
            return Err(config(format!("a decrement takes at least 1, not {n}")));
        }
        let (table, id_col, value) = (&self.table, &self.id, &self.value);
        let mut p = Params::<DB>::new();
        let mut update = format!("UPDATE {table} SET {value} = {value} - {}", p.next());
        let mut args = vec![Value::Int(n)];
        if let Some(version) = &self.version {
            update.push_str(&format!(", {version} = {version} + 1"));
        }
        update.push_str(&format!(
            " WHERE {id_col} = {} AND {value} >= {}",
            p.next(),
            p.next()
        ));
        args.extend([id.value(), Value::Int(n)]);
        if let (Some(version), Some(expected)) = (&self.version, expected) {
            update.push_str(&format!(" AND {version} = {}", p.next()));
            args.push(Value::Int(expected));
        }
        let reread = self.select::<DB>(DB::FOR_UPDATE);

        for _ in 0..ATTEMPTS {
            if update_one::<DB>(conn, &update, &args, (table, id_col), "a decrement").await? {
                return Ok(CounterUpdate::Applied);
            }
            let Some(cols) = DB::fetch_ints(conn, reread.clone(), &[id.value()])
                .await
                .map_err(db_error)?
            else {
                return Ok(CounterUpdate::NotFound);
            };
            let (available, version) = self.columns(&cols)?;
            if let (Some(expected), Some(current)) = (expected, version)
                && current != expected
            {
                return Ok(CounterUpdate::Conflict {
                    current_version: current,
                });
            }
            if available < n {
                return Ok(CounterUpdate::Insufficient { available });
            }
            // Enough after all: it changed between the statements. Again.
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("{table} row kept changing under the decrement"),
        ))
    }
}
