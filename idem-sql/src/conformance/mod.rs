//! SQL store conformance: what every [`SqlStore`] must do when the claim,
//! the business writes and the outcome share one transaction
//! (`transactions.rs`), and what only a table can show: row locks,
//! migrations, purging (`table.rs`). Here: the statements the cases run on
//! their own tables, and what the cases share.

mod handler;
mod table;
mod transactions;

use std::future::Future;
use std::time::Duration;

use sqlx::AssertSqlSafe;

pub use handler::{
    a_nested_commit_is_undone_with_a_failed_request, a_nested_commit_keeps_the_key_held,
    a_nested_rollback_undoes_only_its_own_writes, a_transaction_the_handler_ended_never_runs_again,
};
pub use table::{
    completed_key_answers_without_waiting_on_its_row, migrate_twice_and_custom_table,
    purge_removes_only_expired_rows,
};
pub use transactions::{
    a_claim_whose_connection_died_frees_its_key_at_once,
    a_dropped_transaction_leaves_its_connection_clean,
    an_expired_record_is_taken_over_in_a_transaction,
    claims_and_commits_dropped_midway_leave_the_store_whole, commit_keeps_writes_and_outcome,
    concurrent_duplicates_from_two_processes_all_replay, dropped_transaction_rolls_back,
    duplicate_of_an_open_transaction_is_in_flight_then_replays,
    duplicate_past_the_lock_timeout_is_in_flight, keys_and_outcomes_of_any_bytes_round_trip,
    rollback_undoes_writes_and_claim,
};

use crate::{Dialect, SqlStore, TxGuard, TxSlot};
use idem_core::conformance::LONG;
use idem_core::{Fingerprint, IdempotencyKey, Outcome, OwnerToken, StoredResponse};
use idem_core::{OpenTransaction, TransactionalStore, TxClaim};

const EFFECTS: &str = "idem_test_effects";

/// How long a claim that must not wait on a lock may take: far below the
/// lock waits of the suite's stores for a write (PostgreSQL: no limit outside
/// a transactional claim; MariaDB/MySQL: `innodb_lock_wait_timeout`, 50 s by
/// default), so a claim that writes first times out here. On SQLite such a
/// claim fails instead, with `SQLITE_BUSY` once the pool's `busy_timeout`
/// (1 s in the test setup) runs out.
const NO_WAIT: Duration = Duration::from_secs(2);

fn fp() -> Fingerprint {
    idem_core::conformance::fp(9)
}

fn response() -> Outcome {
    Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "done",
    ))
}

/// Plain statements on a pool or a connection, for the cases' own tables.
pub trait TestSql: Dialect {
    /// Statements that, run on a connection and left open, hold a lock any
    /// write to the record row `{hash}` (hex) of `{table}` waits on.
    const LOCK_RECORD: &'static [&'static str];
    /// A text value written as the hexadecimal digits `{hex}` of its UTF-8
    /// bytes.
    const TEXT_FROM_HEX: &'static str;
    /// Runs `sql` on the pool.
    fn exec(pool: &sqlx::Pool<Self>, sql: String) -> impl Future<Output = ()> + Send;
    /// Runs `sql` on `conn`.
    fn exec_on(conn: &mut Self::Connection, sql: String) -> impl Future<Output = ()> + Send;
    /// Runs `sql` on `conn`, which may fail.
    fn try_exec_on(
        conn: &mut Self::Connection,
        sql: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Runs a `SELECT COUNT(*)`.
    fn count(pool: &sqlx::Pool<Self>, sql: String) -> impl Future<Output = i64> + Send;
}

macro_rules! test_sql {
    ($($feature:literal => $db:ty, text: $text:expr, lock: $lock:expr;)*) => {$(
        #[cfg(feature = $feature)]
        impl TestSql for $db {
            const LOCK_RECORD: &'static [&'static str] = $lock;
            const TEXT_FROM_HEX: &'static str = $text;
            async fn exec(pool: &sqlx::Pool<Self>, sql: String) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await.expect("statement");
            }
            async fn exec_on(conn: &mut Self::Connection, sql: String) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await.expect("statement");
            }
            async fn try_exec_on(conn: &mut Self::Connection, sql: String) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await.map(drop)
            }
            // A simple query, as the others: through a pooler in
            // transaction pooling a prepared one could meet another
            // session's statement of its name (`tests/pooler.rs`).
            async fn count(pool: &sqlx::Pool<Self>, sql: String) -> i64 {
                let row = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_one(pool).await.expect("count");
                sqlx::Row::try_get(&row, 0).expect("a count")
            }
        }
    )*};
}

test_sql! {
    "postgres" => sqlx::Postgres, text: "convert_from(decode('{hex}', 'hex'), 'UTF8')", lock: &[
        "BEGIN",
        "SELECT 1 FROM {table} WHERE key_hash = decode('{hash}', 'hex') FOR UPDATE",
    ];
    "mysql" => sqlx::MySql, text: "CONVERT(X'{hex}' USING utf8mb4)", lock: &[
        "BEGIN",
        "SELECT 1 FROM {table} WHERE key_hash = X'{hash}' FOR UPDATE",
    ];
    // One writer at a time: an open write transaction blocks every write.
    "sqlite" => sqlx::Sqlite, text: "CAST(X'{hex}' AS TEXT)", lock: &["BEGIN IMMEDIATE"];
}

/// A fresh key for `case`, and the nonce its effect rows carry, with the
/// effects table in place.
async fn fresh_case<DB: TestSql>(store: &SqlStore<DB>, case: &str) -> (IdempotencyKey, String) {
    DB::exec(
        store.pool(),
        format!("CREATE TABLE IF NOT EXISTS {EFFECTS} (k VARCHAR(64) NOT NULL)"),
    )
    .await;
    idem_core::conformance::fresh_key_and_nonce(case)
}

/// How many effect rows the case of `nonce` wrote.
async fn effects<DB: TestSql>(pool: &sqlx::Pool<DB>, nonce: &str) -> i64 {
    DB::count(
        pool,
        format!("SELECT COUNT(*) FROM {EFFECTS} WHERE k = '{nonce}'"),
    )
    .await
}

/// A transactional claim of `key` by a new owner, as a request would make
/// it.
async fn claim_in_transaction<DB: Dialect>(store: &SqlStore<DB>, key: &IdempotencyKey) -> TxClaim {
    store
        .claim_in_transaction(key, &fp(), LONG, OwnerToken::generate())
        .await
        .unwrap()
}

/// Claims `key` in a transaction, as a request would, and lends its
/// transaction as `Tx` does: the open claim, and its transaction, locked
/// until the guard is dropped.
async fn claim_lent<DB: Dialect>(
    store: &SqlStore<DB>,
    key: &IdempotencyKey,
) -> (Box<dyn OpenTransaction>, TxGuard<DB>) {
    let claim = claim_in_transaction(store, key).await;
    let TxClaim::Open(tx) = claim else {
        panic!("expected to acquire, got {claim:?}");
    };
    let guard = tx
        .handle()
        .get::<TxSlot<DB>>()
        .expect("a transaction on this database")
        .lock()
        .await;
    (tx, guard)
}

/// Claims in a transaction and writes one effect row in it, as a handler
/// would through its transaction handle.
async fn claim_and_write<DB: TestSql>(
    store: &SqlStore<DB>,
    key: &IdempotencyKey,
    nonce: &str,
) -> Box<dyn OpenTransaction> {
    let (tx, mut guard) = claim_lent(store, key).await;
    let conn: &mut DB::Connection = guard.as_mut().expect("an open transaction");
    DB::exec_on(
        conn,
        format!("INSERT INTO {EFFECTS} (k) VALUES ('{nonce}')"),
    )
    .await;
    tx
}

/// A store on the same pool and table with its own memory, as another
/// process would have: it knows nothing of `store`'s open claims.
fn another_process<DB: Dialect>(store: &SqlStore<DB>) -> SqlStore<DB> {
    SqlStore::builder(store.pool().clone())
        .table(store.table())
        .build()
        .expect("the suite's table name")
}

/// Generates one test per transactional case; `$make` as for
/// [`store_conformance_tests!`](idem_core::store_conformance_tests), whose
/// cases it runs too.
#[macro_export]
macro_rules! transactional_conformance_tests {
    ($make:expr) => {
        $crate::__core::store_conformance_tests!(@cases [$crate::conformance] $make;
            commit_keeps_writes_and_outcome,
            rollback_undoes_writes_and_claim,
            dropped_transaction_rolls_back,
            a_dropped_transaction_leaves_its_connection_clean,
            duplicate_of_an_open_transaction_is_in_flight_then_replays,
            concurrent_duplicates_from_two_processes_all_replay,
            a_claim_whose_connection_died_frees_its_key_at_once,
            duplicate_past_the_lock_timeout_is_in_flight,
            completed_key_answers_without_waiting_on_its_row,
            migrate_twice_and_custom_table,
            purge_removes_only_expired_rows,
            keys_and_outcomes_of_any_bytes_round_trip,
            an_expired_record_is_taken_over_in_a_transaction,
            claims_and_commits_dropped_midway_leave_the_store_whole,
            a_nested_commit_is_undone_with_a_failed_request,
            a_nested_rollback_undoes_only_its_own_writes,
            a_nested_commit_keeps_the_key_held,
            a_transaction_the_handler_ended_never_runs_again,
        );
    };
}
