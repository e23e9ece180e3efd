//! SQL store conformance: what every [`SqlStore`] must do when the claim,
//! the business writes and the outcome share one transaction, and what only
//! a table can show (row locks, migrations, purging).

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::future::Future;

use sqlx::AssertSqlSafe;

use crate::sql::{Dialect, SqlStore};
use crate::store::{TransactionalStore, TxClaim};
use crate::{Claim, Duplicate, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};

const LONG: Duration = Duration::from_secs(60);
const EFFECTS: &str = "idem_test_effects";

fn fresh_key(case: &str) -> (IdempotencyKey, String) {
    let nonce = format!("{:016x}", rand::random::<u64>());
    (
        IdempotencyKey::new("idem-test:", &format!("{case}:{nonce}")),
        nonce,
    )
}

fn fp() -> Fingerprint {
    Fingerprint::from_bytes([9; 32])
}

/// Plain statements on a pool or a connection, for the cases' own tables.
pub trait TestSql: Dialect {
    /// Statements that, run on a connection and left open, hold a lock any
    /// write to the record row `{hash}` (hex) of `{table}` waits on.
    const LOCK_RECORD: &'static [&'static str];
    /// Runs `sql` on the pool.
    fn exec(pool: &sqlx::Pool<Self>, sql: String) -> impl Future<Output = ()> + Send;
    /// Runs `sql` on `conn`.
    fn exec_on(conn: &mut Self::Connection, sql: String) -> impl Future<Output = ()> + Send;
    /// Runs a `SELECT COUNT(*)`.
    fn count(pool: &sqlx::Pool<Self>, sql: String) -> impl Future<Output = i64> + Send;
}

macro_rules! test_sql {
    ($($feature:literal => $db:ty, lock: $lock:expr;)*) => {$(
        #[cfg(feature = $feature)]
        impl TestSql for $db {
            const LOCK_RECORD: &'static [&'static str] = $lock;
            async fn exec(pool: &sqlx::Pool<Self>, sql: String) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await.expect("statement");
            }
            async fn exec_on(conn: &mut Self::Connection, sql: String) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await.expect("statement");
            }
            async fn count(pool: &sqlx::Pool<Self>, sql: String) -> i64 {
                sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(pool).await.expect("count")
            }
        }
    )*};
}

test_sql! {
    "postgres" => sqlx::Postgres, lock: &[
        "BEGIN",
        "SELECT 1 FROM {table} WHERE key_hash = decode('{hash}', 'hex') FOR UPDATE",
    ];
    "mysql" => sqlx::MySql, lock: &[
        "BEGIN",
        "SELECT 1 FROM {table} WHERE key_hash = X'{hash}' FOR UPDATE",
    ];
    // One writer at a time: an open write transaction blocks every write.
    "sqlite" => sqlx::Sqlite, lock: &["BEGIN IMMEDIATE"];
}

async fn effects_table<DB: TestSql>(pool: &sqlx::Pool<DB>) {
    DB::exec(
        pool,
        format!("CREATE TABLE IF NOT EXISTS {EFFECTS} (k VARCHAR(64) NOT NULL)"),
    )
    .await;
}

async fn effects<DB: TestSql>(pool: &sqlx::Pool<DB>, nonce: &str) -> i64 {
    DB::count(
        pool,
        format!("SELECT COUNT(*) FROM {EFFECTS} WHERE k = '{nonce}'"),
    )
    .await
}

/// Claims in a transaction and writes one effect row in it, as a handler
/// would through its transaction handle.
async fn claim_and_write<DB: TestSql>(
    store: &SqlStore<DB>,
    key: &IdempotencyKey,
    nonce: &str,
) -> Box<dyn crate::store::OpenTransaction> {
    let claim = store
        .claim_in_transaction(key, &fp(), LONG, OwnerToken::generate())
        .await
        .unwrap();
    let TxClaim::Open(tx) = claim else {
        panic!("expected to acquire, got {claim:?}");
    };
    let handle = tx.handle();
    let slot = handle.slot::<DB>().expect("a transaction on this database");
    let mut lease = slot.lease().await;
    let conn: &mut DB::Connection = lease.as_mut().expect("an open transaction");
    DB::exec_on(
        conn,
        format!("INSERT INTO {EFFECTS} (k) VALUES ('{nonce}')"),
    )
    .await;
    tx
}

fn response() -> Outcome {
    Outcome::Response(crate::StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "done",
    ))
}

/// Commit makes the business write and the outcome durable together.
pub async fn commit_keeps_writes_and_outcome<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    effects_table(store.pool()).await;
    let (key, nonce) = fresh_key("tx-commit");
    let tx = claim_and_write(&store, &key, &nonce).await;
    assert_eq!(
        effects(store.pool(), &nonce).await,
        0,
        "not visible before commit"
    );
    tx.commit(&response(), LONG).await.unwrap();
    assert_eq!(effects(store.pool(), &nonce).await, 1);
    assert_eq!(
        store
            .claim(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(response())
    );
}

/// Rollback undoes the business write and frees the key.
pub async fn rollback_undoes_writes_and_claim<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    effects_table(store.pool()).await;
    let (key, nonce) = fresh_key("tx-rollback");
    claim_and_write(&store, &key, &nonce)
        .await
        .rollback()
        .await
        .unwrap();
    assert_eq!(effects(store.pool(), &nonce).await, 0);
    assert!(matches!(
        store
            .claim(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Acquired(_)
    ));
}

/// Dropping the transaction (a panic, a cancelled request) is a rollback.
pub async fn dropped_transaction_rolls_back<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    effects_table(store.pool()).await;
    let (key, nonce) = fresh_key("tx-drop");
    drop(claim_and_write(&store, &key, &nonce).await);
    // The rollback of a dropped transaction runs when its connection is next
    // used; claiming again (on any connection) must find the key free.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store
            .claim(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap()
        {
            Claim::Acquired(_) => break,
            other if Instant::now() > deadline => panic!("key still held: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(effects(store.pool(), &nonce).await, 0);
}

/// A store on the same pool and table with its own memory, as another
/// process would have: it knows nothing of `store`'s open claims.
fn another_process<DB: TestSql>(store: &SqlStore<DB>) -> SqlStore<DB> {
    SqlStore::builder(store.pool().clone())
        .table(store.table())
        .build()
        .expect("the suite's table name")
}

/// A duplicate arriving while the first transaction is open is told "in
/// flight" without waiting for it to end, from this process (answered from
/// memory) and from another (a store of its own on the same table); once
/// the first has committed, both replay what it committed: one effect.
pub async fn duplicate_of_an_open_transaction_is_in_flight_then_replays<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    effects_table(store.pool()).await;
    let (key, nonce) = fresh_key("tx-dup");
    let elsewhere = another_process(&store);
    let first = claim_and_write(&store, &key, &nonce).await;
    // Both answer while the first is still open: neither waited for it.
    for (who, store) in [("this process", &*store), ("another process", &elsewhere)] {
        let claim = store
            .claim_in_transaction(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap();
        assert!(
            matches!(claim, TxClaim::Duplicate(Duplicate::InFlight { .. })),
            "{who}: {claim:?}"
        );
    }
    first.commit(&response(), LONG).await.unwrap();
    for (who, store) in [("this process", &*store), ("another process", &elsewhere)] {
        match store
            .claim_in_transaction(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap()
        {
            TxClaim::Duplicate(Duplicate::Replay(outcome)) => {
                assert_eq!(outcome, response(), "{who}");
            }
            other => panic!("{who}: expected a replay, got {other:?}"),
        }
    }
    assert_eq!(effects(store.pool(), &nonce).await, 1);
}

/// A claim whose transaction ended without committing (its connection
/// gone, as when its process is killed) leaves the key free at once, for
/// another process, with none of its writes.
pub async fn a_claim_whose_connection_died_frees_its_key_at_once<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    effects_table(store.pool()).await;
    let (key, nonce) = fresh_key("tx-died");
    let first = claim_and_write(&store, &key, &nonce).await;
    // Dropped unfinished: sqlx rolls it back as the connection goes back
    // to the pool, on a task of its own, so the key frees a moment later,
    // with no lease to run out.
    drop(first);
    let elsewhere = another_process(&store);
    let deadline = Instant::now() + NO_WAIT;
    let retry = loop {
        match elsewhere
            .claim_in_transaction(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap()
        {
            TxClaim::Open(retry) => break retry,
            claim => {
                assert!(Instant::now() < deadline, "the key stayed held: {claim:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    retry.rollback().await.unwrap();
    assert_eq!(effects(store.pool(), &nonce).await, 0);
}

/// A duplicate that outwaits the lock timeout is told the key is in flight.
/// The store must have been built with a lock timeout (or SQLite busy
/// timeout) of about a second.
pub async fn duplicate_past_the_lock_timeout_is_in_flight<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    effects_table(store.pool()).await;
    let (key, nonce) = fresh_key("tx-timeout");
    let first = claim_and_write(&store, &key, &nonce).await;
    let claim = store
        .claim_in_transaction(&key, &fp(), LONG, OwnerToken::generate())
        .await
        .unwrap();
    assert!(
        matches!(claim, TxClaim::Duplicate(Duplicate::InFlight { .. })),
        "{claim:?}"
    );
    first.commit(&response(), LONG).await.unwrap();
    assert_eq!(effects(store.pool(), &nonce).await, 1);
}

/// How long a claim that must not wait on a lock may take: far below the
/// lock waits of the suite's stores for a write (PostgreSQL: no limit outside
/// a transactional claim; MariaDB/MySQL: `innodb_lock_wait_timeout`, 50 s by
/// default), so a claim that writes first times out here. On SQLite such a
/// claim fails instead, with `SQLITE_BUSY` once the pool's `busy_timeout`
/// (1 s in the test setup) runs out.
const NO_WAIT: Duration = Duration::from_secs(2);

/// A plain claim, which must answer within [`NO_WAIT`].
async fn claim_without_waiting<DB: TestSql>(
    store: &SqlStore<DB>,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Claim {
    let started = Instant::now();
    let claim = store.claim(key, fingerprint, LONG, OwnerToken::generate());
    match tokio::time::timeout(NO_WAIT, claim).await {
        Ok(Ok(claim)) => claim,
        Ok(Err(err)) => panic!(
            "the claim failed after {:?} (it waited on the lock): {err:?}",
            started.elapsed()
        ),
        Err(_) => panic!("the claim still waited on the row lock after {NO_WAIT:?}"),
    }
}

/// A duplicate of a completed key is answered from a plain read: it neither
/// writes nor waits while another transaction holds a lock on the record row
/// (PostgreSQL, MariaDB/MySQL: `SELECT ... FOR UPDATE`; SQLite: the
/// database's write lock), whether it replays or mismatches. The store must
/// have been built with a lock timeout (or SQLite busy timeout) of about a
/// second, as for [`duplicate_past_the_lock_timeout_is_in_flight`].
pub async fn completed_key_answers_without_waiting_on_its_row<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    let (key, _) = fresh_key("no-wait");
    let owner = super::acquire(&*store, &key, &fp(), LONG).await;
    store
        .complete(&key, &owner, &response(), LONG)
        .await
        .unwrap();

    let hash: String = crate::sql::key_hash(&key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut holder = store.pool().acquire().await.expect("a connection");
    for sql in DB::LOCK_RECORD {
        let sql = sql
            .replace("{table}", store.table())
            .replace("{hash}", &hash);
        DB::exec_on(&mut holder, sql).await;
    }

    assert_eq!(
        claim_without_waiting(&store, &key, &fp()).await,
        Claim::Replay(response())
    );
    let other = Fingerprint::from_bytes([7; 32]);
    assert_eq!(
        claim_without_waiting(&store, &key, &other).await,
        Claim::Mismatch
    );
    // A transactional claim: on PostgreSQL its one statement reads first as
    // well, and replays at once. Elsewhere it writes the row before reading
    // it, so it waits on the lock until its lock timeout: the lock is real.
    let in_tx = store
        .claim_in_transaction(&key, &fp(), LONG, OwnerToken::generate())
        .await
        .unwrap();
    if DB::CLAIM_READS_FIRST {
        assert!(
            matches!(in_tx, TxClaim::Duplicate(Duplicate::Replay(_))),
            "{in_tx:?}"
        );
    } else {
        assert!(
            matches!(in_tx, TxClaim::Duplicate(Duplicate::InFlight { .. })),
            "{in_tx:?}"
        );
    }

    DB::exec_on(&mut holder, "ROLLBACK".to_owned()).await;
    drop(holder);
    assert_eq!(
        store
            .claim(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(response())
    );
}

/// `migrate` is idempotent, and a custom table works.
pub async fn migrate_twice_and_custom_table<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let custom = SqlStore::builder(store.pool().clone())
        .table("idem_custom_records")
        .build()
        .unwrap();
    custom.migrate().await.unwrap();
    custom.migrate().await.unwrap();
    let (key, _) = fresh_key("custom");
    assert!(matches!(
        custom
            .claim(&key, &fp(), LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Acquired(_)
    ));
    let bad = SqlStore::builder(store.pool().clone())
        .table("x; DROP TABLE y")
        .build()
        .unwrap_err();
    assert_eq!(bad.kind(), crate::ErrorKind::Config);
}

/// `purge_expired` deletes expired rows in batches and leaves live ones.
pub async fn purge_removes_only_expired_rows<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let (live, _) = fresh_key("purge-live");
    let owner = super::acquire(&*store, &live, &fp(), LONG).await;
    for i in 0..5 {
        let (dead, _) = fresh_key(&format!("purge-dead-{i}"));
        let _ = store
            .claim(
                &dead,
                &fp(),
                Duration::from_millis(1),
                OwnerToken::generate(),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let purged = store.purge_expired(2).await.unwrap();
    assert!(purged >= 5, "purged {purged}");
    store
        .complete(&live, &owner, &response(), LONG)
        .await
        .unwrap();
}

/// Generates one test per transactional case; `$make` as for
/// [`store_conformance_tests!`](crate::store_conformance_tests).
#[macro_export]
macro_rules! transactional_conformance_tests {
    ($make:expr) => {
        $crate::transactional_conformance_tests!(@cases $make;
            commit_keeps_writes_and_outcome,
            rollback_undoes_writes_and_claim,
            dropped_transaction_rolls_back,
            duplicate_of_an_open_transaction_is_in_flight_then_replays,
            a_claim_whose_connection_died_frees_its_key_at_once,
            duplicate_past_the_lock_timeout_is_in_flight,
            completed_key_answers_without_waiting_on_its_row,
            migrate_twice_and_custom_table,
            purge_removes_only_expired_rows,
        );
    };
    (@cases $make:expr; $($case:ident,)*) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run(async {
                    if let Some(store) = $make.await {
                        $crate::conformance::sql::$case(::std::sync::Arc::new(store)).await;
                    }
                });
            }
        )*
    };
}
