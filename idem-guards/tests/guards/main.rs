//! The business-side guards against real PostgreSQL, MariaDB/MySQL, SQLite
//! and Redis, one module per guard: state-machine transitions, counters,
//! one-time tokens, the inbox, the lock, and the transactional outbox with
//! its relay. Concurrency cases run on a multi-thread runtime and count
//! effects (rows), not answers alone.
//!
//! Server URLs: `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`,
//! `IDEM_TEST_REDIS_URL`; SQLite uses fresh files in the temp directory.
//! Each case makes its own tables (named with a nonce) and drops them.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

#[macro_use]
mod support;

mod counter;
mod inbox;
#[cfg(feature = "redis")]
mod lock;
mod outbox;
mod state_machine;
mod tokens;
