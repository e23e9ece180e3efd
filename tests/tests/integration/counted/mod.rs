//! Counted, not timed: what a request costs in commits, round trips and
//! Redis commands, read from PostgreSQL's own statistics, the wire and a
//! Redis of the test's own.
//!
//! The waits for `pg_stat_database` to settle (about ten seconds each:
//! PostgreSQL flushes an idle session's counts that late) run side by side
//! with the binary's other tests. Each test counts a database of its own,
//! so none sees another's transactions.

mod commits;
mod round_trips;
