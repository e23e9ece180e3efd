//! `PgStore` on PostgreSQL: the conformance suites; transactional claims
//! that hold their key by an advisory lock and write their record at
//! commit; lock timeouts brought within PostgreSQL's range; the
//! transactional scripts' prepared statements, deallocated or prepared
//! partway; escape strings whatever `standard_conforming_strings` says.

use std::time::Duration;

use idem_core::{Claim, Duplicate, Fingerprint, IdempotencyKey, IdempotencyStore, OwnerToken};
use idem_core::{OpenTransaction, TransactionalStore, TxClaim};
use idem_sql::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_sql::sqlx::{self, Postgres};
use idem_sql::{PgStore, TxSlot};
use idem_test_support::{postgres_url, server_missing};

use crate::common::{self, a_plain_claim_that_waited_holds_a_whole_lease, drop_table};
use crate::common::{on_a_slow_table, open_fresh, outcome, postgres, rand_u64};

idem_core::store_conformance_tests!(crate::common::postgres());
idem_sql::transactional_conformance_tests!(crate::common::postgres());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_claim_that_waited_holds_a_whole_lease() {
    if let Some(store) = postgres().await {
        a_plain_claim_that_waited_holds_a_whole_lease(store).await;
    }
}

/// Lock timeouts outside what PostgreSQL takes are brought within it: 30
/// days (over its largest, about 24.8) made every transactional claim fail
/// (`set_config` refused it), and zero meant waiting for ever on a row
/// lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeouts_out_of_range_are_brought_within_it() {
    let Some(shared) = postgres().await else {
        return;
    };
    let pool = shared.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_pg_locked (k TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let row = format!("locked-{:016x}", rand_u64());
    sqlx::query("INSERT INTO idem_test_pg_locked (k) VALUES ($1)")
        .bind(&row)
        .execute(&pool)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT k FROM idem_test_pg_locked WHERE k = $1 FOR UPDATE")
        .bind(&row)
        .execute(&mut *holder)
        .await
        .unwrap();
    let fp = Fingerprint::from_bytes([8; 32]);
    let open = |timeout: Duration| {
        let (pool, row) = (pool.clone(), row.clone());
        async move {
            let store = PgStore::builder(pool)
                .lock_timeout(timeout)
                .build()
                .unwrap();
            let key = IdempotencyKey::new("idem-test:", &format!("{row}:{}", timeout.as_secs()));
            match store
                .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
                .await
                .unwrap_or_else(|err| panic!("{timeout:?}: {err}"))
            {
                TxClaim::Open(tx) => tx,
                TxClaim::Duplicate(duplicate) => panic!("a fresh key: {duplicate:?}"),
            }
        }
    };

    // Thirty days: the claim's transaction opens.
    open(Duration::from_secs(30 * 86_400))
        .await
        .rollback()
        .await
        .unwrap();

    // Zero: the handler's statement on a row locked elsewhere times out.
    let tx = open(Duration::ZERO).await;
    let handle = tx.handle();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
        sqlx::query("UPDATE idem_test_pg_locked SET k = k WHERE k = $1")
            .bind(&row)
            .execute(&mut **guard.as_mut().unwrap())
            .await
    })
    .await;
    let err = waited
        .expect("a zero lock timeout does not wait for ever")
        .expect_err("the row is locked elsewhere");
    assert!(err.to_string().contains("lock timeout"), "{err}");
    tx.rollback().await.unwrap();
    holder.rollback().await.unwrap();
}

/// A prepare that failed partway (here the table was not migrated yet:
/// the lock's statement was prepared, the read's refused) leaves its first
/// statements on the connection, outliving the rollback. The next claim
/// there prepares the ones missing: preparing all of them again was
/// refused ("already exists"), and every transactional claim on that
/// connection failed until it closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_that_failed_partway_is_finished_later() {
    let url = postgres_url();
    let pool = match PgPoolOptions::new().max_connections(1).connect(&url).await {
        Ok(pool) => pool,
        Err(err) => return server_missing("PostgreSQL", &url, err).unwrap_or(()),
    };
    let table = format!("idem_test_partway_{:016x}", rand_u64());
    let store = PgStore::builder(pool).table(&table).build().unwrap();
    let key = IdempotencyKey::new("idem-test:", "partway");
    let fp = Fingerprint::from_bytes([7; 32]);
    let lease = Duration::from_secs(30);
    let before = store
        .claim_in_transaction(&key, &fp, lease, OwnerToken::generate())
        .await;
    assert!(before.is_err(), "no table yet: {before:?}");

    store.migrate().await.expect("migrate");
    let claimed = store
        .claim_in_transaction(&key, &fp, lease, OwnerToken::generate())
        .await
        .expect("the same connection claims once the table is there");
    let TxClaim::Open(tx) = claimed else {
        panic!("a fresh key is acquired: {claimed:?}");
    };
    tx.rollback().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {table}; DROP TABLE IF EXISTS {table}_schema; \
         DROP TABLE IF EXISTS {table}_points"
    )))
    .execute(store.pool())
    .await
    .unwrap();
}

/// A transactional claim holds its key by an advisory lock and writes its
/// record once, completed, at commit. While it is open nothing is in the
/// table (a crash leaves nothing behind), another process's transactional
/// claim is told "in flight" and a plain claim waits, then replays; a live
/// record that got into the table meanwhile makes the commit fail, with
/// none of its writes; an expired record is taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_claims_write_their_record_at_commit() {
    let Some(store) = postgres().await else {
        return;
    };
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_pg_effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let elsewhere = PgStore::builder(
        PgPoolOptions::new()
            .max_connections(4)
            .connect(&postgres_url())
            .await
            .unwrap(),
    )
    .build()
    .unwrap();
    let run = rand_u64();
    let key =
        |name: &str| IdempotencyKey::new("idem-test:", &format!("pg-at-commit:{run:016x}:{name}"));
    let fp = Fingerprint::from_bytes([5; 32]);
    let lease = Duration::from_secs(30);
    let write = |tx: &dyn OpenTransaction, effect: String| {
        let handle = tx.handle();
        async move {
            let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
            sqlx::query("INSERT INTO idem_test_pg_effects (k) VALUES ($1)")
                .bind(effect)
                .execute(&mut **guard.as_mut().unwrap())
                .await
                .expect("the effect, in the claim's transaction");
        }
    };
    // `SELECT COUNT(*) ... WHERE {column} = $1`, on the pool.
    let count = |sql: &'static str, value: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(value)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let rows = |key: &IdempotencyKey| {
        count(
            "SELECT COUNT(*) FROM idem_records WHERE idem_key = $1",
            key.as_str().to_owned(),
        )
    };
    let effects = |effect: String| {
        count(
            "SELECT COUNT(*) FROM idem_test_pg_effects WHERE k = $1",
            effect,
        )
    };

    // Open: no record yet, another process told "in flight"; committed: one
    // completed record, replayed.
    let first = key("first");
    let tx = open_fresh(&store, &first, &fp, lease).await;
    write(&*tx, format!("{run}-first")).await;
    {
        // Seen from inside the transaction itself.
        let handle = tx.handle();
        let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
        let inside: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE idem_key = $1")
                .bind(first.as_str())
                .fetch_one(&mut **guard.as_mut().unwrap())
                .await
                .unwrap();
        assert_eq!(inside, 0, "nothing written before the commit");
    }
    let duplicate = elsewhere
        .claim_in_transaction(&first, &fp, lease, OwnerToken::generate())
        .await
        .expect("PostgreSQL answers");
    assert!(
        matches!(duplicate, TxClaim::Duplicate(Duplicate::InFlight { .. })),
        "{duplicate:?}"
    );
    tx.commit(&outcome("first"), lease).await.expect("commit");
    assert_eq!(rows(&first).await, 1);
    assert_eq!(effects(format!("{run}-first")).await, 1);
    let replay = elsewhere
        .claim(&first, &fp, lease, OwnerToken::generate())
        .await
        .unwrap();
    assert_eq!(replay, Claim::Replay(outcome("first")));

    // A plain claim of the key while the transaction is open waits for it
    // (the advisory lock, shared), then replays what it committed.
    let waited = key("waited");
    let tx = open_fresh(&store, &waited, &fp, lease).await;
    write(&*tx, format!("{run}-waited")).await;
    let plain = tokio::spawn({
        let (elsewhere, waited) = (elsewhere.clone(), waited.clone());
        async move {
            elsewhere
                .claim(&waited, &fp, lease, OwnerToken::generate())
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !plain.is_finished(),
        "the plain claim waits for the transaction"
    );
    tx.commit(&outcome("waited"), lease).await.expect("commit");
    assert_eq!(
        plain.await.unwrap().unwrap(),
        Claim::Replay(outcome("waited"))
    );
    assert_eq!(effects(format!("{run}-waited")).await, 1);

    // The unique index is the last word: a live record that got into the
    // table meanwhile, by any path, makes the commit fail, and none of the
    // transaction's writes stay.
    let raced = key("raced");
    let tx = open_fresh(&store, &raced, &fp, lease).await;
    write(&*tx, format!("{run}-raced")).await;
    sqlx::query(
        "INSERT INTO idem_records (key_hash, idem_key, state, owner, fingerprint, expires_at) \
         VALUES ($1, $2, 'I', $3, $4, now() + interval '1 minute')",
    )
    .bind(&blake3::hash(raced.as_str().as_bytes()).as_bytes()[..])
    .bind(raced.as_str())
    .bind(&OwnerToken::generate().as_bytes()[..])
    .bind(&fp.as_bytes()[..])
    .execute(&pool)
    .await
    .expect("a live record written past the store");
    assert!(tx.commit(&outcome("tx"), lease).await.is_err(), "refused");
    assert_eq!(effects(format!("{run}-raced")).await, 0, "rolled back");

    // An expired record is taken over at commit.
    let expired = key("expired");
    let Claim::Acquired(owner) = store
        .claim(&expired, &fp, lease, OwnerToken::generate())
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    store
        .complete(&expired, &owner, &outcome("old"), Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let tx = open_fresh(&store, &expired, &fp, lease).await;
    tx.commit(&outcome("new"), lease).await.expect("takes over");
    assert_eq!(rows(&expired).await, 1);
    let replay = store
        .claim(&expired, &fp, lease, OwnerToken::generate())
        .await
        .unwrap();
    assert_eq!(replay, Claim::Replay(outcome("new")));
}

/// The transactional scripts' statements are prepared on each connection
/// by the first claim that finds them missing. Deallocated between two
/// requests (`DEALLOCATE ALL`, as a pooler in front of PostgreSQL may run
/// it, with sqlx's own statement cache off), they are prepared again by the
/// next claim; deallocated by a handler inside its own transaction, the
/// commit fails and nothing of the handler's is kept: the key is free and
/// its retry commits once. Statements another version of the store left in
/// the session do not stand in the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_deallocated_are_prepared_again() {
    if postgres().await.is_none() {
        return;
    }
    // One connection: every claim meets the statements the last one left.
    // sqlx's own statements unnamed, as behind a pooler, so that they
    // outlive `DEALLOCATE ALL`.
    let options = postgres_url()
        .parse::<PgConnectOptions>()
        .unwrap()
        .statement_cache_capacity(0);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let store = PgStore::builder(pool.clone())
        .max_transactions(1)
        .build()
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS idem_test_pg_effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let run = rand_u64();
    let fp = Fingerprint::from_bytes([6; 32]);
    let outcome = outcome("kept");
    let key = move |name: &str| {
        IdempotencyKey::new("idem-test:", &format!("pg-prepare:{run:016x}:{name}"))
    };
    // Claims `name`, writes its effect and, if asked, deallocates every
    // statement of the session in the same transaction; then commits.
    let attempt = |name: &'static str, deallocate: bool| {
        let (store, outcome) = (store.clone(), outcome.clone());
        async move {
            let key = key(name);
            let claim = store
                .claim_in_transaction(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
                .await
                .expect("PostgreSQL answers");
            let TxClaim::Open(tx) = claim else {
                panic!("{name}: expected to acquire, got {claim:?}");
            };
            {
                let handle = tx.handle();
                let mut guard = handle.get::<TxSlot<Postgres>>().unwrap().lock().await;
                let conn = &mut **guard.as_mut().unwrap();
                sqlx::query("INSERT INTO idem_test_pg_effects (k) VALUES ($1)")
                    .bind(format!("{run}-{name}"))
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                if deallocate {
                    sqlx::raw_sql("DEALLOCATE ALL")
                        .execute(&mut *conn)
                        .await
                        .unwrap();
                }
            }
            tx.commit(&outcome, Duration::from_secs(60)).await
        }
    };
    let effects = |name: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM idem_test_pg_effects WHERE k = $1")
                .bind(format!("{run}-{name}"))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };

    // Another version of the store, sharing the session (as through a
    // pooler during an upgrade), left statements of its own under the names
    // this one would use without its generation in them.
    sqlx::raw_sql(
        "PREPARE idem_lock_idem_records AS SELECT 1; \
         PREPARE idem_read_idem_records (bytea) AS SELECT 2; \
         PREPARE idem_insert_idem_records (bytea, text) AS SELECT 3",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Prepared by the first claim, then deallocated between requests.
    attempt("before", false).await.expect("committed");
    sqlx::raw_sql("DEALLOCATE ALL")
        .execute(&pool)
        .await
        .unwrap();
    attempt("after", false)
        .await
        .expect("committed, the statements prepared again");
    assert_eq!((effects("before").await, effects("after").await), (1, 1));

    // Deallocated inside the handler's transaction: nothing kept.
    attempt("inside", true)
        .await
        .expect_err("the commit finds its statement gone");
    assert_eq!(
        effects("inside").await,
        0,
        "the handler's write rolled back"
    );
    // The key is free, and its retry commits once and replays.
    attempt("inside", false).await.expect("the retry commits");
    assert_eq!(effects("inside").await, 1);
    assert_eq!(
        store
            .claim(
                &key("inside"),
                &fp,
                Duration::from_secs(30),
                OwnerToken::generate()
            )
            .await
            .unwrap(),
        Claim::Replay(outcome.clone())
    );
}

/// The transactional scripts write bytes as escape strings (`E'\\x…'`),
/// which read the same whatever the session's
/// `standard_conforming_strings` says: with it off (where a plain `'\x…'`
/// would lose its backslash), keys and bodies full of backslashes and
/// quotes still round-trip as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_read_the_same_without_standard_conforming_strings() {
    if postgres().await.is_none() {
        return;
    }
    let options = postgres_url()
        .parse::<PgConnectOptions>()
        .unwrap()
        .options([("standard_conforming_strings", "off")]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let setting: String = sqlx::query_scalar("SHOW standard_conforming_strings")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(setting, "off");
    let store = PgStore::new(pool);
    let fp = Fingerprint::from_bytes([8; 32]);
    let body: Vec<u8> = b"\\x41 \\\\ '' \\' "
        .iter()
        .copied()
        .chain(0..=255u8)
        .collect();
    let outcome = outcome(body);
    let key = IdempotencyKey::new(
        "idem-test:",
        &format!(r"pg-scs-off:{:016x}:\x41\\'", rand_u64()),
    );
    let tx = open_fresh(&store, &key, &fp, Duration::from_secs(30)).await;
    tx.commit(&outcome, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        store
            .claim(&key, &fp, Duration::from_secs(30), OwnerToken::generate())
            .await
            .unwrap(),
        Claim::Replay(outcome)
    );
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE idem_key = $1")
        .bind(key.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 1, "the key stored as it is");
}

/// `common::claims_shorter_than_their_round_trip_acquire`, on a table
/// whose inserts last longer than the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_shorter_than_their_round_trip_acquire() {
    let Some(shared) = postgres().await else {
        return;
    };
    let store = on_a_slow_table(shared.pool(), |table| {
        format!(
            "CREATE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql \
                   AS $$ BEGIN PERFORM pg_sleep(0.005); RETURN NEW; END $$; \
                 CREATE TRIGGER {table}_slow BEFORE INSERT ON {table} \
                   FOR EACH ROW EXECUTE FUNCTION {table}_slow()"
        )
    })
    .await;
    common::claims_shorter_than_their_round_trip_acquire(store.clone()).await;
    drop_table(&store).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP FUNCTION {}_slow()",
        store.table()
    )))
    .execute(store.pool())
    .await
    .unwrap();
}

/// A transactional claim whose handler sits idle past its lease (its
/// process paused, its connection frozen) frees its key within about a
/// lease, and its late commit writes nothing
/// (`common::a_transaction_idle_past_its_lease_frees_its_key`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_idle_past_its_lease_frees_its_key() {
    let Some(store) = postgres().await else {
        return;
    };
    // A store of its own: another process, which knows nothing of the
    // first's open claims.
    let elsewhere = PgStore::builder(store.pool().clone())
        .table(store.table())
        .build()
        .unwrap();
    common::a_transaction_idle_past_its_lease_frees_its_key(store, elsewhere).await;
}
