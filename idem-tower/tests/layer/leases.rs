//! Leases in plain mode: the layer renews the lease while the handler runs,
//! so a handler several leases long keeps its claim; a handler that starves
//! its renewals loses the key to a duplicate, and its stale completion is
//! refused (ARCHITECTURE.md, "Records" and "The three layers").

use std::time::{Duration, Instant};

use http::StatusCode;
use idem_tower::{Idempotency, InFlightPolicy, MemoryStore};
use tower::Layer;

use crate::fixtures::{ORDER, counting, created, order_body};
use crate::support::{Calls, post, send};

/// What a handler that outlives a lost lease risks. One that blocks its
/// thread (here `std::thread::sleep`, in real life blocking I/O without
/// `spawn_blocking`) starves its own renewals, which run in the same
/// future: its lease ends, a duplicate takes the key over and runs the
/// effect a second time, and the first attempt's completion is refused, so
/// duplicates replay the second run's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_lease_is_taken_over_and_the_stale_completion_is_rejected() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        if n == 1 {
            std::thread::sleep(Duration::from_secs(1));
        }
        created(n)
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_millis(300))
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/orders", Some("k-lease"), ORDER);

    let stale = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(calls.get(), 1);

    let takeover = send(&service, request()).await;
    assert_eq!(takeover.status, StatusCode::CREATED, "{takeover:?}");
    assert!(
        !takeover.replayed(),
        "the lease had expired: the duplicate runs"
    );
    assert_eq!(takeover.text(), order_body(2));
    assert_eq!(calls.get(), 2);

    // The stale attempt still answers its own client, but cannot store.
    let stale = stale.await.expect("no panic");
    assert_eq!(stale.status, StatusCode::CREATED);
    assert_eq!(stale.text(), order_body(1));

    let replay = send(&service, request()).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(
        replay.text(),
        order_body(2),
        "the stale completion must not overwrite the new owner's"
    );
    assert_eq!(calls.get(), 2);
}

/// The lease of the renewal tests: the layer renews it every 100 ms.
const RENEWED_LEASE: Duration = Duration::from_millis(300);

/// A handler running three leases long keeps its claim: the layer renews
/// the lease while it runs, so every duplicate, before and after the first
/// lease would have ended, is told "in flight" (never handed the key), and
/// once it returns they are replayed its response. One run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_running_three_leases_long_keeps_its_claim() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(RENEWED_LEASE * 3).await;
        created(n)
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(RENEWED_LEASE)
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/orders", Some("k-renewed"), ORDER);

    let started = Instant::now();
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    calls.wait_for(1).await;
    let mut in_flight_at = Vec::new();
    while !first.is_finished() {
        let duplicate = send(&service, request()).await;
        if first.is_finished() && duplicate.replayed() {
            break;
        }
        duplicate.assert_problem(StatusCode::CONFLICT, "in-flight");
        in_flight_at.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = first.await.expect("the first answers");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.text(), order_body(1));
    let last = *in_flight_at.last().expect("duplicates while it ran");
    assert!(
        last > RENEWED_LEASE * 2,
        "no duplicate came after two leases: {in_flight_at:?}"
    );
    assert!(
        in_flight_at
            .iter()
            .filter(|at| **at > RENEWED_LEASE)
            .count()
            >= 5,
        "too few duplicates after the first lease: {in_flight_at:?}"
    );

    for _ in 0..3 {
        let replay = send(&service, request()).await;
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(replay.text(), order_body(1));
    }
    assert_eq!(calls.get(), 1, "three leases long, one run");
}

/// A duplicate that waits (`InFlightPolicy::Wait`) for a handler running three
/// leases long waits it out and replays its response: the renewals keep it
/// from taking the key over when the first lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_duplicate_outwaits_a_handler_three_leases_long_and_replays() {
    let calls = Calls::default();
    let inner = counting(&calls, |n, _| async move {
        tokio::time::sleep(RENEWED_LEASE * 3).await;
        created(n)
    });
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(RENEWED_LEASE)
        .in_flight(InFlightPolicy::Wait(Duration::from_secs(5)))
        .build();
    let service = idem.layer().layer(inner);
    let request = || post("/orders", Some("k-renewed-wait"), ORDER);

    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, request()).await }
    });
    calls.wait_for(1).await;
    let waited = send(&service, request()).await;
    let first = first.await.expect("the first answers");

    assert_eq!(first.status, StatusCode::CREATED);
    assert!(waited.replayed(), "{waited:?}");
    assert_eq!(waited.body, first.body);
    assert_eq!(calls.get(), 1);
}
