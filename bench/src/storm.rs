//! The storm: many duplicates of one slow transactional request, arriving
//! with a few distinct keys, on PostgreSQL with a small pool. What it shows:
//! how many pooled connections are in use, when the duplicates are answered
//! against when the first completes, and how long the distinct keys take
//! with the duplicates against without them (the baseline, in the same
//! run).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use http::StatusCode;
use idem_tower::sql::sqlx::{self, PgPool, Postgres, postgres::PgPoolOptions};
use idem_tower::{Idempotency, PgStore, Tx};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// One storm's shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) pool: u32,
    pub(crate) duplicates: usize,
    pub(crate) keys: usize,
    pub(crate) handler: Duration,
}

/// What one storm measured.
#[derive(Debug, Clone)]
pub(crate) struct StormRow {
    pub(crate) shape: Shape,
    /// Most pooled connections in use at once.
    pub(crate) peak_connections: u32,
    /// When the first request with the duplicated key completed.
    pub(crate) first_done: Option<Duration>,
    /// When the last duplicate was answered.
    pub(crate) last_duplicate: Option<Duration>,
    /// Duplicates answered 409 / replayed / 5xx.
    pub(crate) conflicts: usize,
    pub(crate) replays: usize,
    pub(crate) errors: usize,
    /// When the last first request (distinct keys and the duplicated
    /// key's first) completed.
    pub(crate) keys_done: Duration,
    /// Handler runs, and the keys that should have run.
    pub(crate) runs: u32,
    pub(crate) expected_runs: u32,
}

#[derive(Clone)]
struct App {
    pool: PgPool,
    runs: Arc<AtomicU32>,
    handler: Duration,
}

async fn charge(
    State(app): State<App>,
    mut tx: Tx<Postgres>,
    Json(op): Json<String>,
) -> Result<StatusCode, StatusCode> {
    app.runs.fetch_add(1, Ordering::SeqCst);
    sqlx::query("INSERT INTO bench_storm (op) VALUES ($1)")
        .bind(op)
        .execute(&mut *tx)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    // Handlers read through the pool too.
    sqlx::query("SELECT 1")
        .execute(&app.pool)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    tokio::time::sleep(app.handler).await;
    Ok(StatusCode::CREATED)
}

/// Runs `shape` once with its duplicates, and once without them (the
/// baseline: the same first requests alone), each on a fresh app and fresh
/// keys.
pub(crate) async fn run(
    server_rt: &Handle,
    pg_url: &str,
    nonce: &str,
    shape: Shape,
) -> Result<[StormRow; 2], String> {
    let baseline = Shape {
        duplicates: 0,
        ..shape
    };
    let pool = shape.pool;
    let with = once(server_rt, pg_url, &format!("{nonce}-p{pool}-d"), shape).await?;
    let without = once(server_rt, pg_url, &format!("{nonce}-p{pool}-b"), baseline).await?;
    Ok([without, with])
}

/// One storm on a fresh app: the first requests and their duplicates
/// released at once, the pool's connections in use sampled meanwhile.
async fn once(
    server_rt: &Handle,
    pg_url: &str,
    nonce: &str,
    shape: Shape,
) -> Result<StormRow, String> {
    let served = serve(server_rt, pg_url, shape).await?;
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn(peak_in_use(served.pool.clone(), Arc::clone(&sampling)));
    let tasks = release(served.addr, nonce, shape);
    let mut row = tally(shape, tasks).await?;
    sampling.store(false, Ordering::Relaxed);
    row.peak_connections = sampler.await.map_err(|e| e.to_string())?;
    row.runs = served.runs.load(Ordering::SeqCst);
    served.server.abort();
    served.pool.close().await;
    Ok(row)
}

/// A storm's app, serving on the server runtime.
struct Served {
    /// Its pool, of `shape.pool` connections.
    pool: PgPool,
    /// Handler runs.
    runs: Arc<AtomicU32>,
    addr: SocketAddr,
    server: JoinHandle<std::io::Result<()>>,
}

/// Serves `charge` behind idem in transactional mode on `127.0.0.1:0`.
async fn serve(server_rt: &Handle, pg_url: &str, shape: Shape) -> Result<Served, String> {
    let pool = PgPoolOptions::new()
        .max_connections(shape.pool)
        .acquire_timeout(Duration::from_secs(30))
        .connect(pg_url)
        .await
        .map_err(|e| format!("PostgreSQL at {pg_url}: {e}"))?;
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_storm (op TEXT NOT NULL)")
        .execute(&pool)
        .await
        .map_err(|e| e.to_string())?;
    let store = PgStore::new(pool.clone());
    let layer = Idempotency::new(store)
        .layer_with_key("storm:{header:idempotency-key}")
        .map_err(|e| e.to_string())?
        .transactional()
        .map_err(|e| e.to_string())?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/charges", post(charge).layer(layer))
        .with_state(App {
            pool: pool.clone(),
            runs: Arc::clone(&runs),
            handler: shape.handler,
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = server_rt.spawn(async move { axum::serve(listener, app).await });
    Ok(Served {
        pool,
        runs,
        addr,
        server,
    })
}

/// The most connections of `pool` in use at once, sampled every 2 ms
/// while `sampling` holds.
async fn peak_in_use(pool: PgPool, sampling: Arc<AtomicBool>) -> u32 {
    let mut peak = 0;
    while sampling.load(Ordering::Relaxed) {
        let in_use = pool.size().saturating_sub(pool.num_idle() as u32);
        peak = peak.max(in_use);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    peak
}

/// One request's answer: whether it carried the duplicated key, its status
/// and whether it was marked as a replay (or the error), and when it came.
type Answer = (bool, Result<(StatusCode, bool), String>, Duration);

/// Sends the first request with the duplicated key and its duplicates
/// (none in the baseline), then the distinct keys, all released at once.
fn release(addr: SocketAddr, nonce: &str, shape: Shape) -> Vec<JoinHandle<Answer>> {
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/charges");
    let dup_key = format!("{nonce}-dup");
    let keys: Vec<(bool, String)> = std::iter::repeat_n((true, dup_key), shape.duplicates + 1)
        .chain((0..shape.keys).map(|i| (false, format!("{nonce}-k{i}"))))
        .collect();
    let start = Instant::now();
    let barrier = Arc::new(tokio::sync::Barrier::new(keys.len()));
    keys.into_iter()
        .map(|(duplicated, key)| {
            let (client, url, barrier) = (client.clone(), url.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let status = client
                    .post(&url)
                    .header("idempotency-key", &key)
                    .json(&key)
                    .send()
                    .await
                    .map(|r| (r.status(), r.headers().contains_key("idempotent-replayed")))
                    .map_err(|e| e.to_string());
                (duplicated, status, start.elapsed())
            })
        })
        .collect()
}

/// Waits for every answer and counts them into a row (without the peak
/// connections and handler runs, known once the storm is over).
async fn tally(shape: Shape, tasks: Vec<JoinHandle<Answer>>) -> Result<StormRow, String> {
    let mut row = StormRow {
        shape,
        peak_connections: 0,
        first_done: None,
        last_duplicate: None,
        conflicts: 0,
        replays: 0,
        errors: 0,
        keys_done: Duration::ZERO,
        runs: 0,
        expected_runs: shape.keys as u32 + 1,
    };
    for task in tasks {
        let (duplicated, status, at) = task.await.map_err(|e| e.to_string())?;
        match (duplicated, status) {
            (false, Ok((StatusCode::CREATED, false))) => row.keys_done = row.keys_done.max(at),
            (true, Ok((StatusCode::CREATED, false))) => {
                row.first_done = Some(at);
                row.keys_done = row.keys_done.max(at);
            }
            (true, Ok((StatusCode::CONFLICT, _))) => {
                row.conflicts += 1;
                row.last_duplicate = row.last_duplicate.max(Some(at));
            }
            (true, Ok((StatusCode::CREATED, true))) => {
                row.replays += 1;
                row.last_duplicate = row.last_duplicate.max(Some(at));
            }
            _ => row.errors += 1,
        }
    }
    Ok(row)
}

/// The storm table, in Markdown.
pub(crate) fn write(out: &mut impl std::io::Write, rows: &[StormRow]) -> std::io::Result<()> {
    writeln!(
        out,
        "| pool | duplicates + first requests | handler | peak connections in use | first done ms | last duplicate answered ms | duplicates 409 / replayed / 5xx | first requests done ms | vs no duplicates | first requests/s | handler runs (expected) |"
    )?;
    writeln!(out, "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|")?;
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    for pair in rows.chunks(2) {
        let [baseline, storm] = pair else { continue };
        for row in [baseline, storm] {
            let s = row.shape;
            writeln!(
                out,
                "| {} | {} + {} | {} ms | {} | {} | {} | {} / {} / {} | {} | {} | {:.1} | {} ({}) |",
                s.pool,
                s.duplicates,
                s.keys + 1,
                s.handler.as_millis(),
                row.peak_connections,
                row.first_done.map_or("-".into(), ms),
                row.last_duplicate.map_or("-".into(), ms),
                row.conflicts,
                row.replays,
                row.errors,
                ms(row.keys_done),
                if std::ptr::eq(row, baseline) {
                    "1.00x".to_owned()
                } else {
                    format!(
                        "{:.2}x",
                        row.keys_done.as_secs_f64() / baseline.keys_done.as_secs_f64()
                    )
                },
                (s.keys + 1) as f64 / row.keys_done.as_secs_f64(),
                row.runs,
                row.expected_runs,
            )?;
        }
    }
    Ok(())
}
