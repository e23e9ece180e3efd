//! What the databases' modules share: a store on each database, the values
//! a case writes, and the cases more than one database runs.

use std::time::Duration;

use idem_core::{Claim, Fingerprint, IdempotencyKey, IdempotencyStore, OpenTransaction};
use idem_core::{Outcome, OwnerToken, StoredResponse, TransactionalStore, TxClaim};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;
use idem_sql::sqlx::mysql::MySqlPoolOptions;
use idem_sql::sqlx::postgres::PgPoolOptions;
use idem_sql::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use idem_sql::{MySqlStore, PgStore, SqlStore, SqliteStore, TxSlot};
use idem_test_support::{mysql_url, postgres_url, server_missing};

/// Short enough for the lock-timeout case to run quickly.
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) async fn postgres() -> Option<PgStore> {
    let url = postgres_url();
    let pool = match PgPoolOptions::new().max_connections(80).connect(&url).await {
        Ok(pool) => pool,
        Err(err) => return server_missing("PostgreSQL", &url, err),
    };
    let store = PgStore::builder(pool)
        .lock_timeout(LOCK_TIMEOUT)
        .build()
        .unwrap();
    store.migrate().await.expect("migrate");
    Some(store)
}

pub(crate) async fn mysql() -> Option<MySqlStore> {
    let url = mysql_url();
    let pool = match MySqlPoolOptions::new()
        .max_connections(80)
        .connect(&url)
        .await
    {
        Ok(pool) => pool,
        Err(err) => return server_missing("MySQL/MariaDB", &url, err),
    };
    let store = MySqlStore::builder(pool)
        .lock_timeout(LOCK_TIMEOUT)
        .build()
        .unwrap();
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A fresh SQLite file in the temp directory, named after `name`, in WAL.
pub(crate) fn sqlite_file(name: &str) -> SqliteConnectOptions {
    let path = std::env::temp_dir().join(format!("idem-test-{name}{:016x}.db", rand_u64()));
    SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
}

pub(crate) async fn sqlite() -> Option<SqliteStore> {
    let options = sqlite_file("").busy_timeout(LOCK_TIMEOUT);
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("a SQLite file in the temp directory");
    let store = SqliteStore::new(pool);
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A completed outcome: `201` with `body`.
pub(crate) fn outcome(body: impl Into<bytes::Bytes>) -> Outcome {
    Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        body,
    ))
}

/// A completed outcome: `201` with the body `done`.
pub(crate) fn done_outcome() -> Outcome {
    outcome("done")
}

pub(crate) fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// A key no other run has used: `{case}:{nonce}`.
pub(crate) fn fresh_key(case: &str) -> IdempotencyKey {
    IdempotencyKey::new("idem-test:", &format!("{case}:{:016x}", rand_u64()))
}

/// The transaction of a transactional claim of a key expected free.
pub(crate) async fn open_fresh<S: TransactionalStore>(
    store: &S,
    key: &IdempotencyKey,
    fp: &Fingerprint,
    lease: Duration,
) -> Box<dyn OpenTransaction> {
    match store
        .claim_in_transaction(key, fp, lease, OwnerToken::generate())
        .await
        .unwrap()
    {
        TxClaim::Open(tx) => tx,
        TxClaim::Duplicate(duplicate) => panic!("a fresh key is acquired: {duplicate:?}"),
    }
}

/// The errors the tasks of `tasks` ended with, once all have ended.
pub(crate) async fn failures(mut tasks: tokio::task::JoinSet<Result<(), String>>) -> Vec<String> {
    let mut failed = Vec::new();
    while let Some(result) = tasks.join_next().await {
        if let Err(err) = result.expect("no task panics") {
            failed.push(err);
        }
    }
    failed
}

/// A plain claim that waited for a transactional claim of its key (on
/// PostgreSQL the key's advisory lock, on MySQL the claim's row) holds a
/// whole lease from when it got the key. Counted from when it started,
/// its lease was over by then: a duplicate took the key at once and ran
/// the handler a second time, and the claim's renewals were refused.
pub(crate) async fn a_plain_claim_that_waited_holds_a_whole_lease<S>(store: S)
where
    S: IdempotencyStore + TransactionalStore + Clone + 'static,
{
    let key = fresh_key("waited-lease");
    let fp = Fingerprint::from_bytes([6; 32]);
    let lease = Duration::from_millis(500);
    let tx = open_fresh(&store, &key, &fp, Duration::from_secs(30)).await;
    let plain = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move { store.claim(&key, &fp, lease, OwnerToken::generate()).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !plain.is_finished(),
        "the plain claim waits for the transaction"
    );
    tx.rollback().await.unwrap();
    let Claim::Acquired(owner) = plain.await.unwrap().unwrap() else {
        panic!("the key is free once the transaction rolled back");
    };
    let duplicate = store
        .claim(&key, &fp, lease, OwnerToken::generate())
        .await
        .unwrap();
    assert!(
        matches!(duplicate, Claim::InFlight { .. }),
        "the waited claim still holds the key: {duplicate:?}"
    );
    store
        .renew(&key, &owner, lease)
        .await
        .expect("its lease is running");
}

/// Leases shorter than a claim's own round trips: a millisecond, a
/// nanosecond, and zero (which the stores take as a millisecond).
const SHORTER_THAN_A_ROUND_TRIP: [Duration; 3] = [
    Duration::from_millis(1),
    Duration::from_nanos(1),
    Duration::ZERO,
];

/// A store on `pool` with a table of its own, whose inserts the
/// statements `slow(table)` (a trigger) make last longer than a
/// millisecond.
pub(crate) async fn on_a_slow_table<DB: TestSql>(
    pool: &Pool<DB>,
    slow: impl Fn(&str) -> String,
) -> SqlStore<DB> {
    let table = format!("idem_test_slow_{:012x}", rand_u64() & 0xffff_ffff_ffff);
    let store = SqlStore::builder(pool.clone())
        .table(&table)
        .build()
        .unwrap();
    store.migrate().await.expect("migrate");
    DB::exec(pool, slow(&table)).await;
    store
}

/// Drops the store's table and its version table.
pub(crate) async fn drop_table<DB: TestSql>(store: &SqlStore<DB>) {
    let table = store.table();
    DB::exec(store.pool(), format!("DROP TABLE {table}")).await;
    DB::exec(store.pool(), format!("DROP TABLE {table}_schema")).await;
    DB::exec(store.pool(), format!("DROP TABLE IF EXISTS {table}_points")).await;
}

/// A claim whose lease is over before its own statements are (here its
/// insert is slowed down, and sixteen claim at once) still acquires its
/// fresh key: every plain claim is `Acquired`, every transactional claim
/// opens, whatever the lease, a nanosecond and zero included. On MySQL,
/// which reads its row back, the claim found its own row expired, took
/// it for another's that had gone, and after eight tries reported the
/// store unavailable ("kept changing under the claim").
pub(crate) async fn claims_shorter_than_their_round_trip_acquire<S>(store: S)
where
    S: IdempotencyStore + TransactionalStore + Clone + 'static,
{
    const CLAIMS: usize = 16;
    let fp = Fingerprint::from_bytes([3; 32]);
    for lease in SHORTER_THAN_A_ROUND_TRIP {
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..CLAIMS {
            let store = store.clone();
            tasks.spawn(async move {
                let key = fresh_key(&format!("short-lease:{n}"));
                match store.claim(&key, &fp, lease, OwnerToken::generate()).await {
                    Ok(Claim::Acquired(_)) => Ok(()),
                    other => Err(format!("{lease:?}, plain claim {n}: {other:?}")),
                }
            });
        }
        assert_eq!(failures(tasks).await, Vec::<String>::new(), "{lease:?}");
        for n in 0..2 {
            let key = fresh_key(&format!("short-lease-tx:{n}"));
            let claimed = store
                .claim_in_transaction(&key, &fp, lease, OwnerToken::generate())
                .await;
            let Ok(TxClaim::Open(tx)) = claimed else {
                panic!("{lease:?}, transactional claim {n}: {claimed:?}");
            };
            tx.rollback().await.expect("rollback");
        }
    }
}

/// A transactional claim whose handler sits idle past its lease (its
/// process paused, its connection frozen) does not hold its key for as
/// long as it is paused: the database ends its transaction with its
/// session once it has sat idle a lease (at least a second), `elsewhere`
/// (a store of another process on the same table) gets the key, and the
/// paused claim's late commit writes nothing, its own write included. A
/// handler idle less than its lease commits, and so does one idle 200 ms
/// on a lease shorter than a round trip (the bound's floor). Databases
/// that bound idle transactions only (PostgreSQL, MariaDB).
pub(crate) async fn a_transaction_idle_past_its_lease_frees_its_key<DB: TestSql>(
    store: SqlStore<DB>,
    elsewhere: SqlStore<DB>,
) {
    const TABLE: &str = "idem_test_idle";
    let pool = elsewhere.pool().clone();
    DB::exec(
        &pool,
        format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (k VARCHAR(64) NOT NULL, who VARCHAR(16) NOT NULL)"
        ),
    )
    .await;
    let lease = Duration::from_millis(1500);
    let fp = Fingerprint::from_bytes([6; 32]);
    let nonce = format!("{:016x}", rand_u64());
    let claim = |store: &SqlStore<DB>, case: &str, lease: Duration| {
        let (store, key) = (store.clone(), format!("{case}-{nonce}"));
        async move {
            let claimed = store
                .claim_in_transaction(
                    &IdempotencyKey::new("idem-test:", &key),
                    &fp,
                    lease,
                    OwnerToken::generate(),
                )
                .await
                .unwrap();
            match claimed {
                TxClaim::Open(tx) => Ok(tx),
                other => Err(other),
            }
        }
    };
    let write = |tx: &dyn OpenTransaction, case: &str, who: &str| {
        let handle = tx.handle();
        let sql = format!("INSERT INTO {TABLE} (k, who) VALUES ('{case}-{nonce}', '{who}')");
        async move {
            let mut guard = handle.get::<TxSlot<DB>>().unwrap().lock().await;
            DB::exec_on(guard.as_mut().unwrap(), sql).await;
        }
    };
    let rows = |case: &str, who: &str| {
        let sql =
            format!("SELECT COUNT(*) FROM {TABLE} WHERE k = '{case}-{nonce}' AND who = '{who}'");
        let pool = pool.clone();
        async move { DB::count(&pool, sql).await }
    };
    let kept = Duration::from_secs(60);

    // Idle for less than its lease: kept.
    let tx = claim(&store, "short", lease).await.unwrap();
    write(&*tx, "short", "first").await;
    tokio::time::sleep(lease / 2).await;
    tx.commit(&outcome("kept"), kept)
        .await
        .expect("a handler idle less than its lease commits");
    assert_eq!(rows("short", "first").await, 1);

    // A lease shorter than a round trip still leaves the handler a second.
    let tx = claim(&store, "tiny", Duration::from_nanos(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    write(&*tx, "tiny", "first").await;
    tx.commit(&outcome("tiny"), kept)
        .await
        .expect("a claim of a nanosecond's lease, idle 200 ms, commits");
    assert_eq!(rows("tiny", "first").await, 1);

    // Paused past it: another process takes the key within about a lease.
    let paused = claim(&store, "long", lease).await.unwrap();
    write(&*paused, "long", "first").await;
    let started = std::time::Instant::now();
    let taken = loop {
        match claim(&elsewhere, "long", lease).await {
            Ok(taken) => break taken,
            Err(TxClaim::Duplicate(idem_core::Duplicate::InFlight { .. })) => {
                assert!(
                    started.elapsed() < lease * 4,
                    "the paused claim still holds its key after {:?}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("{other:?}"),
        }
    };
    let waited = started.elapsed();
    eprintln!("the key was free {waited:?} after the paused claim's last statement");
    assert!(
        waited >= lease / 2,
        "taken over after {waited:?}, before a lease idle"
    );
    write(&*taken, "long", "second").await;
    taken
        .commit(&outcome("second"), kept)
        .await
        .expect("the second commits");
    let late = paused.commit(&outcome("late"), kept).await;
    assert!(late.is_err(), "the paused claim's late commit: {late:?}");
    assert_eq!(
        rows("long", "first").await,
        0,
        "the paused claim's write kept"
    );
    assert_eq!(rows("long", "second").await, 1);
}
