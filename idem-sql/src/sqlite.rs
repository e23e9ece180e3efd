//! SQLite: `INSERT ... ON CONFLICT DO UPDATE ... WHERE expired RETURNING`
//! claims or takes over; the clock is SQLite's `julianday('now')` in Unix
//! milliseconds. One writer at a time: a transactional claim holds the
//! database's write lock until it commits; the store's writes in this
//! process take turns (`writer.rs`), its plain writes in batches of many
//! per statement (`batch.rs`, `sqlite/many.rs`), and those of other
//! processes wait for the pool's `busy_timeout` (duplicates of a live key
//! only read).

use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Sqlite};

use super::batch::{Write, Written};
use super::dialect::{
    ClaimArgs, ClaimStep, Dialect, Queries, RecordRow, bind_all, has_code, record_row,
    run_migrations, sealed, shared_statements,
};
use super::{SqlStore, unavailable};
use idem_core::{Error, OwnerToken};

mod many;
mod script;

const MIGRATIONS: &[(i64, &str)] = &[(
    1,
    include_str!("../migrations/sqlite/0001_create_records.sql"),
)];

impl sealed::Sealed for Sqlite {}

impl Dialect for Sqlite {
    fn placeholder(n: usize) -> String {
        format!("?{n}")
    }

    /// Unix milliseconds.
    const NOW: &'static str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

    fn now_plus_ms(ms: &str) -> String {
        format!("{} + {ms}", Self::NOW)
    }

    fn ms_until(column: &str) -> String {
        format!("{column} - {}", Self::NOW)
    }

    fn int(expr: &str) -> String {
        expr.to_owned()
    }

    fn insert_or_skip(into: &str, values: &str) -> String {
        // With no conflict target: any unique key.
        format!("INSERT INTO {into} VALUES ({values}) ON CONFLICT DO NOTHING")
    }

    // No row locks: a writer holds the whole database's write lock.
    const FOR_UPDATE: &'static str = "";
    const FOR_SHARE: &'static str = "";
    const TIMESTAMP: &'static str = "INTEGER";
    const SHORT_TEXT: &'static str = "TEXT";
    const HASH: &'static str = "BLOB";
    const TABLE_OPTIONS: &'static str = "";

    fn queries(table: &str) -> Queries {
        let (now, left) = (Self::NOW, Self::ms_until("expires_at"));
        let expires = Self::now_plus_ms;
        Queries {
            claim: format!(
                "INSERT INTO {table} AS r \
                   (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
                 VALUES (?1, ?2, 'I', ?3, ?4, NULL, {lease_end}) {take_over} \
                 RETURNING 1",
                lease_end = expires("?5"),
                take_over = take_over_expired(),
            )
            .into(),
            select: format!(
                "SELECT state, owner, fingerprint, outcome, {left} FROM {table} WHERE key_hash = ?1"
            )
            .into(),
            complete: format!(
                "UPDATE {table} SET state = 'C', owner = NULL, outcome = ?1, expires_at = {} \
                 WHERE key_hash = ?3 AND state = 'I' AND owner = ?4",
                expires("?2"),
            )
            .into(),
            release: format!(
                "DELETE FROM {table} WHERE key_hash = ?1 AND state = 'I' AND owner = ?2"
            )
            .into(),
            renew: format!(
                "UPDATE {table} SET expires_at = {} \
                 WHERE key_hash = ?2 AND state = 'I' AND owner = ?3 AND expires_at > {now}",
                expires("?1"),
            )
            .into(),
            purge: format!(
                "DELETE FROM {table} WHERE key_hash IN ( \
                   SELECT key_hash FROM {table} WHERE expires_at < {now} LIMIT ?1)"
            )
            .into(),
            table: table.into(),
        }
    }

    async fn migrate(pool: &sqlx::Pool<Self>, table: &str) -> Result<(), sqlx::Error> {
        // BEGIN IMMEDIATE takes the write lock first: one migrator at a time.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        run_migrations::<Self>(
            &mut tx,
            table,
            MIGRATIONS,
            format!(
                "CREATE TABLE IF NOT EXISTS {table}_schema ( \
                   version INTEGER PRIMARY KEY, \
                   applied_at {} NOT NULL DEFAULT ({}))",
                Self::TIMESTAMP,
                Self::NOW,
            ),
            format!("SELECT max(version) FROM {table}_schema"),
        )
        .await?;
        tx.commit().await
    }

    const CLAIM_READS_FIRST: bool = false;
    const ONE_WRITER: bool = true;

    /// A returned row means the claim inserted or took over the record;
    /// otherwise read what is in the way.
    async fn claim(
        conn: &mut SqliteConnection,
        q: &Queries,
        args: ClaimArgs<'_>,
    ) -> Result<ClaimStep, sqlx::Error> {
        let inserted = bind_all(sqlx::query(AssertSqlSafe(q.claim.clone())), &args.values())
            .fetch_optional(&mut *conn)
            .await?;
        if inserted.is_some() {
            return Ok(ClaimStep::Acquired);
        }
        Ok(ClaimStep::found(Self::read(conn, q, args.key_hash).await?))
    }
    shared_statements!(SqliteConnection);

    /// Every completion in one statement, then every claim in another
    /// (`sqlite/many.rs`), the rest one at a time: a claim the statement
    /// did not acquire, to read what is in the way; a release or renewal;
    /// a second write of a key already in the statement.
    async fn run_writes(
        store: &SqlStore<Self>,
        conn: &mut SqliteConnection,
        writes: &[&Write],
    ) -> Vec<Result<Written, Error>> {
        let mut written: Vec<Option<Result<Written, Error>>> =
            writes.iter().map(|_| None).collect();
        many::complete(conn, store.table(), writes, &mut written).await;
        many::claim(conn, store.table(), writes, &mut written).await;
        for (answer, write) in written.iter_mut().zip(writes) {
            if answer.is_none() {
                *answer = Some(store.run_write(conn, write).await.map_err(unavailable));
            }
        }
        written.into_iter().flatten().collect()
    }

    async fn tx_commit(
        mut tx: sqlx::Transaction<'static, Self>,
        q: &Queries,
        args: ClaimArgs<'_>,
        outcome: &[u8],
        ttl_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let script = script::commit(
            &q.table,
            Self::NOW,
            &script::Completion {
                key_hash: args.key_hash,
                owner: args.owner.as_bytes(),
                outcome,
                ttl_ms,
            },
        );
        match sqlx::raw_sql(AssertSqlSafe(script)).execute(&mut *tx).await {
            // Committed; dropping `tx` rolls back the empty transaction
            // the script began (`script::commit`).
            Ok(_) => Ok(true),
            Err(err) => {
                tx.rollback().await?;
                Err(err)
            }
        }
    }

    fn is_lock_timeout(err: &sqlx::Error) -> bool {
        // SQLITE_BUSY and its extended codes
        has_code(err, &["5", "261", "517"])
    }
}

/// What a claim's insert does on meeting the key's row (`r`): takes it over
/// if it expired, else nothing.
fn take_over_expired() -> String {
    let now = Sqlite::NOW;
    format!(
        "ON CONFLICT (key_hash) DO UPDATE SET \
           idem_key = excluded.idem_key, state = 'I', owner = excluded.owner, \
           fingerprint = excluded.fingerprint, outcome = NULL, \
           expires_at = excluded.expires_at, created_at = {now} \
         WHERE r.expires_at <= {now}"
    )
}
