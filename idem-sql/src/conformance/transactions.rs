//! Transactional conformance cases: the claim, the business writes and the
//! outcome commit or roll back together, and a duplicate of an open
//! transaction never waits for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    NO_WAIT, TestSql, another_process, claim_and_write, claim_in_transaction, effects, fp,
    fresh_case, response,
};
use crate::SqlStore;
use idem_core::TxClaim;
use idem_core::conformance::{LONG, duplicate};
use idem_core::{Claim, Duplicate, IdempotencyStore, Outcome, OwnerToken, StoredResponse};

/// Commit makes the business write and the outcome durable together.
pub async fn commit_keeps_writes_and_outcome<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let (key, nonce) = fresh_case(&store, "tx-commit").await;
    let tx = claim_and_write(&store, &key, &nonce).await;
    assert_eq!(
        effects(store.pool(), &nonce).await,
        0,
        "not visible before commit"
    );
    tx.commit(&response(), LONG).await.unwrap();
    assert_eq!(effects(store.pool(), &nonce).await, 1);
    assert_eq!(
        duplicate(&*store, &key, &fp()).await,
        Claim::Replay(response())
    );
}

/// Rollback undoes the business write and frees the key.
pub async fn rollback_undoes_writes_and_claim<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let (key, nonce) = fresh_case(&store, "tx-rollback").await;
    claim_and_write(&store, &key, &nonce)
        .await
        .rollback()
        .await
        .unwrap();
    assert_eq!(effects(store.pool(), &nonce).await, 0);
    assert!(matches!(
        duplicate(&*store, &key, &fp()).await,
        Claim::Acquired(_)
    ));
}

/// Dropping the transaction (a panic, a cancelled request) is a rollback.
pub async fn dropped_transaction_rolls_back<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let (key, nonce) = fresh_case(&store, "tx-drop").await;
    drop(claim_and_write(&store, &key, &nonce).await);
    // The rollback of a dropped transaction runs when its connection is next
    // used; claiming again (on any connection) must find the key free.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match duplicate(&*store, &key, &fp()).await {
            Claim::Acquired(_) => break,
            other if Instant::now() > deadline => panic!("key still held: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(effects(store.pool(), &nonce).await, 0);
}

/// A dropped transaction is over before its connection serves anything
/// else: on a pool of one connection, the next claim's commit commits its
/// own write alone, never the dropped one's (which a transaction left open
/// on the pooled connection would carry into it).
pub async fn a_dropped_transaction_leaves_its_connection_clean<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    let options = store.pool().connect_options();
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(1)
        .connect_with(options.as_ref().clone())
        .await
        .expect("a pool of one connection");
    let one = SqlStore::builder(pool)
        .table(store.table())
        .build()
        .expect("the suite's table name");
    let (dropped, dropped_nonce) = fresh_case(&store, "tx-drop-clean").await;
    drop(claim_and_write(&one, &dropped, &dropped_nonce).await);
    let (next, next_nonce) = fresh_case(&store, "tx-drop-clean-next").await;
    claim_and_write(&one, &next, &next_nonce)
        .await
        .commit(&response(), LONG)
        .await
        .expect("the next claim commits");
    assert_eq!(effects(store.pool(), &next_nonce).await, 1);
    assert_eq!(
        effects(store.pool(), &dropped_nonce).await,
        0,
        "the dropped transaction's write was committed by the next claim's commit"
    );
    assert!(matches!(
        duplicate(&*store, &dropped, &fp()).await,
        Claim::Acquired(_)
    ));
}

/// A duplicate arriving while the first transaction is open is told "in
/// flight" without waiting for it to end, from this process (answered from
/// memory) and from another (a store of its own on the same table); once
/// the first has committed, both replay what it committed: one effect.
pub async fn duplicate_of_an_open_transaction_is_in_flight_then_replays<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    let (key, nonce) = fresh_case(&store, "tx-dup").await;
    let elsewhere = another_process(&store);
    let first = claim_and_write(&store, &key, &nonce).await;
    // Both answer while the first is still open: neither waited for it.
    for (who, store) in [("this process", &*store), ("another process", &elsewhere)] {
        let claim = claim_in_transaction(store, &key).await;
        assert!(
            matches!(claim, TxClaim::Duplicate(Duplicate::InFlight { .. })),
            "{who}: {claim:?}"
        );
    }
    first.commit(&response(), LONG).await.unwrap();
    for (who, store) in [("this process", &*store), ("another process", &elsewhere)] {
        match claim_in_transaction(store, &key).await {
            TxClaim::Duplicate(Duplicate::Replay(outcome)) => {
                assert_eq!(outcome, response(), "{who}");
            }
            other => panic!("{who}: expected a replay, got {other:?}"),
        }
    }
    assert_eq!(effects(store.pool(), &nonce).await, 1);
}

/// Duplicates of a completed key arriving at once from two processes (two
/// stores on one table) all replay it. A claim of a completed key holds
/// the key for a moment (PostgreSQL's advisory lock, MySQL's row lock,
/// SQLite's write lock), and a duplicate of the other process that met it
/// was told "in flight" for a key whose response it could replay (this
/// process's duplicates wait for one claim of the key instead).
pub async fn concurrent_duplicates_from_two_processes_all_replay<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    const ROUNDS: usize = 10;
    const EACH_ROUND: usize = 10;
    let (key, nonce) = fresh_case(&store, "tx-dups").await;
    let first = claim_and_write(&store, &key, &nonce).await;
    first.commit(&response(), LONG).await.unwrap();
    let elsewhere = Arc::new(another_process(&store));
    for round in 0..ROUNDS {
        let mut claims = tokio::task::JoinSet::new();
        for n in 0..EACH_ROUND {
            let store = if n % 2 == 0 {
                Arc::clone(&store)
            } else {
                Arc::clone(&elsewhere)
            };
            let key = key.clone();
            claims.spawn(async move { claim_in_transaction(&store, &key).await });
        }
        while let Some(claim) = claims.join_next().await {
            match claim.expect("a claim's task") {
                TxClaim::Duplicate(Duplicate::Replay(outcome)) => assert_eq!(outcome, response()),
                other => panic!("round {round}: expected a replay, got {other:?}"),
            }
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
    let (key, nonce) = fresh_case(&store, "tx-died").await;
    let first = claim_and_write(&store, &key, &nonce).await;
    // Dropped unfinished: sqlx rolls it back as the connection goes back
    // to the pool, on a task of its own, so the key frees a moment later,
    // with no lease to run out.
    drop(first);
    let elsewhere = another_process(&store);
    let deadline = Instant::now() + NO_WAIT;
    let retry = loop {
        match claim_in_transaction(&elsewhere, &key).await {
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
    let (key, nonce) = fresh_case(&store, "tx-timeout").await;
    let first = claim_and_write(&store, &key, &nonce).await;
    let claim = claim_in_transaction(&*store, &key).await;
    assert!(
        matches!(claim, TxClaim::Duplicate(Duplicate::InFlight { .. })),
        "{claim:?}"
    );
    first.commit(&response(), LONG).await.unwrap();
    assert_eq!(effects(store.pool(), &nonce).await, 1);
}

/// Keys and outcomes are stored as they are, whatever characters they
/// hold: quotes, backslashes, SQL, dollar quotes, NUL-free Unicode, every
/// byte value in a body. Keys that differ by one such character are
/// different keys.
pub async fn keys_and_outcomes_of_any_bytes_round_trip<DB: TestSql>(store: Arc<SqlStore<DB>>) {
    let (_, nonce) = fresh_case(&store, "tx-bytes").await;
    let body: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let outcome = idem_core::Outcome::Response(idem_core::StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        body,
    ));
    let names = [
        "it's",
        "it''s",
        "back\\slash'",
        "'); DROP TABLE idem_records; --",
        "$$ $tag$ \\x00",
        "ключ · 鍵 · 🔑",
    ];
    for name in names {
        let key = idem_core::IdempotencyKey::new("idem-test:", &format!("{nonce}:{name}"));
        let TxClaim::Open(tx) = claim_in_transaction(&*store, &key).await else {
            panic!("{name:?}: a fresh key is acquired");
        };
        tx.commit(&outcome, LONG).await.expect("committed");
        assert_eq!(
            duplicate(&*store, &key, &fp()).await,
            Claim::Replay(outcome.clone()),
            "{name:?}"
        );
        let hex: String = key.as_str().bytes().map(|b| format!("{b:02x}")).collect();
        let stored = DB::count(
            store.pool(),
            format!(
                "SELECT COUNT(*) FROM {} WHERE idem_key = {}",
                store.table(),
                DB::TEXT_FROM_HEX.replace("{hex}", &hex)
            ),
        )
        .await;
        assert_eq!(stored, 1, "{name:?}: the key stored as it is");
    }
}

/// A record whose time is up, completed or abandoned in flight, is taken
/// over by the next transactional claim: its handler runs, and what it
/// commits replaces the old record.
pub async fn an_expired_record_is_taken_over_in_a_transaction<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    let short = Duration::from_millis(300);
    let past_short = Duration::from_millis(1100);
    let again = || {
        Outcome::Response(StoredResponse::new(
            http::StatusCode::OK,
            http::HeaderMap::new(),
            "again",
        ))
    };
    // Completed, kept for `short` only.
    let (completed, nonce) = fresh_case(&store, "tx-expired").await;
    claim_and_write(&store, &completed, &nonce)
        .await
        .commit(&response(), short)
        .await
        .unwrap();
    // Claimed outside a transaction by an owner that never came back.
    let (abandoned, _) = fresh_case(&store, "tx-expired").await;
    let claim = store
        .claim(&abandoned, &fp(), short, OwnerToken::generate())
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    tokio::time::sleep(past_short).await;
    for (what, key) in [("completed", &completed), ("abandoned", &abandoned)] {
        claim_and_write(&store, key, &nonce)
            .await
            .commit(&again(), LONG)
            .await
            .unwrap_or_else(|err| panic!("{what}: the takeover commits: {err}"));
        assert_eq!(
            duplicate(&*store, key, &fp()).await,
            Claim::Replay(again()),
            "{what}"
        );
    }
    assert_eq!(effects(store.pool(), &nonce).await, 3);
}

/// Claims and commits dropped at any moment (their requests gone, a
/// timeout around them) leave the store whole: each round claims a fresh
/// key, writes its effect and commits on a task that is aborted somewhere
/// between its start and a little past the time an attempt takes.
/// After each, a fresh claim on the same pool opens and rolls back cleanly
/// (a connection left with a transaction its driver miscounts fails
/// there); at the end every key has its effect and its record together, or
/// neither and is free.
pub async fn claims_and_commits_dropped_midway_leave_the_store_whole<DB: TestSql>(
    store: Arc<SqlStore<DB>>,
) {
    const ROUNDS: u32 = 60;
    // How long an attempt takes here, to spread the drops over it.
    let (key, nonce) = fresh_case(&store, "tx-dropped-midway").await;
    let started = Instant::now();
    let tx = claim_and_write(&store, &key, &nonce).await;
    tx.commit(&response(), LONG).await.unwrap();
    let attempt_takes = started.elapsed();
    let mut cases = vec![(key, nonce)];
    for round in 0..ROUNDS {
        let (key, nonce) = fresh_case(&store, "tx-dropped-midway").await;
        let attempt = {
            let (store, key, nonce) = (Arc::clone(&store), key.clone(), nonce.clone());
            tokio::spawn(async move {
                let tx = claim_and_write(&store, &key, &nonce).await;
                tx.commit(&response(), LONG).await.unwrap();
            })
        };
        // Spread over the claim, the write and the commit, and past them.
        tokio::time::sleep(attempt_takes * (round * 37 % 100) / 80).await;
        attempt.abort();
        if let Err(err) = attempt.await {
            assert!(err.is_cancelled(), "round {round}: {err}");
        }
        let (probe, _) = fresh_case(&store, "tx-dropped-midway-probe").await;
        let TxClaim::Open(tx) = claim_in_transaction(&*store, &probe).await else {
            panic!("round {round}: a fresh key is acquired");
        };
        tx.rollback().await.expect("a clean rollback");
        cases.push((key, nonce));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (key, nonce) in cases {
        let written = effects(store.pool(), &nonce).await;
        loop {
            match duplicate(&*store, &key, &fp()).await {
                Claim::Replay(outcome) => {
                    assert_eq!(outcome, response());
                    assert_eq!(written, 1, "a record, so its effect once");
                    break;
                }
                Claim::Acquired(_) => {
                    assert_eq!(written, 0, "no record, so no effect");
                    break;
                }
                // A dropped transaction's rollback runs when its
                // connection is next used.
                other if Instant::now() > deadline => panic!("key still held: {other:?}"),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}
