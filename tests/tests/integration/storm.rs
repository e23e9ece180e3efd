//! A storm on transactional PostgreSQL with a small pool: duplicates of a
//! slow first request never hold a pooled connection while they wait, so
//! nothing starves. Two app instances (each its own store and a pool of
//! 4), a 500 ms handler that also reads through the pool, 20 duplicates of
//! one key split across the instances, 6 distinct keys and an unrelated
//! read, all at once over loopback HTTP; and a burst of retries of a
//! completed request, which all replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use idem_tests::Backend;
use idem_tower::sql::sqlx::{self, PgPool, Postgres, postgres::PgPoolOptions};
use idem_tower::{Idempotency, InFlightPolicy, PgStore, Tx};

const HANDLER: Duration = Duration::from_millis(500);

#[derive(Clone)]
struct Storm {
    pool: PgPool,
    runs: Arc<AtomicUsize>,
}

/// The handler: one effect row through the claim's transaction, a read
/// through the pool (as handlers do), then a slow part.
async fn charge(
    State(storm): State<Storm>,
    mut tx: Tx<Postgres>,
    Json(body): Json<serde_json::Value>,
) -> Result<StatusCode, StatusCode> {
    let op = body["op"].as_str().unwrap_or_default().to_owned();
    storm.runs.fetch_add(1, Ordering::SeqCst);
    sqlx::query("INSERT INTO storm_effects (op) VALUES ($1)")
        .bind(&op)
        .execute(&mut *tx)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    sqlx::query("SELECT count(*) FROM storm_effects")
        .execute(&storm.pool)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    tokio::time::sleep(HANDLER).await;
    Ok(StatusCode::CREATED)
}

async fn unrelated(State(storm): State<Storm>) -> Result<&'static str, StatusCode> {
    sqlx::query("SELECT 1")
        .execute(&storm.pool)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok("ok")
}

/// One app instance on its own pool of 4; its address.
async fn instance(url: &str, runs: &Arc<AtomicUsize>) -> String {
    instance_with(url, runs, 4, InFlightPolicy::Reject).await
}

async fn instance_with(
    url: &str,
    runs: &Arc<AtomicUsize>,
    pool_size: u32,
    in_flight: InFlightPolicy,
) -> String {
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(20))
        .connect(url)
        .await
        .expect("PostgreSQL");
    let store = PgStore::builder(pool.clone())
        .table("idem_storm")
        .build()
        .expect("a table name");
    store.migrate().await.expect("migrate");
    let idem = Idempotency::new(store);
    let layer = idem
        .layer_with_key("storm:{header:idempotency-key}")
        .expect("a valid template")
        .in_flight(in_flight)
        .transactional()
        .expect("PgStore has transactions");
    let storm = Storm {
        pool,
        runs: Arc::clone(runs),
    };
    let app = Router::new()
        .route("/charges", post(charge).layer(layer))
        .route("/unrelated", get(unrelated))
        .with_state(storm);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// A pool on the test database, with the effects table in place.
async fn effects_table(url: &str) -> PgPool {
    let pool = PgPool::connect(url).await.expect("PostgreSQL");
    // Two tests may create it at once, and concurrent CREATE TABLE IF NOT
    // EXISTS can collide in PostgreSQL's catalog: one at a time.
    let mut tx = pool.begin().await.expect("a transaction");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('storm_effects'))")
        .execute(&mut *tx)
        .await
        .expect("the creation lock");
    sqlx::query("CREATE TABLE IF NOT EXISTS storm_effects (op TEXT NOT NULL)")
        .execute(&mut *tx)
        .await
        .expect("the effects table");
    tx.commit().await.expect("the effects table, committed");
    pool
}

/// How many effects the handler left for `op`.
async fn effects(pool: &PgPool, op: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM storm_effects WHERE op = $1")
        .bind(op)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// `POST {app}/charges` with `key`: the status, and whether it was a replay.
async fn post_charge(client: &reqwest::Client, app: &str, key: &str) -> (StatusCode, bool) {
    let response = client
        .post(format!("{app}/charges"))
        .header("idempotency-key", key)
        .json(&serde_json::json!({ "op": key }))
        .send()
        .await
        .expect("an answer");
    (
        response.status(),
        response.headers().contains_key("idempotent-replayed"),
    )
}

/// `copies` of one charge, sent at once from tasks of their own (released
/// together by a barrier): what each got.
async fn burst(copies: usize, app: &str, key: &str) -> Vec<(StatusCode, bool)> {
    let client = reqwest::Client::new();
    let barrier = Arc::new(tokio::sync::Barrier::new(copies));
    let tasks: Vec<_> = (0..copies)
        .map(|_| {
            let (client, barrier) = (client.clone(), Arc::clone(&barrier));
            let (app, key) = (app.to_owned(), key.to_owned());
            tokio::spawn(async move {
                barrier.wait().await;
                post_charge(&client, &app, &key).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("no request task panics"));
    }
    answers
}

/// What one request got, and when its answer arrived.
#[derive(Debug)]
struct Answer {
    key: String,
    status: StatusCode,
    replayed: bool,
    at: Instant,
}

/// Each duplicate is answered without a connection: 409 while the first
/// runs, or, where its instance's own first copy of the key was still
/// waiting for its turn among that instance's open claims (two of four
/// requests there get one at once), the replay of the first once it is
/// committed, having waited for that copy's check outside the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_hold_no_connection_while_the_first_runs() {
    let Some(url) = Backend::Postgres.database_url().await else {
        return;
    };
    let setup = effects_table(&url).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let apps = [instance(&url, &runs).await, instance(&url, &runs).await];
    let run = idem_tests::nonce();
    let dup_key = format!("{run}-dup");
    let distinct: Vec<String> = (0..6).map(|i| format!("{run}-k{i}")).collect();

    // Sessions waiting on a lock, sampled throughout: a duplicate waiting on
    // the first's row would show here.
    let storming = Arc::new(AtomicBool::new(true));
    let lock_waits = {
        let (setup, storming) = (setup.clone(), Arc::clone(&storming));
        tokio::spawn(async move {
            let mut most = 0i64;
            while storming.load(Ordering::SeqCst) {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&setup)
                .await
                .expect("pg_stat_activity");
                most = most.max(waiting);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            most
        })
    };

    let client = reqwest::Client::new();
    let barrier = Arc::new(tokio::sync::Barrier::new(27));
    let mut tasks = Vec::new();
    let keys = std::iter::repeat_n(dup_key.clone(), 20).chain(distinct.iter().cloned());
    for (i, key) in keys.enumerate() {
        let (client, barrier) = (client.clone(), Arc::clone(&barrier));
        let app = apps[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let response = client
                .post(format!("{app}/charges"))
                .header("idempotency-key", &key)
                .json(&serde_json::json!({ "op": key }))
                .send()
                .await
                .expect("an answer");
            Answer {
                key,
                status: response.status(),
                replayed: response.headers().contains_key("idempotent-replayed"),
                at: Instant::now(),
            }
        }));
    }
    let read = {
        let (client, barrier, app) = (client.clone(), Arc::clone(&barrier), apps[0].clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let response = client
                .get(format!("{app}/unrelated"))
                .send()
                .await
                .expect("an answer");
            (response.status(), Instant::now())
        })
    };
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("no request task panics"));
    }
    let (read_status, read_at) = read.await.expect("the read");
    storming.store(false, Ordering::SeqCst);
    let most_lock_waits = lock_waits.await.expect("the sampler");

    for answer in &answers {
        assert!(
            !answer.status.is_server_error(),
            "no 5xx in the storm: {answer:?}"
        );
    }
    assert_eq!(read_status, StatusCode::OK);
    let firsts: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed)
        .collect();
    assert_eq!(firsts.len(), 7, "each key ran once: {answers:#?}");
    let dup_first = firsts
        .iter()
        .find(|a| a.key == dup_key)
        .expect("the duplicated key ran");
    let conflicts: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT)
        .collect();
    let replays = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && a.replayed)
        .count();
    assert_eq!(conflicts.len() + replays, 19, "{answers:#?}");
    assert!(conflicts.iter().all(|a| a.key == dup_key), "{answers:#?}");
    // A 409 is decided while the first holds the key, then its duplicate
    // rolls its own transaction back and answers, which may reach the
    // client just after the first's own answer; a duplicate that waited for
    // the first would come a handler's length later.
    for conflict in &conflicts {
        assert!(
            conflict.at < dup_first.at + HANDLER / 5,
            "a 409 came {:?} after the first request completed: it waited",
            conflict.at - dup_first.at
        );
    }
    let first_done = firsts.iter().map(|a| a.at).min().expect("firsts");
    assert!(
        read_at < first_done,
        "the unrelated read queued behind the transactions"
    );
    assert_eq!(most_lock_waits, 0, "a session waited on a lock");
    assert_eq!(runs.load(Ordering::SeqCst), 7, "one run per key");
    for key in distinct.iter().chain([&dup_key]) {
        assert_eq!(effects(&setup, key).await, 1, "{key}");
    }
}

/// Under `InFlightPolicy::Wait`, duplicates wait for the first outside the pool
/// and replay it: on a pool of 2 (one open claim at a time), ten waiting
/// duplicates leave the first's handler its second connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_replay_without_holding_connections() {
    let Some(url) = Backend::Postgres.database_url().await else {
        return;
    };
    let setup = effects_table(&url).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = instance_with(
        &url,
        &runs,
        2,
        InFlightPolicy::Wait(Duration::from_secs(10)),
    )
    .await;
    let key = format!("{}-wait", idem_tests::nonce());
    let answers = burst(11, &app, &key).await;
    let mut replays = 0;
    for (status, replayed) in answers {
        assert_eq!(
            status,
            StatusCode::CREATED,
            "every copy gets the first's answer"
        );
        replays += usize::from(replayed);
    }
    assert_eq!(replays, 10);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(effects(&setup, &key).await, 1);
}

/// A burst of retries of a request that has completed: every copy gets the
/// replay, none a 409. (The copies meet in this process while one of them
/// checks the store; they wait for what that check finds, holding nothing,
/// instead of being told "in flight".)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_retries_of_a_completed_request_all_replay() {
    let Some(url) = Backend::Postgres.database_url().await else {
        return;
    };
    let setup = effects_table(&url).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = instance(&url, &runs).await;
    let key = format!("{}-burst", idem_tests::nonce());
    let first = post_charge(&reqwest::Client::new(), &app, &key).await;
    assert_eq!(first, (StatusCode::CREATED, false));

    let copies = 40;
    let answers = burst(copies, &app, &key).await;
    let replays = answers
        .iter()
        .filter(|&&answer| answer == (StatusCode::CREATED, true))
        .count();
    assert_eq!(replays, copies, "every retry replays: {answers:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(effects(&setup, &key).await, 1);
}
