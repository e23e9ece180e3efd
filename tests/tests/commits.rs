//! Counted, not timed: a first request in transactional mode costs exactly
//! one database commit (the claim, the order, the debit and the stored
//! response together), and a replay costs none. Read from PostgreSQL's own
//! `pg_stat_database`, for a database of the test's own (`idem_commits`),
//! in a test binary of its own, so no other activity lands in the count.
//!
//! PostgreSQL 15 flushes a backend's statistics lazily, up to 10 s late
//! (`PGSTAT_IDLE_INTERVAL`), so each reading waits until the counter has
//! not moved for longer than that.

use std::time::{Duration, Instant};

use http::StatusCode;
use idem_examples::orders::App;
use idem_tests::{Backend, Harness};
use idem_tower::core::sql::sqlx::{self, PgPool};

/// `xact_commit` of the app's database, read from another database so that
/// reading it commits nothing there; polled until the backends' lazily
/// flushed statistics stop moving.
async fn settled_commits(observer: &PgPool, database: &str) -> i64 {
    let read = || async {
        sqlx::query_scalar::<_, i64>("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
            .bind(database)
            .fetch_one(observer)
            .await
            .expect("pg_stat_database")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = read().await;
    let mut stable_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = read().await;
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if stable_since.elapsed() >= Duration::from_millis(10_500) {
            return now;
        }
        assert!(Instant::now() < deadline, "pg_stat_database never settled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_first_request_costs_one_commit_and_a_replay_none() {
    let Some(url) = Backend::Postgres.database_url().await else {
        return;
    };
    let server = url.rsplit_once('/').expect("a URL with a database").0;
    let observer = PgPool::connect(&format!("{server}/postgres"))
        .await
        .expect("observer");
    let database = "idem_commits";
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(database)
            .fetch_one(&observer)
            .await
            .expect("pg_database");
    if !exists {
        sqlx::query("CREATE DATABASE idem_commits")
            .execute(&observer)
            .await
            .expect("create the measurement database");
    }
    let app = App::connect(&format!("{server}/{database}"), false)
        .await
        .expect("the orders app on idem_commits");
    let h = Harness::serve(app).await;

    // Warm up: the pool's connection exists and the statements are prepared.
    let warm = h.send(h.order("commits", "u", "warm-up", 10)).await;
    assert_eq!(warm.status, StatusCode::CREATED);

    let before = settled_commits(&observer, database).await;
    let first = h.send(h.order("commits", "u", "measured", 10)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let after_first = settled_commits(&observer, database).await;

    let replay = h.send(h.order("commits", "u", "measured", 10)).await;
    assert!(replay.replayed());
    let after_replay = settled_commits(&observer, database).await;

    eprintln!(
        "commits: first request {}, replay {}",
        after_first - before,
        after_replay - after_first
    );
    assert_eq!(after_first - before, 1, "a first request is one commit");
    assert_eq!(after_replay - after_first, 0, "a replay commits nothing");
    assert_eq!(h.app.calls.orders(), 2, "warm-up and measured, each once");
}
