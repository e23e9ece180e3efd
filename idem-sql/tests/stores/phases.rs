//! Recovery points (`idem-sql/src/points.rs`) on real PostgreSQL,
//! MariaDB/MySQL and SQLite, with effects counted: a three-phase payment
//! (the order created pending, the provider charged under the operation's
//! key, the order marked paid) failed after each phase and retried, and
//! run by concurrent tasks. The orders are rows in the database, counted;
//! the provider is an in-process stand-in that deduplicates by key, as
//! Stripe does, and counts its calls and charges. Each case has a store
//! table of its own, dropped once it passed; the PostgreSQL cases run
//! through PgBouncer in transaction pooling too (ARCHITECTURE.md,
//! "Recovery points").
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{Phases, RecoveryPoints};

/// The provider: one charge per key, however often it is called.
#[derive(Default)]
struct Provider {
    charges: Mutex<HashMap<[u8; 32], String>>,
    calls: AtomicUsize,
}

impl Provider {
    fn charge(&self, key: &[u8; 32]) -> String {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut charges = self.charges.lock().unwrap();
        let n = charges.len();
        charges
            .entry(*key)
            .or_insert_with(|| format!("ch_{n}"))
            .clone()
    }

    fn charged(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

/// Where a run of the payment fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// After the phase, the run stops (a crash, a 5xx: the key released).
    After(u8),
    /// The provider charged, and the run stopped before the charge's point
    /// was recorded.
    InsideCharge,
    /// The order marked paid in the phase's transaction, and the phase
    /// failed before its commit.
    InsideMarkPaid,
}

#[derive(Debug)]
enum Failure {
    Crash,
    Store(#[allow(dead_code)] idem_core::Error),
    Sql(#[allow(dead_code)] idem_sql::sqlx::Error),
}

impl From<idem_core::Error> for Failure {
    fn from(err: idem_core::Error) -> Self {
        Self::Store(err)
    }
}

impl From<idem_sql::sqlx::Error> for Failure {
    fn from(err: idem_sql::sqlx::Error) -> Self {
        Self::Sql(err)
    }
}

/// How often each phase's own work ran, over every run.
#[derive(Default)]
struct Ran {
    create: AtomicUsize,
    mark: AtomicUsize,
}

/// A random order id: a run that made the order again would make another.
fn order_id() -> i64 {
    i64::try_from(rand::random::<u64>() >> 12).unwrap()
}

fn operation() -> [u8; 32] {
    rand::random()
}

/// The payment and its cases, on one database.
macro_rules! phase_cases {
    ($db:ident, $DB:ident, $pool:path, [$p1:literal, $p2:literal]) => {
        mod $db {
            use super::*;
            use idem_sql::SqlStore;
            use idem_sql::sqlx::{self, $DB};

            struct Shop {
                store: SqlStore<$DB>,
                orders: String,
                provider: Provider,
                ran: Ran,
            }

            impl Shop {
                async fn new() -> Option<Self> {
                    let pool = $pool().await?;
                    let table = format!("ph_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
                    let store = SqlStore::builder(pool.clone())
                        .table(&table)
                        .build()
                        .unwrap();
                    store.migrate().await.unwrap();
                    let orders = format!("{table}_orders");
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL, \
                         state VARCHAR(16) NOT NULL, charge_id VARCHAR(64))"
                    )))
                    .execute(&pool)
                    .await
                    .unwrap();
                    Some(Self {
                        store,
                        orders,
                        provider: Provider::default(),
                        ran: Ran::default(),
                    })
                }

                /// One run of the payment of `operation`: the order's id and
                /// the charge's.
                async fn pay(
                    &self,
                    operation: [u8; 32],
                    fault: Fault,
                ) -> Result<(i64, String), Failure> {
                    let phases = Phases::new(&self.store, operation, Duration::from_secs(600));
                    let order: i64 = phases
                        .transaction("create-order", |mut tx| async move {
                            let id = order_id();
                            sqlx::query(sqlx::AssertSqlSafe(format!(
                                "INSERT INTO {} (id, amount, state) VALUES ({}, {}, 'pending')",
                                self.orders, $p1, $p2
                            )))
                            .persistent(false)
                            .bind(id)
                            .bind(1200_i64)
                            .execute(&mut *tx)
                            .await?;
                            self.ran.create.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Failure>(id)
                        })
                        .await?;
                    if fault == Fault::After(1) {
                        return Err(Failure::Crash);
                    }
                    let charge: String = phases
                        .call("psp-charge", || async {
                            // The key derived from the operation: the same
                            // on every run.
                            let charge = self.provider.charge(&operation);
                            if fault == Fault::InsideCharge {
                                return Err(Failure::Crash);
                            }
                            Ok(charge)
                        })
                        .await?;
                    if fault == Fault::After(2) {
                        return Err(Failure::Crash);
                    }
                    let paid_with = charge.clone();
                    phases
                        .transaction("mark-paid", |mut tx| async move {
                            sqlx::query(sqlx::AssertSqlSafe(format!(
                                "UPDATE {} SET state = 'paid', charge_id = {} WHERE id = {}",
                                self.orders, $p1, $p2
                            )))
                            .persistent(false)
                            .bind(paid_with)
                            .bind(order)
                            .execute(&mut *tx)
                            .await?;
                            self.ran.mark.fetch_add(1, Ordering::SeqCst);
                            if fault == Fault::InsideMarkPaid {
                                return Err(Failure::Crash);
                            }
                            Ok::<_, Failure>(())
                        })
                        .await?;
                    if fault == Fault::After(3) {
                        return Err(Failure::Crash);
                    }
                    Ok((order, charge))
                }

                /// Every order: id, state, charge. Simple queries, which a
                /// pooler in transaction pooling answers whole.
                async fn orders(&self) -> Vec<(i64, String, Option<String>)> {
                    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "SELECT id, state, charge_id FROM {}",
                        self.orders
                    )))
                    .fetch_all(self.store.pool())
                    .await
                    .unwrap();
                    rows.iter()
                        .map(|row| {
                            use sqlx::Row;
                            (row.get(0), row.get(1), row.get(2))
                        })
                        .collect()
                }

                async fn points(&self) -> i64 {
                    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "SELECT COUNT(*) FROM {}_points",
                        self.store.table()
                    )))
                    .fetch_one(self.store.pool())
                    .await
                    .unwrap();
                    sqlx::Row::get(&row, 0)
                }

                /// Drops the case's tables, once it passed.
                async fn drop_tables(&self) {
                    let table = self.store.table();
                    for dropped in [
                        &self.orders,
                        &format!("{table}_points"),
                        &format!("{table}_schema"),
                        &table.to_owned(),
                    ] {
                        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {dropped}")))
                            .execute(self.store.pool())
                            .await
                            .unwrap();
                    }
                }
            }

            #[tokio::test]
            async fn a_payment_failed_after_each_phase_resumes_after_it() {
                // (fault, phases the failed run finished, provider calls in all)
                let cases = [
                    (Fault::After(1), 1, 1),
                    (Fault::InsideCharge, 1, 2),
                    (Fault::After(2), 2, 1),
                    (Fault::InsideMarkPaid, 2, 1),
                    (Fault::After(3), 3, 1),
                ];
                for (fault, finished, calls) in cases {
                    let Some(shop) = Shop::new().await else {
                        return;
                    };
                    let op = operation();
                    assert!(
                        matches!(shop.pay(op, fault).await, Err(Failure::Crash)),
                        "{fault:?}"
                    );
                    let phases = Phases::new(&shop.store, op, Duration::from_secs(600));
                    assert_eq!(phases.finished().await.unwrap(), finished, "{fault:?}");
                    if fault == Fault::InsideMarkPaid {
                        // The phase's write rolled back with its point.
                        let orders = shop.orders().await;
                        assert_eq!(orders.len(), 1);
                        assert_eq!(orders[0].1, "pending", "{fault:?}");
                    }

                    let (order, charge) = shop.pay(op, Fault::None).await.expect("the retry");
                    assert_eq!(
                        shop.orders().await,
                        vec![(order, "paid".to_owned(), Some(charge.clone()))],
                        "{fault:?}: one order, paid with the one charge"
                    );
                    assert_eq!(shop.provider.charged(), 1, "{fault:?}: charged once");
                    assert_eq!(
                        shop.provider.calls.load(Ordering::SeqCst),
                        calls,
                        "{fault:?}"
                    );
                    assert_eq!(
                        shop.ran.create.load(Ordering::SeqCst),
                        1,
                        "{fault:?}: order made once"
                    );
                    assert_eq!(shop.points().await, 3);

                    // A later run runs nothing and answers the same.
                    assert_eq!(shop.pay(op, Fault::None).await.unwrap(), (order, charge));
                    assert_eq!(shop.ran.create.load(Ordering::SeqCst), 1);
                    assert_eq!(shop.provider.calls.load(Ordering::SeqCst), calls);
                    shop.drop_tables().await;
                }
            }

            /// A nested transaction in a phase (`begin()` on the `PhaseTx`,
            /// committed) is a savepoint of the phase's: a phase that then
            /// fails keeps nothing, its point included, and its retry
            /// creates the order once.
            #[tokio::test]
            async fn a_nested_commit_in_a_failed_phase_keeps_nothing() {
                let Some(shop) = Shop::new().await else {
                    return;
                };
                let op = operation();
                let create = |fail: bool| {
                    let phases = Phases::new(&shop.store, op, Duration::from_secs(600));
                    let orders = shop.orders.clone();
                    async move {
                        phases
                            .transaction("create-order", |mut tx| async move {
                                let id = order_id();
                                let mut inner = sqlx::Connection::begin(&mut *tx).await?;
                                sqlx::query(sqlx::AssertSqlSafe(format!(
                                    "INSERT INTO {orders} (id, amount, state) \
                                     VALUES ({}, {}, 'pending')",
                                    $p1, $p2
                                )))
                                .persistent(false)
                                .bind(id)
                                .bind(1200_i64)
                                .execute(&mut *inner)
                                .await?;
                                inner.commit().await?;
                                if fail {
                                    return Err(Failure::Crash);
                                }
                                Ok::<_, Failure>(id)
                            })
                            .await
                    }
                };
                assert!(matches!(create(true).await, Err(Failure::Crash)));
                assert_eq!(shop.orders().await, [], "the failed phase kept its order");
                assert_eq!(shop.points().await, 0);
                let order = create(false).await.expect("the retry");
                assert_eq!(shop.orders().await, [(order, "pending".to_owned(), None)]);
                assert_eq!(create(false).await.expect("a later run"), order);
                shop.drop_tables().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_runs_finish_each_phase_once() {
                let Some(shop) = Shop::new().await else {
                    return;
                };
                let shop = std::sync::Arc::new(shop);
                let op = operation();
                let runs: Vec<_> = (0..8)
                    .map(|_| {
                        let shop = std::sync::Arc::clone(&shop);
                        tokio::spawn(async move { shop.pay(op, Fault::None).await.expect("a run") })
                    })
                    .collect();
                let mut answers = Vec::new();
                for run in runs {
                    answers.push(run.await.unwrap());
                }
                let (order, charge) = answers[0].clone();
                assert!(
                    answers.iter().all(|a| *a == (order, charge.clone())),
                    "{answers:?}"
                );
                assert_eq!(
                    shop.orders().await,
                    vec![(order, "paid".to_owned(), Some(charge))],
                    "one order kept, whichever runs made one"
                );
                assert_eq!(shop.provider.charged(), 1);
                assert_eq!(shop.points().await, 3);
                shop.drop_tables().await;
            }

            #[tokio::test]
            async fn expired_points_are_absent_and_purged() {
                let Some(shop) = Shop::new().await else {
                    return;
                };
                let op = operation();
                let calls = AtomicUsize::new(0);
                let short = Phases::new(&shop.store, op, Duration::from_millis(300));
                let call = || || async { Ok::<_, Failure>(calls.fetch_add(1, Ordering::SeqCst)) };
                assert_eq!(short.call("lookup", call()).await.unwrap(), 0);
                assert_eq!(short.call("lookup", call()).await.unwrap(), 0, "memoised");
                assert_eq!(short.finished().await.unwrap(), 1);
                tokio::time::sleep(Duration::from_millis(600)).await;
                assert_eq!(short.finished().await.unwrap(), 0);
                assert_eq!(
                    short.call("lookup", call()).await.unwrap(),
                    1,
                    "ran again once expired"
                );

                let other = Phases::new(&shop.store, operation(), Duration::from_millis(1));
                other.call("lookup", call()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert_eq!(shop.points().await, 2);
                shop.store.purge_expired(100).await.unwrap();
                assert_eq!(
                    shop.points().await,
                    1,
                    "the expired point purged, the live one kept"
                );
                assert_eq!(shop.store.finished(&op).await.unwrap(), 1);
                shop.drop_tables().await;
            }
        }
    };
}

async fn postgres_pool() -> Option<idem_sql::sqlx::PgPool> {
    let url = idem_test_support::postgres_url();
    match idem_sql::sqlx::PgPool::connect(&url).await {
        Ok(pool) => Some(pool),
        Err(err) => idem_test_support::server_missing("PostgreSQL", &url, err),
    }
}

/// PostgreSQL through PgBouncer in transaction pooling: the points'
/// statements, and the shop's own (unnamed, in the phases' transactions),
/// on server sessions shared between transactions.
async fn pgbouncer_pool() -> Option<idem_sql::sqlx::PgPool> {
    let url = idem_test_support::pgbouncer_url();
    match idem_sql::sqlx::PgPool::connect(&url).await {
        Ok(pool) => Some(pool),
        Err(err) => idem_test_support::server_missing("PgBouncer", &url, err),
    }
}

async fn mysql_pool() -> Option<idem_sql::sqlx::MySqlPool> {
    let url = idem_test_support::mysql_url();
    match idem_sql::sqlx::MySqlPool::connect(&url).await {
        Ok(pool) => Some(pool),
        Err(err) => idem_test_support::server_missing("MySQL/MariaDB", &url, err),
    }
}

async fn sqlite_pool() -> Option<idem_sql::sqlx::SqlitePool> {
    use idem_sql::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let path = std::env::temp_dir().join(idem_test_support::unique("idem-phases") + ".db");
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    Some(
        SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("a SQLite file in the temp directory"),
    )
}

phase_cases!(postgres, Postgres, postgres_pool, ["$1", "$2"]);
phase_cases!(pgbouncer, Postgres, pgbouncer_pool, ["$1", "$2"]);
phase_cases!(mysql, MySql, mysql_pool, ["?", "?"]);
phase_cases!(sqlite, Sqlite, sqlite_pool, ["?1", "?2"]);
