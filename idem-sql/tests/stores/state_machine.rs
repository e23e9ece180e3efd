//! The record state machine's properties (idem-core's
//! `tests/state_machine.rs` says which, and how time is judged) on the SQL
//! stores, by the database's clock: the same reference model and runner,
//! fewer cases, every step a round trip to a server.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::sync::Arc;
use std::time::Duration;

use idem_core::conformance::model::{SPREAD, Shape, run, runtime};
/// Fewer cases: every step is a round trip to a server.
const SQL: Shape = Shape {
    cases: 16,
    ..SPREAD
};

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_store_keeps_one_owner_and_every_response() {
    use idem_sql::SqliteStore;
    use idem_sql::sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };

    let runtime = runtime();
    let nonce: u64 = rand::random();
    let path = std::env::temp_dir().join(format!("idem-state-machine-{nonce:016x}.db"));
    let store = runtime.block_on(async {
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("a SQLite file in the temp directory");
        let store = SqliteStore::new(pool);
        store.migrate().await.expect("migrate");
        store
    });
    let pool = store.pool().clone();
    run(&runtime, Arc::new(store), SQL);
    runtime.block_on(pool.close());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_store_keeps_one_owner_and_every_response() {
    use idem_sql::PgStore;
    use idem_sql::sqlx::postgres::PgPoolOptions;
    use idem_test_support::{postgres_url, server_missing};

    let runtime = runtime();
    let url = postgres_url();
    let store = runtime.block_on(async {
        match PgPoolOptions::new().max_connections(8).connect(&url).await {
            Ok(pool) => {
                let store = PgStore::new(pool);
                store.migrate().await.expect("migrate");
                Some(store)
            }
            Err(err) => server_missing("PostgreSQL", &url, err),
        }
    });
    if let Some(store) = store {
        run(&runtime, Arc::new(store), SQL);
    }
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_store_keeps_one_owner_and_every_response() {
    use idem_sql::MySqlStore;
    use idem_sql::sqlx::mysql::MySqlPoolOptions;
    use idem_test_support::{mysql_url, server_missing};

    let runtime = runtime();
    let url = mysql_url();
    let store = runtime.block_on(async {
        match MySqlPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
        {
            Ok(pool) => {
                let store = MySqlStore::new(pool);
                store.migrate().await.expect("migrate");
                Some(store)
            }
            Err(err) => server_missing("MySQL/MariaDB", &url, err),
        }
    });
    if let Some(store) = store {
        run(&runtime, Arc::new(store), SQL);
    }
}
