//! `SentinelConnection` against real servers of the test's own: a primary,
//! its replica and one sentinel (quorum 1, the primary judged down after a
//! second). The failover cases kill or stop the primary, have the sentinel
//! promote the replica, and count what the connection did meanwhile: how
//! many commands failed, how long until one succeeded on the new primary,
//! and which writes are there afterwards. The others: wrong URLs fail at
//! `open`, concurrent commands share one lookup, and the store conformance
//! suite passes on the connection.

use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};
use idem_core::{
    Claim, Fingerprint, IdempotencyKey, IdempotencyStore, Outcome, OwnerToken, StoredResponse,
};
use idem_redis::{RedisStore, SentinelConnection};
use redis::{ErrorKind, RedisError, RedisResult, cmd};

use idem_test_support::free_port;
use idem_test_support::redis::{RedisServer, Reply, Sentinel};

/// The service's name in the sentinel's configuration.
const SERVICE: &str = "idem-test";
/// The bound on every wait: failovers here take a second or two.
const WITHIN: Duration = Duration::from_secs(20);
/// The pause between two commands while the primary is gone.
const PACE: Duration = Duration::from_millis(25);

struct Servers {
    primary: RedisServer,
    replica: RedisServer,
    sentinel: Sentinel,
}

/// A primary, its replica (synced) and a sentinel that trusts the replica
/// enough to promote it; `None` if `redis-server` is not installed.
async fn servers() -> Option<Servers> {
    let primary = RedisServer::start(&[])?;
    let replica = RedisServer::replica_of(primary.port())?;
    let sentinel = Sentinel::start(SERVICE, primary.port(), 1000)?;
    sentinel.wait_for_replicas(1, WITHIN).await;
    Some(Servers {
        primary,
        replica,
        sentinel,
    })
}

async fn open(sentinel: &Sentinel) -> SentinelConnection {
    SentinelConnection::open(&sentinel.url())
        .await
        .expect("SentinelConnection::open on the test's sentinel")
}

/// The port of the server `conn` talks to, as that server says.
async fn port_of(conn: &mut SentinelConnection) -> u16 {
    let pair: Vec<String> = cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query_async(conn)
        .await
        .expect("CONFIG GET port");
    pair[1].parse().expect("a port")
}

/// The role of the server `conn` talks to (`master`, `slave`).
async fn role_of(conn: &mut SentinelConnection) -> String {
    let role: redis::Value = cmd("ROLE").query_async(conn).await.expect("ROLE");
    match role {
        redis::Value::Array(parts) => redis::from_redis_value(parts[0].clone()).expect("a role"),
        other => panic!("ROLE answered {other:?}"),
    }
}

/// Writes `before` = `kept`, which a failover must not lose once
/// [`replicated`].
async fn set_before(conn: &mut SentinelConnection) {
    let () = cmd("SET")
        .arg("before")
        .arg("kept")
        .query_async(conn)
        .await
        .unwrap();
}

/// Waits until the replica has every write made so far on `conn`.
async fn replicated(conn: &mut SentinelConnection) {
    let acked: i64 = cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(conn)
        .await
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged the writes");
}

async fn incr(conn: &mut SentinelConnection, key: &str) -> RedisResult<i64> {
    cmd("INCR").arg(key).query_async(conn).await
}

async fn get(conn: &mut SentinelConnection, key: &str) -> Option<String> {
    cmd("GET").arg(key).query_async(conn).await.expect("GET")
}

/// Runs `attempt` every [`PACE`] until it succeeds: how many attempts
/// failed and how long it took.
///
/// # Panics
///
/// If none succeeded within [`WITHIN`], with the last error.
async fn until_ok<T, E: std::fmt::Debug>(
    what: &str,
    mut attempt: impl AsyncFnMut() -> Result<T, E>,
) -> (T, u32, Duration) {
    let start = Instant::now();
    let mut failed = 0;
    loop {
        match attempt().await {
            Ok(value) => return (value, failed, start.elapsed()),
            Err(err) => {
                failed += 1;
                assert!(
                    start.elapsed() < WITHIN,
                    "{what}: still failing after {WITHIN:?} and {failed} attempts, last with {err:?}"
                );
            }
        }
        tokio::time::sleep(PACE).await;
    }
}

fn key(case: &str) -> IdempotencyKey {
    IdempotencyKey::new(
        "idem-test:",
        &format!("sentinel-{case}:{:016x}", rand::random::<u64>()),
    )
}

fn outcome(body: &'static str) -> Outcome {
    Outcome::Response(StoredResponse::new(
        StatusCode::CREATED,
        HeaderMap::new(),
        body,
    ))
}

const LEASE: Duration = Duration::from_secs(60);

/// (a) The connection, never reopened, follows a kill -9 of the primary to
/// the promoted replica; what was replicated before is there, and every
/// write that succeeded counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_to_the_replica() {
    let Some(mut servers) = servers().await else {
        return;
    };
    let mut conn = open(&servers.sentinel).await;
    assert_eq!(port_of(&mut conn).await, servers.primary.port());
    set_before(&mut conn).await;
    for _ in 0..5 {
        incr(&mut conn, "counter").await.unwrap();
    }
    replicated(&mut conn).await;
    assert_eq!(get(&mut conn, "before").await.as_deref(), Some("kept"));

    servers.primary.kill_9();
    servers.sentinel.start_failover(WITHIN).await;
    let (_, failed, took) = until_ok("INCR after the failover", async || {
        incr(&mut conn, "counter").await
    })
    .await;
    eprintln!(
        "kill -9: {failed} commands failed, the first success {took:?} after the failover began"
    );
    assert!(
        failed >= 1,
        "a command on the dead primary fails before the connection moves"
    );
    for _ in 0..9 {
        incr(&mut conn, "counter")
            .await
            .expect("commands keep succeeding on the new primary");
    }

    assert_eq!(port_of(&mut conn).await, servers.replica.port());
    assert_eq!(role_of(&mut conn).await, "master");
    servers
        .sentinel
        .wait_for_primary(servers.replica.port(), WITHIN)
        .await;
    assert_eq!(get(&mut conn, "before").await.as_deref(), Some("kept"));
    // Five before, ten after: no failed INCR took effect, none twice.
    assert_eq!(get(&mut conn, "counter").await.as_deref(), Some("15"));
    assert_eq!(
        servers.replica.query(&["GET", "counter"]).unwrap(),
        Reply::Bulk(Some("15".to_owned())),
        "the writes are on the promoted replica itself"
    );
}

/// (b) The store on a `SentinelConnection` claims a fresh key after the
/// failover, on the new primary; a record completed (and replicated)
/// before the failover still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_claims_a_fresh_key_after_the_failover() {
    let Some(mut servers) = servers().await else {
        return;
    };
    let store = RedisStore::new(open(&servers.sentinel).await);
    let fp = Fingerprint::from_bytes([7; 32]);
    let before = key("before");
    let owner = store
        .claim(&before, &fp, LEASE, OwnerToken::generate())
        .await
        .unwrap()
        .acquired()
        .expect("a fresh key is acquired");
    store
        .complete(&before, &owner, &outcome("before"), LEASE)
        .await
        .unwrap();
    replicated(&mut store.connection().clone()).await;

    servers.primary.kill_9();
    servers.sentinel.start_failover(WITHIN).await;
    let after = key("after");
    let (claim, failed, took) = until_ok("a claim after the failover", async || {
        store
            .claim(&after, &fp, LEASE, OwnerToken::generate())
            .await
    })
    .await;
    eprintln!(
        "store: {failed} claims failed, the first answered {took:?} after the failover began"
    );
    let Claim::Acquired(owner) = claim else {
        panic!("the first claim to be answered acquires the fresh key, got {claim:?}");
    };

    // The record is on the promoted replica, and only one owner holds it.
    assert_eq!(
        servers.replica.query(&["EXISTS", after.as_str()]).unwrap(),
        Reply::Integer(1)
    );
    assert!(matches!(
        store
            .claim(&after, &fp, LEASE, OwnerToken::generate())
            .await
            .unwrap(),
        Claim::InFlight { .. }
    ));
    store
        .complete(&after, &owner, &outcome("after"), LEASE)
        .await
        .unwrap();
    for (key, body) in [(&after, "after"), (&before, "before")] {
        assert_eq!(
            store
                .claim(key, &fp, LEASE, OwnerToken::generate())
                .await
                .unwrap(),
            Claim::Replay(outcome(body)),
            "{body}"
        );
    }
}

/// (c) A clone made before the failover follows it too: clones share the
/// primary connection, so once one has moved, the other's first command
/// succeeds on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_made_before_the_failover_follows_it() {
    let Some(mut servers) = servers().await else {
        return;
    };
    let mut conn = open(&servers.sentinel).await;
    let mut clone = conn.clone();
    incr(&mut clone, "shared").await.unwrap();
    replicated(&mut clone).await;

    servers.primary.kill_9();
    servers.sentinel.start_failover(WITHIN).await;
    let (_, failed, took) = until_ok("INCR on the original", async || {
        incr(&mut conn, "shared").await
    })
    .await;
    eprintln!("clone: the original failed {failed} times, moved {took:?} after the failover began");

    // No error on the clone: it is already on the new primary.
    assert_eq!(incr(&mut clone, "shared").await.unwrap(), 3);
    assert_eq!(port_of(&mut clone).await, servers.replica.port());
    assert_eq!(get(&mut conn, "shared").await.as_deref(), Some("3"));
}

/// A primary that stops answering (SIGSTOP: its connections stay open)
/// while every caller gives up after 100 ms, as the tiered store's gate
/// timeout does: the connection still leaves it and follows the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_away_from_a_primary_that_stopped_answering() {
    let Some(servers) = servers().await else {
        return;
    };
    let mut conn = open(&servers.sentinel).await;
    set_before(&mut conn).await;
    replicated(&mut conn).await;

    servers.primary.pause();
    servers.sentinel.start_failover(WITHIN).await;
    let mut timed_out = 0;
    let (value, failed, took) =
        until_ok(
            "GET, each given 100 ms",
            async || match tokio::time::timeout(
                Duration::from_millis(100),
                get_checked(&mut conn, "before"),
            )
            .await
            {
                Ok(result) => result,
                Err(elapsed) => {
                    timed_out += 1;
                    Err(RedisError::from((
                        ErrorKind::Io,
                        "the caller gave up",
                        elapsed.to_string(),
                    )))
                }
            },
        )
        .await;
    eprintln!(
        "SIGSTOP: {failed} commands failed ({timed_out} given up by the caller), \
         the first success {took:?} after the failover began"
    );
    assert!(
        timed_out >= 1,
        "commands on the stopped primary hang until the caller gives up"
    );
    assert_eq!(value.as_deref(), Some("kept"));
    assert_eq!(port_of(&mut conn).await, servers.replica.port());
    servers.primary.resume();
}

async fn get_checked(conn: &mut SentinelConnection, key: &str) -> RedisResult<Option<String>> {
    cmd("GET").arg(key).query_async(conn).await
}

/// While no primary is known, concurrent commands share one lookup instead
/// of each asking the sentinels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_share_one_lookup() {
    let Some(mut servers) = servers().await else {
        return;
    };
    let mut conn = open(&servers.sentinel).await;
    incr(&mut conn, "n").await.unwrap();
    // Sentinel mode keeps no per-command statistics: count every command
    // the sentinel processes (reading the count is one of them).
    let commands = |sentinel: &Sentinel| {
        let Ok(Reply::Bulk(Some(stats))) = sentinel.query(&["INFO", "stats"]) else {
            panic!("INFO stats from the sentinel");
        };
        stats
            .lines()
            .find_map(|line| line.strip_prefix("total_commands_processed:"))
            .and_then(|count| count.trim().parse::<u32>().ok())
            .expect("total_commands_processed")
    };

    servers.primary.kill_9();
    // One command meets the dead connection and drops it.
    assert!(incr(&mut conn, "n").await.is_err());
    let before = commands(&servers.sentinel);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let mut conn = conn.clone();
            tokio::spawn(async move { incr(&mut conn, "n").await })
        })
        .collect();
    let mut failed = 0;
    for task in tasks {
        failed += u32::from(task.await.unwrap().is_err());
    }
    // Less the INFO that read `before`.
    let asked = commands(&servers.sentinel) - before - 1;
    eprintln!(
        "50 concurrent commands with no primary: {failed} failed, {asked} commands to the sentinel"
    );
    assert_eq!(failed, 50, "no primary, no success");
    // A lookup is one SENTINEL MASTERS (and a ROLE if it reconnects to the
    // sentinel); fifty lookups would be fifty or more.
    assert!(
        (1..=4).contains(&asked),
        "the 50 commands shared the lookups: {asked} commands to the sentinel"
    );
}

/// A wrong URL fails at `open`, with an error that says what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_url_fails_at_open() {
    let err = SentinelConnection::open("redis+sentinel://127.0.0.1:26379")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidClientConfig);
    assert!(err.to_string().contains("no service name"), "{err}");

    let Some(primary) = RedisServer::start(&[]) else {
        return;
    };
    let Some(sentinel) = Sentinel::start(SERVICE, primary.port(), 1000) else {
        return;
    };
    let err = SentinelConnection::open(&format!(
        "redis+sentinel://127.0.0.1:{}/no-such-service",
        sentinel.port()
    ))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MasterNameNotFoundBySentinel, "{err}");
    let nobody = free_port();
    let err = SentinelConnection::open(&format!("redis+sentinel://127.0.0.1:{nobody}/{SERVICE}"))
        .await
        .unwrap_err();
    assert!(err.is_io_error(), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("sentinels 127.0.0.1:{nobody}")),
        "the error says whom it asked: {err}"
    );
    // The right URL, for contrast.
    let mut conn = open(&sentinel).await;
    assert_eq!(port_of(&mut conn).await, primary.port());
}

/// The store conformance suite on a `SentinelConnection`, its cases at
/// once: every command a store sends (`SET NX GET`, `PTTL`, the Lua scripts
/// loaded on first use) goes through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_conformance_suite_passes_on_it() {
    use idem_core::conformance as suite;
    use std::sync::Arc;

    let Some(primary) = RedisServer::start(&[]) else {
        return;
    };
    let Some(sentinel) = Sentinel::start(SERVICE, primary.port(), 1000) else {
        return;
    };
    let store = Arc::new(RedisStore::new(open(&sentinel).await));
    tokio::join!(
        suite::claim_complete_replay(store.clone()),
        suite::not_replayable_outcome_is_kept(store.clone()),
        suite::concurrent_claims_have_one_winner(store.clone()),
        suite::release_then_reclaim(store.clone()),
        suite::only_the_owner_moves_the_record(store.clone()),
        suite::fingerprint_mismatch(store.clone()),
        suite::keys_are_independent(store.clone()),
        suite::in_flight_reports_lease_left(store.clone()),
        suite::expired_lease_is_taken_over(store.clone()),
        suite::stale_owner_cannot_complete_or_release(store.clone()),
        suite::ttl_expiry_frees_the_key(store.clone()),
        suite::renew_keeps_a_claim_past_its_lease(store.clone()),
        suite::stale_owner_cannot_renew(store.clone()),
        suite::renew_of_a_finished_or_foreign_claim_is_lease_lost(store.clone()),
    );
}

/// `open_lazy` opens with nothing to ask (no sentinel up yet): commands fail
/// until the sentinel and its primary are up, then succeed on the same
/// connection, unopened again. A malformed URL still fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_lazy_starts_before_redis_and_connects_once_it_is_up() {
    let err = SentinelConnection::open_lazy("redis+sentinel://127.0.0.1:26379").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidClientConfig);

    let sentinel_port = free_port();
    let mut conn = SentinelConnection::open_lazy(&format!(
        "redis+sentinel://127.0.0.1:{sentinel_port}/{SERVICE}"
    ))
    .expect("a well-formed URL opens without a sentinel");
    let before = incr(&mut conn, "lazy-counter").await;
    assert!(before.unwrap_err().is_io_error(), "no sentinel yet");

    let Some(primary) = RedisServer::start(&[]) else {
        return;
    };
    let Some(_sentinel) = Sentinel::start_on(sentinel_port, SERVICE, primary.port(), 1000) else {
        return;
    };
    let (value, failures, _) =
        until_ok("open_lazy", async || incr(&mut conn, "lazy-counter").await).await;
    assert_eq!(value, 1, "the first command that got through ran once");
    assert_eq!(port_of(&mut conn).await, primary.port());
    eprintln!("open_lazy: {failures} failed commands before the sentinel answered");
}
