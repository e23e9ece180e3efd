//! A transactional handler that groups its writes the way sqlx users do,
//! in a nested transaction (`begin()` and `commit()` on the `Tx` it is
//! given), over real HTTP on loopback, on PostgreSQL, PgBouncer,
//! MySQL/MariaDB and a SQLite file: the nested transaction is a savepoint,
//! so a request that then fails keeps none of its writes, its retry runs
//! once, and another instance never gets the key while the first runs.
//! A handler that sends a raw COMMIT instead never makes its effect
//! twice. Every effect is a row tagged with the handler run that wrote it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use idem_tests::Backend;
use idem_tower::sql::sqlx::{self, AssertSqlSafe, Connection, Database, Executor, Pool};
use idem_tower::sql::{Dialect, SqlStore};
use idem_tower::{Idempotency, Tx};

/// The effects table: one row per write, with the key and the handler run
/// that wrote it.
const EFFECTS: &str = "idem_handler_tx_effects";

/// The handler's runs, numbered across instances.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

/// How the handler ends its first write, from the `x-mode` header.
fn mode(headers: &HeaderMap) -> &str {
    headers
        .get("x-mode")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("nested")
}

/// Writes one effect row for `key` by `run`, in the nested transaction
/// (`nested`: `sqlx::Connection::begin(&mut *tx)`; `method`: `tx.begin()`)
/// or before a raw COMMIT (`raw-commit`); then fails with a 500 if asked
/// (`x-fail`), waits if asked (`x-pause-ms`), and writes a second row.
async fn order<DB>(
    mut tx: Tx<DB>,
    Extension(runs): Extension<Runs>,
    headers: HeaderMap,
) -> StatusCode
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let run = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let write = || {
        AssertSqlSafe(format!(
            "INSERT INTO {EFFECTS} (k, run) VALUES ('{key}', {run})"
        ))
    };
    let first = async {
        match mode(&headers) {
            "nested" => {
                let mut inner = sqlx::Connection::begin(&mut *tx).await?;
                sqlx::raw_sql(write()).execute(&mut *inner).await?;
                inner.commit().await
            }
            "method" => {
                let mut inner = tx.begin().await?;
                sqlx::raw_sql(write()).execute(&mut *inner).await?;
                inner.commit().await
            }
            _ => {
                sqlx::raw_sql(write()).execute(&mut *tx).await?;
                sqlx::raw_sql("COMMIT").execute(&mut *tx).await.map(drop)
            }
        }
    };
    if first.await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    if headers.contains_key("x-fail") {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    if let Some(ms) = headers
        .get("x-pause-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    match sqlx::raw_sql(write()).execute(&mut *tx).await {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// One instance of the app: its own pool and store on the shared table,
/// served on loopback.
struct Instance {
    base: String,
    client: reqwest::Client,
}

impl Instance {
    async fn start<DB>(pool: Pool<DB>, runs: Runs) -> Self
    where
        DB: Dialect,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    {
        let store = SqlStore::<DB>::builder(pool)
            .table("idem_handler_tx_records")
            .build()
            .expect("a store");
        store.migrate().await.expect("migrated");
        let layer = Idempotency::new(store)
            .layer_with_key("handler-tx:{header:idempotency-key}")
            .expect("a key template")
            .transactional()
            .expect("a transactional store");
        let app = Router::new()
            .route("/orders", post(order::<DB>).layer(layer))
            .layer(Extension(runs));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base,
            client: reqwest::Client::new(),
        }
    }

    /// Sends the order of `key` with `headers`: its status and its problem
    /// type (empty if none).
    async fn send_for_type(&self, key: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let response = self.request(key, headers).send().await.expect("an answer");
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let problem = body["type"].as_str().unwrap_or_default().to_owned();
        (status, problem)
    }

    /// The order of `key` with `headers`.
    fn request(&self, key: &str, headers: &[(&str, &str)]) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(format!("{}/orders", self.base))
            .header("idempotency-key", key)
            .body("{}");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
    }

    /// Sends the order of `key` with `headers`: its status and whether it
    /// was a replay.
    async fn send(&self, key: &str, headers: &[(&str, &str)]) -> (u16, bool) {
        let response = self
            .request(key, headers)
            .send()
            .await
            .expect("an answer over loopback");
        let replayed = response.headers().contains_key("idempotent-replayed");
        (response.status().as_u16(), replayed)
    }
}

/// The runs whose rows `key` has, in order, one entry per row.
async fn rows<DB: Database>(pool: &Pool<DB>, key: &str) -> Vec<i64>
where
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let rows = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT run FROM {EFFECTS} WHERE k = '{key}' ORDER BY run"
    )))
    .fetch_all(pool)
    .await
    .expect("the effects");
    rows.iter()
        .map(|row| sqlx::Row::try_get::<i64, _>(row, 0).expect("a run"))
        .collect()
}

/// The cases, on one database: `pool` and `other` are two pools on it, the
/// two instances' own.
async fn cases<DB>(pool: Pool<DB>, other: Pool<DB>)
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {EFFECTS} (k VARCHAR(64) NOT NULL, run BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("the effects table");
    let runs = Runs::default();
    let a = Instance::start(pool.clone(), runs.clone()).await;
    let b = Instance::start(other, runs.clone()).await;
    let nonce = idem_tests::nonce();

    // A nested commit, then a failure; the retry; a duplicate.
    for mode in ["nested", "method"] {
        let key = format!("{nonce}-{mode}-fail");
        let fail = [("x-mode", mode), ("x-fail", "1")];
        assert_eq!(a.send(&key, &fail).await, (500, false), "{mode}");
        assert_eq!(
            rows(&pool, &key).await,
            [] as [i64; 0],
            "{mode}: the failed request's nested commit kept its write"
        );
        assert_eq!(
            a.send(&key, &[("x-mode", mode)]).await,
            (201, false),
            "{mode}"
        );
        let kept = rows(&pool, &key).await;
        assert_eq!(kept.len(), 2, "{mode}: {kept:?}");
        assert_eq!(kept[0], kept[1], "{mode}: one run's writes: {kept:?}");
        assert_eq!(
            b.send(&key, &[("x-mode", mode)]).await,
            (201, true),
            "{mode}"
        );
        assert_eq!(rows(&pool, &key).await, kept, "{mode}");
    }

    // Two instances: the second asks while the first, past its nested
    // commit, still runs.
    let key = format!("{nonce}-race");
    let first = {
        let key = key.clone();
        let a_base = a.base.clone();
        tokio::spawn(async move {
            let a = Instance {
                base: a_base,
                client: reqwest::Client::new(),
            };
            a.send(&key, &[("x-pause-ms", "1500")]).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // In flight; or, on SQLite, where another process's claim waits for
    // the database's write lock (its busy timeout), the first's replay.
    let (status, replayed) = b.send(&key, &[]).await;
    assert!(
        status == 409 || (status == 201 && replayed),
        "the second instance, while the first runs: {status}, replayed: {replayed}"
    );
    assert_eq!(first.await.expect("the first request"), (201, false));
    assert_eq!(b.send(&key, &[]).await, (201, true));
    let kept = rows(&pool, &key).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(kept[0], kept[1], "one run's writes: {kept:?}");

    // A raw COMMIT: whatever the database kept of the first attempt, the
    // effect is never made by two runs.
    let key = format!("{nonce}-raw");
    let raw = [("x-mode", "raw-commit")];
    let (first, first_type) = a.send_for_type(&key, &raw).await;
    let (second, second_type) = b.send_for_type(&key, &[]).await;
    let kept = rows(&pool, &key).await;
    let mut writers = kept.clone();
    writers.dedup();
    assert!(writers.len() <= 1, "rows of two runs: {kept:?}");
    match (first, second) {
        // The handler's COMMIT was found: the key is kept, not replayed.
        (500, 409) => {
            assert!(!kept.is_empty(), "{kept:?}");
            assert_eq!(first_type, "urn:idem:problem:transaction-ended");
            assert_eq!(second_type, "urn:idem:problem:not-replayable");
        }
        // Nothing of the first attempt was kept (SQLite refused its
        // COMMIT, which the handler answered with a 500): the retry ran,
        // once.
        (500 | 503, 201) => assert_eq!(kept.len(), 2, "{kept:?}"),
        other => panic!("answers {other:?}, rows {kept:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_transaction_is_a_savepoint_on_postgres() {
    let Some(url) = Backend::Postgres.database_url().await else {
        return;
    };
    let connect = || sqlx::PgPool::connect(&url);
    cases(
        connect().await.expect("PostgreSQL"),
        connect().await.expect("PostgreSQL"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_transaction_is_a_savepoint_through_pgbouncer() {
    let Some(url) = Backend::PgBouncer.database_url().await else {
        return;
    };
    // sqlx's own statements unnamed, as through a pooler in transaction
    // pooling they must be.
    let options: sqlx::postgres::PgConnectOptions = url
        .split('?')
        .next()
        .expect("a URL")
        .parse()
        .expect("a PostgreSQL URL");
    let options = options.statement_cache_capacity(0);
    let connect = || sqlx::PgPool::connect_with(options.clone());
    cases(
        connect().await.expect("PgBouncer"),
        connect().await.expect("PgBouncer"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_transaction_is_a_savepoint_on_mysql() {
    let Some(url) = Backend::MySql.database_url().await else {
        return;
    };
    let connect = || sqlx::MySqlPool::connect(&url);
    cases(
        connect().await.expect("MySQL"),
        connect().await.expect("MySQL"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_transaction_is_a_savepoint_on_sqlite() {
    let Some(url) = Backend::Sqlite.database_url().await else {
        return;
    };
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().expect("a SQLite URL");
    let options = options
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let connect = || sqlx::SqlitePool::connect_with(options.clone());
    let pool = connect().await.expect("SQLite");
    cases(pool.clone(), connect().await.expect("SQLite")).await;
}
