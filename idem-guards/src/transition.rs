//! State-machine transitions: one conditional `UPDATE`, and a re-read to
//! tell a duplicate from an illegal move.

use std::fmt;
use std::marker::PhantomData;

use super::sql::{Ident, Params, RowId, Value, config, db_error, update_one};
use crate::GuardDb;
use idem_core::{Error, ErrorKind};

/// How many times a transition retries when the row moved back into a
/// source state between its update and its re-read.
const ATTEMPTS: usize = 4;

/// A state of an entity's lifecycle, stored as text in its state column.
///
/// ```
/// use idem_guards::LifecycleState;
///
/// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// enum Shipment { Packed, Shipped, Delivered }
///
/// impl LifecycleState for Shipment {
///     const ALL: &'static [Self] = &[Self::Packed, Self::Shipped, Self::Delivered];
///
///     fn as_str(&self) -> &'static str {
///         match self {
///             Self::Packed => "PACKED",
///             Self::Shipped => "SHIPPED",
///             Self::Delivered => "DELIVERED",
///         }
///     }
/// }
///
/// assert_eq!(Shipment::from_stored("SHIPPED"), Some(Shipment::Shipped));
/// assert_eq!(Shipment::from_stored("LOST"), None);
/// ```
pub trait LifecycleState: Copy + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// Every state.
    const ALL: &'static [Self];

    /// The text the state column holds for this state.
    fn as_str(&self) -> &'static str;

    /// The state the column's `text` stands for; `None` if it is none of
    /// them (reported as [`ErrorKind::Corrupt`]). By default, the state of
    /// [`ALL`](LifecycleState::ALL) whose [`as_str`](LifecycleState::as_str)
    /// is `text`.
    fn from_stored(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| s.as_str() == text)
    }
}

/// What a [`StateMachine::transition`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a transition that did not apply must be answered"]
pub enum Transition<S> {
    /// This call moved the row: do the step's one-time work (book the
    /// credit, send the mail) in the same transaction.
    Applied,
    /// The row was already in the target state: a duplicate. Answer it as
    /// a success and do nothing again.
    AlreadyInTarget,
    /// The row is in a state the step may not leave (`current`): answer it
    /// as a conflict, do nothing.
    Illegal {
        /// Where the row is.
        current: S,
    },
    /// No row has that id.
    NotFound,
}

impl<S> Transition<S> {
    /// Whether the row is now in the target state: [`Transition::Applied`]
    /// or [`Transition::AlreadyInTarget`].
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Applied | Self::AlreadyInTarget)
    }
}

/// Moves rows of one table between the states of a lifecycle, each move a
/// compare-and-set on the state column.
///
/// A transition is `UPDATE {table} SET {state} = :to WHERE {id} = :id AND
/// {state} IN (:from...)`. One row updated: [`Transition::Applied`]. None:
/// the row is re-read (locked, in your transaction) and the answer is
/// [`Transition::AlreadyInTarget`] (a duplicate, an idempotent success),
/// [`Transition::Illegal`] or [`Transition::NotFound`]. There is no window
/// between a check and a write: the check *is* the write's `WHERE`, so of
/// fifteen concurrent callbacks exactly one gets `Applied`.
///
/// The state column must be a text column (`TEXT`, `VARCHAR`, `CHAR`) and
/// the id column unique.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn run(pool: idem_sql::sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_guards::{LifecycleState, StateMachine, Transition};
///
/// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// enum Pay { WaitPay, Paid, Refunded }
/// impl LifecycleState for Pay {
///     const ALL: &'static [Self] = &[Pay::WaitPay, Pay::Paid, Pay::Refunded];
///     fn as_str(&self) -> &'static str {
///         match self { Pay::WaitPay => "WAIT_PAY", Pay::Paid => "PAID", Pay::Refunded => "REFUNDED" }
///     }
/// }
///
/// let payments = StateMachine::<Pay>::new("payments", "payment_no", "state")?;
/// let mut tx = pool.begin().await?;
/// let refund = payments.transition(&mut *tx, "P-1", &[Pay::Paid], Pay::Refunded).await?;
/// if refund == Transition::Applied {
///     // book the reversal here, in `tx`
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct StateMachine<S> {
    table: Ident,
    id: Ident,
    state: Ident,
    states: PhantomData<fn() -> S>,
}

impl<S> Clone for StateMachine<S> {
    fn clone(&self) -> Self {
        Self {
            table: self.table.clone(),
            id: self.id.clone(),
            state: self.state.clone(),
            states: PhantomData,
        }
    }
}

impl<S> fmt::Debug for StateMachine<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateMachine")
            .field("table", &self.table)
            .field("id", &self.id)
            .field("state", &self.state)
            .finish()
    }
}

impl<S: LifecycleState> StateMachine<S> {
    /// The lifecycle kept in `table`'s `state_column`, rows keyed by
    /// `id_column`. Each name must be an [`Ident`], else an
    /// [`ErrorKind::Config`] error.
    pub fn new(table: &str, id_column: &str, state_column: &str) -> Result<Self, Error> {
        Ok(Self {
            table: Ident::new(table)?,
            id: Ident::new(id_column)?,
            state: Ident::new(state_column)?,
            states: PhantomData,
        })
    }

    /// Moves row `id` from any of `from` to `to`, on `conn` (your
    /// transaction, if it is in one).
    ///
    /// `from` must be non-empty and must not contain `to` (that move could
    /// not be told from a duplicate): either is an [`ErrorKind::Config`]
    /// error. A stored state [`LifecycleState::from_stored`] does not know is
    /// [`ErrorKind::Corrupt`]; a database error is
    /// [`ErrorKind::Unavailable`].
    pub async fn transition<C>(
        &self,
        conn: &mut C,
        id: impl Into<RowId<'_>>,
        from: &[S],
        to: S,
    ) -> Result<Transition<S>, Error>
    where
        C: sqlx::Connection<Database: GuardDb>,
    {
        if from.is_empty() {
            return Err(config("a transition needs at least one source state"));
        }
        if from.contains(&to) {
            return Err(config(format!(
                "{to:?} is both a source and the target of the transition"
            )));
        }
        self.run::<C::Database>(conn, id.into(), from, to).await
    }

    async fn run<DB: GuardDb>(
        &self,
        conn: &mut DB::Connection,
        id: RowId<'_>,
        from: &[S],
        to: S,
    ) -> Result<Transition<S>, Error> {
        let (table, id_col, state) = (&self.table, &self.id, &self.state);
        let mut p = Params::<DB>::new();
        let update = format!(
            "UPDATE {table} SET {state} = {} WHERE {id_col} = {} AND {state} IN ({})",
            p.next(),
            p.next(),
            p.list(from.len())
        );
        let mut args = vec![Value::Text(to.as_str()), id.value()];
        args.extend(from.iter().map(|s| Value::Text(s.as_str())));
        let reread = format!(
            "SELECT {state} FROM {table} WHERE {id_col} = {}{}",
            DB::placeholder(1),
            DB::FOR_UPDATE,
        );

        for _ in 0..ATTEMPTS {
            if update_one::<DB>(conn, &update, &args, (table, id_col), "a transition").await? {
                return Ok(Transition::Applied);
            }
            let Some(text) = DB::fetch_text(conn, reread.clone(), &[id.value()])
                .await
                .map_err(db_error)?
            else {
                return Ok(Transition::NotFound);
            };
            // A row whose state is NULL is there: not "not found".
            let Some(text) = text else {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{table}.{state} is NULL, which is no known state"),
                ));
            };
            let current = S::from_stored(&text).ok_or_else(|| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("{table}.{state} holds {text:?}, which is no known state"),
                )
            })?;
            if current == to {
                return Ok(Transition::AlreadyInTarget);
            }
            if !from.contains(&current) {
                return Ok(Transition::Illegal { current });
            }
            // Moved back into a source state since the update: try again.
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("{table} row kept changing state under the transition"),
        ))
    }
}
