//! SQLite's plain writes run in batches (`idem-sql/src/batch.rs`):
//! writes that queue while the store's turn to write is taken run together
//! when it comes, every claim in one statement and every completion in
//! another. These tests hold the turn with an open transactional claim, let
//! writes queue behind it from tasks on a multi-thread runtime, then let it
//! go, and check what each write did, what the table holds, and how much
//! the WAL grew (its autocheckpoint is off, so every committed page stays
//! in it).
#![cfg(feature = "sqlite")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_core::{
    Claim, Error, ErrorKind, Fingerprint, IdempotencyKey, Outcome, OwnerToken, StoredResponse,
};
use idem_core::{IdempotencyStore, OpenTransaction, TransactionalStore, TxClaim};
use idem_sql::SqliteStore;
use idem_sql::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use idem_sql::sqlx::{self, SqlitePool};
use tokio::task::JoinSet;

const LEASE: Duration = Duration::from_secs(30);
const KEEP: Duration = Duration::from_secs(600);
/// Long enough for spawned tasks to reach the queue behind the held turn.
const QUEUE_UP: Duration = Duration::from_millis(300);

struct Db {
    store: SqliteStore,
    pool: SqlitePool,
    path: PathBuf,
}

async fn db(name: &str) -> Db {
    let path =
        std::env::temp_dir().join(format!("idem-test-batches-{name}-{:016x}.db", rand_u64()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .pragma("wal_autocheckpoint", "0")
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .expect("a SQLite file in the temp directory");
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.expect("migrate");
    Db { store, pool, path }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new("idem-test:", name)
}

fn fp() -> Fingerprint {
    Fingerprint::from_bytes([3; 32])
}

fn done(body: &str) -> Outcome {
    Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        body.to_owned(),
    ))
}

/// Takes the store's turn to write, with a transactional claim of a key of
/// its own, until it is rolled back.
async fn hold_the_turn(store: &SqliteStore) -> Box<dyn OpenTransaction> {
    let claim = store
        .claim_in_transaction(&key("turn-holder"), &fp(), LEASE, OwnerToken::generate())
        .await
        .expect("the holder's claim");
    let TxClaim::Open(open) = claim else {
        panic!("the holder acquires: {claim:?}");
    };
    open
}

/// Bytes in the WAL file: what the commits since the last checkpoint wrote.
fn wal_bytes(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

async fn rows(pool: &SqlitePool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE state = ?1")
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A plain claim of `name` by an owner of its own.
async fn claim(store: &SqliteStore, name: &str, lease: Duration) -> Result<Claim, Error> {
    store
        .claim(&key(name), &fp(), lease, OwnerToken::generate())
        .await
}

/// Claims `{prefix}:{n}` for each `n` below `count`, one after another
/// (each a batch of its own); every claim must acquire. Their owners.
async fn acquire_each(
    store: &SqliteStore,
    prefix: &str,
    count: usize,
    lease: Duration,
) -> Vec<OwnerToken> {
    let mut owners = Vec::new();
    for n in 0..count {
        let claim = claim(store, &format!("{prefix}:{n}"), lease).await;
        let Ok(Claim::Acquired(owner)) = claim else {
            panic!("claim {prefix}:{n}: {claim:?}");
        };
        owners.push(owner);
    }
    owners
}

/// A task per name claiming it (with a lease of [`LEASE`]), each answered
/// with the name's index.
fn spawn_claims(store: &SqliteStore, names: Vec<String>) -> JoinSet<(usize, Result<Claim, Error>)> {
    let mut claims = JoinSet::new();
    for (i, name) in names.into_iter().enumerate() {
        let store = store.clone();
        claims.spawn(async move { (i, claim(&store, &name, LEASE).await) });
    }
    claims
}

/// Claims that queued behind the turn commit together: the WAL grows by a
/// fraction of what the same number of claims wrote one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_claims_commit_together() {
    const CLAIMS: usize = 32;
    let Db { store, pool, path } = db("together").await;

    // One after another: each claim is a batch, and a commit, of its own.
    let before = wal_bytes(&path);
    acquire_each(&store, "alone", CLAIMS, LEASE).await;
    let alone = wal_bytes(&path) - before;

    // Queued behind the held turn, then let go together.
    let holder = hold_the_turn(&store).await;
    let names = (0..CLAIMS).map(|n| format!("together:{n}")).collect();
    let mut claims = spawn_claims(&store, names);
    tokio::time::sleep(QUEUE_UP).await;
    let before = wal_bytes(&path);
    holder.rollback().await.expect("the holder rolls back");
    while let Some(claim) = claims.join_next().await {
        let (n, claim) = claim.expect("no claim panics");
        assert!(matches!(claim, Ok(Claim::Acquired(_))), "{n}: {claim:?}");
    }
    let together = wal_bytes(&path) - before;

    assert_eq!(
        rows(&pool, "I").await,
        2 * CLAIMS as i64,
        "every claim's row"
    );
    assert!(
        together * 4 <= alone,
        "{CLAIMS} queued claims wrote {together} bytes of WAL; one after another, {alone}"
    );
}

/// Copies of one key queued in one batch: exactly one acquires, the others
/// learn it is in flight; a completion in the same batch stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_acquires_each_key_once() {
    const KEYS: usize = 8;
    const COPIES: usize = 3;
    let Db { store, pool, .. } = db("once").await;
    let owner = acquire_each(&store, "completed", 1, LEASE).await[0];
    let completed = key("completed:0");

    let holder = hold_the_turn(&store).await;
    let names = (0..COPIES * KEYS)
        .map(|i| format!("once:{}", i % KEYS))
        .collect();
    let mut claims = spawn_claims(&store, names);
    let completion = {
        let (store, completed) = (store.clone(), completed.clone());
        tokio::spawn(async move {
            store
                .complete(&completed, &owner, &done("first"), KEEP)
                .await
        })
    };
    tokio::time::sleep(QUEUE_UP).await;
    holder.rollback().await.expect("the holder rolls back");

    let mut acquired = [0; KEYS];
    while let Some(claim) = claims.join_next().await {
        let (i, claim) = claim.expect("no claim panics");
        match claim {
            Ok(Claim::Acquired(_)) => acquired[i % KEYS] += 1,
            Ok(Claim::InFlight { .. }) => {}
            other => panic!("copy {} of key {}: {other:?}", i / KEYS, i % KEYS),
        }
    }
    assert_eq!(acquired, [1; KEYS], "one copy of each key acquires");
    completion
        .await
        .unwrap()
        .expect("the owner's completion in the batch");
    let replay = claim(&store, "completed:0", LEASE).await;
    assert_eq!(replay.ok(), Some(Claim::Replay(done("first"))));
    assert_eq!(rows(&pool, "I").await, KEYS as i64);
    assert_eq!(rows(&pool, "C").await, 1);
}

/// Completions queued behind the turn commit in one statement, each fenced
/// by its owner: the owners' complete their keys, a stale owner's is told
/// its lease is lost and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_completions_are_fenced_by_their_owners() {
    const KEYS: usize = 12;
    let Db { store, pool, .. } = db("fenced").await;
    let owners = acquire_each(&store, "fenced", KEYS, LEASE).await;

    let holder = hold_the_turn(&store).await;
    let mut completions = JoinSet::new();
    for (n, owner) in owners.into_iter().enumerate() {
        let store = store.clone();
        // Every third completion comes from a stranger to the key.
        let owner = if n % 3 == 0 {
            OwnerToken::generate()
        } else {
            owner
        };
        completions.spawn(async move {
            let completed = store
                .complete(
                    &key(&format!("fenced:{n}")),
                    &owner,
                    &done(&format!("body {n}")),
                    KEEP,
                )
                .await;
            (n, completed)
        });
    }
    tokio::time::sleep(QUEUE_UP).await;
    holder.rollback().await.expect("the holder rolls back");

    while let Some(completed) = completions.join_next().await {
        let (n, completed) = completed.expect("no completion panics");
        if n % 3 == 0 {
            let err = completed.expect_err("a stranger cannot complete");
            assert_eq!(err.kind(), ErrorKind::LeaseLost, "key {n}");
        } else {
            completed.unwrap_or_else(|err| panic!("key {n}: {err:?}"));
        }
    }
    for n in 0..KEYS {
        let claim = store
            .claim(
                &key(&format!("fenced:{n}")),
                &fp(),
                LEASE,
                OwnerToken::generate(),
            )
            .await
            .expect("the store answers");
        if n % 3 == 0 {
            assert!(
                matches!(claim, Claim::InFlight { .. }),
                "key {n}: {claim:?}"
            );
        } else {
            assert_eq!(claim, Claim::Replay(done(&format!("body {n}"))), "key {n}");
        }
    }
    assert_eq!(rows(&pool, "C").await, (KEYS - KEYS / 3) as i64);
}

/// A claim whose caller stopped waiting while it was queued is skipped: it
/// never holds the key, so the next claim of the key acquires at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_given_up_in_the_queue_holds_nothing() {
    let Db { store, pool, .. } = db("given-up").await;
    let abandoned = key("given-up");

    let holder = hold_the_turn(&store).await;
    let gave_up = tokio::time::timeout(
        QUEUE_UP,
        store.claim(&abandoned, &fp(), LEASE, OwnerToken::generate()),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the claim waits behind the turn: {gave_up:?}"
    );
    holder.rollback().await.expect("the holder rolls back");

    let claim = store
        .claim(&abandoned, &fp(), LEASE, OwnerToken::generate())
        .await;
    assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
    assert_eq!(
        rows(&pool, "I").await,
        1,
        "the key's one row, the second claim's"
    );
}

/// Claims of keys whose leases ran out, queued in one batch, take the rows
/// over; the old owners can no longer complete them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_takes_over_expired_claims() {
    const KEYS: usize = 6;
    let Db { store, pool, .. } = db("takeover").await;
    let short = Duration::from_millis(20);
    let old_owners = acquire_each(&store, "expired", KEYS, short).await;
    tokio::time::sleep(short * 3).await;

    let holder = hold_the_turn(&store).await;
    let names = (0..KEYS).map(|n| format!("expired:{n}")).collect();
    let mut claims = spawn_claims(&store, names);
    tokio::time::sleep(QUEUE_UP).await;
    holder.rollback().await.expect("the holder rolls back");
    while let Some(claim) = claims.join_next().await {
        let (n, claim) = claim.expect("no claim panics");
        assert!(
            matches!(claim, Ok(Claim::Acquired(_))),
            "key {n}: {claim:?}"
        );
    }
    for (n, owner) in old_owners.iter().enumerate() {
        let late = store
            .complete(&key(&format!("expired:{n}")), owner, &done("late"), KEEP)
            .await;
        assert_eq!(
            late.map_err(|err| err.kind()),
            Err(ErrorKind::LeaseLost),
            "key {n}"
        );
    }
    assert_eq!(rows(&pool, "I").await, KEYS as i64, "the new owners' rows");
}

/// Callers that give up at every moment of their claim's life (queued,
/// while its batch runs, with its answer sent but unread): whatever the
/// moment, no key is left held for a caller that did not learn it acquired
/// it. A claim acquired for a caller that never read the answer is released
/// in a later batch, which runs before any write queued after it is
/// answered. `select!` picks among ready branches at random, so a caller
/// whose answer and deadline are both ready sometimes drops the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_is_held_for_a_caller_that_gave_up() {
    const CALLERS: u64 = 200;
    let Db { store, pool, .. } = db("gave-up").await;

    let mut callers = JoinSet::new();
    for n in 0..CALLERS {
        let store = store.clone();
        // From 0 to 40 ms, over the whole of the callers' claims here.
        let patience = Duration::from_micros(n * 200);
        callers.spawn(async move {
            let (key, fp) = (key(&format!("patience:{n}")), fp());
            let claim = store.claim(&key, &fp, LEASE, OwnerToken::generate());
            tokio::select! {
                claim = claim => Some(claim),
                () = tokio::time::sleep(patience) => None,
            }
        });
    }
    let mut acquired = 0;
    while let Some(caller) = callers.join_next().await {
        if let Some(claim) = caller.expect("no caller panics") {
            assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
            acquired += 1;
        }
    }
    // Two writes queued after every caller is done: the releases queued
    // for callers that went are in a batch that has run when they answer.
    for last in ["last:1", "last:2"] {
        let claim = store
            .claim(&key(last), &fp(), LEASE, OwnerToken::generate())
            .await;
        assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
    }
    assert_eq!(
        rows(&pool, "I").await,
        acquired + 2,
        "rows in flight: those of callers told they acquired, and the last two"
    );
}

/// The batches write through a connection of their own, opened with the
/// pool's options: on an in-memory database (`sqlite::memory:`) that is the
/// pool's database too, so what the batches write, the pool reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_database_is_the_one_the_batches_write() {
    const KEYS: usize = 16;
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect("sqlite::memory:")
        .await
        .expect("an in-memory database");
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.expect("migrate");

    let mut requests = JoinSet::new();
    for n in 0..KEYS {
        let store = store.clone();
        requests.spawn(async move {
            let key = key(&format!("memory:{n}"));
            let claim = store
                .claim(&key, &fp(), LEASE, OwnerToken::generate())
                .await;
            let Ok(Claim::Acquired(owner)) = claim else {
                return Err(format!("claim {n}: {claim:?}"));
            };
            let done = store
                .complete(&key, &owner, &done(&format!("{n}")), KEEP)
                .await;
            done.map_err(|err| format!("completion {n}: {err}"))
        });
    }
    while let Some(request) = requests.join_next().await {
        request
            .expect("no request panics")
            .expect("claimed and completed");
    }
    assert_eq!(
        rows(&pool, "C").await,
        KEYS as i64,
        "the pool reads every record"
    );
    let replay = store
        .claim(&key("memory:3"), &fp(), LEASE, OwnerToken::generate())
        .await;
    assert_eq!(replay.ok(), Some(Claim::Replay(done("3"))));
}

/// On a current-thread runtime (`#[tokio::main(flavor = "current_thread")]`,
/// `#[tokio::test]`), whose one thread drives the timers, the batches'
/// runner still runs: concurrent claims and completions on the runtime's
/// thread all commit.
#[tokio::test]
async fn batches_run_on_a_current_thread_runtime() {
    const KEYS: usize = 24;
    let Db { store, pool, .. } = db("current-thread").await;
    let requests = (0..KEYS).map(|n| {
        let store = store.clone();
        async move {
            let name = format!("current:{n}");
            let Ok(Claim::Acquired(owner)) = claim(&store, &name, LEASE).await else {
                return Err(format!("claim {n}"));
            };
            let completed = store.complete(&key(&name), &owner, &done("ok"), KEEP).await;
            completed.map_err(|err| format!("completion {n}: {err}"))
        }
    });
    let answers = futures_util::future::join_all(requests).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(rows(&pool, "C").await, KEYS as i64);
}

/// The batches write on a connection of their own, outside the pool: with
/// every pooled connection held by someone else, a completion still
/// commits (on a pooled connection it would wait out the acquire timeout
/// and fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_need_no_pooled_connection() {
    let path = std::env::temp_dir().join(format!("idem-test-batches-own-{:016x}.db", rand_u64()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options)
        .await
        .expect("a SQLite file in the temp directory");
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.expect("migrate");
    let owner = acquire_each(&store, "own", 1, LEASE).await[0];

    let held = pool.acquire().await.expect("the pool's one connection");
    let completed = store
        .complete(&key("own:0"), &owner, &done("ok"), KEEP)
        .await;
    drop(held);
    completed.expect("completed without a pooled connection");
    assert_eq!(rows(&pool, "C").await, 1);
}
