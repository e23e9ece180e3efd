//! What the guards' columns hold, on every database alike, against real
//! PostgreSQL, MariaDB/MySQL and SQLite: ids that differ only by case, a
//! trailing space or an accent are different ids (MySQL's default
//! collations would take them for one: the inbox skipped a new message as
//! a duplicate, the outbox dropped a new event as already queued), and an
//! outbox event with large headers and payload comes back whole (MySQL's
//! `TEXT` holds 64 KiB, and `INSERT IGNORE` cut the rest off silently).
//!
//! Each case makes its own tables (named with a nonce), so a table an
//! earlier run created with other column types does not hide the result.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::sync::{Arc, Mutex};

use idem_core::{BoxError, BoxFuture};
use idem_guards::{
    Delivery, Enqueued, Event, GuardDb, Inbox, Outbox, PendingEvent, Processed, Published,
    Publisher, Relay,
};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;

#[macro_use]
mod support;
use support::{Table, mysql, nonce, postgres, sqlite};

// ---------------------------------------------------------------------------
// The inbox

/// An inbox of consumer `ledger` in a fresh table, and a fresh table of
/// effects.
async fn inbox<DB: GuardDb + TestSql>(pool: &Pool<DB>) -> (Inbox<DB>, Table<DB>, Table<DB>) {
    let log = Table {
        pool: pool.clone(),
        name: format!("col_inbox_{}", nonce()),
    };
    let inbox = Inbox::with_table(pool.clone(), &log.name, "ledger").unwrap();
    inbox.migrate().await.unwrap();
    let effects = Table::create(pool, "col_effects", "n INTEGER NOT NULL").await;
    (inbox, log, effects)
}

/// Processes `message_id` / `business_id`: its effect is one row in
/// `effects`.
async fn handle<DB: GuardDb + TestSql>(
    inbox: &Inbox<DB>,
    effects: &str,
    message_id: &str,
    business_id: &str,
) -> Processed<()> {
    let sql = format!("INSERT INTO {effects} (n) VALUES (1)");
    inbox
        .process(message_id, business_id, move |conn| {
            Box::pin(async move {
                DB::exec_on(conn, sql).await;
                Ok::<_, &'static str>(())
            })
        })
        .await
        .unwrap()
}

/// Business ids that differ only by case, by a trailing space or by an
/// accent are different events: each runs its effect. So are message ids,
/// and consumer names.
async fn ids_differing_only_by_case_space_or_accent_each_run_their_effect<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    let (inbox, log, effects) = inbox(&pool).await;
    let e = effects.name.as_str();
    let business = ["T-A", "T-a", "T-a ", "T-\u{e1}"];
    for (n, id) in business.iter().enumerate() {
        assert_eq!(
            handle(&inbox, e, &format!("m-{n}"), id).await,
            Processed::Done(()),
            "business id {id:?}"
        );
    }
    assert_eq!(
        effects.count("1 = 1").await,
        4,
        "one effect per business id"
    );
    // Message ids the same way (each with a business id of its own).
    for (id, business) in [("m-X", "U-1"), ("m-x", "U-2"), ("m-x ", "U-3")] {
        assert_eq!(
            handle(&inbox, e, id, business).await,
            Processed::Done(()),
            "message id {id:?}"
        );
    }
    assert_eq!(effects.count("1 = 1").await, 7);
    // The very same ids are still duplicates.
    assert!(matches!(
        handle(&inbox, e, "m-1", "T-a").await,
        Processed::Skipped(_)
    ));
    assert!(matches!(
        handle(&inbox, e, "m-other", "T-a ").await,
        Processed::Skipped(_)
    ));
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

// ---------------------------------------------------------------------------
// The outbox

/// A broker that keeps every event it is handed.
#[derive(Default)]
struct Recorder(Mutex<Vec<PendingEvent>>);

struct To(Arc<Recorder>);

impl Publisher for To {
    fn publish<'a>(
        &'a self,
        pending: &'a PendingEvent,
    ) -> BoxFuture<'a, Result<Published, BoxError>> {
        Box::pin(async move {
            self.0.0.lock().unwrap().push(pending.clone());
            Ok(Published::Stored)
        })
    }
}

async fn outbox<DB: GuardDb + TestSql>(pool: &Pool<DB>) -> Outbox<DB> {
    let outbox = Outbox::with_table(pool.clone(), &format!("col_obx_{}", nonce())).unwrap();
    outbox.migrate().await.unwrap();
    outbox
}

async fn drop_tables<DB: GuardDb + TestSql>(outbox: Outbox<DB>) {
    let name = outbox.table();
    DB::exec(outbox.pool(), format!("DROP TABLE {name}")).await;
    DB::exec(outbox.pool(), format!("DROP TABLE {name}_lock")).await;
}

async fn enqueue<DB: GuardDb + TestSql>(outbox: &Outbox<DB>, event: &Event) -> Enqueued {
    let mut tx = outbox.pool().begin().await.unwrap();
    let enqueued = outbox.enqueue(&mut tx, event).await.unwrap();
    tx.commit().await.unwrap();
    enqueued
}

/// Event ids that differ only by case (or a trailing space) are different
/// events: each is enqueued and published, under its own id.
async fn event_ids_differing_only_by_case_are_each_enqueued<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let outbox = outbox(&pool).await;
    let ids = ["x:aB", "x:Ab", "x:ab", "x:ab "];
    for id in ids {
        let event = Event::new("orders.created", "k", "{}")
            .unwrap()
            .with_id(id)
            .unwrap();
        assert_eq!(enqueue(&outbox, &event).await, Enqueued::New, "{id:?}");
    }
    let again = Event::new("orders.created", "k", "{}")
        .unwrap()
        .with_id("x:Ab")
        .unwrap();
    assert_eq!(enqueue(&outbox, &again).await, Enqueued::AlreadyQueued);
    assert_eq!(outbox.unsent().await.unwrap(), 4);

    let broker = Arc::new(Recorder::default());
    let relay = Relay::new(outbox.clone(), To(broker.clone()));
    let pass = relay.run_once().await.unwrap();
    assert_eq!(pass.published, 4, "{pass:?}");
    let published: Vec<String> = broker
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.event().id().to_owned())
        .collect();
    assert_eq!(published, ids);
    drop_tables(outbox).await;
}

/// An event with a 70,000-byte header value and a 100 KiB payload comes
/// back from the relay's claim as it was enqueued, and an event of another
/// key in the same batch is published too.
async fn large_headers_and_payload_round_trip<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let outbox = outbox(&pool).await;
    let value: String = (0..70_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let payload: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
    let big = Event::new("orders.created", "big", payload.clone())
        .unwrap()
        .header("x-large", value.clone())
        .expect("a valid header");
    assert_eq!(enqueue(&outbox, &big).await, Enqueued::New);
    let small = Event::new("orders.created", "small", "{}").unwrap();
    assert_eq!(enqueue(&outbox, &small).await, Enqueued::New);

    let broker = Arc::new(Recorder::default());
    let relay = Relay::new(outbox.clone(), To(broker.clone()));
    let pass = relay.run_once().await.expect("the claim reads both events");
    assert_eq!((pass.claimed, pass.published), (2, 2), "{pass:?}");
    let published = broker.0.lock().unwrap().clone();
    assert_eq!(published.len(), 2);
    assert_eq!(published[0].event(), &big, "the large event, whole");
    assert_eq!(published[0].payload().len(), payload.len());
    assert_eq!(published[0].event().headers()[0].1.len(), value.len());
    assert_eq!(published[1].event(), &small);
    assert_eq!(outbox.unsent().await.unwrap(), 0);
    drop_tables(outbox).await;
}

sql_cases!(
    ids_differing_only_by_case_space_or_accent_each_run_their_effect,
    event_ids_differing_only_by_case_are_each_enqueued,
    large_headers_and_payload_round_trip,
);
