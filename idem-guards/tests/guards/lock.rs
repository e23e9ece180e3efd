//! `RedisLock`: a holder whose lease ran out cannot touch the next
//! holder's lock, a lease meant as forever holds, and the keep-alive renews
//! while Redis answers and says "lost" once the lease ran out unrenewed.

use std::time::Duration;

use idem_guards::RedisLock;
use redis::aio::ConnectionManager;

use crate::support::{nonce, redis};

/// A holder whose lease ran out can neither release nor renew the lock a
/// second holder now owns; the second holder's lock stays intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_holder_cannot_release_the_next_holders_lock() {
    let Some(conn) = redis().await else {
        return;
    };
    let name = format!("job-{}", nonce());
    let lock = RedisLock::with_namespace(
        conn.clone(),
        "idem-test:",
        &name,
        Duration::from_millis(300),
    );
    let first = lock.try_acquire().await.unwrap().expect("free");
    assert!(lock.try_acquire().await.unwrap().is_none(), "held");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let long = RedisLock::with_namespace(conn, "idem-test:", &name, Duration::from_secs(30));
    let second = long.try_acquire().await.unwrap().expect("lease ran out");
    assert_ne!(first.owner(), second.owner());
    assert!(!first.renew().await.unwrap(), "stale renew");
    assert!(!first.release().await.unwrap(), "stale release");
    assert!(
        long.try_acquire().await.unwrap().is_none(),
        "the second holder still holds it"
    );
    assert!(second.release().await.unwrap());
    assert!(long.try_acquire().await.unwrap().is_some(), "free again");
}

/// A lease and a wait meant as forever (`Duration::MAX`): taken as a
/// century, never an overflow nor an expiry Redis refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_and_a_wait_meant_as_forever_hold() {
    let Some(conn) = redis().await else {
        return;
    };
    let name = format!("forever-{}", nonce());
    let lock = RedisLock::with_namespace(conn, "idem-test:", &name, Duration::MAX);
    let guard = lock
        .acquire(Duration::MAX)
        .await
        .unwrap()
        .expect("a free lock");
    assert!(lock.try_acquire().await.unwrap().is_none(), "held");
    assert!(guard.renew().await.unwrap());
    assert!(guard.release().await.unwrap());
}

/// The keep-alive's Redis goes away: once the lease has run out with
/// no renewal confirmed, the lock may be another's, and `lost` says so
/// (it kept saying the lock was held while the renewals failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keep_alive_says_lost_once_the_lease_ran_out_unrenewed() {
    let Some(mut server) = idem_test_support::redis::RedisServer::start(&[]) else {
        return;
    };
    let client = ::redis::Client::open(server.url()).expect("a Redis URL");
    let conn = ConnectionManager::new(client).await.expect("the server");
    let lock = RedisLock::with_namespace(
        conn,
        "idem-test:",
        &format!("gone-{}", nonce()),
        Duration::from_millis(300),
    );
    let guard = lock.try_acquire().await.unwrap().expect("free");
    let keep_alive = guard.keep_alive();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!keep_alive.lost(), "renewed while Redis answers");
    server.stop();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(keep_alive.lost(), "the lease ran out unrenewed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keep_alive_holds_the_lock_past_its_lease_and_acquire_waits() {
    let Some(conn) = redis().await else {
        return;
    };
    let lock = RedisLock::with_namespace(
        conn,
        "idem-test:",
        &format!("job-{}", nonce()),
        Duration::from_millis(300),
    );
    let guard = lock.try_acquire().await.unwrap().expect("free");
    let keep_alive = guard.keep_alive();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!keep_alive.lost());
    assert!(
        lock.acquire(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none(),
        "still held thanks to renewals"
    );
    drop(keep_alive);
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire(Duration::from_secs(5)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(guard.release().await.unwrap());
    let next = waiter.await.unwrap().expect("the waiter gets it");
    assert!(next.release().await.unwrap());
}
