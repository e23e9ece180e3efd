//! `MySqlStore` on MariaDB or MySQL: the conformance suites, and the
//! session's lock wait a transactional claim sets and sets back.

use std::time::Duration;

use idem_core::{Duplicate, Fingerprint, OwnerToken, TransactionalStore, TxClaim};
use idem_sql::MySqlStore;
use idem_sql::sqlx::mysql::MySqlPoolOptions;
use idem_test_support::mysql_url;

use crate::common::{self, a_plain_claim_that_waited_holds_a_whole_lease, drop_table, fresh_key};
use crate::common::{mysql, on_a_slow_table};

idem_core::store_conformance_tests!(crate::common::mysql());
idem_sql::transactional_conformance_tests!(crate::common::mysql());

/// The transactional suite again with MySQL's scripts, which a MariaDB
/// from 10.5 does not get by itself (`mysql/script.rs`), on a table of its
/// own (a purge deletes whatever expired in its table).
mod portable_scripts {
    async fn store() -> Option<idem_sql::MySqlStore> {
        let shared = crate::common::mysql().await?;
        let store = idem_sql::MySqlStore::builder(shared.pool().clone())
            .table("idem_test_portable_records")
            .lock_timeout(crate::common::LOCK_TIMEOUT)
            .build()
            .unwrap();
        store.migrate().await.expect("migrate");
        store.portable_scripts_for_tests();
        Some(store)
    }

    idem_sql::transactional_conformance_tests!(store());
}

/// A transactional claim runs with no lock wait, which is a session
/// variable of the pooled connection. Every path must set it back: here a
/// duplicate told "in flight" leaves its (only) connection waiting the
/// store's lock timeout again, for the next user of the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_leave_the_pooled_lock_wait_as_configured() {
    let Some(first) = mysql().await else { return };
    let one = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_url())
        .await
        .expect("MariaDB");
    let elsewhere = MySqlStore::builder(one.clone())
        .lock_timeout(Duration::from_secs(7))
        .build()
        .unwrap();
    let key = fresh_key("lock-wait");
    let fp = Fingerprint::from_bytes([9; 32]);
    let claim = |store: &MySqlStore| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .claim_in_transaction(&key, &fp, Duration::from_secs(60), OwnerToken::generate())
                .await
                .expect("MariaDB answers")
        }
    };

    let TxClaim::Open(open) = claim(&first).await else {
        panic!("the first claim acquires");
    };
    let duplicate = claim(&elsewhere).await;
    assert!(
        matches!(duplicate, TxClaim::Duplicate(Duplicate::InFlight { .. })),
        "{duplicate:?}"
    );
    let wait: u64 = idem_sql::sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
        .fetch_one(&one)
        .await
        .expect("the session variable");
    assert_eq!(wait, 7, "the claim's no-wait setting leaked into the pool");
    open.rollback().await.expect("rollback");
}

/// A transactional duplicate of a completed key does not wait while
/// another transaction holds the record's row, however long the store's
/// lock timeout (here 7 s): the claim's upsert waits for no lock of its
/// own (`SET STATEMENT innodb_lock_wait_timeout = 0`, or the session's
/// lock wait set to MariaDB's 0 or MySQL's least, a second), and the
/// record, read as last committed, replays (`mysql.rs`, `locked`). With
/// MariaDB's scripts and with MySQL's. The conformance suite's lock
/// timeout, a second, is too short to tell an upsert that waits for it
/// from one that does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_completed_key_replays_without_waiting_the_lock_timeout() {
    let Some(shared) = mysql().await else { return };
    for portable in [false, true] {
        replays_while_held(&shared, portable).await;
    }
}

/// A completed key's duplicate claimed in a transaction on `shared`'s
/// table, with MySQL's scripts if `portable`, while another transaction
/// holds its row.
async fn replays_while_held(shared: &MySqlStore, portable: bool) {
    use idem_core::{Claim, IdempotencyStore, Outcome, StoredResponse};
    use idem_sql::sqlx::{self, Acquire};
    use std::time::Instant;

    let store = MySqlStore::builder(shared.pool().clone())
        .table(shared.table())
        .lock_timeout(Duration::from_secs(7))
        .build()
        .unwrap();
    if portable {
        store.portable_scripts_for_tests();
    }
    let key = fresh_key("read-no-lock");
    let fp = Fingerprint::from_bytes([6; 32]);
    let owner = OwnerToken::generate();
    let claimed = store
        .claim(&key, &fp, Duration::from_secs(60), owner)
        .await
        .expect("MariaDB answers");
    assert!(matches!(claimed, Claim::Acquired(_)), "{claimed:?}");
    let outcome = Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "read without a lock",
    ));
    store
        .complete(&key, &owner, &outcome, Duration::from_secs(600))
        .await
        .expect("completed");

    let mut holder = shared.pool().acquire().await.expect("a connection");
    let mut held = holder.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT state FROM {} WHERE idem_key = ? FOR UPDATE",
        store.table()
    )))
    .bind(key.as_str())
    .fetch_one(&mut *held)
    .await
    .expect("the row, locked");

    let started = Instant::now();
    let duplicate = store
        .claim_in_transaction(&key, &fp, Duration::from_secs(60), OwnerToken::generate())
        .await
        .expect("MariaDB answers");
    let waited = started.elapsed();
    assert!(
        matches!(&duplicate, TxClaim::Duplicate(Duplicate::Replay(o)) if *o == outcome),
        "portable scripts {portable}: {duplicate:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "portable scripts {portable}: the duplicate waited {waited:?} on the row another \
         transaction holds"
    );
    held.rollback().await.expect("rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_claim_that_waited_holds_a_whole_lease() {
    if let Some(store) = mysql().await {
        a_plain_claim_that_waited_holds_a_whole_lease(store).await;
    }
}

/// `common::claims_shorter_than_their_round_trip_acquire`, on a table
/// whose inserts last longer than the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_shorter_than_their_round_trip_acquire() {
    let Some(shared) = mysql().await else {
        return;
    };
    let store = on_a_slow_table(shared.pool(), |table| {
        format!(
            "CREATE TRIGGER {table}_slow BEFORE INSERT ON {table} \
                 FOR EACH ROW DO SLEEP(0.005)"
        )
    })
    .await;
    common::claims_shorter_than_their_round_trip_acquire(store.clone()).await;
    drop_table(&store).await;
}

/// A MySQL transactional commit completes the claim's row, checks that it
/// did, and commits, in one text query (`mysql/script.rs`). If the row is
/// no longer the claim's (here the handler deleted it through `Tx`,
/// something past the store), the check fails the query before its
/// COMMIT: the commit is refused as fenced and none of the handler's
/// writes stay.
#[tokio::test]
async fn transactional_commit_over_a_row_not_its_own_commits_nothing() {
    use idem_core::{IdempotencyKey, Outcome, StoredResponse};
    use idem_sql::TxSlot;
    use idem_sql::sqlx::{self, MySql};

    let Some(store) = mysql().await else {
        return;
    };
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_mysql_effects (k VARCHAR(255) NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let name = format!("mysql-fenced-commit:{:016x}", common::rand_u64());
    let key = IdempotencyKey::new("idem-test:", &name);
    let fp = Fingerprint::from_bytes([5; 32]);
    let claim = store
        .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
        .await
        .expect("MySQL answers");
    let TxClaim::Open(tx) = claim else {
        panic!("a fresh key is claimed");
    };
    {
        let handle = tx.handle();
        let mut guard = handle.get::<TxSlot<MySql>>().unwrap().lock().await;
        let conn = &mut **guard.as_mut().unwrap();
        sqlx::query("INSERT INTO idem_test_mysql_effects (k) VALUES (?)")
            .bind(&name)
            .execute(&mut *conn)
            .await
            .unwrap();
        let deleted = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {} WHERE idem_key = ?",
            store.table()
        )))
        .bind(key.as_str())
        .execute(&mut *conn)
        .await
        .unwrap();
        assert_eq!(
            deleted.rows_affected(),
            1,
            "the claim's row, in its transaction"
        );
    }
    let outcome = Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "done",
    ));
    let committed = tx.commit(&outcome, Duration::from_secs(600)).await;
    assert!(
        committed.is_err(),
        "a commit over a row not its own is refused"
    );
    let effects: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_mysql_effects WHERE k = ?")
            .bind(&name)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(effects, 0, "nothing of the handler's committed");
}

/// A transactional claim runs the claim, its read and the completion as
/// statements its connection prepared (`mysql/script.rs`). A connection
/// that lost them (here deallocated, before the claim and again between
/// the claim and its commit, as a session reset would) prepares them again
/// in the same query, and the claim and its commit go through; the user
/// variable that carried the stored response is emptied after the commit.
/// With MariaDB's scripts and with MySQL's.
#[tokio::test]
async fn transactional_claims_prepare_again_what_their_connection_lost() {
    let Some(shared) = mysql().await else {
        return;
    };
    let one = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_url())
        .await
        .expect("MariaDB");
    for portable in [false, true] {
        let store = MySqlStore::builder(one.clone())
            .table(shared.table())
            .build()
            .unwrap();
        if portable {
            store.portable_scripts_for_tests();
        }
        prepare_again(&store, &one).await;
    }
}

/// A claim and a commit on `store`, whose pool is `one` connection, with
/// the statements deallocated before and in between, twice.
async fn prepare_again(store: &MySqlStore, one: &idem_sql::sqlx::MySqlPool) {
    use idem_core::{Outcome, StoredResponse};
    use idem_sql::TxSlot;
    use idem_sql::sqlx::{self, MySql};

    let fp = Fingerprint::from_bytes([4; 32]);
    let deallocate = |what: &str| {
        sqlx::AssertSqlSafe(format!("DEALLOCATE PREPARE idem1_{what}_{}", store.table()))
    };
    let outcome = Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "prepared again",
    ));
    for round in 0..2 {
        let key = fresh_key("prepare-again");
        let claim = store
            .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
            .await
            .expect("MySQL answers");
        let TxClaim::Open(tx) = claim else {
            panic!("round {round}: a fresh key is claimed");
        };
        {
            let handle = tx.handle();
            let mut guard = handle.get::<TxSlot<MySql>>().unwrap().lock().await;
            let conn = &mut **guard.as_mut().unwrap();
            sqlx::raw_sql(deallocate("complete"))
                .execute(&mut *conn)
                .await
                .expect("the completion was prepared by the claim");
        }
        tx.commit(&outcome, Duration::from_secs(600))
            .await
            .expect("the commit prepares the completion again");
        let again = store
            .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
            .await
            .expect("MySQL answers");
        assert!(
            matches!(&again, TxClaim::Duplicate(Duplicate::Replay(o)) if *o == outcome),
            "round {round}: {again:?}"
        );
        let emptied: bool = sqlx::query_scalar("SELECT @idem_outcome IS NULL")
            .fetch_one(one)
            .await
            .unwrap();
        assert!(emptied, "the stored response left in a session variable");
        // Each server's scripts prepare some of these and not the others:
        // deallocating one the session lacks fails.
        for what in ["claim", "claimr", "select", "complete"] {
            let _ = sqlx::raw_sql(deallocate(what)).execute(one).await;
        }
    }
}

/// On MariaDB a transactional claim whose handler sits idle past its
/// lease (its process paused, its connection frozen) frees its key within
/// about a lease (whole seconds), and its late commit writes nothing
/// (`common::a_transaction_idle_past_its_lease_frees_its_key`); a
/// connection that committed goes back to the pool with autocommit and
/// the server's bound, not the claim's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_idle_past_its_lease_frees_its_key() {
    use idem_sql::sqlx;

    let Some(elsewhere) = mysql().await else {
        return;
    };
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(elsewhere.pool())
        .await
        .unwrap();
    if !version.contains("MariaDB") {
        eprintln!("skipped: MySQL has no bound on idle transactions ({version})");
        return;
    }
    // One connection: the one the claims used is the one read after.
    let one = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_url())
        .await
        .unwrap();
    let store = MySqlStore::builder(one.clone()).build().unwrap();
    common::a_transaction_idle_past_its_lease_frees_its_key(store, elsewhere).await;
    let session: (i64, i64) = sqlx::query_as(
        "SELECT CAST(@@autocommit AS SIGNED), CAST(@@idle_transaction_timeout AS SIGNED)",
    )
    .fetch_one(&one)
    .await
    .unwrap();
    assert_eq!(session, (1, 0), "the pooled session set back");
}
