//! Plain (non-transactional) claims across processes, with a real kill.
//!
//! Two `orders` processes on the memory database keep their idempotency
//! records in Redis alone, so `POST /orders` is a plain claim in a store
//! both share, living by its lease (1 s here) and nothing else: no
//! transaction ends with the process. The first process's handler runs many
//! leases long and keeps its claim, renewing it (the second answers every
//! duplicate 409). Then the first is killed with SIGKILL mid-handler: no
//! destructor releases anything, no rollback. Its claim must free within
//! about one lease of the kill, and the second process then runs the retry,
//! once.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{handler_calls, metric, scrape, unique};
use idem_test_support::{redis_url, server_missing};

/// The lease both processes run with.
const LEASE: Duration = Duration::from_secs(1);
/// How long the killed process's handler would have slept.
const HANDLER_MS: u64 = 60_000;
/// Leeway over one lease for the claim to free: the test's polling, the
/// request round trips, and Redis's expiry.
const LEEWAY: Duration = Duration::from_millis(500);

fn order(base: &str, tenant: &str, delay_ms: Option<u64>) -> reqwest::RequestBuilder {
    let request = support::order(base, "plain-lease-key", tenant, "lease-user", 1_500);
    match delay_ms {
        Some(ms) => request.header("x-chaos-delay-ms", ms.to_string()),
        None => request,
    }
}

/// Sends the order to `base` and returns its status and whether it was a
/// replay.
async fn status(base: &str, tenant: &str) -> (u16, bool) {
    let reply = order(base, tenant, None)
        .send()
        .await
        .expect("POST /orders");
    let replayed = reply.headers().get("idempotent-replayed").is_some();
    (reply.status().as_u16(), replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_claim_frees_within_about_one_lease() {
    let redis = redis_url();
    let addr = redis.trim_start_matches("redis://");
    if let Err(err) = tokio::net::TcpStream::connect(addr).await {
        server_missing::<()>("Redis", &redis, err);
        return;
    }
    let lease_ms = LEASE.as_millis().to_string();
    let args = ["--lease-ms", lease_ms.as_str()];
    let first = support::start_orders_with("memory", Some(&redis), &args);
    let second = support::start_orders_with("memory", Some(&redis), &args);
    let tenant = unique("plain-lease");

    let doomed = tokio::spawn({
        let (base, tenant) = (first.base.clone(), tenant.clone());
        async move { order(&base, &tenant, Some(HANDLER_MS)).send().await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while handler_calls(&first.base).await == 0.0 {
        assert!(Instant::now() < deadline, "the handler never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();

    // Three and a half leases of the handler: the other process's
    // duplicates are all told it is in flight, never handed the key.
    let mut duplicates = 0;
    while started.elapsed() < LEASE * 7 / 2 {
        let (code, _) = status(&second.base, &tenant).await;
        assert_eq!(
            code,
            409,
            "a duplicate {:?} into the handler must be in flight",
            started.elapsed()
        );
        duplicates += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = scrape(&first.base).await;
    let renewed = |result| {
        metric(
            &text,
            "idem_lease_renewals_total",
            &[("result", result), ("route", "/orders")],
        )
        .unwrap_or(0.0)
    };
    let (ok, failed, lost) = (renewed("ok"), renewed("failed"), renewed("lost"));
    assert!(
        ok >= 8.0,
        "renewals every third of a lease: {ok} in 3.5 leases"
    );
    assert_eq!((failed, lost), (0.0, 0.0), "no renewal failed");

    first.kill_9();
    let killed = Instant::now();
    assert!(
        doomed.await.unwrap().is_err(),
        "the client saw the connection die"
    );
    // Renewed at most a third of a lease before the kill: still held.
    assert_eq!(
        status(&second.base, &tenant).await.0,
        409,
        "the claim outlives its process until its lease ends"
    );
    let freed = loop {
        let (code, replayed) = status(&second.base, &tenant).await;
        match code {
            409 => {
                assert!(
                    killed.elapsed() < LEASE * 3,
                    "the dead process's claim never freed"
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            201 => {
                assert!(!replayed, "nothing was stored: the retry runs");
                break killed.elapsed();
            }
            other => panic!("unexpected status {other}"),
        }
    };
    eprintln!(
        "plain claim freed {freed:?} after SIGKILL (lease {LEASE:?}; {ok} renewals over \
         {duplicates} duplicates before the kill)"
    );
    assert!(
        freed <= LEASE + LEEWAY,
        "freed {freed:?} after the kill, more than about one lease ({LEASE:?})"
    );
    assert!(
        freed >= LEASE / 2,
        "freed {freed:?} after the kill: sooner than the renewed lease allows"
    );

    let again = status(&second.base, &tenant).await;
    assert_eq!(again, (201, true), "the retry's response is replayed");
    assert_eq!(handler_calls(&second.base).await, 1.0, "the retry ran once");
}
