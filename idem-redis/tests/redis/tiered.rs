//! The tiered store (Redis gate, PostgreSQL truth) against real servers:
//! the conformance suite, answers from Redis alone, SQL catching what Redis
//! lost, and a Redis outage in the middle of traffic.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Claim, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken};
use idem_redis::RedisStore;
use idem_redis::tiered::{BreakerState, TieredStore};
use idem_sql::PgStore;
use idem_sql::sqlx::postgres::PgPoolOptions;
use idem_test_support::{postgres_url, redis::RedisServer, redis_url, server_missing};
use redis::aio::ConnectionManager;

type Tiered = TieredStore<ConnectionManager, PgStore>;

async fn truth() -> Option<PgStore> {
    let url = postgres_url();
    let pool = match PgPoolOptions::new().max_connections(80).connect(&url).await {
        Ok(pool) => pool,
        Err(err) => return server_missing("PostgreSQL", &url, err),
    };
    let store = PgStore::new(pool);
    store.migrate().await.expect("migrate");
    Some(store)
}

async fn gate(url: &str) -> Option<RedisStore<ConnectionManager>> {
    let client = redis::Client::open(url).expect("a Redis URL");
    match client.get_connection_manager().await {
        Ok(conn) => Some(RedisStore::new(conn)),
        Err(err) => server_missing("Redis", url, err),
    }
}

/// The shared Redis in front of the shared PostgreSQL.
async fn tiered() -> Option<Tiered> {
    let url = redis_url();
    Some(TieredStore::new(gate(&url).await?, truth().await?))
}

mod conformance {
    idem_core::store_conformance_tests!(super::tiered());
}

fn key(case: &str) -> IdempotencyKey {
    IdempotencyKey::new(
        "idem-test:",
        &format!("{case}:{:016x}", rand::random::<u64>()),
    )
}

const FP: Fingerprint = Fingerprint::from_bytes([4; 32]);
const LONG: Duration = Duration::from_secs(60);

async fn first_then_complete(store: &Tiered, key: &IdempotencyKey) -> Outcome {
    let owner = OwnerToken::generate();
    assert_eq!(
        store.claim(key, &FP, LONG, owner).await.unwrap(),
        Claim::Acquired(owner)
    );
    let outcome = Outcome::NotReplayable;
    store.complete(key, &owner, &outcome, LONG).await.unwrap();
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_of_a_completed_request_are_answered_by_redis_alone() {
    let Some(store) = tiered().await else { return };
    let key = key("gate-answers");
    let outcome = first_then_complete(&store, &key).await;
    let before = store.counters().snapshot();
    for _ in 0..5 {
        let claim = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
        assert_eq!(claim.unwrap(), Claim::Replay(outcome.clone()));
    }
    let after = store.counters().snapshot();
    assert_eq!(after.answered_by_gate - before.answered_by_gate, 5);
    assert_eq!(after.fallback_caught, before.fallback_caught);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_catches_what_redis_lost_and_rewarms_the_gate() {
    let Some(store) = tiered().await else { return };
    let key = key("fallback");
    let outcome = first_then_complete(&store, &key).await;
    // Redis loses the record: eviction, expiry, failover.
    store.gate().forget(&key).await.unwrap();

    let before = store.counters().snapshot();
    let claim = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
    assert_eq!(
        claim.unwrap(),
        Claim::Replay(outcome.clone()),
        "SQL's answer"
    );
    let caught = store.counters().snapshot();
    assert_eq!(caught.fallback_caught - before.fallback_caught, 1);

    let claim = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
    assert_eq!(claim.unwrap(), Claim::Replay(outcome));
    let rewarmed = store.counters().snapshot();
    assert_eq!(
        rewarmed.answered_by_gate - caught.answered_by_gate,
        1,
        "the gate answers again"
    );
    assert_eq!(rewarmed.fallback_caught, caught.fallback_caught);
}

/// Found by the model checker (`verify/`): the first request committed, its
/// gate record is gone (expired before the gate's completion, evicted, lost
/// in a failover), and a request reusing the key with another body claimed
/// the gate meanwhile. The first's retry must be replayed from SQL, not
/// refused by the gate's record of a request SQL will refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_of_a_committed_request_is_replayed_while_another_body_holds_the_gate() {
    let url = redis_url();
    let Some(gate_store) = gate(&url).await else {
        return;
    };
    let Some(truth) = truth().await else { return };
    let store = TieredStore::new(gate_store.clone(), truth);
    let key = key("gate-mismatch");
    let outcome = first_then_complete(&store, &key).await;

    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(key.as_str())
        .query_async(&mut redis)
        .await
        .unwrap();
    let other = Fingerprint::from_bytes([9; 32]);
    let intruder = OwnerToken::generate();
    assert_eq!(
        gate_store
            .claim(&key, &other, LONG, intruder)
            .await
            .unwrap(),
        Claim::Acquired(intruder),
        "the other body holds the gate"
    );

    let retry = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
    assert_eq!(retry.unwrap(), Claim::Replay(outcome), "SQL's answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_in_process_cache_answers_without_a_network_trip() {
    let Some(gate) = gate(&redis_url()).await else {
        return;
    };
    let Some(truth) = truth().await else { return };
    let store = TieredStore::builder(gate, truth)
        .cache(1_000, Duration::from_secs(5))
        .build();
    let key = key("cache");
    first_then_complete(&store, &key).await;
    let _ = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
    let before = store.counters().snapshot();
    for _ in 0..3 {
        let claim = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
        assert!(matches!(claim.unwrap(), Claim::Replay(_)));
    }
    let mismatch = store
        .claim(
            &key,
            &Fingerprint::from_bytes([9; 32]),
            LONG,
            OwnerToken::generate(),
        )
        .await;
    assert_eq!(mismatch.unwrap(), Claim::Mismatch);
    let after = store.counters().snapshot();
    assert_eq!(after.cache_hits - before.cache_hits, 4);
    assert_eq!(after.answered_by_gate, before.answered_by_gate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_outage_degrades_to_sql_and_recovers_without_a_restart() {
    let Some(mut server) = RedisServer::start(&[]) else {
        return;
    };
    let Some(gate) = gate(&server.url()).await else {
        return;
    };
    let Some(truth) = truth().await else { return };
    let store = Arc::new(
        TieredStore::builder(gate, truth)
            .gate_timeout(Duration::from_millis(100))
            .breaker(2, Duration::from_millis(300))
            .build(),
    );

    let warm = key("outage-warm");
    first_then_complete(&store, &warm).await;

    server.stop();
    // Exactly once with Redis gone: each key runs once, duplicates replay.
    for i in 0..6 {
        let key = key(&format!("outage-{i}"));
        let outcome = first_then_complete(&store, &key).await;
        let again = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
        assert_eq!(again.unwrap(), Claim::Replay(outcome));
    }
    let down = store.counters().snapshot();
    assert!(down.degraded >= 12, "{down:?}");
    assert!(down.breaker_opened >= 1, "{down:?}");
    assert_ne!(store.breaker_state(), BreakerState::Closed);

    server.restart();
    // The breaker probes again after its pause, and closes on a success.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.breaker_state() != BreakerState::Closed {
        assert!(
            std::time::Instant::now() < deadline,
            "the gate never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = store.claim(&warm, &FP, LONG, OwnerToken::generate()).await;
    }
    let up = store.counters().snapshot();
    assert!(up.breaker_recovered >= 1, "{up:?}");

    // And the gate is in use again: a fresh key's duplicates come from Redis.
    let key = key("outage-after");
    first_then_complete(&store, &key).await;
    let before = store.counters().snapshot();
    let again = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
    assert!(matches!(again.unwrap(), Claim::Replay(_)));
    assert_eq!(
        store.counters().snapshot().answered_by_gate - before.answered_by_gate,
        1
    );
}

/// SQL's completion landed but its answer was lost (here it is completed
/// behind the tiered store's back), and the retry of the completion is told
/// the lease is lost: the gate's in-flight record of the claim goes, so a
/// duplicate asks SQL and is replayed, not told "in flight" for a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_sql_took_unheard_leaves_the_gate_to_sql() {
    let Some(store) = tiered().await else { return };
    let key = key("completion-unheard");
    let owner = OwnerToken::generate();
    assert_eq!(
        store.claim(&key, &FP, LONG, owner).await.unwrap(),
        Claim::Acquired(owner)
    );
    let outcome = Outcome::NotReplayable;
    store
        .truth()
        .complete(&key, &owner, &outcome, LONG)
        .await
        .unwrap();
    let retried = store.complete(&key, &owner, &outcome, LONG).await;
    assert_eq!(
        retried.map_err(|err| err.kind()),
        Err(idem_core::ErrorKind::LeaseLost)
    );
    assert_eq!(
        store
            .claim(&key, &FP, LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome),
        "the duplicate is SQL's replay"
    );
}

/// A redis-server of the test's own (so that pausing it hangs no other
/// test) as the gate, with this gate timeout and breaker, in front of the
/// shared PostgreSQL.
async fn private_gate(
    gate_timeout: Duration,
    (threshold, pause): (u32, Duration),
) -> Option<(RedisServer, Tiered)> {
    let server = RedisServer::start(&[])?;
    let store = TieredStore::builder(gate(&server.url()).await?, truth().await?)
        .gate_timeout(gate_timeout)
        .breaker(threshold, pause)
        .build();
    Some((server, store))
}

/// A claim whose gate command timed out may still land on the gate (here
/// Redis hangs with the `SET NX` in its socket and runs it when it wakes).
/// When SQL does not give that claim the key (another request holds it),
/// its gate record is taken back, under its token: left there, it would
/// answer "in flight" to every duplicate for a lease, in place of SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_that_timed_out_on_the_gate_takes_its_record_back() {
    let Some((server, store)) =
        private_gate(Duration::from_millis(50), (100, Duration::from_secs(1))).await
    else {
        return;
    };
    // The release script loaded: a hung server cannot answer NOSCRIPT in
    // time for the script to be loaded and sent again.
    let warm = key("timed-out-claim-warm");
    let owner = OwnerToken::generate();
    assert_eq!(
        store.claim(&warm, &FP, LONG, owner).await.unwrap(),
        Claim::Acquired(owner)
    );
    store.release(&warm, &owner).await.unwrap();

    let key = key("timed-out-claim");
    let holder = OwnerToken::generate();
    assert_eq!(
        store.truth().claim(&key, &FP, LONG, holder).await.unwrap(),
        Claim::Acquired(holder),
        "another request holds the key in SQL"
    );

    server.pause();
    let mine = store.claim(&key, &FP, LONG, OwnerToken::generate()).await;
    assert!(matches!(mine, Ok(Claim::InFlight { .. })), "{mine:?}");
    server.resume();
    // What the hung server was sent runs now, in order.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let probe = OwnerToken::generate();
    assert_eq!(
        store.gate().claim(&key, &FP, LONG, probe).await.unwrap(),
        Claim::Acquired(probe),
        "the gate holds no record of the timed-out claim"
    );
}

/// The breaker's probe is dropped mid-flight (here a caller's timeout around
/// a claim; in the layer, a lease renewal dropped when the handler returns)
/// while Redis hangs. The next request must probe again once Redis answers:
/// a probe dropped unsettled once left the breaker half-open with a probe
/// "running" for good, and the gate skipped until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_dropped_mid_flight_lets_the_next_request_probe() {
    let Some((server, store)) =
        private_gate(Duration::from_secs(1), (1, Duration::from_millis(200))).await
    else {
        return;
    };
    let warm = key("dropped-probe-warm");
    first_then_complete(&store, &warm).await;

    // Redis hangs (SIGSTOP): a claim's gate command fails, the breaker opens.
    server.pause();
    let _ = store
        .claim(
            &key("dropped-probe-open"),
            &FP,
            LONG,
            OwnerToken::generate(),
        )
        .await;
    assert_eq!(store.breaker_state(), BreakerState::Open);

    // Once the breaker's pause is over, the next claim probes; it is
    // dropped unsettled.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let probed = key("dropped-probe");
    let probe = store.claim(&probed, &FP, LONG, OwnerToken::generate());
    let dropped = tokio::time::timeout(Duration::from_millis(100), probe).await;
    assert!(dropped.is_err(), "the probe hangs on Redis: {dropped:?}");

    // Redis answers again: a later request probes and closes the breaker.
    server.resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.breaker_state() != BreakerState::Closed {
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker stayed {:?}: no request probed again",
            store.breaker_state()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = store.claim(&warm, &FP, LONG, OwnerToken::generate()).await;
    }
}

/// A transactional claim the gate holds in flight lives as long as its SQL
/// transaction: while that is open, duplicates (here from another process,
/// with stores of their own) are told "in flight"; once it ended without
/// committing, as when its process is killed, the gate's orphaned record
/// does not block the retry: the truth finds the key free and it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_orphaned_gate_claim_does_not_block_the_transactional_retry() {
    use idem_core::Duplicate;
    use idem_core::{TransactionalStore, TxClaim};

    let Some(store) = tiered().await else { return };
    let Some(elsewhere) = tiered().await else {
        return;
    };
    let key = key("tx-orphan");
    let claim = |store: &Tiered| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .claim_in_transaction(&key, &FP, LONG, OwnerToken::generate())
                .await
                .expect("the stores answer")
        }
    };

    let first = claim(&store).await;
    assert!(matches!(first, TxClaim::Open(_)), "{first:?}");
    let live = claim(&elsewhere).await;
    assert!(
        matches!(live, TxClaim::Duplicate(Duplicate::InFlight { .. })),
        "a live first request keeps its key: {live:?}"
    );

    // A first request whose process died: PostgreSQL rolled its transaction
    // back with its session, and the gate still holds its in-flight record
    // for the rest of the lease (planted here as the dead process left it).
    let TxClaim::Open(tx) = first else {
        unreachable!()
    };
    tx.rollback().await.expect("rollback");
    let orphan = gate(&redis_url()).await.expect("Redis is up");
    let dead_owner = OwnerToken::generate();
    assert_eq!(
        orphan.claim(&key, &FP, LONG, dead_owner).await.unwrap(),
        Claim::Acquired(dead_owner)
    );
    let before = elsewhere.counters().snapshot();
    let TxClaim::Open(retry) = claim(&elsewhere).await else {
        panic!("the retry must run at once, not after the gate's 60 s lease");
    };
    assert_eq!(
        elsewhere.counters().snapshot().orphans_freed - before.orphans_freed,
        1
    );
    retry
        .commit(&Outcome::NotReplayable, LONG)
        .await
        .expect("commit");
    let replay = claim(&store).await;
    assert!(
        matches!(replay, TxClaim::Duplicate(Duplicate::Replay(_))),
        "{replay:?}"
    );
}

/// Copies of one request at once: the first claims the gate, but a second
/// reaches SQL before it (finding no transaction there, it takes the gate
/// over). The first's claim in SQL waits for the second's transaction and
/// gets its answer replayed. Redis lost nothing, so nothing is counted as
/// caught, and the gate keeps the winner's record; whereas a key Redis did
/// lose is counted (`sql_catches_what_redis_lost_and_rewarms_the_gate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_overtaken_on_its_way_to_sql_is_not_counted_as_caught() {
    use idem_core::{TransactionalStore, TxClaim};

    let Some(store) = tiered().await else { return };
    let Some(truth) = truth().await else { return };
    let key = key("overtaken");
    // The second copy's claim in SQL, open (its row written, uncommitted).
    let (winner, loser) = (OwnerToken::generate(), OwnerToken::generate());
    let TxClaim::Open(won) = truth
        .claim_in_transaction(&key, &FP, LONG, winner)
        .await
        .expect("PostgreSQL answers")
    else {
        panic!("a fresh key is free");
    };
    let before = store.counters().snapshot();
    // The first copy: its `SET NX` on the gate succeeds, then its claim in
    // SQL waits on the second's row.
    let first = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move { store.claim(&key, &FP, LONG, loser).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut redis = store.gate().connection().clone();
    while !redis::cmd("EXISTS")
        .arg(key.as_str())
        .query_async::<bool>(&mut redis)
        .await
        .unwrap()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the first copy never claimed the gate"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The second takes the gate over, as the tiered store's transactional
    // claim does once SQL is its, and commits its answer.
    store
        .gate()
        .put_in_flight(&key, &FP, winner, LONG)
        .await
        .unwrap();
    let outcome = Outcome::NotReplayable;
    won.commit(&outcome, LONG).await.expect("commit");
    store
        .gate()
        .complete(&key, &winner, &outcome, LONG)
        .await
        .expect("the winner completes the gate");

    assert_eq!(
        first.await.unwrap().unwrap(),
        Claim::Replay(outcome.clone())
    );
    let after = store.counters().snapshot();
    assert_eq!(
        after.fallback_caught, before.fallback_caught,
        "Redis lost nothing"
    );
    assert_eq!(
        store
            .gate()
            .claim(&key, &FP, LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome),
        "the gate holds the winner's answer"
    );
}

/// A transactional commit answers before the gate's completion, which
/// follows on a task: a duplicate that meets the committed request's
/// in-flight gate record meanwhile (planted here as it stands until the
/// completion lands, or for good if the process dies first) is replayed
/// from SQL, and the gate is re-warmed with the completed record, so the
/// next duplicate is answered by Redis alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_before_the_gates_completion_is_replayed_from_sql() {
    use idem_core::Duplicate;
    use idem_core::{TransactionalStore, TxClaim};

    let Some(store) = tiered().await else { return };
    let Some(truth) = truth().await else { return };
    let Some(redis) = gate(&redis_url()).await else {
        return;
    };
    let key = key("tx-before-gate-completion");
    // Committed in SQL; the gate holds the first's in-flight record.
    let first = OwnerToken::generate();
    let TxClaim::Open(tx) = truth
        .claim_in_transaction(&key, &FP, LONG, first)
        .await
        .expect("PostgreSQL answers")
    else {
        panic!("a fresh key is free");
    };
    assert_eq!(
        redis.claim(&key, &FP, LONG, first).await.unwrap(),
        Claim::Acquired(first)
    );
    let outcome = Outcome::NotReplayable;
    tx.commit(&outcome, LONG).await.expect("commit");

    let duplicate = store
        .claim_in_transaction(&key, &FP, LONG, OwnerToken::generate())
        .await
        .expect("the stores answer");
    assert!(
        matches!(&duplicate, TxClaim::Duplicate(Duplicate::Replay(o)) if *o == outcome),
        "replayed from SQL, not told in flight: {duplicate:?}"
    );
    assert_eq!(
        redis
            .claim(&key, &FP, LONG, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome),
        "the gate re-warmed with the completed record"
    );
}
