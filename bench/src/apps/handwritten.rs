//! The orders endpoint with deduplication written by hand, as a careful
//! engineer writes it for each database without idem: the baseline idem
//! is measured against.
//!
//! In the business transaction, first the deduplication row: the
//! idempotency key under a unique key scoped by the tenant, with a hash of
//! the request. If it was inserted, the handler's writes follow, then the
//! response is stored in that row, and everything commits together. If the
//! key was there already, the stored response is answered (same status,
//! `Location` and body, marked `Idempotent-Replayed: true`), or `422` for
//! another request under the key. A concurrent duplicate meets the first's
//! uncommitted row: it waits for it up to a short lock timeout set once per
//! connection, then reads what the first committed, or answers `409`.
//!
//! | database | the row | waiting for a concurrent first |
//! |---|---|---|
//! | PostgreSQL | `INSERT ... ON CONFLICT DO NOTHING`, then a read on conflict | `lock_timeout`, set when the pool connects |
//! | MySQL/MariaDB | `INSERT IGNORE`, then a locking read on conflict | `innodb_lock_wait_timeout`, set when the pool connects |
//! | SQLite | `INSERT ... ON CONFLICT DO NOTHING`, then a read on conflict | the write lock, up to the busy timeout |
//!
//! One statement more than the bare endpoint before its writes, and one
//! after them (the response stored).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use idem_tower::sql::sqlx::mysql::MySqlPoolOptions;
use idem_tower::sql::sqlx::postgres::PgPoolOptions;
use idem_tower::sql::sqlx::{self, Executor, MySql, Postgres, Sqlite};

use super::orders::{
    AccountOrder, DEDUP_TABLE, OrdersDb, Placed, prepare_mysql_orders, prepare_sqlite_orders,
};
use super::pools::sqlite_pool;
use super::{AppState, Pools, Routes};

/// How long a duplicate waits for a concurrent first's transaction before
/// it answers `409`: one second (MySQL's least).
const LOCK_WAIT_SECS: u64 = 1;

/// A stored response: status, `Location`, body.
type Stored = (i32, Option<String>, Vec<u8>);

/// What the deduplication row of a key says, when it was there already.
enum Found {
    /// The response stored by the request that committed the key.
    Response(Stored),
    /// The key was used for another request (its hash differs).
    OtherRequest,
}

/// The request's key and tenant, and a hash of its body.
struct Dedup {
    tenant: String,
    key: String,
    fingerprint: i64,
}

impl Dedup {
    /// From the request's headers and body; `None` without a usable key.
    fn of(headers: &HeaderMap, body: &[u8]) -> Option<Self> {
        let key = headers.get("idempotency-key")?.to_str().ok()?;
        if key.is_empty() || key.len() > 255 {
            return None;
        }
        let tenant = headers
            .get("x-tenant-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mut hasher = DefaultHasher::new();
        body.hash(&mut hasher);
        Some(Self {
            tenant: tenant.to_owned(),
            key: key.to_owned(),
            fingerprint: hasher.finish().cast_signed(),
        })
    }

    /// What a row found under the key says to this request.
    fn found(&self, (fingerprint, stored): (i64, Stored)) -> Found {
        if fingerprint == self.fingerprint {
            Found::Response(stored)
        } else {
            Found::OtherRequest
        }
    }
}

/// The statements of one database's hand-written deduplication.
trait HandDedup: OrdersDb {
    /// Inserts the key's row; `false` if it was there already.
    async fn insert_key(conn: &mut Self::Connection, dedup: &Dedup) -> Result<bool, sqlx::Error>;
    /// The key's row: its request hash and stored response.
    async fn read_key(
        conn: &mut Self::Connection,
        dedup: &Dedup,
    ) -> Result<(i64, Stored), sqlx::Error>;
    /// Stores the response in the key's row.
    async fn store_response(
        conn: &mut Self::Connection,
        dedup: &Dedup,
        response: &Stored,
    ) -> Result<(), sqlx::Error>;
    /// Whether `err` is a lock wait run out: a concurrent first holds the
    /// key.
    fn is_lock_wait(err: &sqlx::Error) -> bool;
}

/// Whether `err` is a database error with one of these codes.
fn has_code(err: &sqlx::Error, codes: &[&str]) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| codes.contains(&code.as_ref()))
}

/// `HandDedup` on a database with `$n` parameters and `ON CONFLICT`
/// (PostgreSQL, SQLite).
macro_rules! on_conflict_do_nothing {
    ($db:ty, $lock_codes:expr) => {
        impl HandDedup for $db {
            async fn insert_key(
                conn: &mut Self::Connection,
                dedup: &Dedup,
            ) -> Result<bool, sqlx::Error> {
                let done = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {DEDUP_TABLE} (tenant, idem_key, fingerprint) \
                     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
                )))
                .bind(&dedup.tenant)
                .bind(&dedup.key)
                .bind(dedup.fingerprint)
                .execute(&mut *conn)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn read_key(
                conn: &mut Self::Connection,
                dedup: &Dedup,
            ) -> Result<(i64, Stored), sqlx::Error> {
                let (fingerprint, status, location, body): (
                    i64,
                    Option<i32>,
                    Option<String>,
                    Option<Vec<u8>>,
                ) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT fingerprint, status, location, body FROM {DEDUP_TABLE} \
                     WHERE tenant = $1 AND idem_key = $2"
                )))
                .bind(&dedup.tenant)
                .bind(&dedup.key)
                .fetch_one(&mut *conn)
                .await?;
                Ok((
                    fingerprint,
                    (status.unwrap_or(500), location, body.unwrap_or_default()),
                ))
            }

            async fn store_response(
                conn: &mut Self::Connection,
                dedup: &Dedup,
                (status, location, body): &Stored,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE {DEDUP_TABLE} SET status = $3, location = $4, body = $5 \
                     WHERE tenant = $1 AND idem_key = $2"
                )))
                .bind(&dedup.tenant)
                .bind(&dedup.key)
                .bind(*status)
                .bind(location.as_deref())
                .bind(&body[..])
                .execute(&mut *conn)
                .await?;
                Ok(())
            }

            fn is_lock_wait(err: &sqlx::Error) -> bool {
                has_code(err, $lock_codes)
            }
        }
    };
}

// PostgreSQL: lock_not_available. SQLite: SQLITE_BUSY (and its extended
// codes), the write lock held past the busy timeout.
on_conflict_do_nothing!(Postgres, &["55P03"]);
on_conflict_do_nothing!(Sqlite, &["5", "261", "517"]);

impl HandDedup for MySql {
    async fn insert_key(conn: &mut Self::Connection, dedup: &Dedup) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT IGNORE INTO {DEDUP_TABLE} (tenant, idem_key, fingerprint) VALUES (?, ?, ?)"
        )))
        .bind(&dedup.tenant)
        .bind(&dedup.key)
        .bind(dedup.fingerprint)
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn read_key(
        conn: &mut Self::Connection,
        dedup: &Dedup,
    ) -> Result<(i64, Stored), sqlx::Error> {
        // A locking read: the latest committed row, not the snapshot's.
        let (fingerprint, status, location, body): (
            i64,
            Option<i32>,
            Option<String>,
            Option<Vec<u8>>,
        ) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT fingerprint, status, location, body FROM {DEDUP_TABLE} \
             WHERE tenant = ? AND idem_key = ? LOCK IN SHARE MODE"
        )))
        .bind(&dedup.tenant)
        .bind(&dedup.key)
        .fetch_one(&mut *conn)
        .await?;
        Ok((
            fingerprint,
            (status.unwrap_or(500), location, body.unwrap_or_default()),
        ))
    }

    async fn store_response(
        conn: &mut Self::Connection,
        dedup: &Dedup,
        (status, location, body): &Stored,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {DEDUP_TABLE} SET status = ?, location = ?, body = ? \
             WHERE tenant = ? AND idem_key = ?"
        )))
        .bind(*status)
        .bind(location.as_deref())
        .bind(&body[..])
        .bind(&dedup.tenant)
        .bind(&dedup.key)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    fn is_lock_wait(err: &sqlx::Error) -> bool {
        // ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK
        err.as_database_error()
            .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
            .is_some_and(|e| matches!(e.number(), 1205 | 1213))
    }
}

/// What the transaction came to.
enum Done {
    /// The handler ran; its response, stored.
    Placed(Stored),
    Found(Found),
}

/// The orders endpoint with hand-written deduplication on `DB`.
async fn create_order_hand<DB: HandDedup>(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(dedup) = Dedup::of(&headers, &body) else {
        return (
            StatusCode::BAD_REQUEST,
            "an Idempotency-Key header is required",
        )
            .into_response();
    };
    let Ok(order) = serde_json::from_slice::<AccountOrder>(&body) else {
        return StatusCode::UNPROCESSABLE_ENTITY.into_response();
    };
    let result = async {
        let mut tx = DB::bare_pool(&state).begin().await?;
        if !DB::insert_key(&mut tx, &dedup).await? {
            let found = DB::read_key(&mut tx, &dedup).await?;
            // Nothing of ours to keep: rolled back when dropped.
            return Ok(Done::Found(dedup.found(found)));
        }
        state.calls.fetch_add(1, Ordering::Relaxed);
        let placed = DB::place_order(&mut tx, order).await?;
        if !state.delay.is_zero() {
            tokio::time::sleep(state.delay).await;
        }
        let response = render(&placed);
        DB::store_response(&mut tx, &dedup, &response).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(Done::Placed(response))
    };
    match result.await {
        Ok(Done::Placed(response)) => answer(response, false),
        Ok(Done::Found(Found::Response(response))) => answer(response, true),
        Ok(Done::Found(Found::OtherRequest)) => StatusCode::UNPROCESSABLE_ENTITY.into_response(),
        Err(err) if DB::is_lock_wait(&err) => (
            StatusCode::CONFLICT,
            [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The response to store for `placed`: what the bare endpoint answers.
fn render(placed: &Placed) -> Stored {
    let body = serde_json::to_vec(placed).expect("an order serializes");
    (
        i32::from(StatusCode::CREATED.as_u16()),
        Some(format!("/orders/{}", placed.order_id)),
        body,
    )
}

/// `response`, as answered first or replayed.
fn answer((status, location, body): Stored, replayed: bool) -> Response {
    let status = u16::try_from(status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(location) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// The endpoint with hand-written deduplication on PostgreSQL, its pool
/// (each connection's `lock_timeout` set as it connects) in the app's
/// state.
pub(super) async fn on_postgres(
    url: &str,
    pool: u32,
    state: &mut AppState,
) -> Result<Routes, String> {
    let pool = PgPoolOptions::new()
        .max_connections(pool)
        .after_connect(|conn, _| {
            Box::pin(async move {
                let set = format!("SET lock_timeout = '{LOCK_WAIT_SECS}s'");
                conn.execute(sqlx::AssertSqlSafe(set)).await.map(drop)
            })
        })
        .connect(url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
    state.pg = Some(pool.clone());
    Ok((
        Router::new().route("/orders", post(create_order_hand::<Postgres>)),
        Pools::pg(pool),
    ))
}

/// The same on MySQL/MariaDB (each connection's
/// `innodb_lock_wait_timeout` set as it connects).
pub(super) async fn on_mysql(
    url: &str,
    pool: u32,
    accounts: u32,
    state: &mut AppState,
) -> Result<Routes, String> {
    let pool = MySqlPoolOptions::new()
        .max_connections(pool)
        .after_connect(|conn, _| {
            Box::pin(async move {
                let set = format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECS}");
                conn.execute(sqlx::AssertSqlSafe(set)).await.map(drop)
            })
        })
        .connect(url)
        .await
        .map_err(|e| format!("MySQL at {url}: {e}"))?;
    prepare_mysql_orders(&pool, accounts).await?;
    state.mysql = Some(pool.clone());
    Ok((
        Router::new().route("/orders", post(create_order_hand::<MySql>)),
        Pools::mysql(pool),
    ))
}

/// The same on SQLite (`synchronous = NORMAL`; a concurrent duplicate
/// waits for the write lock up to the pool's busy timeout).
pub(super) async fn on_sqlite(
    path: &Path,
    pool: u32,
    accounts: u32,
    state: &mut AppState,
) -> Result<Routes, String> {
    let pool = sqlite_pool(path, pool, false).await?;
    prepare_sqlite_orders(&pool, accounts).await?;
    state.sqlite = Some(pool.clone());
    Ok((
        Router::new().route("/orders", post(create_order_hand::<Sqlite>)),
        Pools::sqlite(pool),
    ))
}
