//! `StateMachine`: a compare-and-set transition of a row's state, applied
//! once, told apart from a repeat, an illegal move and a missing row, and
//! rolled back with the caller's transaction.

use std::sync::Arc;

use idem_core::ErrorKind;
use idem_guards::{GuardDb, LifecycleState, StateMachine, Transition};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;

use crate::support::{Table, all_at_once};

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
    let moves = all_at_once(15, |_| {
        let (pool, machine, ledger_name) = (pool.clone(), machine.clone(), ledger_name.clone());
        async move {
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
        }
    })
    .await;
    let (mut applied, mut already) = (0, 0);
    for moved in moves {
        match moved {
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

sql_cases!(
    transition_applies_once_then_is_already_in_target,
    a_null_state_is_corrupt_not_missing,
    concurrent_transitions_apply_exactly_once,
    transition_rolls_back_with_the_callers_transaction,
    transition_rejects_what_it_cannot_use,
);
