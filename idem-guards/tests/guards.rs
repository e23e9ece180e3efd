//! The business-side guards against real PostgreSQL, MariaDB/MySQL, SQLite
//! and Redis: state-machine transitions, counters, one-time tokens, the
//! inbox and the lock. Concurrency cases run on a multi-thread runtime and
//! count effects (rows), not answers alone.
//!
//! Server URLs: `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`,
//! `IDEM_TEST_REDIS_URL`; SQLite uses fresh files in the temp directory.
//! Each case makes its own tables (named with a nonce) and drops them.
#![cfg(all(
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite",
    feature = "redis"
))]

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use idem_core::ErrorKind;
use idem_guards::{
    Counter, CounterUpdate, Delivery, DuplicateOf, GuardDb, Inbox, LifecycleState, ProcessError,
    Processed, RedisLock, RedisTokens, SqlTokens, StateMachine, TokenUse, Transition,
};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;
use idem_test_support::{redis_url, server_missing};
use tokio::sync::Barrier;

#[macro_use]
mod support;
use support::{Table, mysql, nonce, postgres, sqlite};

async fn redis() -> Option<ConnectionManager> {
    let url = redis_url();
    let client = match ::redis::Client::open(url.as_str()) {
        Ok(client) => client,
        Err(err) => return server_missing("Redis", &url, err),
    };
    match ConnectionManager::new(client).await {
        Ok(conn) => Some(conn),
        Err(err) => server_missing("Redis", &url, err),
    }
}

// ---------------------------------------------------------------------------
// State-machine transitions

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PayState {
    WaitPay,
    Paid,
    Refunded,
}

impl LifecycleState for PayState {
    const ALL: &'static [Self] = &[Self::WaitPay, Self::Paid, Self::Refunded];

    fn as_str(&self) -> &'static str {
        match self {
            Self::WaitPay => "WAIT_PAY",
            Self::Paid => "PAID",
            Self::Refunded => "REFUNDED",
        }
    }
}

async fn payments<DB: GuardDb + TestSql>(pool: &Pool<DB>) -> (Table<DB>, StateMachine<PayState>) {
    let table = Table::create(
        pool,
        "guard_pay",
        "payment_no VARCHAR(64) PRIMARY KEY, state VARCHAR(16) NOT NULL",
    )
    .await;
    let machine = StateMachine::new(&table.name, "payment_no", "state").unwrap();
    (table, machine)
}

async fn insert_payment<DB: TestSql>(table: &Table<DB>, no: &str, state: &str) {
    DB::exec(
        &table.pool,
        format!(
            "INSERT INTO {} (payment_no, state) VALUES ('{no}', '{state}')",
            table.name
        ),
    )
    .await;
}

async fn transition_applies_once_then_is_already_in_target<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (table, machine) = payments(&pool).await;
    insert_payment(&table, "P-1", "WAIT_PAY").await;
    let mut conn = pool.acquire().await.unwrap();
    let paid = &[PayState::WaitPay];
    assert_eq!(
        machine
            .transition(&mut *conn, "P-1", paid, PayState::Paid)
            .await
            .unwrap(),
        Transition::Applied
    );
    for _ in 0..3 {
        let again = machine
            .transition(&mut *conn, "P-1", paid, PayState::Paid)
            .await
            .unwrap();
        assert_eq!(again, Transition::AlreadyInTarget);
        assert!(again.is_success());
    }
    assert_eq!(
        machine
            .transition(&mut *conn, "P-1", &[PayState::Paid], PayState::Refunded)
            .await
            .unwrap(),
        Transition::Applied
    );
    let late = machine
        .transition(&mut *conn, "P-1", paid, PayState::Paid)
        .await
        .unwrap();
    assert_eq!(
        late,
        Transition::Illegal {
            current: PayState::Refunded
        }
    );
    assert!(!late.is_success());
    assert_eq!(
        machine
            .transition(&mut *conn, "P-404", &[PayState::WaitPay], PayState::Paid)
            .await
            .unwrap(),
        Transition::NotFound
    );
    assert_eq!(table.count("state = 'REFUNDED'").await, 1);
    drop(conn);
    table.drop_table().await;
}

/// A row whose state column is NULL exists: the transition says its state
/// is corrupt, never that the row is not there.
async fn a_null_state_is_corrupt_not_missing<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let table = Table::create(
        &pool,
        "guard_pay_null",
        "payment_no VARCHAR(64) PRIMARY KEY, state VARCHAR(16) NULL",
    )
    .await;
    let machine = StateMachine::new(&table.name, "payment_no", "state").unwrap();
    DB::exec(
        &table.pool,
        format!(
            "INSERT INTO {} (payment_no, state) VALUES ('P-1', NULL)",
            table.name
        ),
    )
    .await;
    let mut conn = pool.acquire().await.unwrap();
    let err = machine
        .transition(&mut *conn, "P-1", &[PayState::WaitPay], PayState::Paid)
        .await
        .expect_err("a NULL state is no state");
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert_eq!(table.count("state IS NULL").await, 1, "nothing written");
    drop(conn);
    table.drop_table().await;
}

/// Fifteen callbacks at once, each in its own transaction: one transition
/// applies and books one credit; every other sees it done.
async fn concurrent_transitions_apply_exactly_once<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (table, machine) = payments(&pool).await;
    let ledger = Table::create(&pool, "guard_ledger", "payment_no VARCHAR(64) NOT NULL").await;
    insert_payment(&table, "P-1", "WAIT_PAY").await;
    let (machine, ledger_name) = (Arc::new(machine), Arc::new(ledger.name.clone()));
    let barrier = Arc::new(Barrier::new(15));
    let tasks: Vec<_> = (0..15)
        .map(|_| {
            let (pool, machine, ledger_name, barrier) = (
                pool.clone(),
                machine.clone(),
                ledger_name.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let mut tx = pool.begin().await.unwrap();
                let moved = machine
                    .transition(&mut *tx, "P-1", &[PayState::WaitPay], PayState::Paid)
                    .await
                    .unwrap();
                if moved == Transition::Applied {
                    DB::exec_on(
                        &mut tx,
                        format!("INSERT INTO {ledger_name} (payment_no) VALUES ('P-1')"),
                    )
                    .await;
                }
                tx.commit().await.unwrap();
                moved
            })
        })
        .collect();
    let (mut applied, mut already) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Transition::Applied => applied += 1,
            Transition::AlreadyInTarget => already += 1,
            other => panic!("every callback must succeed, got {other:?}"),
        }
    }
    assert_eq!((applied, already), (1, 14));
    assert_eq!(ledger.count("payment_no = 'P-1'").await, 1, "one credit");
    table.drop_table().await;
    ledger.drop_table().await;
}

async fn transition_rolls_back_with_the_callers_transaction<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (table, machine) = payments(&pool).await;
    insert_payment(&table, "P-1", "WAIT_PAY").await;
    let mut tx = pool.begin().await.unwrap();
    let moved = machine
        .transition(&mut *tx, "P-1", &[PayState::WaitPay], PayState::Paid)
        .await
        .unwrap();
    assert_eq!(moved, Transition::Applied);
    tx.rollback().await.unwrap();
    assert_eq!(table.count("state = 'WAIT_PAY'").await, 1);
    let mut conn = pool.acquire().await.unwrap();
    let moved = machine
        .transition(&mut *conn, "P-1", &[PayState::WaitPay], PayState::Paid)
        .await
        .unwrap();
    assert_eq!(moved, Transition::Applied, "the retry applies");
    drop(conn);
    table.drop_table().await;
}

async fn transition_rejects_what_it_cannot_use<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (table, machine) = payments(&pool).await;
    insert_payment(&table, "P-odd", "LOST").await;
    let mut conn = pool.acquire().await.unwrap();
    let err = machine
        .transition(&mut *conn, "P-odd", &[], PayState::Paid)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let err = machine
        .transition(&mut *conn, "P-odd", &[PayState::Paid], PayState::Paid)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let err = machine
        .transition(&mut *conn, "P-odd", &[PayState::WaitPay], PayState::Paid)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "an unknown stored state");
    for bad in [
        ("t; DROP TABLE x", "id", "state"),
        ("t", "id)", "state"),
        ("t", "id", "state = 'x' --"),
    ] {
        let err = StateMachine::<PayState>::new(bad.0, bad.1, bad.2).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{bad:?}");
    }
    drop(conn);
    table.drop_table().await;
}

// ---------------------------------------------------------------------------
// Counters

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
    let barrier = Arc::new(Barrier::new(100));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (pool, counter, barrier) = (pool.clone(), counter.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut conn = pool.acquire().await.unwrap();
                counter.decrement(&mut *conn, "book", 1).await.unwrap()
            })
        })
        .collect();
    let (mut applied, mut insufficient) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
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

// ---------------------------------------------------------------------------
// One-time tokens (SQL)

async fn tokens<DB: GuardDb + TestSql>(pool: &Pool<DB>) -> (SqlTokens<DB>, Table<DB>) {
    let table = Table {
        pool: pool.clone(),
        name: format!("guard_tokens_{}", nonce()),
    };
    let tokens = SqlTokens::with_table(pool.clone(), &table.name).unwrap();
    tokens.migrate().await.unwrap();
    tokens.migrate().await.unwrap();
    (tokens, table)
}

async fn twenty_submits_with_one_token(
    consume: impl Fn() -> tokio::task::JoinHandle<TokenUse>,
) -> usize {
    let tasks: Vec<_> = (0..20).map(|_| consume()).collect();
    let mut consumed = 0;
    for task in tasks {
        if let TokenUse::Consumed(_) = task.await.unwrap() {
            consumed += 1;
        }
    }
    consumed
}

async fn sql_token_race<DB: GuardDb + TestSql>(tokens: SqlTokens<DB>, pool: Pool<DB>) {
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_secs(600))
        .await
        .unwrap();
    let barrier = Arc::new(Barrier::new(20));
    let consumed = twenty_submits_with_one_token(|| {
        let (tokens, pool, token, barrier) =
            (tokens.clone(), pool.clone(), token.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let mut conn = pool.acquire().await.unwrap();
            tokens
                .consume(&mut *conn, "acme:alice:checkout", &token)
                .await
                .unwrap()
        })
    })
    .await;
    assert_eq!(consumed, 1, "exactly one submit passes");
}

async fn twenty_concurrent_submits_with_one_token_pass_once<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (tokens, table) = tokens(&pool).await;
    sql_token_race(tokens, pool).await;
    table.drop_table().await;
}

/// The path MySQL takes (no `DELETE ... RETURNING`): a locked read and a
/// delete in a transaction.
async fn twenty_concurrent_submits_pass_once_by_locked_read<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (tokens, table) = tokens(&pool).await;
    sql_token_race(tokens.without_delete_returning(), pool).await;
    table.drop_table().await;
}

async fn token_is_bound_to_its_subject_and_restorable<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (tokens, table) = tokens(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:bob:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Invalid,
        "another subject's token"
    );
    let consumed = tokens
        .consume(&mut *conn, "acme:alice:checkout", &token)
        .await
        .unwrap()
        .consumed()
        .expect("consumed");
    assert!(consumed.ttl_left > Duration::from_secs(500));
    assert!(consumed.ttl_left <= Duration::from_secs(600));
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Invalid,
        "a double submit"
    );
    // The business step failed: restore, and the user can submit again.
    assert!(tokens.restore(&consumed).await.unwrap());
    assert!(!tokens.restore(&consumed).await.unwrap(), "already back");
    assert!(matches!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Consumed(_)
    ));
    // Consumed in a transaction that rolls back: back by itself.
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_secs(600))
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(matches!(
        tokens
            .consume(&mut *tx, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Consumed(_)
    ));
    tx.rollback().await.unwrap();
    assert!(matches!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Consumed(_)
    ));
    // Expired: invalid.
    let token = tokens
        .issue("acme:alice:checkout", Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &token)
            .await
            .unwrap(),
        TokenUse::Invalid
    );
    assert_eq!(
        tokens
            .consume(&mut *conn, "acme:alice:checkout", &"forged".into())
            .await
            .unwrap(),
        TokenUse::Invalid
    );
    drop(conn);
    table.drop_table().await;
}

// ---------------------------------------------------------------------------
// The inbox

async fn inbox<DB: GuardDb + TestSql>(pool: &Pool<DB>) -> (Inbox<DB>, Table<DB>, Table<DB>) {
    let log = Table {
        pool: pool.clone(),
        name: format!("guard_inbox_{}", nonce()),
    };
    let inbox = Inbox::with_table(pool.clone(), &log.name, "ledger").unwrap();
    inbox.migrate().await.unwrap();
    inbox.migrate().await.unwrap();
    let effects = Table::create(pool, "guard_effects", "transfer_id VARCHAR(64) NOT NULL").await;
    (inbox, log, effects)
}

/// Handles a transfer: one effect row, in the inbox's transaction.
async fn handle<DB: GuardDb + TestSql>(
    inbox: &Inbox<DB>,
    effects: &str,
    message_id: &str,
    transfer_id: &str,
    fail: bool,
) -> Result<Processed<()>, ProcessError<&'static str>> {
    let sql = format!("INSERT INTO {effects} (transfer_id) VALUES ('{transfer_id}')");
    inbox
        .process(message_id, transfer_id, move |conn| {
            Box::pin(async move {
                DB::exec_on(conn, sql).await;
                if fail { Err("handler failed") } else { Ok(()) }
            })
        })
        .await
}

/// Business ids that differ only by case, by a trailing space or by an
/// accent are different events: each runs its effect. So are message ids,
/// and consumer names. (MySQL's default collations took them for one: the
/// inbox skipped a new event as a duplicate, its effect never applied.)
async fn ids_differing_only_by_case_space_or_accent_each_run_their_effect<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    let (inbox, log, effects) = inbox(&pool).await;
    let e = effects.name.as_str();
    let done = |processed: Result<Processed<()>, _>| {
        assert_eq!(
            processed.expect("the handler succeeds"),
            Processed::Done(())
        );
    };
    for (n, id) in ["T-A", "T-a", "T-a ", "T-\u{e1}"].iter().enumerate() {
        done(handle(&inbox, e, &format!("m-{n}"), id, false).await);
    }
    assert_eq!(
        effects.count("1 = 1").await,
        4,
        "one effect per business id"
    );
    // Message ids the same way (each with a business id of its own).
    for (id, business) in [("m-X", "U-1"), ("m-x", "U-2"), ("m-x ", "U-3")] {
        done(handle(&inbox, e, id, business, false).await);
    }
    assert_eq!(effects.count("1 = 1").await, 7);
    // The very same ids are still duplicates.
    for (id, business) in [("m-1", "T-a"), ("m-other", "T-a ")] {
        let again = handle(&inbox, e, id, business, false).await;
        assert!(matches!(again, Ok(Processed::Skipped(_))), "{again:?}");
    }
    assert_eq!(effects.count("1 = 1").await, 7, "duplicates ran nothing");
    // A consumer whose name differs only by case keeps its own log.
    let other = Inbox::with_table(pool.clone(), &log.name, "Ledger").unwrap();
    assert_eq!(
        other
            .record(&mut *pool.acquire().await.unwrap(), "m-0", "T-A")
            .await
            .unwrap(),
        Delivery::First
    );
    effects.drop_table().await;
    log.drop_table().await;
}

async fn duplicates_by_message_or_business_id_are_skipped<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (inbox, log, effects) = inbox(&pool).await;
    let e = effects.name.as_str();
    assert_eq!(
        handle(&inbox, e, "m-1", "T-1", false).await.unwrap(),
        Processed::Done(())
    );
    for _ in 0..2 {
        assert_eq!(
            handle(&inbox, e, "m-1", "T-1", false).await.unwrap(),
            Processed::Skipped(DuplicateOf::Message)
        );
    }
    assert_eq!(
        handle(&inbox, e, "m-1-republished", "T-1", false)
            .await
            .unwrap(),
        Processed::Skipped(DuplicateOf::BusinessEvent)
    );
    assert_eq!(
        handle(&inbox, e, "m-2", "T-2", false).await.unwrap(),
        Processed::Done(())
    );
    assert_eq!(effects.count("transfer_id = 'T-1'").await, 1);
    assert_eq!(effects.count("transfer_id = 'T-2'").await, 1);
    // record() in a caller's transaction: the row goes with it.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "m-3", "T-3").await.unwrap(),
        Delivery::First
    );
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "m-3", "T-3").await.unwrap(),
        Delivery::First
    );
    tx.commit().await.unwrap();
    // Another consumer keeps its own log in the same table.
    let audit = Inbox::with_table(pool.clone(), &log.name, "audit").unwrap();
    assert_eq!(
        audit
            .record(&mut *pool.acquire().await.unwrap(), "m-1", "T-1")
            .await
            .unwrap(),
        Delivery::First
    );
    assert_eq!(
        inbox
            .purge_older_than(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        inbox
            .record(&mut *pool.acquire().await.unwrap(), &"x".repeat(256), "T")
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Config
    );
    effects.drop_table().await;
    log.drop_table().await;
}

async fn handler_error_rolls_back_and_the_redelivery_runs_once<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    let (inbox, log, effects) = inbox(&pool).await;
    let e = effects.name.as_str();
    match handle(&inbox, e, "m-1", "T-1", true).await {
        Err(ProcessError::Failed("handler failed")) => {}
        other => panic!("expected the handler's error, got {other:?}"),
    }
    assert_eq!(effects.count("1 = 1").await, 0, "its write rolled back");
    // The broker redelivers: it runs, once.
    assert_eq!(
        handle(&inbox, e, "m-1", "T-1", false).await.unwrap(),
        Processed::Done(())
    );
    assert_eq!(
        handle(&inbox, e, "m-1", "T-1", false).await.unwrap(),
        Processed::Skipped(DuplicateOf::Message)
    );
    assert_eq!(effects.count("transfer_id = 'T-1'").await, 1);
    effects.drop_table().await;
    log.drop_table().await;
}

/// Ten messages, each delivered to three consumers at once and re-published
/// once under a new id: ten effects.
async fn concurrent_deliveries_process_each_event_once<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let (inbox, log, effects) = inbox(&pool).await;
    let effects_name = Arc::new(effects.name.clone());
    let barrier = Arc::new(Barrier::new(40));
    let mut tasks = Vec::new();
    for n in 0..10 {
        for copy in 0..4 {
            let (inbox, effects_name, barrier) =
                (inbox.clone(), effects_name.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let message = if copy == 3 {
                    format!("m-{n}-again")
                } else {
                    format!("m-{n}")
                };
                barrier.wait().await;
                handle(&inbox, &effects_name, &message, &format!("T-{n}"), false)
                    .await
                    .unwrap()
            }));
        }
    }
    let mut done = 0;
    for task in tasks {
        if task.await.unwrap() == Processed::Done(()) {
            done += 1;
        }
    }
    assert_eq!(done, 10);
    assert_eq!(effects.count("1 = 1").await, 10);
    for n in 0..10 {
        assert_eq!(effects.count(&format!("transfer_id = 'T-{n}'")).await, 1);
    }
    effects.drop_table().await;
    log.drop_table().await;
}

sql_cases!(
    transition_applies_once_then_is_already_in_target,
    a_null_state_is_corrupt_not_missing,
    concurrent_transitions_apply_exactly_once,
    transition_rolls_back_with_the_callers_transaction,
    transition_rejects_what_it_cannot_use,
    hundred_concurrent_decrements_on_fifty_apply_fifty,
    versioned_decrement_tells_conflict_from_insufficient,
    twenty_concurrent_submits_with_one_token_pass_once,
    token_is_bound_to_its_subject_and_restorable,
    duplicates_by_message_or_business_id_are_skipped,
    ids_differing_only_by_case_space_or_accent_each_run_their_effect,
    handler_error_rolls_back_and_the_redelivery_runs_once,
    concurrent_deliveries_process_each_event_once,
);

/// The locked-read path is MySQL's; PostgreSQL runs it too, as a second
/// opinion. (SQLite always has `RETURNING`, and a deferred read-then-write
/// transaction there fails fast on a busy snapshot instead of waiting.)
mod locked_read {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn mysql_twenty_concurrent_submits_pass_once() {
        if let Some(pool) = super::mysql().await {
            super::twenty_concurrent_submits_pass_once_by_locked_read(pool).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_twenty_concurrent_submits_pass_once() {
        if let Some(pool) = super::postgres().await {
            super::twenty_concurrent_submits_pass_once_by_locked_read(pool).await;
        }
    }
}

// ---------------------------------------------------------------------------
// Redis: tokens and the lock

mod redis {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn twenty_concurrent_submits_with_one_token_pass_once() {
        let Some(conn) = super::redis().await else {
            return;
        };
        let tokens = RedisTokens::new(conn).namespace("idem-test:");
        let subject = format!("acme:alice:{}", nonce());
        let token = tokens
            .issue(&subject, Duration::from_secs(60))
            .await
            .unwrap();
        let barrier = Arc::new(Barrier::new(20));
        let consumed = twenty_submits_with_one_token(|| {
            let (tokens, token, subject, barrier) = (
                tokens.clone(),
                token.clone(),
                subject.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                tokens.consume(&subject, &token).await.unwrap()
            })
        })
        .await;
        assert_eq!(consumed, 1, "exactly one submit passes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn token_is_bound_to_its_subject_and_restorable() {
        let Some(conn) = super::redis().await else {
            return;
        };
        let tokens = RedisTokens::new(conn).namespace("idem-test:");
        let subject = format!("acme:alice:{}", nonce());
        let token = tokens
            .issue(&subject, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            tokens.consume("acme:bob:x", &token).await.unwrap(),
            TokenUse::Invalid
        );
        let consumed = tokens
            .consume(&subject, &token)
            .await
            .unwrap()
            .consumed()
            .expect("consumed");
        assert!(consumed.ttl_left > Duration::from_secs(50));
        assert_eq!(
            tokens.consume(&subject, &token).await.unwrap(),
            TokenUse::Invalid
        );
        assert!(tokens.restore(&consumed).await.unwrap());
        assert!(!tokens.restore(&consumed).await.unwrap());
        assert!(matches!(
            tokens.consume(&subject, &token).await.unwrap(),
            TokenUse::Consumed(_)
        ));
        let short = tokens
            .issue(&subject, Duration::from_millis(100))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            tokens.consume(&subject, &short).await.unwrap(),
            TokenUse::Invalid
        );
    }

    /// A holder whose lease ran out can neither release nor renew the lock a
    /// second holder now owns; the second holder's lock stays intact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn expired_holder_cannot_release_the_next_holders_lock() {
        let Some(conn) = super::redis().await else {
            return;
        };
        let name = format!("job-{}", nonce());
        let lock = RedisLock::with_namespace(
            conn.clone(),
            "idem-test:",
            &name,
            Duration::from_millis(300),
        );
        let first = lock.try_acquire().await.unwrap().expect("free");
        assert!(lock.try_acquire().await.unwrap().is_none(), "held");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let long = RedisLock::with_namespace(conn, "idem-test:", &name, Duration::from_secs(30));
        let second = long.try_acquire().await.unwrap().expect("lease ran out");
        assert_ne!(first.owner(), second.owner());
        assert!(!first.renew().await.unwrap(), "stale renew");
        assert!(!first.release().await.unwrap(), "stale release");
        assert!(
            long.try_acquire().await.unwrap().is_none(),
            "the second holder still holds it"
        );
        assert!(second.release().await.unwrap());
        assert!(long.try_acquire().await.unwrap().is_some(), "free again");
    }

    /// A lease and a wait meant as forever (`Duration::MAX`): taken as a
    /// century, never an overflow nor an expiry Redis refuses.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_lease_and_a_wait_meant_as_forever_hold() {
        let Some(conn) = super::redis().await else {
            return;
        };
        let name = format!("forever-{}", nonce());
        let lock = RedisLock::with_namespace(conn, "idem-test:", &name, Duration::MAX);
        let guard = lock
            .acquire(Duration::MAX)
            .await
            .unwrap()
            .expect("a free lock");
        assert!(lock.try_acquire().await.unwrap().is_none(), "held");
        assert!(guard.renew().await.unwrap());
        assert!(guard.release().await.unwrap());
    }

    /// The keep-alive's Redis goes away: once the lease has run out with
    /// no renewal confirmed, the lock may be another's, and `lost` says so
    /// (it kept saying the lock was held while the renewals failed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn keep_alive_says_lost_once_the_lease_ran_out_unrenewed() {
        let Some(mut server) = idem_test_support::redis::RedisServer::start(&[]) else {
            return;
        };
        let client = ::redis::Client::open(server.url()).expect("a Redis URL");
        let conn = ConnectionManager::new(client).await.expect("the server");
        let lock = RedisLock::with_namespace(
            conn,
            "idem-test:",
            &format!("gone-{}", nonce()),
            Duration::from_millis(300),
        );
        let guard = lock.try_acquire().await.unwrap().expect("free");
        let keep_alive = guard.keep_alive();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!keep_alive.lost(), "renewed while Redis answers");
        server.stop();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(keep_alive.lost(), "the lease ran out unrenewed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn keep_alive_holds_the_lock_past_its_lease_and_acquire_waits() {
        let Some(conn) = super::redis().await else {
            return;
        };
        let lock = RedisLock::with_namespace(
            conn,
            "idem-test:",
            &format!("job-{}", nonce()),
            Duration::from_millis(300),
        );
        let guard = lock.try_acquire().await.unwrap().expect("free");
        let keep_alive = guard.keep_alive();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(!keep_alive.lost());
        assert!(
            lock.acquire(Duration::from_millis(200))
                .await
                .unwrap()
                .is_none(),
            "still held thanks to renewals"
        );
        drop(keep_alive);
        let waiter = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.acquire(Duration::from_secs(5)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(guard.release().await.unwrap());
        let next = waiter.await.unwrap().expect("the waiter gets it");
        assert!(next.release().await.unwrap());
    }
}
