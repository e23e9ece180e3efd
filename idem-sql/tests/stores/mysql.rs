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
