//! The SQL stores against real PostgreSQL, MariaDB/MySQL and SQLite, one
//! module per database: the store and transactional conformance suites,
//! and what only that database's store does. Server URLs come from the
//! environment: `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`; SQLite uses
//! a fresh file under the system temp directory. `common` holds the stores
//! and the cases more than one database runs.
#![cfg(all(
    feature = "test-util",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]

mod common;

mod mysql;
mod postgres;
mod sqlite;
