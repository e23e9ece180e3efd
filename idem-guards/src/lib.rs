//! Business-side guards: what keeps an effect single when the idempotency
//! record cannot see the duplicate, or when there is no HTTP request at all.
//!
//! The idempotency layer answers "has this *request* been handled?". The
//! guards answer questions about the *data*, and they hold even after the
//! record has expired, when a duplicate comes through another door (a queue,
//! a second endpoint, an operator's script), or when the work is not a
//! request:
//!
//! | guard | question it answers | use it for |
//! |---|---|---|
//! | [`StateMachine`] (SQL) | "is the row still in a state this step may leave?" | entities with a lifecycle: payments `WAIT_PAY -> PAID -> REFUNDED`, orders, shipments |
//! | [`Counter`] (SQL) | "is there still enough, and has nobody else moved it?" | stock, seats, quotas: `stock >= n`, optionally a version |
//! | [`SqlTokens`] / [`RedisTokens`] | "has this form been submitted already?" | one-time tokens handed out with a form, consumed atomically on submit |
//! | [`Inbox`] (SQL) | "has this message (or this business event) been processed?" | idempotent consumers of at-least-once queues |
//! | [`RedisLock`] | "is someone else doing this *right now*?" | rare work that must be serialised; **not** a dedup |
//! | [`Outbox`] + [`Relay`] (SQL) | "will this event leave if and only if my writes commit?" | events a service publishes after writing: enqueued in the writes' transaction, relayed at least once |
//!
//! Each guard is one atomic statement (or one Lua script), never a
//! check-then-write: the check is the write's own `WHERE`, unique index or
//! compare-and-delete, and "nothing happened" is told apart by re-reading, not
//! guessed. A duplicate is answered as a success ([`Transition::AlreadyInTarget`],
//! [`Delivery::Duplicate`]), so upstream stops retrying.
//!
//! The SQL guards come with a database feature (`postgres`, `mysql`,
//! `sqlite`), the Redis ones with `redis`; idem-tower's `guards` feature
//! brings this crate as `idem_tower::guards`. They run on the same
//! databases as idem-sql's stores (bounds name them as [`GuardDb`]) and on
//! the same Redis connections as idem-redis's `RedisStore`, and use nothing
//! of either but their public API.
//!
//! # In your transaction
//!
//! The SQL guards take `&mut DB::Connection`, so they run in whatever
//! transaction you give them: a `sqlx::Transaction`, or the `Tx` extractor
//! of `idem-tower`'s transactional mode (it dereferences to the connection).
//! The guard's statement and your other writes then commit together, or not
//! at all:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(pool: idem_sql::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_guards::{LifecycleState, StateMachine, Transition};
//! use idem_sql::sqlx;
//!
//! #[derive(Debug, Clone, Copy, PartialEq, Eq)]
//! enum Pay { WaitPay, Paid }
//!
//! impl LifecycleState for Pay {
//!     const ALL: &'static [Self] = &[Pay::WaitPay, Pay::Paid];
//!     fn as_str(&self) -> &'static str {
//!         match self { Pay::WaitPay => "WAIT_PAY", Pay::Paid => "PAID" }
//!     }
//! }
//!
//! let payments = StateMachine::<Pay>::new("payments", "payment_no", "state")?;
//! let mut tx = pool.begin().await?;
//! match payments.transition(&mut *tx, "P-1", &[Pay::WaitPay], Pay::Paid).await? {
//!     Transition::Applied => {
//!         // first time: book the credit in the same transaction
//!         sqlx::query("INSERT INTO ledger (payment_no) VALUES ($1)")
//!             .bind("P-1")
//!             .execute(&mut *tx)
//!             .await?;
//!     }
//!     Transition::AlreadyInTarget => {} // a duplicate: success, nothing to book
//!     Transition::Illegal { current } => return Err(format!("payment is {current:?}").into()),
//!     Transition::NotFound => return Err("no such payment".into()),
//! }
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! # Names are never spliced from input
//!
//! Tables and columns are [`Ident`]s: ASCII letters, digits and underscores,
//! not starting with a digit, at most 48 bytes, checked once when the guard
//! is built. Everything else (ids, states, amounts, tokens) is a bound
//! parameter.
//!
//! # Errors
//!
//! Every guard returns the crate's [`Error`](idem_core::Error):
//! [`ErrorKind::Config`](idem_core::ErrorKind::Config) for something the guard was
//! built or called with that it cannot use (a bad identifier, an empty set of
//! source states), [`ErrorKind::Corrupt`](idem_core::ErrorKind::Corrupt) for a
//! stored value it cannot read back (an unknown state), and
//! [`ErrorKind::Unavailable`](idem_core::ErrorKind::Unavailable) for anything the
//! database or Redis answered with an error (the source chain holds it).
//! In a transaction, roll back on any error.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a store feature no guard is built, and what the token guards
// share has no user (`cargo check --workspace` and `cargo package` build
// the crate so): no warnings for that.
#![cfg_attr(not(any(feature = "sql", feature = "redis")), allow(dead_code))]

#[cfg(feature = "sql")]
mod counter;
#[cfg(feature = "sql")]
mod db;
#[cfg(feature = "sql")]
mod inbox;
#[cfg(feature = "redis")]
mod lock;
#[cfg(feature = "sql")]
mod outbox;
#[cfg(feature = "sql")]
mod sql;
mod token;
#[cfg(feature = "sql")]
mod transition;

#[cfg(feature = "sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use counter::{Counter, CounterUpdate};
#[cfg(feature = "sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use db::GuardDb;
#[cfg(feature = "sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use inbox::{DEFAULT_INBOX_TABLE, Delivery, DuplicateOf, Inbox, ProcessError, Processed};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use lock::{KeepAlive, LockGuard, RedisLock};
#[cfg(feature = "sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use outbox::{
    DEFAULT_OUTBOX_TABLE, Enqueued, Event, Outbox, Pass, PendingEvent, Published, Publisher, Relay,
};
#[cfg(all(feature = "sql", feature = "nats"))]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use outbox::{EVENT_KEY_HEADER, JetStreamPublisher};
#[cfg(feature = "sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use sql::{Ident, RowId};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use token::RedisTokens;
pub use token::{ConsumedToken, OneTimeToken, TokenUse};
#[cfg(feature = "sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use token::{DEFAULT_TOKEN_TABLE, SqlTokens};
#[cfg(feature = "sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use transition::{LifecycleState, StateMachine, Transition};
