//! Counted, not timed, through the orders app with PostgreSQL behind a Redis
//! gate (transactional mode): a duplicate of a completed request costs one
//! Redis command and no SQL at all; a first request costs at most two Redis
//! commands and exactly one database commit. Redis commands are what clients
//! send to a Redis of the test's own (`MONITOR`); SQL is `pg_stat_database`
//! of a database of its own.

use idem_app::orders::App;
use idem_tests::Harness;
use idem_tests::pg_stats::PgStats;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_tower::core::conformance::RedisServer;

/// What clients send to a Redis, seen through `MONITOR` (which marks the
/// commands a Lua script runs inside Redis as `lua`: those are not round
/// trips and are left out).
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(port: u16) -> Self {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli monitor");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let (ready, started) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if line == "OK" {
                        let _ = ready.send(());
                    } else {
                        lines.lock().unwrap().push(line);
                    }
                }
            });
        }
        started
            .recv_timeout(Duration::from_secs(10))
            .expect("MONITOR started");
        Self { child, lines }
    }

    /// The command names clients sent, once the stream has caught up.
    fn stop(mut self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(300));
        let _ = self.child.kill();
        let _ = self.child.wait();
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter(|line| !line.contains(" lua] "))
            .filter_map(|line| line.split("] ").nth(1)?.split(' ').next())
            .map(|name| name.trim_matches('"').to_uppercase())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_costs_one_redis_command_and_no_sql() {
    let Some(stats) = PgStats::for_database("idem_round_trips").await else {
        return;
    };
    let Some(redis_server) = RedisServer::start(&[]) else {
        return;
    };
    let app = App::connect_tiered(&stats.url(), Some(&redis_server.url()), false, |b| b)
        .await
        .expect("the orders app behind a Redis gate");
    let h = Harness::serve(app).await;

    // Warm up: scripts loaded, statements prepared, connections open.
    let warm = h.send(h.order("trips", "u", "warm-up", 10)).await;
    assert_eq!(warm.status, 201);

    let before = stats.settled().await;
    let monitor = Monitor::start(redis_server.port());
    let first = h.send(h.order("trips", "u", "measured", 10)).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let first_redis = monitor.stop();
    let after_first = stats.settled().await;

    let monitor = Monitor::start(redis_server.port());
    let duplicate = h.send(h.order("trips", "u", "measured", 10)).await;
    assert!(duplicate.replayed());
    let duplicate_redis = monitor.stop();
    let after_duplicate = stats.settled().await;

    eprintln!(
        "first request: Redis {first_redis:?}, commits {}; duplicate: Redis {duplicate_redis:?}, \
         commits {}, rollbacks {}",
        after_first.commits - before.commits,
        after_duplicate.commits - after_first.commits,
        after_duplicate.rollbacks - after_first.rollbacks,
    );
    assert!(first_redis.len() <= 2, "first request: {first_redis:?}");
    assert_eq!(
        after_first.commits - before.commits,
        1,
        "first request: one commit"
    );
    assert_eq!(duplicate_redis, ["SET"], "duplicate: one SET ... NX GET");
    assert_eq!(
        after_duplicate, after_first,
        "a duplicate touches no SQL at all"
    );
    assert_eq!(h.app.calls.orders(), 2);
}
