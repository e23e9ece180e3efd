//! `PgStore` through PgBouncer in transaction pooling (`.ci/services`
//! starts it; `IDEM_TEST_PGBOUNCER_URL`): each transaction of a client
//! connection may run on another server session, shared with other
//! clients. The store and transactional conformance suites, `migrate` from
//! several processes' pools at once, and the statements docs/poolers.md
//! tells users to write.
#![cfg(all(feature = "test-util", feature = "postgres"))]

use std::time::Duration;

use idem_sql::PgStore;
use idem_sql::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use idem_sql::sqlx::{self, Row};
use idem_test_support::{pgbouncer_url, server_missing};

/// A pool of 20 client connections, with the statement cache off as sqlx
/// users behind PgBouncer are told to set it (with sqlx 0.9 it still names
/// statements: idem's own must not depend on it either way).
async fn pooled() -> Option<PgPool> {
    let url = pgbouncer_url();
    let options = match url.parse::<PgConnectOptions>() {
        Ok(options) => options.statement_cache_capacity(0),
        Err(err) => return server_missing("PgBouncer", &url, err),
    };
    match PgPoolOptions::new()
        .max_connections(20)
        .connect_with(options)
        .await
    {
        Ok(pool) => Some(pool),
        Err(err) => server_missing("PgBouncer", &url, err),
    }
}

async fn store() -> Option<PgStore> {
    let store = PgStore::builder(pooled().await?)
        .lock_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    store.migrate().await.expect("migrate through the pooler");
    Some(store)
}

mod through_pgbouncer {
    idem_core::store_conformance_tests!(super::store());
    idem_sql::transactional_conformance_tests!(super::store());
}

/// Three processes starting at once, each migrating a fresh table through
/// the pooler: every `migrate` succeeds (sqlx's named statements failed it
/// with 42P05, `sqlx_s_1` already exists on a shared session).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_from_several_pools_at_once() {
    let Some(first) = pooled().await else { return };
    let table = format!("idem_pooled_{:08x}", std::process::id() ^ rand_u32());
    let mut starts = Vec::new();
    for _ in 0..3 {
        let table = table.clone();
        starts.push(tokio::spawn(async move {
            let pool = pooled().await.expect("PgBouncer");
            for _ in 0..5 {
                let store = PgStore::builder(pool.clone())
                    .table(&table)
                    .build()
                    .unwrap();
                store.migrate().await?;
            }
            Ok::<_, idem_core::Error>(())
        }));
    }
    for start in starts {
        start.await.unwrap().expect("migrate through the pooler");
    }
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM information_schema.tables WHERE table_name = $1")
            .persistent(false)
            .bind(&table)
            .fetch_one(&mut *first.begin().await.unwrap())
            .await
            .unwrap();
    assert_eq!(tables, 1);
}

/// What docs/poolers.md tells users to write for their own queries: each
/// statement unnamed (`.persistent(false)`), in a transaction. Many clients
/// with statements of different shapes, over four server sessions: every
/// answer is the client's own. (Outside a transaction the same statements
/// were answered with other clients' statements: sqlx parses and runs in
/// two round trips, and the pooler may give each its own session.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unnamed_statements_in_transactions_answer_their_own_client() {
    let Some(pool) = pooled().await else { return };
    let mut clients = Vec::new();
    for client in 0..20_i64 {
        let pool = pool.clone();
        clients.push(tokio::spawn(async move {
            let mut right = 0;
            for i in 0..100_i64 {
                // Two shapes, so that a statement run with another's
                // parameters would fail, and another's text would answer
                // another sum.
                let sql = if client % 2 == 0 {
                    format!("SELECT $1::int8 + {client}")
                } else {
                    format!("SELECT $1::int8 + $2::int8 + {client}")
                };
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .persistent(false)
                    .bind(i);
                if client % 2 == 1 {
                    query = query.bind(0_i64);
                }
                let mut tx = pool.begin().await.expect("begin");
                let row = query.fetch_one(&mut *tx).await.expect("its own statement");
                tx.commit().await.expect("commit");
                right += i64::from(row.get::<i64, _>(0) == i + client);
            }
            right
        }));
    }
    let mut right = 0;
    for client in clients {
        right += client.await.unwrap();
    }
    assert_eq!(right, 20 * 100);
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) as u32
}
