//! The store and transactional conformance suites against real PostgreSQL,
//! MariaDB/MySQL and SQLite. Server URLs come from the environment:
//! `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`; SQLite uses a fresh file
//! under the system temp directory.
#![cfg(all(
    feature = "test-util",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]

use std::time::Duration;

use idem_core::conformance::{mysql_url, postgres_url, server_missing};
use idem_sql::sqlx::mysql::MySqlPoolOptions;
use idem_sql::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_sql::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use idem_sql::{MySqlStore, PgStore, SqliteStore, TxSlot};

/// Short enough for the lock-timeout case to run quickly.
const LOCK_TIMEOUT: Duration = Duration::from_secs(1);

async fn postgres() -> Option<PgStore> {
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

async fn mysql() -> Option<MySqlStore> {
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
fn sqlite_file(name: &str) -> SqliteConnectOptions {
    let path = std::env::temp_dir().join(format!("idem-test-{name}{:016x}.db", rand_u64()));
    SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
}

async fn sqlite() -> Option<SqliteStore> {
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

/// A completed outcome: `201` with the body `done`.
fn done_outcome() -> idem_core::Outcome {
    idem_core::Outcome::Response(idem_core::StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "done",
    ))
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

mod postgres {
    idem_core::store_conformance_tests!(super::postgres());
    idem_sql::transactional_conformance_tests!(super::postgres());
}

mod mysql {
    idem_core::store_conformance_tests!(super::mysql());
    idem_sql::transactional_conformance_tests!(super::mysql());
}

mod sqlite {
    idem_core::store_conformance_tests!(super::sqlite());
    idem_sql::transactional_conformance_tests!(super::sqlite());
}

/// MariaDB: a transactional claim runs with no lock wait, which is a session
/// variable of the pooled connection. Every path must set it back: here a
/// duplicate told "in flight" leaves its (only) connection waiting the
/// store's lock timeout again, for the next user of the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claims_leave_the_pooled_lock_wait_as_configured() {
    use idem_core::Duplicate;
    use idem_core::{Fingerprint, IdempotencyKey, OwnerToken};
    use idem_core::{TransactionalStore, TxClaim};

    let Some(first) = mysql().await else { return };
    let url = mysql_url();
    let one = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("MariaDB");
    let elsewhere = MySqlStore::builder(one.clone())
        .lock_timeout(Duration::from_secs(7))
        .build()
        .unwrap();
    let key = IdempotencyKey::new("idem-test:", &format!("lock-wait:{:016x}", rand_u64()));
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

/// SQLite: the store's own writes in one process take turns instead of
/// meeting SQLite's busy handler. With `busy_timeout` zero, any write that
/// found another connection writing would fail at once with `SQLITE_BUSY`;
/// concurrent first requests on distinct keys, plain and transactional, on
/// a pool of 8 from two threads, must all claim and complete, each with
/// exactly one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writes_of_one_store_take_turns_instead_of_failing_busy() {
    use idem_core::{Claim, Fingerprint, IdempotencyKey, OwnerToken};
    use idem_core::{IdempotencyStore, TransactionalStore, TxClaim};
    use idem_sql::sqlx::{self, Sqlite};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

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
    let mut failed = Vec::new();
    while let Some(result) = tasks.join_next().await {
        if let Err(err) = result.expect("no task panics") {
            failed.push(err);
        }
    }
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

/// SQLite: a transactional claim waiting for the turn to write holds no
/// connection: it takes one when its turn comes from the writers' queue,
/// or is handed the committing claim's with its transaction begun
/// (`relay.rs`). While one claim's handler runs and others queue behind
/// it, that claim's connection is the only one in use, the rest of the
/// pool free for reads, and every queued claim then commits in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_transactional_claims_waiting_for_their_turn_hold_no_connection() {
    use idem_core::{Fingerprint, IdempotencyKey, OwnerToken};
    use idem_core::{TransactionalStore, TxClaim};
    use idem_sql::sqlx;

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
    let mut failed = Vec::new();
    while let Some(result) = queued.join_next().await {
        if let Err(err) = result.expect("no task panics") {
            failed.push(err);
        }
    }
    assert_eq!(
        failed,
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

/// PostgreSQL: a transactional claim holds its key by an advisory lock and
/// writes its record once, completed, at commit. While it is open nothing
/// is in the table (a crash leaves nothing behind), another process's
/// transactional claim is told "in flight" and a plain claim waits, then
/// replays; a live record that got into the table meanwhile makes the
/// commit fail, with none of its writes; an expired record is taken over.
/// A plain claim that waited for a transactional claim of its key (on
/// PostgreSQL the key's advisory lock, on MySQL the claim's row) holds a
/// whole lease from when it got the key. Counted from when it started,
/// its lease was over by then: a duplicate took the key at once and ran
/// the handler a second time, and the claim's renewals were refused.
async fn a_plain_claim_that_waited_holds_a_whole_lease<S>(store: S)
where
    S: idem_core::IdempotencyStore + idem_core::TransactionalStore + Clone + 'static,
{
    use idem_core::{Claim, Fingerprint, IdempotencyKey, OwnerToken, TxClaim};

    let key = IdempotencyKey::new("idem-test:", &format!("waited-lease:{:016x}", rand_u64()));
    let fp = Fingerprint::from_bytes([6; 32]);
    let lease = Duration::from_millis(500);
    let TxClaim::Open(tx) = store
        .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_plain_claim_that_waited_holds_a_whole_lease() {
    if let Some(store) = postgres().await {
        a_plain_claim_that_waited_holds_a_whole_lease(store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_plain_claim_that_waited_holds_a_whole_lease() {
    if let Some(store) = mysql().await {
        a_plain_claim_that_waited_holds_a_whole_lease(store).await;
    }
}

/// Lock timeouts outside what PostgreSQL takes are brought within it: 30
/// days (over its largest, about 24.8) made every transactional claim fail
/// (`set_config` refused it), and zero meant waiting for ever on a row
/// lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lock_timeouts_out_of_range_are_brought_within_it() {
    use idem_core::{Fingerprint, IdempotencyKey, OwnerToken, TransactionalStore, TxClaim};
    use idem_sql::sqlx::{self, Postgres};

    let Some(shared) = postgres().await else {
        return;
    };
    let pool = shared.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_pg_locked (k TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let row = format!("locked-{:016x}", rand_u64());
    sqlx::query("INSERT INTO idem_test_pg_locked (k) VALUES ($1)")
        .bind(&row)
        .execute(&pool)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT k FROM idem_test_pg_locked WHERE k = $1 FOR UPDATE")
        .bind(&row)
        .execute(&mut *holder)
        .await
        .unwrap();
    let fp = Fingerprint::from_bytes([8; 32]);
    let open = |timeout: Duration| {
        let (pool, row) = (pool.clone(), row.clone());
        async move {
            let store = PgStore::builder(pool)
                .lock_timeout(timeout)
                .build()
                .unwrap();
            let key = IdempotencyKey::new("idem-test:", &format!("{row}:{}", timeout.as_secs()));
            match store
                .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
                .await
                .unwrap_or_else(|err| panic!("{timeout:?}: {err}"))
            {
                TxClaim::Open(tx) => tx,
                TxClaim::Duplicate(duplicate) => panic!("a fresh key: {duplicate:?}"),
            }
        }
    };

    // Thirty days: the claim's transaction opens.
    open(Duration::from_secs(30 * 86_400))
        .await
        .rollback()
        .await
        .unwrap();

    // Zero: the handler's statement on a row locked elsewhere times out.
    let tx = open(Duration::ZERO).await;
    let handle = tx.handle();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
        sqlx::query("UPDATE idem_test_pg_locked SET k = k WHERE k = $1")
            .bind(&row)
            .execute(&mut **guard.as_mut().unwrap())
            .await
    })
    .await;
    let err = waited
        .expect("a zero lock timeout does not wait for ever")
        .expect_err("the row is locked elsewhere");
    assert!(err.to_string().contains("lock timeout"), "{err}");
    tx.rollback().await.unwrap();
    holder.rollback().await.unwrap();
}

/// A prepare that failed partway (here the table was not migrated yet:
/// the lock's statement was prepared, the read's refused) leaves its first
/// statements on the connection, outliving the rollback. The next claim
/// there prepares the ones missing: preparing all of them again was
/// refused ("already exists"), and every transactional claim on that
/// connection failed until it closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_prepare_that_failed_partway_is_finished_later() {
    use idem_core::{Fingerprint, IdempotencyKey, OwnerToken, TransactionalStore, TxClaim};
    use idem_sql::sqlx;

    let url = postgres_url();
    let pool = match PgPoolOptions::new().max_connections(1).connect(&url).await {
        Ok(pool) => pool,
        Err(err) => return server_missing("PostgreSQL", &url, err).unwrap_or(()),
    };
    let table = format!("idem_test_partway_{:016x}", rand_u64());
    let store = PgStore::builder(pool).table(&table).build().unwrap();
    let key = IdempotencyKey::new("idem-test:", "partway");
    let fp = Fingerprint::from_bytes([7; 32]);
    let lease = Duration::from_secs(30);
    let before = store
        .claim_in_transaction(&key, &fp, lease, OwnerToken::generate())
        .await;
    assert!(before.is_err(), "no table yet: {before:?}");

    store.migrate().await.expect("migrate");
    let claimed = store
        .claim_in_transaction(&key, &fp, lease, OwnerToken::generate())
        .await
        .expect("the same connection claims once the table is there");
    let TxClaim::Open(tx) = claimed else {
        panic!("a fresh key is acquired: {claimed:?}");
    };
    tx.rollback().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {table}; DROP TABLE IF EXISTS {table}_schema"
    )))
    .execute(store.pool())
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transactional_claims_write_their_record_at_commit() {
    use idem_core::{Claim, Duplicate, Fingerprint, IdempotencyKey, Outcome, OwnerToken};
    use idem_core::{IdempotencyStore, OpenTransaction, TransactionalStore, TxClaim};
    use idem_core::{StoredResponse, conformance::postgres_url};
    use idem_sql::sqlx::{self, Postgres};

    let Some(store) = postgres().await else {
        return;
    };
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_pg_effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let elsewhere = PgStore::builder(
        PgPoolOptions::new()
            .max_connections(4)
            .connect(&postgres_url())
            .await
            .unwrap(),
    )
    .build()
    .unwrap();
    let run = rand_u64();
    let key =
        |name: &str| IdempotencyKey::new("idem-test:", &format!("pg-at-commit:{run:016x}:{name}"));
    let fp = Fingerprint::from_bytes([5; 32]);
    let lease = Duration::from_secs(30);
    let outcome = |body: &'static str| {
        Outcome::Response(StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            body,
        ))
    };
    let open = |store: &PgStore, key: &IdempotencyKey| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .claim_in_transaction(&key, &fp, lease, OwnerToken::generate())
                .await
                .expect("PostgreSQL answers")
        }
    };
    let write = |tx: &dyn OpenTransaction, effect: String| {
        let handle = tx.handle();
        async move {
            let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
            sqlx::query("INSERT INTO idem_test_pg_effects (k) VALUES ($1)")
                .bind(effect)
                .execute(&mut **guard.as_mut().unwrap())
                .await
                .expect("the effect, in the claim's transaction");
        }
    };
    // `SELECT COUNT(*) ... WHERE {column} = $1`, on the pool.
    let count = |sql: &'static str, value: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(value)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let rows = |key: &IdempotencyKey| {
        count(
            "SELECT COUNT(*) FROM idem_records WHERE idem_key = $1",
            key.as_str().to_owned(),
        )
    };
    let effects = |effect: String| {
        count(
            "SELECT COUNT(*) FROM idem_test_pg_effects WHERE k = $1",
            effect,
        )
    };

    // Open: no record yet, another process told "in flight"; committed: one
    // completed record, replayed.
    let first = key("first");
    let TxClaim::Open(tx) = open(&store, &first).await else {
        panic!("a fresh key is acquired");
    };
    write(&*tx, format!("{run}-first")).await;
    {
        // Seen from inside the transaction itself.
        let handle = tx.handle();
        let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
        let inside: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE idem_key = $1")
                .bind(first.as_str())
                .fetch_one(&mut **guard.as_mut().unwrap())
                .await
                .unwrap();
        assert_eq!(inside, 0, "nothing written before the commit");
    }
    let duplicate = open(&elsewhere, &first).await;
    assert!(
        matches!(duplicate, TxClaim::Duplicate(Duplicate::InFlight { .. })),
        "{duplicate:?}"
    );
    tx.commit(&outcome("first"), lease).await.expect("commit");
    assert_eq!(rows(&first).await, 1);
    assert_eq!(effects(format!("{run}-first")).await, 1);
    let replay = elsewhere
        .claim(&first, &fp, lease, OwnerToken::generate())
        .await
        .unwrap();
    assert_eq!(replay, Claim::Replay(outcome("first")));

    // A plain claim of the key while the transaction is open waits for it
    // (the advisory lock, shared), then replays what it committed.
    let waited = key("waited");
    let TxClaim::Open(tx) = open(&store, &waited).await else {
        panic!("a fresh key is acquired");
    };
    write(&*tx, format!("{run}-waited")).await;
    let plain = tokio::spawn({
        let (elsewhere, waited) = (elsewhere.clone(), waited.clone());
        async move {
            elsewhere
                .claim(&waited, &fp, lease, OwnerToken::generate())
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !plain.is_finished(),
        "the plain claim waits for the transaction"
    );
    tx.commit(&outcome("waited"), lease).await.expect("commit");
    assert_eq!(
        plain.await.unwrap().unwrap(),
        Claim::Replay(outcome("waited"))
    );
    assert_eq!(effects(format!("{run}-waited")).await, 1);

    // The unique index is the last word: a live record that got into the
    // table meanwhile, by any path, makes the commit fail, and none of the
    // transaction's writes stay.
    let raced = key("raced");
    let TxClaim::Open(tx) = open(&store, &raced).await else {
        panic!("a fresh key is acquired");
    };
    write(&*tx, format!("{run}-raced")).await;
    sqlx::query(
        "INSERT INTO idem_records (key_hash, idem_key, state, owner, fingerprint, expires_at) \
         VALUES ($1, $2, 'I', $3, $4, now() + interval '1 minute')",
    )
    .bind(&blake3::hash(raced.as_str().as_bytes()).as_bytes()[..])
    .bind(raced.as_str())
    .bind(&OwnerToken::generate().as_bytes()[..])
    .bind(&fp.as_bytes()[..])
    .execute(&pool)
    .await
    .expect("a live record written past the store");
    assert!(tx.commit(&outcome("tx"), lease).await.is_err(), "refused");
    assert_eq!(effects(format!("{run}-raced")).await, 0, "rolled back");

    // An expired record is taken over at commit.
    let expired = key("expired");
    let Claim::Acquired(owner) = store
        .claim(&expired, &fp, lease, OwnerToken::generate())
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    store
        .complete(&expired, &owner, &outcome("old"), Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let TxClaim::Open(tx) = open(&store, &expired).await else {
        panic!("an expired key is acquired");
    };
    tx.commit(&outcome("new"), lease).await.expect("takes over");
    assert_eq!(rows(&expired).await, 1);
    let replay = store
        .claim(&expired, &fp, lease, OwnerToken::generate())
        .await
        .unwrap();
    assert_eq!(replay, Claim::Replay(outcome("new")));
}

/// SQLite's transactional completion and COMMIT go in one script whose
/// guard fails unless the completed record was written: a claim that
/// finds a live record of its key in the way at commit (here written
/// through its own transaction) commits nothing, its effect included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_commit_over_a_live_record_commits_nothing() {
    use idem_core::{Fingerprint, IdempotencyKey, OwnerToken, TransactionalStore, TxClaim};
    use idem_sql::sqlx::{self, Sqlite};

    let Some(store) = sqlite().await else { return };
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_fence_effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let effect = format!("fence-{:016x}", rand_u64());
    let key = IdempotencyKey::new("idem-test:", &effect);
    let TxClaim::Open(tx) = store
        .claim_in_transaction(
            &key,
            &Fingerprint::from_bytes([6; 32]),
            Duration::from_secs(30),
            OwnerToken::generate(),
        )
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
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

/// The transactional scripts' statements are prepared on each connection
/// by the first claim that finds them missing. Deallocated between two
/// requests (`DEALLOCATE ALL`, as a pooler in front of PostgreSQL may run
/// it, with sqlx's own statement cache off), they are prepared again by the
/// next claim; deallocated by a handler inside its own transaction, the
/// commit fails and nothing of the handler's is kept: the key is free and
/// its retry commits once. Statements another version of the store left in
/// the session do not stand in the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statements_deallocated_are_prepared_again() {
    use idem_core::conformance::postgres_url;
    use idem_core::{Claim, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};
    use idem_core::{StoredResponse, TransactionalStore, TxClaim};
    use idem_sql::sqlx::{self, Postgres};

    if postgres().await.is_none() {
        return;
    }
    // One connection: every claim meets the statements the last one left.
    // sqlx's own statements unnamed, as behind a pooler, so that they
    // outlive `DEALLOCATE ALL`.
    let options = postgres_url()
        .parse::<PgConnectOptions>()
        .unwrap()
        .statement_cache_capacity(0);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let store = PgStore::builder(pool.clone())
        .max_transactions(1)
        .build()
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_pg_effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let run = rand_u64();
    let fp = Fingerprint::from_bytes([6; 32]);
    let outcome = Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "kept",
    ));
    let key = move |name: &str| {
        IdempotencyKey::new("idem-test:", &format!("pg-prepare:{run:016x}:{name}"))
    };
    // Claims `name`, writes its effect and, if asked, deallocates every
    // statement of the session in the same transaction; then commits.
    let attempt = |name: &'static str, deallocate: bool| {
        let (store, outcome) = (store.clone(), outcome.clone());
        async move {
            let key = key(name);
            let claim = store
                .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
                .await
                .expect("PostgreSQL answers");
            let TxClaim::Open(tx) = claim else {
                panic!("{name}: expected to acquire, got {claim:?}");
            };
            {
                let handle = tx.handle();
                let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
                let conn = &mut **guard.as_mut().unwrap();
                sqlx::query("INSERT INTO idem_test_pg_effects (k) VALUES ($1)")
                    .bind(format!("{run}-{name}"))
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                if deallocate {
                    sqlx::raw_sql("DEALLOCATE ALL")
                        .execute(&mut *conn)
                        .await
                        .unwrap();
                }
            }
            tx.commit(&outcome, Duration::from_secs(60)).await
        }
    };
    let effects = |name: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM idem_test_pg_effects WHERE k = $1")
                .bind(format!("{run}-{name}"))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };

    // Another version of the store, sharing the session (as through a
    // pooler during an upgrade), left statements of its own under the names
    // this one would use without its generation in them.
    sqlx::raw_sql(
        "PREPARE idem_lock_idem_records AS SELECT 1; \
         PREPARE idem_read_idem_records (bytea) AS SELECT 2; \
         PREPARE idem_insert_idem_records (bytea, text) AS SELECT 3",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Prepared by the first claim, then deallocated between requests.
    attempt("before", false).await.expect("committed");
    sqlx::raw_sql("DEALLOCATE ALL")
        .execute(&pool)
        .await
        .unwrap();
    attempt("after", false)
        .await
        .expect("committed, the statements prepared again");
    assert_eq!((effects("before").await, effects("after").await), (1, 1));

    // Deallocated inside the handler's transaction: nothing kept.
    attempt("inside", true)
        .await
        .expect_err("the commit finds its statement gone");
    assert_eq!(
        effects("inside").await,
        0,
        "the handler's write rolled back"
    );
    // The key is free, and its retry commits once and replays.
    attempt("inside", false).await.expect("the retry commits");
    assert_eq!(effects("inside").await, 1);
    assert_eq!(
        store
            .claim(
                &key("inside"),
                &fp,
                Duration::from_secs(30),
                OwnerToken::generate()
            )
            .await
            .unwrap(),
        Claim::Replay(outcome.clone())
    );
}

/// The transactional scripts write bytes as escape strings (`E'\\x…'`),
/// which read the same whatever the session's
/// `standard_conforming_strings` says: with it off (where a plain `'\x…'`
/// would lose its backslash), keys and bodies full of backslashes and
/// quotes still round-trip as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_scripts_read_the_same_without_standard_conforming_strings() {
    use idem_core::conformance::postgres_url;
    use idem_core::{Claim, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};
    use idem_core::{StoredResponse, TransactionalStore, TxClaim};
    use idem_sql::sqlx;

    if postgres().await.is_none() {
        return;
    }
    let options = postgres_url()
        .parse::<PgConnectOptions>()
        .unwrap()
        .options([("standard_conforming_strings", "off")]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let setting: String = sqlx::query_scalar("SHOW standard_conforming_strings")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(setting, "off");
    let store = PgStore::new(pool);
    let fp = Fingerprint::from_bytes([8; 32]);
    let body: Vec<u8> = b"\\x41 \\\\ '' \\' "
        .iter()
        .copied()
        .chain(0..=255u8)
        .collect();
    let outcome = Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        body,
    ));
    let key = IdempotencyKey::new(
        "idem-test:",
        &format!(r"pg-scs-off:{:016x}:\x41\\'", rand_u64()),
    );
    let TxClaim::Open(tx) = store
        .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    tx.commit(&outcome, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        store
            .claim(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome)
    );
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE idem_key = $1")
        .bind(key.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 1, "the key stored as it is");
}

/// A MySQL transactional commit completes the claim's row, checks that it
/// did, and commits, in one text query (`mysql/script.rs`). If the row is
/// no longer the claim's (here the handler deleted it through `Tx`,
/// something past the store), the check fails the query before its
/// COMMIT: the commit is refused as fenced and none of the handler's
/// writes stay.
#[tokio::test]
async fn mysql_transactional_commit_over_a_row_not_its_own_commits_nothing() {
    use idem_core::{Fingerprint, IdempotencyKey, Outcome, OwnerToken, StoredResponse};
    use idem_core::{TransactionalStore, TxClaim};
    use idem_sql::sqlx::{self, MySql};

    let Some(store) = mysql().await else {
        return;
    };
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_mysql_effects (k VARCHAR(255) NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let name = format!("mysql-fenced-commit:{:016x}", rand_u64());
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
