//! `SqliteStore`: the conformance suites, the store's writes taking turns
//! instead of meeting SQLite's busy handler, claims queued for the turn
//! holding no connection, and the commit's guard. (The batches and the
//! relayed write lock have test files of their own.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{Claim, Fingerprint, IdempotencyKey, OwnerToken};
use idem_core::{IdempotencyStore, TransactionalStore, TxClaim};
use idem_sql::sqlx::sqlite::SqlitePoolOptions;
use idem_sql::sqlx::{self, Sqlite};
use idem_sql::{SqliteStore, TxSlot};

use crate::common::{self, done_outcome, drop_table, failures, on_a_slow_table, open_fresh};
use crate::common::{rand_u64, sqlite, sqlite_file};

idem_core::store_conformance_tests!(crate::common::sqlite());
idem_sql::transactional_conformance_tests!(crate::common::sqlite());

/// The store's own writes in one process take turns instead of meeting
/// SQLite's busy handler. With `busy_timeout` zero, any write that found
/// another connection writing would fail at once with `SQLITE_BUSY`;
/// concurrent first requests on distinct keys, plain and transactional, on
/// a pool of 8 from two threads, must all claim and complete, each with
/// exactly one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_one_store_take_turns_instead_of_failing_busy() {
    const REQUESTS: usize = 48;
    let options = sqlite_file("turns-").busy_timeout(Duration::ZERO);
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("a SQLite file in the temp directory");
    sqlx::query("CREATE TABLE effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.expect("migrate");
    let (lease, keep) = (Duration::from_secs(30), Duration::from_secs(600));

    let mut tasks = tokio::task::JoinSet::new();
    let ran = Arc::new(AtomicUsize::new(0));
    for n in 0..REQUESTS {
        let (store, ran) = (store.clone(), Arc::clone(&ran));
        tasks.spawn(async move {
            let key = IdempotencyKey::new("idem-test:", &format!("turns:{n}"));
            let fp = Fingerprint::from_bytes([7; 32]);
            let owner = OwnerToken::generate();
            if n % 2 == 0 {
                let claim = store.claim(&key, &fp, lease, owner).await;
                let Ok(Claim::Acquired(owner)) = claim else {
                    return Err(format!("plain claim {n}: {claim:?}"));
                };
                // The handler's effect; not a write of the database, which
                // would meet SQLite's lock outside the store's turns.
                ran.fetch_add(1, Ordering::SeqCst);
                let completed = store.complete(&key, &owner, &done_outcome(), keep).await;
                completed.map_err(|err| format!("plain completion {n}: {err}"))
            } else {
                let claim = store.claim_in_transaction(&key, &fp, lease, owner).await;
                let Ok(TxClaim::Open(tx)) = claim else {
                    return Err(format!("transactional claim {n}: {claim:?}"));
                };
                {
                    let handle = tx.handle();
                    let mut guard = handle.get::<TxSlot<Sqlite>>().unwrap().lock().await;
                    sqlx::query("INSERT INTO effects (k) VALUES (?1)")
                        .bind(format!("tx-{n}"))
                        .execute(&mut **guard.as_mut().unwrap())
                        .await
                        .expect("the effect, in the claim's transaction");
                }
                let committed = tx.commit(&done_outcome(), keep).await;
                committed.map_err(|err| format!("commit {n}: {err}"))
            }
        });
    }
    let failed = failures(tasks).await;
    assert_eq!(failed, Vec::<String>::new(), "every write took its turn");
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(ran.load(Ordering::SeqCst), REQUESTS / 2, "plain handlers");
    assert_eq!(
        count("SELECT COUNT(*) FROM effects").await,
        (REQUESTS / 2) as i64,
        "transactional handlers' writes"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM idem_records WHERE state = 'C'").await,
        REQUESTS as i64
    );
}

/// A transactional claim waiting for the turn to write holds no
/// connection: it takes one when its turn comes from the writers' queue,
/// or is handed the committing claim's with its transaction begun
/// (`relay.rs`). While one claim's handler runs and others queue behind
/// it, that claim's connection is the only one in use, the rest of the
/// pool free for reads, and every queued claim then commits in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_claims_waiting_for_their_turn_hold_no_connection() {
    const POOL: u32 = 4;
    const QUEUED: usize = 5;
    let options = sqlite_file("queued-");
    let path = options.get_filename().to_owned();
    let pool = SqlitePoolOptions::new()
        .max_connections(POOL)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options)
        .await
        .expect("a SQLite file in the temp directory");
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.expect("migrate");
    let (lease, keep) = (Duration::from_secs(30), Duration::from_secs(600));
    let claim = |n: usize| {
        let store = store.clone();
        async move {
            let key = IdempotencyKey::new("idem-test:", &format!("queued:{n}"));
            let fp = Fingerprint::from_bytes([9; 32]);
            store
                .claim_in_transaction(&key, &fp, lease, OwnerToken::generate())
                .await
        }
    };

    // The first claim holds the turn, as its handler would.
    let Ok(TxClaim::Open(first)) = claim(0).await else {
        panic!("the first claim is open");
    };
    let mut queued = tokio::task::JoinSet::new();
    for n in 1..=QUEUED {
        let claim = claim(n);
        let done = done_outcome();
        queued.spawn(async move {
            match claim.await {
                Ok(TxClaim::Open(tx)) => tx.commit(&done, keep).await.map_err(|e| e.to_string()),
                other => Err(format!("claim {n}: {other:?}")),
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let in_use = pool.size() - pool.num_idle() as u32;
    assert_eq!(
        in_use, 1,
        "connections held by the open claim and those queued behind it"
    );
    let read: i64 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .expect("a read finds a connection while claims queue for the turn");
    assert_eq!(read, 1);

    first
        .commit(&done_outcome(), keep)
        .await
        .expect("the first commit");
    assert_eq!(
        failures(queued).await,
        Vec::<String>::new(),
        "every queued claim committed in turn"
    );
    let records: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {} WHERE state = 'C'",
        store.table()
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(records, QUEUED as i64 + 1);
    pool.close().await;
    let _ = std::fs::remove_file(&path);
}

/// The transactional completion and COMMIT go in one script whose guard
/// fails unless the completed record was written: a claim that finds a
/// live record of its key in the way at commit (here written through its
/// own transaction) commits nothing, its effect included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_over_a_live_record_commits_nothing() {
    let Some(store) = sqlite().await else { return };
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_fence_effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let effect = format!("fence-{:016x}", rand_u64());
    let key = IdempotencyKey::new("idem-test:", &effect);
    let fp = Fingerprint::from_bytes([6; 32]);
    let tx = open_fresh(&store, &key, &fp, Duration::from_secs(30)).await;
    {
        let handle = tx.handle();
        let mut guard = handle.get::<TxSlot<Sqlite>>().unwrap().lock().await;
        let conn = &mut **guard.as_mut().unwrap();
        sqlx::query("INSERT INTO idem_test_fence_effects (k) VALUES (?1)")
            .bind(&effect)
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (key_hash, idem_key, state, fingerprint, outcome, expires_at) \
             VALUES (?1, ?2, 'C', ?3, X'00', 9223372036854775807)",
            store.table()
        )))
        .bind(&blake3::hash(key.as_str().as_bytes()).as_bytes()[..])
        .bind(key.as_str())
        .bind(&[6u8; 32][..])
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    assert!(
        tx.commit(&done_outcome(), Duration::from_secs(30))
            .await
            .is_err(),
        "refused"
    );
    let effects: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_fence_effects WHERE k = ?1")
            .bind(&effect)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(effects, 0, "rolled back");
}

/// `common::claims_shorter_than_their_round_trip_acquire`, on a table
/// whose inserts last longer than the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_shorter_than_their_round_trip_acquire() {
    let Some(shared) = sqlite().await else {
        return;
    };
    let store = on_a_slow_table(shared.pool(), |table| {
        // No sleep in SQLite: a few megabytes of random bytes.
        format!(
            "CREATE TRIGGER {table}_slow BEFORE INSERT ON {table} \
                 BEGIN SELECT length(randomblob(4000000)); END"
        )
    })
    .await;
    common::claims_shorter_than_their_round_trip_acquire(store.clone()).await;
    drop_table(&store).await;
}
