//! A first request in transactional mode costs exactly
//! one database commit (the claim, the order, the debit and the stored
//! response together), and a replay costs none. Read from PostgreSQL's own
//! `pg_stat_database`, for a database of the test's own (`idem_commits`),
//! so no other activity lands in the count.

use http::StatusCode;
use idem_app::orders::App;
use idem_tests::Harness;
use idem_tests::pg_stats::PgStats;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_first_request_costs_one_commit_and_a_replay_none() {
    let Some(stats) = PgStats::for_database("idem_commits").await else {
        return;
    };
    let app = App::connect(&stats.url(), false)
        .await
        .expect("the orders app on idem_commits");
    let h = Harness::serve(app).await;

    // Warm up: the pool's connection exists and the statements are prepared.
    let warm = h.send(h.order("commits", "u", "warm-up", 10)).await;
    assert_eq!(warm.status, StatusCode::CREATED);

    let before = stats.settled().await.commits;
    let first = h.send(h.order("commits", "u", "measured", 10)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let after_first = stats.settled().await.commits;

    let replay = h.send(h.order("commits", "u", "measured", 10)).await;
    assert!(replay.replayed());
    let after_replay = stats.settled().await.commits;

    eprintln!(
        "commits: first request {}, replay {}",
        after_first - before,
        after_replay - after_first
    );
    assert_eq!(after_first - before, 1, "a first request is one commit");
    assert_eq!(after_replay - after_first, 0, "a replay commits nothing");
    assert_eq!(h.app.calls.orders(), 2, "warm-up and measured, each once");
}
