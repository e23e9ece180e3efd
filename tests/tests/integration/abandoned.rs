//! A client that goes away while its claim is on its way to the store: the
//! claim may still land after the client has gone, and is then let go at
//! once, without calling the service, so a retry runs the handler straight
//! away instead of meeting 409 for a whole lease. On PostgreSQL, with the
//! records' table locked by the test so that the claim's statement is
//! waiting inside the database when the client leaves.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use http::{Request, StatusCode};
use idem_tests::Backend;
use idem_tower::sql::sqlx::{self, AssertSqlSafe, PgPool, postgres::PgPoolOptions};
use idem_tower::{Idempotency, PgStore};
use tower::ServiceExt;

/// Long enough that a claim left behind would fail the test: the retry
/// below gives up after a tenth of it.
const LEASE: Duration = Duration::from_secs(60);

fn order(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Body::from(r#"{"amount_cents":500}"#))
        .expect("a valid request")
}

async fn send(app: &Router, key: &str) -> Response {
    app.clone().oneshot(order(key)).await.expect("infallible")
}

async fn pool_of(connections: u32, url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .connect(url)
        .await
        .expect("PostgreSQL")
}

/// Statements of other sessions waiting for a lock on `table`.
async fn waiting_on(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' \
         AND pid <> pg_backend_pid()",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .expect("pg_stat_activity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_its_claim_waits_in_postgres_leaves_the_key_free() {
    let Some(url) = Backend::Postgres.database_url().await else {
        return;
    };
    // The store's pool holds one connection, whose statements are prepared
    // by a first request: the claim that waits below is executing, not
    // being prepared. The test's own statements go through another pool.
    let store_pool = pool_of(1, &url).await;
    let pool = pool_of(2, &url).await;
    let table = format!("idem_abandoned_{}", idem_tests::nonce());
    let store = PgStore::builder(store_pool)
        .table(&table)
        .lock_timeout(Duration::from_secs(20))
        .build()
        .expect("a table name");
    store.migrate().await.expect("migrate");

    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move || {
                let runs = counted.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    StatusCode::CREATED
                }
            }),
        )
        .layer(Idempotency::builder(store).lease(LEASE).build().layer());
    let warm = send(&app, "k-warm").await;
    assert_eq!(warm.status(), StatusCode::CREATED);

    // The records' table locked: the claim's statement waits in PostgreSQL.
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!(
        "LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *lock)
    .await
    .expect("lock the table");
    let cut_off = tokio::time::timeout(Duration::from_millis(500), send(&app, "k-abandoned")).await;
    assert!(cut_off.is_err(), "answered while its claim could not run");
    assert_eq!(
        waiting_on(&pool, &table).await,
        1,
        "the claim's statement is waiting in the database as its client leaves"
    );
    // The claim now runs, for a client that is no longer there.
    lock.commit().await.expect("unlock");

    let started = Instant::now();
    let retry = loop {
        let response = send(&app, "k-abandoned").await;
        if response.status() != StatusCode::CONFLICT {
            break response;
        }
        assert!(
            started.elapsed() < LEASE / 10,
            "the key stayed claimed by the client that left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the handler ran for the warm-up and the retry, not for the client that left"
    );

    // One record: the retry's, completed and replayed from here on.
    let replay = send(&app, "k-abandoned").await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert!(replay.headers().get("idempotent-replayed").is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await
        .expect("drop the table");
}
