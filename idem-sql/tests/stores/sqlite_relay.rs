//! SQLite's transactional claims pass the write lock on (`idem-sql/src/
//! relay.rs`): a claim that commits while others wait for the turn to
//! write starts the first of them in its commit's own call, and hands it
//! the transaction and the turn. These tests check the order and the
//! count of those hand-offs, a waiting claim that is dropped or finds its
//! key completed, a duplicate of a completed key answered without a place
//! in the line (and, with no connection to read on, told "in flight" at
//! the lock timeout), that the line yields to a batch of plain writes waiting
//! for the turn, under concurrent duplicates from two stores on one file
//! that every key's handler writes once, that claims dropped at any
//! moment leave the lock and the pool's connections as they found them,
//! that a claim meeting another process's writer past the busy timeout
//! is told "in flight", and that a store that is the file's sole writer
//! hands the lock on past the default's limit.
#![cfg(feature = "sqlite")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{Duplicate, Fingerprint, IdempotencyKey, Outcome, OwnerToken, StoredResponse};
use idem_core::{OpenTransaction, TransactionalStore, TxClaim, TxHandle};
use idem_sql::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use idem_sql::sqlx::{self, Sqlite, SqlitePool};
use idem_sql::{SqliteStore, TxSlot};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::task::JoinSet;

const LEASE: Duration = Duration::from_secs(30);
const KEEP: Duration = Duration::from_secs(600);
/// Long enough for spawned tasks to reach the line behind the held turn.
const QUEUE_UP: Duration = Duration::from_millis(300);

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// A fresh SQLite file in WAL with an `effects` table, and a pool on it
/// whose busy timeout is `busy`.
async fn file(busy: Duration) -> (SqliteConnectOptions, SqlitePool) {
    let path = std::env::temp_dir().join(format!("idem-test-relay-{:016x}.db", rand_u64()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(busy);
    let pool = pool_on(options.clone()).await;
    sqlx::query("CREATE TABLE effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    (options, pool)
}

async fn pool_on(options: SqliteConnectOptions) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("a SQLite file in the temp directory")
}

async fn store_on(pool: SqlitePool) -> SqliteStore {
    let store = SqliteStore::new(pool);
    store.migrate().await.expect("migrate");
    store
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new("idem-test:", name)
}

fn fp() -> Fingerprint {
    Fingerprint::from_bytes([5; 32])
}

fn done(body: &str) -> Outcome {
    Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        body.to_owned(),
    ))
}

async fn claim(store: &SqliteStore, name: &str) -> TxClaim {
    store
        .claim_in_transaction(&key(name), &fp(), LEASE, OwnerToken::generate())
        .await
        .expect("a claim")
}

/// The open transaction of a claim of a fresh key `name`.
async fn open(store: &SqliteStore, name: &str) -> Box<dyn OpenTransaction> {
    match claim(store, name).await {
        TxClaim::Open(open) => open,
        TxClaim::Duplicate(duplicate) => panic!("a fresh key is acquired: {duplicate:?}"),
    }
}

/// The handler's effect, written in the claim's transaction.
async fn write_effect(handle: TxHandle, name: &str) {
    let mut guard = handle.get::<TxSlot<Sqlite>>().unwrap().lock().await;
    sqlx::query("INSERT INTO effects (k) VALUES (?1)")
        .bind(name)
        .execute(&mut **guard.as_mut().unwrap())
        .await
        .expect("the effect, in the claim's transaction");
}

/// Claims `name`, and if the claim is open writes its effect and commits;
/// what the claim answered otherwise.
async fn claim_write_commit(store: &SqliteStore, name: &str) -> Option<Duplicate> {
    match claim(store, name).await {
        TxClaim::Open(open) => {
            write_effect(open.handle(), name).await;
            open.commit(&done(name), KEEP).await.expect("commit");
            None
        }
        TxClaim::Duplicate(duplicate) => Some(duplicate),
    }
}

async fn count(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// How many effects the handler of `name` wrote.
async fn effects_of(pool: &SqlitePool, name: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM effects WHERE k = ?1")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Hides the committed record of `name`: moved to a table of its own.
/// [`unhide`] in a transaction puts it back.
async fn hide(pool: &SqlitePool, name: &str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("CREATE TABLE hidden AS SELECT * FROM idem_records WHERE idem_key = ?1")
        .bind(key(name).as_str())
        .execute(&mut *tx)
        .await
        .expect("the record copied");
    sqlx::query("DELETE FROM idem_records WHERE idem_key = ?1")
        .bind(key(name).as_str())
        .execute(&mut *tx)
        .await
        .expect("the record hidden");
    tx.commit().await.unwrap();
}

/// Puts the record [`hide`] hid back, in the transaction of `handle`: as
/// another process completing its key would, seen once it commits.
async fn unhide(handle: TxHandle) {
    let mut guard = handle.get::<TxSlot<Sqlite>>().unwrap().lock().await;
    sqlx::query("INSERT INTO idem_records SELECT * FROM hidden")
        .execute(&mut **guard.as_mut().unwrap())
        .await
        .expect("the record back, in the claim's transaction");
}

/// Claims wait in line behind an open claim: a fresh key, one dropped
/// while it waits, a key completed in the open claim's transaction (by
/// another process, as its read before the line saw it: absent), another
/// fresh key. The open claim's commit starts the first; its commit starts
/// the duplicate (the dropped claim left the line), which replays and
/// rolls back, giving the turn back; the last takes it and starts itself.
/// Two hand-offs, counted; every effect once. With a busy timeout of zero,
/// a lock let go and taken again while another connection wrote would
/// fail at once.
///
/// On a current-thread runtime: the metrics recorder is this thread's.
#[tokio::test]
async fn waiting_claims_are_started_by_the_commit_before_in_order() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (_, pool) = file(Duration::ZERO).await;
    let store = store_on(pool.clone()).await;
    assert_eq!(claim_write_commit(&store, "completed").await, None);
    hide(&pool, "completed").await;

    let holder = open(&store, "holder").await;
    write_effect(holder.handle(), "holder").await;
    unhide(holder.handle()).await;
    let mut waiting = Vec::new();
    for name in ["first-in-line", "dropped", "completed", "last-in-line"] {
        let store = store.clone();
        waiting.push(tokio::spawn(async move {
            claim_write_commit(&store, name).await
        }));
        // Each reaches the line before the next one starts.
        tokio::time::sleep(QUEUE_UP / 4).await;
    }
    let [first, dropped, completed, last] = <[_; 4]>::try_from(waiting).ok().unwrap();
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    holder.commit(&done("holder"), KEEP).await.expect("commit");

    assert_eq!(first.await.unwrap(), None, "first in line committed");
    assert_eq!(
        completed.await.unwrap(),
        Some(Duplicate::Replay(done("completed"))),
        "the completed key replays"
    );
    assert_eq!(last.await.unwrap(), None, "last in line committed");
    let relayed = scrape.render();
    assert!(
        relayed.contains("idem_sqlite_claims_relayed_total 2\n"),
        "two hand-offs: to the first in line, then to the duplicate\n{relayed}"
    );
    for name in ["completed", "holder", "first-in-line", "last-in-line"] {
        let effects = effects_of(&pool, name).await;
        assert_eq!(effects, 1, "{name}");
    }
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 4);
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM idem_records WHERE state = 'C'").await,
        4,
        "the dropped claim left nothing"
    );
}

/// A duplicate of a completed key is answered from a plain read while
/// another claim holds the turn to write, without waiting for it: with
/// the holder open past the lock timeout, a duplicate that waited for the
/// turn to read the key under the lock would be told "in flight". It
/// takes no place in the line: the holder's commit hands nothing on.
///
/// On a current-thread runtime: the metrics recorder is this thread's.
#[tokio::test]
async fn a_duplicate_of_a_completed_key_replays_while_another_claim_writes() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (_, pool) = file(Duration::ZERO).await;
    let store = SqliteStore::builder(pool.clone())
        .lock_timeout(Duration::from_millis(200))
        .build()
        .expect("a store");
    store.migrate().await.expect("migrate");
    assert_eq!(claim_write_commit(&store, "completed").await, None);

    let holder = open(&store, "holder").await;
    write_effect(holder.handle(), "holder").await;
    let duplicate = tokio::spawn({
        let store = store.clone();
        async move { claim_write_commit(&store, "completed").await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(duplicate.is_finished(), "the duplicate waited for the turn");
    assert_eq!(
        duplicate.await.unwrap(),
        Some(Duplicate::Replay(done("completed"))),
        "answered while the holder writes"
    );
    holder.commit(&done("holder"), KEEP).await.expect("commit");

    assert_eq!(effects_of(&pool, "completed").await, 1);
    assert_eq!(effects_of(&pool, "holder").await, 1);
    let relayed = scrape.render();
    assert!(
        !relayed.contains("idem_sqlite_claims_relayed_total"),
        "no claim waited in line\n{relayed}"
    );
}

/// The read before the turn waits for its connection up to the lock
/// timeout, and the turn for what is left of it: with every connection of
/// the pool taken (one by an open claim, the others by the application),
/// a duplicate is told "in flight" at the lock timeout, not held for the
/// pool's acquire timeout waiting for a connection to read on.
#[tokio::test]
async fn a_duplicate_finding_no_connection_waits_no_longer_than_the_lock_timeout() {
    let (options, first_pool) = file(Duration::from_secs(5)).await;
    first_pool.close().await;
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .expect("a SQLite file in the temp directory");
    let store = SqliteStore::builder(pool.clone())
        .lock_timeout(Duration::from_millis(200))
        .max_transactions(2)
        .build()
        .expect("a store");
    store.migrate().await.expect("migrate");
    assert_eq!(claim_write_commit(&store, "completed").await, None);

    let holder = open(&store, "holder").await;
    let mut taken = Vec::new();
    for _ in 0..3 {
        taken.push(pool.acquire().await.expect("the application's connection"));
    }
    let answered = tokio::time::timeout(Duration::from_secs(2), claim(&store, "completed")).await;
    let Ok(TxClaim::Duplicate(Duplicate::InFlight { .. })) = answered else {
        panic!("told in flight at the lock timeout: {answered:?}");
    };
    drop(taken);
    holder.commit(&done("holder"), KEEP).await.expect("commit");
    assert_eq!(
        claim_write_commit(&store, "completed").await,
        Some(Duplicate::Replay(done("completed"))),
        "replayed once connections are idle"
    );
}

/// Concurrent transactional first requests and their duplicates, from
/// tasks on a multi-thread runtime and two stores on one file (two
/// processes' worth: each passes the lock among its own claims, and meets
/// the other's at SQLite's lock): every key's handler writes once, every
/// duplicate replays it in the end, and no claim fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_across_two_stores_write_each_key_once() {
    const KEYS: usize = 24;
    const COPIES: usize = 3;
    let (options, pool) = file(Duration::from_secs(5)).await;
    let stores = [
        store_on(pool.clone()).await,
        store_on(pool_on(options).await).await,
    ];
    let ran = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for copy in 0..COPIES {
        for n in 0..KEYS {
            let store = stores[(n + copy) % 2].clone();
            let ran = Arc::clone(&ran);
            tasks.spawn(async move {
                let name = format!("key-{n}");
                loop {
                    match claim(&store, &name).await {
                        TxClaim::Open(open) => {
                            ran.fetch_add(1, Ordering::SeqCst);
                            write_effect(open.handle(), &name).await;
                            open.commit(&done(&name), KEEP).await.expect("commit");
                            return;
                        }
                        TxClaim::Duplicate(Duplicate::Replay(outcome)) => {
                            assert_eq!(outcome, done(&name));
                            return;
                        }
                        TxClaim::Duplicate(Duplicate::InFlight { .. }) => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        TxClaim::Duplicate(other) => panic!("{name}: {other:?}"),
                    }
                }
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("no claim fails or panics");
    }
    assert_eq!(ran.load(Ordering::SeqCst), KEYS, "one handler run per key");
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM (SELECT k FROM effects GROUP BY k HAVING COUNT(*) = 1)"
        )
        .await,
        KEYS as i64,
        "every key's effect once"
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM effects").await,
        KEYS as i64
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM idem_records WHERE state = 'C'").await,
        KEYS as i64
    );
}

/// The line yields to the store's other writers: a claim that commits
/// while a batch of plain writes waits for the turn hands nothing on, and
/// gives the turn back to the writers' queue, where the transactional
/// claim that queued first takes it, then the batch. Nothing is relayed,
/// and every write is done.
///
/// On a current-thread runtime: the metrics recorder is this thread's.
#[tokio::test]
async fn the_line_yields_to_a_batch_waiting_for_the_turn() {
    use idem_core::{Claim, IdempotencyStore};

    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (_, pool) = file(Duration::from_secs(5)).await;
    let store = store_on(pool.clone()).await;

    let holder = open(&store, "holder").await;
    let in_line = {
        let store = store.clone();
        tokio::spawn(async move { claim_write_commit(&store, "in-line").await })
    };
    tokio::time::sleep(QUEUE_UP / 2).await;
    let plain = {
        let store = store.clone();
        tokio::spawn(async move {
            let claim = store
                .claim(&key("plain"), &fp(), LEASE, OwnerToken::generate())
                .await
                .expect("the plain claim");
            let Claim::Acquired(owner) = claim else {
                panic!("a fresh key is acquired: {claim:?}");
            };
            store
                .complete(&key("plain"), &owner, &done("plain"), KEEP)
                .await
                .expect("the plain completion");
        })
    };
    tokio::time::sleep(QUEUE_UP / 2).await;
    holder.commit(&done("holder"), KEEP).await.expect("commit");

    assert_eq!(in_line.await.unwrap(), None, "the claim in line committed");
    plain.await.expect("the plain writes were done");
    let metrics = scrape.render();
    assert!(
        !metrics.contains("idem_sqlite_claims_relayed_total"),
        "nothing relayed past a waiting batch\n{metrics}"
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM idem_records WHERE state = 'C'").await,
        3
    );
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 1);
}

/// The lock is handed on at most four times in a row, then let go for as
/// long as the next claim takes to start on its own, so that writers
/// outside the store, which SQLite's busy handler makes try again after a
/// sleep, find it free now and then. Six claims wait behind an open one:
/// its commit and the next three hand on (four), the fourth in line's
/// does not, the fifth starts on its own and hands on to the sixth: five
/// hand-offs, every claim committed.
///
/// On a current-thread runtime: the metrics recorder is this thread's.
#[tokio::test]
async fn the_lock_is_let_go_after_four_hand_offs_in_a_row() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (_, pool) = file(Duration::from_secs(5)).await;
    let store = store_on(pool.clone()).await;

    let holder = open(&store, "holder").await;
    let mut waiting = Vec::new();
    for n in 0..6 {
        let store = store.clone();
        waiting.push(tokio::spawn(async move {
            claim_write_commit(&store, &format!("in-line-{n}")).await
        }));
        tokio::time::sleep(QUEUE_UP / 6).await;
    }
    holder.commit(&done("holder"), KEEP).await.expect("commit");
    for claim in waiting {
        assert_eq!(claim.await.unwrap(), None, "every claim in line committed");
    }
    let relayed = scrape.render();
    assert!(
        relayed.contains("idem_sqlite_claims_relayed_total 5\n"),
        "four hand-offs, the lock let go, then one more\n{relayed}"
    );
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 6);
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM idem_records WHERE state = 'C'").await,
        7
    );
}

/// With `sole_writer(true)` (nothing outside the store writes the file)
/// the lock is handed on for as long as claims wait: the same six claims
/// behind an open one make six hand-offs in a row, where the default's
/// limit makes five (the test above).
///
/// On a current-thread runtime: the metrics recorder is this thread's.
#[tokio::test]
async fn a_sole_writer_hands_the_lock_on_past_four_in_a_row() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (_, pool) = file(Duration::from_secs(5)).await;
    let store = SqliteStore::builder(pool.clone())
        .sole_writer(true)
        .build()
        .expect("a store");
    store.migrate().await.expect("migrate");

    let holder = open(&store, "holder").await;
    let mut waiting = Vec::new();
    for n in 0..6 {
        let store = store.clone();
        waiting.push(tokio::spawn(async move {
            claim_write_commit(&store, &format!("in-line-{n}")).await
        }));
        tokio::time::sleep(QUEUE_UP / 6).await;
    }
    holder.commit(&done("holder"), KEEP).await.expect("commit");
    for claim in waiting {
        assert_eq!(claim.await.unwrap(), None, "every claim in line committed");
    }
    let relayed = scrape.render();
    assert!(
        relayed.contains("idem_sqlite_claims_relayed_total 6\n"),
        "six hand-offs in a row, the lock never let go\n{relayed}"
    );
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 6);
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM idem_records WHERE state = 'C'").await,
        7
    );
}

/// Claims dropped at any moment (their requests gone), in the line, while
/// a commit starts them, in their handler or in their own commit, never
/// leave the write lock held, a connection whose transaction sqlx counts
/// wrongly, or an effect without its record. Each round a holder commits
/// while five claims wait behind it and about three of them are dropped
/// (their tasks aborted) a few random milliseconds in: one taken from the
/// line and gone before the baton reaches it has its started transaction
/// rolled back and the turn given back by the committing claim; one
/// dropped in its commit has that commit run to its end all the same (a
/// commit stopped between its COMMIT and its BEGIN left a connection that
/// failed the next claim on it: "no such savepoint"). After each round a
/// fresh claim gets the lock at once and rolls back cleanly; afterwards
/// every key has both its effect and its record, or neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_dropped_at_any_moment_leave_no_lock_and_no_half_write() {
    const ROUNDS: usize = 40;
    const WAITING: usize = 5;
    let (_, pool) = file(Duration::from_secs(5)).await;
    let store = store_on(pool.clone()).await;
    let mut seed = rand_u64();
    let mut dropped = Vec::new();
    for round in 0..ROUNDS {
        let holder_name = format!("r{round}-holder");
        let holder = open(&store, &holder_name).await;
        write_effect(holder.handle(), &holder_name).await;
        let mut waiting = Vec::new();
        for n in 0..WAITING {
            let (store, name) = (store.clone(), format!("r{round}-w{n}"));
            waiting.push((
                name.clone(),
                tokio::spawn(async move { claim_write_commit(&store, &name).await }),
            ));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let commit = tokio::spawn(async move {
            holder
                .commit(&done(&holder_name), KEEP)
                .await
                .expect("commit");
        });
        for (name, task) in &waiting {
            seed = seed.rotate_left(17).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            if seed % 5 < 3 {
                tokio::time::sleep(Duration::from_micros(seed % 3_000)).await;
                task.abort();
                dropped.push(name.clone());
            }
        }
        commit.await.expect("the holder committed");
        for (name, task) in waiting {
            match task.await {
                Ok(answer) => assert_eq!(answer, None, "{name} committed"),
                Err(err) => assert!(err.is_cancelled(), "{name}: {err}"),
            }
        }
        let after = format!("r{round}-after");
        let lock = tokio::time::timeout(Duration::from_secs(2), claim(&store, &after)).await;
        let open = match lock {
            Ok(TxClaim::Open(open)) => open,
            Ok(TxClaim::Duplicate(answer)) => {
                panic!("round {round}: a fresh key answered {answer:?}")
            }
            Err(_) => panic!("round {round}: the lock was left held"),
        };
        open.rollback().await.expect("rollback");
    }
    assert!(!dropped.is_empty(), "claims were dropped");
    for name in &dropped {
        let effects = effects_of(&pool, name).await;
        match claim(&store, name).await {
            TxClaim::Duplicate(Duplicate::Replay(outcome)) => {
                assert_eq!(outcome, done(name));
                assert_eq!(effects, 1, "{name}: a record, so its effect once");
            }
            TxClaim::Open(open) => {
                assert_eq!(effects, 0, "{name}: no record, so no effect");
                open.rollback().await.expect("rollback");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let (effects, records) = (
        count(&pool, "SELECT COUNT(*) FROM effects").await,
        count(&pool, "SELECT COUNT(*) FROM idem_records WHERE state = 'C'").await,
    );
    assert_eq!(effects, records, "an effect for every record, no more");
    assert!(records >= ROUNDS as i64, "every holder committed");
}

/// A claim whose BEGIN IMMEDIATE meets another process's writer holding
/// the write lock past the busy timeout is answered "in flight", as a lock
/// held by the key's first claim is, not with an error; it leaves no
/// transaction open, and once the writer is done the key is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_meets_a_writer_past_the_busy_timeout_is_in_flight() {
    let (options, pool) = file(Duration::from_millis(200)).await;
    let store = store_on(pool.clone()).await;
    let outside = pool_on(options).await;
    let mut writer = outside.acquire().await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut *writer)
        .await
        .unwrap();

    let answer = claim(&store, "busy").await;
    assert!(
        matches!(answer, TxClaim::Duplicate(Duplicate::InFlight { .. })),
        "{answer:?}"
    );
    sqlx::raw_sql("COMMIT").execute(&mut *writer).await.unwrap();
    assert_eq!(claim_write_commit(&store, "busy").await, None);
    assert_eq!(effects_of(&pool, "busy").await, 1);
}
