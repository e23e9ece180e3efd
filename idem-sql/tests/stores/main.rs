//! The SQL stores against real PostgreSQL, MariaDB/MySQL and SQLite, in
//! one test binary: a module per database (the store and transactional
//! conformance suites, and what only that database's store does) and per
//! subject (`phases`, the recovery points; `pooler`, through PgBouncer;
//! `purge`; SQLite's `sqlite_batches` and `sqlite_relay`; the
//! `state_machine` model). Server URLs come from the environment:
//! `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`; SQLite uses a fresh
//! file under the system temp directory. `common` holds the stores and the
//! cases more than one database runs.
#![cfg(all(
    feature = "test-util",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]

mod common;

mod mysql;
mod phases;
mod pooler;
mod postgres;
mod purge;
mod sqlite;
mod sqlite_batches;
mod sqlite_relay;
mod state_machine;
