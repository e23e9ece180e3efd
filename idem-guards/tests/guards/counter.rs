//! `Counter`: decrements that never take a stock below zero, and the
//! versioned form that tells a conflict from an insufficient stock.

use std::sync::Arc;

use idem_core::ErrorKind;
use idem_guards::{Counter, CounterUpdate, GuardDb};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;

use crate::support::{Table, all_at_once};

async fn stock<DB: GuardDb + TestSql>(pool: &Pool<DB>, units: i64) -> Table<DB> {
    let table = Table::create(
        pool,
        "guard_stock",
        "sku VARCHAR(64) PRIMARY KEY, stock BIGINT NOT NULL, version BIGINT NOT NULL",
    )
    .await;
    DB::exec(
        pool,
        format!(
            "INSERT INTO {} (sku, stock, version) VALUES ('book', {units}, 0)",
            table.name
        ),
    )
    .await;
    table
}

/// 100 concurrent decrements of 1 on a stock of 50: exactly 50 apply, the
/// rest find it insufficient, and it never goes below zero.
async fn hundred_concurrent_decrements_on_fifty_apply_fifty<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let table = stock(&pool, 50).await;
    let counter = Arc::new(
        Counter::new(&table.name, "sku", "stock")
            .unwrap()
            .versioned("version")
            .unwrap(),
    );
    let updates = all_at_once(100, |_| {
        let (pool, counter) = (pool.clone(), counter.clone());
        async move {
            let mut conn = pool.acquire().await.unwrap();
            counter.decrement(&mut *conn, "book", 1).await.unwrap()
        }
    })
    .await;
    let (mut applied, mut insufficient) = (0, 0);
    for update in updates {
        match update {
            CounterUpdate::Applied => applied += 1,
            CounterUpdate::Insufficient { available } => {
                assert_eq!(available, 0);
                insufficient += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((applied, insufficient), (50, 50));
    assert_eq!(table.count("stock = 0 AND version = 50").await, 1);
    assert_eq!(table.count("stock < 0").await, 0);
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        counter.read(&mut *conn, "book").await.unwrap(),
        Some((0, Some(50)))
    );
    drop(conn);
    table.drop_table().await;
}

async fn versioned_decrement_tells_conflict_from_insufficient<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    let table = stock(&pool, 3).await;
    let counter = Counter::new(&table.name, "sku", "stock")
        .unwrap()
        .versioned("version")
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let (units, version) = counter.read(&mut *conn, "book").await.unwrap().unwrap();
    assert_eq!((units, version), (3, Some(0)));
    // Someone else takes one first: the version moved.
    assert_eq!(
        counter.decrement(&mut *conn, "book", 1).await.unwrap(),
        CounterUpdate::Applied
    );
    assert_eq!(
        counter
            .decrement_if_version(&mut *conn, "book", 1, 0)
            .await
            .unwrap(),
        CounterUpdate::Conflict { current_version: 1 }
    );
    // Re-read and retry: applies.
    assert_eq!(
        counter
            .decrement_if_version(&mut *conn, "book", 1, 1)
            .await
            .unwrap(),
        CounterUpdate::Applied
    );
    assert_eq!(
        counter
            .decrement_if_version(&mut *conn, "book", 5, 2)
            .await
            .unwrap(),
        CounterUpdate::Insufficient { available: 1 }
    );
    assert_eq!(
        counter.decrement(&mut *conn, "nope", 1).await.unwrap(),
        CounterUpdate::NotFound
    );
    let err = counter.decrement(&mut *conn, "book", 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let plain = Counter::new(&table.name, "sku", "stock").unwrap();
    let err = plain
        .decrement_if_version(&mut *conn, "book", 1, 2)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert_eq!(table.count("stock = 1 AND version = 2").await, 1);
    drop(conn);
    table.drop_table().await;
}

sql_cases!(
    hundred_concurrent_decrements_on_fifty_apply_fifty,
    versioned_decrement_tells_conflict_from_insufficient,
);
