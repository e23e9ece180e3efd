//! Conformance cases only a table can show: a duplicate answered while
//! another transaction locks its row, migrations, purging.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{NO_WAIT, TestSql, claim_in_transaction, fp, response};
use crate::SqlStore;
use idem_core::TxClaim;
use idem_core::conformance::{LONG, acquire, claim, duplicate, fresh_key};
use idem_core::{
    Claim, Duplicate, ErrorKind, Fingerprint, IdempotencyKey, IdempotencyStore, OwnerToken,
};

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
/// second, as for
/// [`duplicate_past_the_lock_timeout_is_in_flight`](super::duplicate_past_the_lock_timeout_is_in_flight).
pub async fn completed_key_answers_without_waiting_on_its_row<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    let key = fresh_key("no-wait");
    let owner = acquire(&*store, &key, &fp(), LONG).await;
    store
        .complete(&key, &owner, &response(), LONG)
        .await
        .unwrap();

    let hash: String = crate::key_hash(&key)
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
    // well, and replays at once. On MySQL it writes the row before reading
    // it, meets the lock (MariaDB at once, MySQL after its least lock wait,
    // a second), then reads the record as last committed and replays
    // (`mysql.rs`, `locked`). On SQLite, with the lock held outside the
    // store, it waits for the write lock up to the busy timeout: the lock
    // is real.
    let in_tx = claim_in_transaction(&store, &key).await;
    if !DB::ONE_WRITER {
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
        duplicate(&*store, &key, &fp()).await,
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
    assert!(matches!(
        duplicate(&custom, &fresh_key("custom"), &fp()).await,
        Claim::Acquired(_)
    ));
    let bad = SqlStore::builder(store.pool().clone())
        .table("x; DROP TABLE y")
        .build()
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::Config);
}

/// `purge_expired` deletes expired rows in batches and leaves live ones.
pub async fn purge_removes_only_expired_rows<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let live = fresh_key("purge-live");
    let owner = acquire(&*store, &live, &fp(), LONG).await;
    for i in 0..5 {
        let dead = fresh_key(&format!("purge-dead-{i}"));
        let _ = claim(&*store, &dead, &fp(), Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let purged = store.purge_expired(2).await.unwrap();
    assert!(purged >= 5, "purged {purged}");
    store
        .complete(&live, &owner, &response(), LONG)
        .await
        .unwrap();
}
