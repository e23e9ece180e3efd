//! The background purge (`idem-sql/src/purge.rs`) against real PostgreSQL,
//! MariaDB/MySQL and SQLite, counted: the rows in the table before and
//! after, what each purge says it deleted, and `idem_records_purged_total`.
//! Server URLs come from the environment as in `stores/`
//! (`IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`; a missing server skips
//! its cases, and fails them under `CI=true`); SQLite uses fresh files
//! under the system temp directory. Every case purges a table of its own,
//! so neither other tests' records nor their purges touch its counts.
#![cfg(all(
    feature = "test-util",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_core::conformance::{LONG, acquire, fp, fresh_key};
use idem_core::{IdempotencyStore, Outcome, StoredResponse};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::mysql::MySqlPoolOptions;
use idem_sql::sqlx::postgres::PgPoolOptions;
use idem_sql::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use idem_sql::sqlx::{self, MySql, MySqlPool, PgPool, Pool, Postgres, Sqlite, SqlitePool};
use idem_sql::{PurgeOptions, PurgeTask, SqlStore};
use idem_test_support::{mysql_url, postgres_url, server_missing};
use metrics_exporter_prometheus::PrometheusBuilder;

/// The purges' period: short, so a case waits a few of them.
const PERIOD: Duration = Duration::from_millis(50);
/// The longest a case waits for the purges to be done.
const PATIENCE: Duration = Duration::from_secs(20);

async fn postgres_pool() -> Option<PgPool> {
    let url = postgres_url();
    match PgPoolOptions::new().max_connections(8).connect(&url).await {
        Ok(pool) => Some(pool),
        Err(err) => server_missing("PostgreSQL", &url, err),
    }
}

async fn mysql_pool() -> Option<MySqlPool> {
    let url = mysql_url();
    match MySqlPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await
    {
        Ok(pool) => Some(pool),
        Err(err) => server_missing("MySQL/MariaDB", &url, err),
    }
}

/// A fresh SQLite file in the temp directory, in WAL, removed when dropped.
struct SqliteFile {
    path: PathBuf,
}

impl SqliteFile {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("idem-test-purge-{name}-{:016x}.db", rand_u64()));
        Self { path }
    }

    /// A pool on the file whose connections wait `busy` for SQLite's
    /// write lock.
    async fn pool(&self, busy: Duration) -> SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(busy);
        SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .expect("a SQLite file in the temp directory")
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// A table name no other case or run uses.
fn fresh_table(case: &str) -> String {
    format!("idem_purge_{case}_{:012x}", rand_u64() & 0xffff_ffff_ffff)
}

/// The store on `pool` with its records in `table`, created if missing.
async fn on_table<DB: TestSql>(pool: Pool<DB>, table: &str) -> SqlStore<DB> {
    let store = SqlStore::builder(pool).table(table).build().unwrap();
    store.migrate().await.expect("migrate");
    store
}

/// Drops the store's table and its version table.
async fn drop_table<DB: TestSql>(store: &SqlStore<DB>) {
    let table = store.table();
    DB::exec(store.pool(), format!("DROP TABLE {table}")).await;
    DB::exec(store.pool(), format!("DROP TABLE {table}_schema")).await;
    DB::exec(store.pool(), format!("DROP TABLE IF EXISTS {table}_points")).await;
}

/// Writes `n` expired records: claims of a minute, then expired together
/// by one statement. (Claims of a lease short enough to wait out raced the
/// purges on a loaded machine: a claim's row could expire, and be purged,
/// before the claim was done with it, and the claim wrote it again, one
/// row more than the test counted.)
async fn expired<DB: TestSql>(store: &SqlStore<DB>, n: usize) {
    for _ in 0..n {
        acquire(store, &fresh_key("purge-dead"), &fp(1), LONG).await;
    }
    DB::exec(
        store.pool(),
        format!(
            "UPDATE {} SET expires_at = {} \
             WHERE idem_key LIKE '%purge-dead%' AND expires_at > {}",
            store.table(),
            DB::now_plus_ms("(-1000)"),
            DB::NOW,
        ),
    )
    .await;
}

/// Writes `n` live records: claims of a minute, every other one completed
/// to be kept for a minute.
async fn live<DB: TestSql>(store: &SqlStore<DB>, n: usize) {
    let done = Outcome::Response(StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "done",
    ));
    for i in 0..n {
        let key = fresh_key("purge-live");
        let owner = acquire(store, &key, &fp(1), LONG).await;
        if i % 2 == 0 {
            store.complete(&key, &owner, &done, LONG).await.unwrap();
        }
    }
}

/// Which of a table's rows a count counts.
#[derive(Debug, Clone, Copy)]
enum Rows {
    /// Every row.
    All,
    /// The expired rows, by the database's clock.
    Expired,
}

/// How many `which` rows the store's table holds.
async fn rows<DB: TestSql>(store: &SqlStore<DB>, which: Rows) -> i64 {
    let table = store.table();
    let sql = match which {
        Rows::All => format!("SELECT COUNT(*) FROM {table}"),
        Rows::Expired => format!(
            "SELECT COUNT(*) FROM {table} WHERE expires_at < {}",
            DB::NOW
        ),
    };
    DB::count(store.pool(), sql).await
}

/// Waits until the store's table holds `n` `which` rows.
async fn until_rows<DB: TestSql>(store: &SqlStore<DB>, which: Rows, n: i64) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = rows(store, which).await;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {now} rows ({which:?}) after {PATIENCE:?}, waiting for {n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `ready()` says so. A pass counts what it deleted (in the
/// task and in `idem_records_purged_total`) once its statement has
/// returned, which is after the rows are gone from the table: a count
/// read as soon as the rows are gone may not have caught up yet.
async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} after {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `purge` has counted `n` deleted records or more.
async fn until_purged(purge: &PurgeTask, n: u64) {
    until(&format!("not {n} counted"), || purge.purged() >= n).await;
}

// ----- A purge deletes the expired rows in batches, keeps the live ones,
// and counts what it deleted. A current-thread runtime: the recorder is
// this thread's own, and the purge's task runs on it.

async fn purges_expired_rows_in_batches_and_counts_them<DB: TestSql>(pool: Pool<DB>) {
    const EXPIRED: usize = 45;
    const LIVE: usize = 7;
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let store = on_table(pool, &fresh_table("batches")).await;
    expired(&store, EXPIRED).await;
    live(&store, LIVE).await;
    until_rows(&store, Rows::Expired, EXPIRED as i64).await;
    assert_eq!(rows(&store, Rows::All).await, (EXPIRED + LIVE) as i64);

    // Batches of 10: one pass deletes 10, 10, 10, 10, then 5, and stops.
    let purge = store.purge_in_background(PurgeOptions::every(PERIOD).batch(10));
    until_rows(&store, Rows::All, LIVE as i64).await;
    assert_eq!(
        rows(&store, Rows::All).await,
        LIVE as i64,
        "the live rows are kept"
    );
    let counted = format!("idem_records_purged_total {EXPIRED}\n");
    until(&format!("no {counted:?}"), || {
        scrape.render().contains(&counted)
    })
    .await;
    // A period more: nothing left to delete, nothing more counted.
    tokio::time::sleep(PERIOD * 3).await;
    assert!(!purge.is_finished());
    let text = scrape.render();
    assert!(
        text.contains(&format!("idem_records_purged_total {EXPIRED}\n")),
        "{text}"
    );
    assert_eq!(purge.stop().await, EXPIRED as u64);
    assert_eq!(rows(&store, Rows::All).await, LIVE as i64);
    drop_table(&store).await;
}

#[tokio::test(flavor = "current_thread")]
async fn postgres_purges_expired_rows_in_batches_and_counts_them() {
    let Some(pool) = postgres_pool().await else {
        return;
    };
    purges_expired_rows_in_batches_and_counts_them::<Postgres>(pool).await;
}

#[tokio::test(flavor = "current_thread")]
async fn mysql_purges_expired_rows_in_batches_and_counts_them() {
    let Some(pool) = mysql_pool().await else {
        return;
    };
    purges_expired_rows_in_batches_and_counts_them::<MySql>(pool).await;
}

#[tokio::test(flavor = "current_thread")]
async fn sqlite_purges_expired_rows_in_batches_and_counts_them() {
    let file = SqliteFile::new("batches");
    let pool = file.pool(Duration::from_secs(5)).await;
    purges_expired_rows_in_batches_and_counts_them::<Sqlite>(pool).await;
}

// ----- Two purgers on one table, as two instances run them: both keep
// running, and each expired row is deleted once, by one of them.

/// `writer` writes waves of expired and live records into the table that
/// `a` and `b` purge, each on a pool of its own.
async fn two_purgers_delete_each_row_once<DB: TestSql>(
    writer: SqlStore<DB>,
    a: SqlStore<DB>,
    b: SqlStore<DB>,
) {
    const WAVES: usize = 6;
    const EXPIRED: usize = 40;
    const LIVE: usize = 2;
    let options = PurgeOptions::every(PERIOD).batch(7);
    let (purge_a, purge_b) = (
        a.purge_in_background(options),
        b.purge_in_background(options),
    );
    for _ in 0..WAVES {
        expired(&writer, EXPIRED).await;
        live(&writer, LIVE).await;
        tokio::time::sleep(PERIOD).await;
    }
    until_rows(&writer, Rows::All, (WAVES * LIVE) as i64).await;
    assert!(
        !purge_a.is_finished() && !purge_b.is_finished(),
        "both still run"
    );
    let (by_a, by_b) = (purge_a.stop().await, purge_b.stop().await);
    eprintln!(
        "{}: purger a deleted {by_a}, purger b {by_b}",
        <DB as sqlx::Database>::NAME
    );
    assert_eq!(by_a + by_b, (WAVES * EXPIRED) as u64, "each row once");
    assert_eq!(
        rows(&writer, Rows::All).await,
        (WAVES * LIVE) as i64,
        "the live rows are kept"
    );
    drop_table(&writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_purgers_delete_each_row_once() {
    let Some(pool) = postgres_pool().await else {
        return;
    };
    let table = fresh_table("two");
    let writer = on_table(pool, &table).await;
    let a = on_table(postgres_pool().await.unwrap(), &table).await;
    let b = on_table(postgres_pool().await.unwrap(), &table).await;
    two_purgers_delete_each_row_once(writer, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_two_purgers_delete_each_row_once() {
    let Some(pool) = mysql_pool().await else {
        return;
    };
    let table = fresh_table("two");
    let writer = on_table(pool, &table).await;
    let a = on_table(mysql_pool().await.unwrap(), &table).await;
    let b = on_table(mysql_pool().await.unwrap(), &table).await;
    two_purgers_delete_each_row_once(writer, a, b).await;
}

/// On SQLite the purgers do not wait for the write lock at all (a busy
/// timeout of zero): whenever the other purger or the writer holds it,
/// a pass fails with `SQLITE_BUSY`, and the next period tries again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_purgers_delete_each_row_once() {
    let file = SqliteFile::new("two");
    let table = fresh_table("two");
    let writer = on_table(file.pool(Duration::from_secs(5)).await, &table).await;
    let a = on_table(file.pool(Duration::ZERO).await, &table).await;
    let b = on_table(file.pool(Duration::ZERO).await, &table).await;
    two_purgers_delete_each_row_once(writer, a, b).await;
}

// ----- Rows another transaction holds: PostgreSQL and MySQL/MariaDB skip
// them and delete the rest; SQLite's write lock, held elsewhere, fails the
// passes. Either way the task goes on and deletes them once they are free.

/// How many expired rows the cases of held rows write.
const HELD_CASE_ROWS: usize = 10;

/// Writes the expired rows of a case of held rows into `store`'s table.
async fn expired_rows_to_hold<DB: TestSql>(store: &SqlStore<DB>) {
    expired(store, HELD_CASE_ROWS).await;
    until_rows(store, Rows::Expired, HELD_CASE_ROWS as i64).await;
}

/// Runs `hold` (with `{table}` for the table) on a connection of its own
/// and leaves its transaction open, holding some of the table's expired
/// rows (row locks) or the whole database (SQLite); the purge must delete
/// `deleted_meanwhile` of them meanwhile, never wait on the rest, and
/// delete those too once the transaction rolls back.
async fn held_rows_are_purged_once_free<DB: TestSql>(
    store: SqlStore<DB>,
    hold: &[String],
    deleted_meanwhile: i64,
) {
    let expired_at_start = HELD_CASE_ROWS as i64;
    assert_eq!(rows(&store, Rows::Expired).await, expired_at_start);
    let mut holder = store.pool().acquire().await.unwrap();
    for sql in hold {
        DB::exec_on(&mut holder, sql.replace("{table}", store.table())).await;
    }

    let purge = store.purge_in_background(PurgeOptions::every(PERIOD).batch(3));
    until_rows(&store, Rows::Expired, expired_at_start - deleted_meanwhile).await;
    until_purged(&purge, deleted_meanwhile as u64).await;
    tokio::time::sleep(PERIOD * 4).await;
    assert_eq!(
        rows(&store, Rows::Expired).await,
        expired_at_start - deleted_meanwhile,
        "the held rows are still there"
    );
    assert!(!purge.is_finished(), "a held row does not end the task");
    assert_eq!(purge.purged(), deleted_meanwhile as u64);

    DB::exec_on(&mut holder, "ROLLBACK".to_owned()).await;
    drop(holder);
    until_rows(&store, Rows::All, 0).await;
    assert_eq!(purge.stop().await, HELD_CASE_ROWS as u64);
    drop_table(&store).await;
}

/// Four of the ten expired rows locked (`SELECT ... FOR UPDATE`).
const LOCK_FOUR: &str = "SELECT key_hash FROM {table} ORDER BY key_hash LIMIT 4 FOR UPDATE";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_skips_rows_another_transaction_holds_and_purges_them_later() {
    let Some(pool) = postgres_pool().await else {
        return;
    };
    let store = on_table(pool, &fresh_table("held")).await;
    expired_rows_to_hold(&store).await;
    let hold = ["BEGIN".to_owned(), LOCK_FOUR.to_owned()];
    held_rows_are_purged_once_free(store, &hold, 6).await;
}

/// Besides the four locked rows, the holder inserts, uncommitted, a live
/// row right after each expired one in key order, as open transactional
/// claims would: the purge must not wait on them either (it would hold the
/// rows it deleted locked for as long as those claims' handlers run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_skips_rows_another_transaction_holds_and_purges_them_later() {
    let Some(pool) = mysql_pool().await else {
        return;
    };
    let store = on_table(pool.clone(), &fresh_table("held")).await;
    expired_rows_to_hold(&store).await;
    let table = store.table();
    let hashes: Vec<Vec<u8>> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT key_hash FROM {table}")))
            .fetch_all(&pool)
            .await
            .unwrap();
    let next_rows: Vec<String> = hashes
        .iter()
        .filter(|hash| hash[31] != 0xff)
        .map(|hash| {
            let next: String = hash[..31].iter().map(|b| format!("{b:02x}")).collect();
            format!(
                "(X'{next}ff', 'idem-test:held-next', 'I', NULL, X'{next}ff', NULL,                  UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)"
            )
        })
        .collect();
    let hold = [
        "BEGIN".to_owned(),
        LOCK_FOUR.to_owned(),
        format!(
            "INSERT INTO {{table}} \
               (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
             VALUES {}",
            next_rows.join(", ")
        ),
    ];
    held_rows_are_purged_once_free(store, &hold, 6).await;
}

/// The purge's pool does not wait for the write lock (a busy timeout of
/// zero), so each pass fails at once with `SQLITE_BUSY` while it is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_that_meet_the_write_lock_fail_and_the_purge_goes_on() {
    let file = SqliteFile::new("held");
    let store = on_table(file.pool(Duration::ZERO).await, &fresh_table("held")).await;
    expired_rows_to_hold(&store).await;
    held_rows_are_purged_once_free(store, &["BEGIN IMMEDIATE".to_owned()], 0).await;
}

// ----- A stopped or dropped purge deletes nothing more.

async fn a_stopped_or_dropped_purge_deletes_nothing_more<DB: TestSql>(store: SqlStore<DB>) {
    let options = PurgeOptions::every(PERIOD);
    let purge = store.purge_in_background(options);
    expired(&store, 3).await;
    until_rows(&store, Rows::All, 0).await;
    assert_eq!(purge.stop().await, 3);
    expired(&store, 2).await;
    until_rows(&store, Rows::Expired, 2).await;
    tokio::time::sleep(PERIOD * 3).await;
    assert_eq!(rows(&store, Rows::Expired).await, 2, "kept after stop");

    let purge = store.purge_in_background(options);
    until_rows(&store, Rows::All, 0).await;
    until_purged(&purge, 2).await;
    assert_eq!(purge.purged(), 2);
    drop(purge);
    // A statement under way when it was dropped may still finish.
    tokio::time::sleep(PERIOD).await;
    expired(&store, 2).await;
    until_rows(&store, Rows::Expired, 2).await;
    tokio::time::sleep(PERIOD * 3).await;
    assert_eq!(rows(&store, Rows::Expired).await, 2, "kept after drop");
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stopped_or_dropped_purge_deletes_nothing_more() {
    let Some(pool) = postgres_pool().await else {
        return;
    };
    let store = on_table(pool, &fresh_table("stop")).await;
    a_stopped_or_dropped_purge_deletes_nothing_more(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_stopped_or_dropped_purge_deletes_nothing_more() {
    let Some(pool) = mysql_pool().await else {
        return;
    };
    let store = on_table(pool, &fresh_table("stop")).await;
    a_stopped_or_dropped_purge_deletes_nothing_more(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_stopped_or_dropped_purge_deletes_nothing_more() {
    let file = SqliteFile::new("stop");
    let store = on_table(
        file.pool(Duration::from_secs(5)).await,
        &fresh_table("stop"),
    )
    .await;
    a_stopped_or_dropped_purge_deletes_nothing_more(store).await;
}
