//! `Inbox`: a message runs its effect once, whether it comes again under
//! its id or under a new one for the same business event; a failed handler
//! rolls back and its redelivery runs; ids are compared byte for byte.

use std::sync::Arc;
use std::time::Duration;

use idem_core::ErrorKind;
use idem_guards::{Delivery, DuplicateOf, GuardDb, Inbox, ProcessError, Processed};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;

use crate::support::{Table, all_at_once, nonce};

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
    // Delivery `i`: message `i / 4`, its fourth copy re-published.
    let processed = all_at_once(40, |i| {
        let (inbox, effects_name) = (inbox.clone(), effects_name.clone());
        let (n, copy) = (i / 4, i % 4);
        async move {
            let message = if copy == 3 {
                format!("m-{n}-again")
            } else {
                format!("m-{n}")
            };
            handle(&inbox, &effects_name, &message, &format!("T-{n}"), false)
                .await
                .unwrap()
        }
    })
    .await;
    let done = processed
        .iter()
        .filter(|processed| **processed == Processed::Done(()))
        .count();
    assert_eq!(done, 10);
    assert_eq!(effects.count("1 = 1").await, 10);
    for n in 0..10 {
        assert_eq!(effects.count(&format!("transfer_id = 'T-{n}'")).await, 1);
    }
    effects.drop_table().await;
    log.drop_table().await;
}

sql_cases!(
    duplicates_by_message_or_business_id_are_skipped,
    ids_differing_only_by_case_space_or_accent_each_run_their_effect,
    handler_error_rolls_back_and_the_redelivery_runs_once,
    concurrent_deliveries_process_each_event_once,
);
