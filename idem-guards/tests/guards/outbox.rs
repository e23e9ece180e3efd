//! The transactional outbox and its relay against real PostgreSQL,
//! MariaDB/MySQL and SQLite: only committed events leave, each key's events
//! leave in order and one at a time however many relays race, a failed
//! publish is retried, a relay that dies mid-batch leaves its events to
//! another once its lease ends, sent events are purged in bounded batches.
//!
//! The broker here is a recording [`Publisher`] (what it was handed, in what
//! order, and how many publishes of one key overlapped): these tests are
//! about the claims and leases in the database. The JetStream publisher is
//! tested against a real NATS server in `app/tests/processes/outbox.rs`.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::BoxError;
use idem_core::BoxFuture;
use idem_guards::{Enqueued, Event, GuardDb, Outbox, PendingEvent, Published, Publisher, Relay};
use idem_sql::conformance::TestSql;
use idem_sql::sqlx::Pool;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::sync::Notify;

use crate::support::{nonce, sqlite};

/// What the broker was handed.
#[derive(Default)]
struct Broker {
    /// Published events, in the order they were stored.
    stored: Mutex<Vec<PendingEvent>>,
    /// Keys with a publish under way.
    in_flight: Mutex<HashSet<String>>,
    /// Publishes of one key that overlapped another of the same key.
    overlaps: Mutex<usize>,
    /// Publish attempts so far.
    attempts: Mutex<usize>,
    /// The first attempts that fail.
    fail_first: usize,
    /// Every how many attempts one fails (0: none).
    fail_every: usize,
    /// How long a publish takes.
    delay: Duration,
}

impl Broker {
    fn failing_every(fail_every: usize, delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            fail_every,
            delay,
            ..Self::default()
        })
    }

    /// Published events as (key, seq, id), in the order they were stored.
    fn stored(&self) -> Vec<(String, i64, String)> {
        self.events()
            .iter()
            .map(|p| {
                (
                    p.event().key().to_owned(),
                    p.seq(),
                    p.event().id().to_owned(),
                )
            })
            .collect()
    }

    /// Published events whole, in the order they were stored.
    fn events(&self) -> Vec<PendingEvent> {
        self.stored.lock().unwrap().clone()
    }
}

/// A relay's handle on the shared [`Broker`].
struct To(Arc<Broker>);

impl Publisher for To {
    fn publish<'a>(
        &'a self,
        pending: &'a PendingEvent,
    ) -> BoxFuture<'a, Result<Published, BoxError>> {
        Box::pin(async move {
            let broker = &self.0;
            let key = pending.event().key().to_owned();
            if !broker.in_flight.lock().unwrap().insert(key.clone()) {
                *broker.overlaps.lock().unwrap() += 1;
            }
            tokio::time::sleep(broker.delay).await;
            let attempt = {
                let mut attempts = broker.attempts.lock().unwrap();
                *attempts += 1;
                *attempts
            };
            let failed = attempt <= broker.fail_first
                || (broker.fail_every > 0 && attempt % broker.fail_every == 0);
            if !failed {
                broker.stored.lock().unwrap().push(pending.clone());
            }
            broker.in_flight.lock().unwrap().remove(&key);
            if failed {
                return Err("the broker refused this one".into());
            }
            Ok(Published::Stored)
        })
    }
}

/// A publisher that never answers: a relay stuck (or dying) mid-publish.
/// `handed` is told when it is handed an event.
#[derive(Default)]
struct Stuck {
    handed: Arc<Notify>,
}

impl Publisher for Stuck {
    fn publish<'a>(&'a self, _: &'a PendingEvent) -> BoxFuture<'a, Result<Published, BoxError>> {
        self.handed.notify_one();
        Box::pin(std::future::pending())
    }
}

/// An outbox in tables of the test's own.
async fn outbox<DB: GuardDb + TestSql>(pool: &Pool<DB>) -> Outbox<DB> {
    let outbox = Outbox::with_table(pool.clone(), &format!("obx_{}", nonce())).unwrap();
    outbox.migrate().await.unwrap();
    outbox
}

async fn drop_tables<DB: GuardDb + TestSql>(outbox: Outbox<DB>) {
    let name = outbox.table();
    DB::exec(outbox.pool(), format!("DROP TABLE {name}")).await;
    DB::exec(outbox.pool(), format!("DROP TABLE {name}_lock")).await;
}

/// Enqueues `event` in a transaction of its own and commits it.
async fn enqueue<DB: GuardDb + TestSql>(outbox: &Outbox<DB>, event: &Event) -> Enqueued {
    let mut tx = outbox.pool().begin().await.unwrap();
    let enqueued = outbox.enqueue(&mut tx, event).await.unwrap();
    tx.commit().await.unwrap();
    enqueued
}

/// [`enqueue`], of an event new to the outbox.
async fn enqueue_committed<DB: GuardDb + TestSql>(outbox: &Outbox<DB>, event: &Event) {
    assert_eq!(enqueue(outbox, event).await, Enqueued::New);
}

fn event(key: &str, n: usize) -> Event {
    Event::new("orders.created", key, format!(r#"{{"n":{n}}}"#))
        .unwrap()
        .with_id(format!("{key}-{n}"))
        .unwrap()
}

async fn only_committed_events_are_published<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let outbox = outbox(&pool).await;
    let committed = event("alice", 1)
        .header("content-type", "application/json")
        .expect("a valid header");
    enqueue_committed(&outbox, &committed).await;

    let mut tx = pool.begin().await.unwrap();
    let rolled_back = event("alice", 2);
    assert_eq!(
        outbox.enqueue(&mut tx, &rolled_back).await.unwrap(),
        Enqueued::New
    );
    tx.rollback().await.unwrap();

    // The same id again: nothing is added.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        outbox.enqueue(&mut tx, &committed).await.unwrap(),
        Enqueued::AlreadyQueued
    );
    tx.commit().await.unwrap();
    assert_eq!(outbox.unsent().await.unwrap(), 1);
    assert!(outbox.lag().await.unwrap().is_some());

    let broker = Broker::failing_every(0, Duration::ZERO);
    let relay = Relay::new(outbox.clone(), To(broker.clone()));
    let pass = relay.run_once().await.unwrap();
    assert_eq!((pass.claimed, pass.published), (1, 1), "{pass:?}");
    let stored = broker.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (stored[0].0.as_str(), stored[0].2.as_str()),
        ("alice", "alice-1")
    );
    assert_eq!(relay.run_once().await.unwrap().claimed, 0, "nothing left");
    assert_eq!(outbox.unsent().await.unwrap(), 0);
    assert_eq!(outbox.lag().await.unwrap(), None);
    drop_tables(outbox).await;
}

async fn a_failed_publish_is_retried_and_holds_back_only_its_key<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    let outbox = outbox(&pool).await;
    for n in 1..=3 {
        enqueue_committed(&outbox, &event("k1", n)).await;
        enqueue_committed(&outbox, &event("k2", n)).await;
    }
    // The first attempt (k1-1) fails, and waits out a backoff of an hour:
    // however slow the machine, the next pass comes before it is over.
    let broker = Arc::new(Broker {
        fail_first: 1,
        ..Broker::default()
    });
    let backoff = Duration::from_secs(3600);
    let relay = Relay::new(outbox.clone(), To(broker.clone())).backoff(backoff, backoff);
    let pass = relay.run_once().await.unwrap();
    assert_eq!(pass.retried, 1, "{pass:?}");
    assert_eq!(pass.published, 3, "k2's three went out: {pass:?}");
    let keys: Vec<_> = broker.stored().into_iter().map(|(k, ..)| k).collect();
    assert_eq!(keys, ["k2", "k2", "k2"], "k1 held back behind its failure");

    // Until its backoff is over, k1's head is not due, and neither is the rest of k1.
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    let (table, pool) = (outbox.table(), outbox.pool());
    let backing_off =
        |after: String| format!("SELECT COUNT(*) FROM {table} WHERE next_attempt_at > {after}");
    assert_eq!(
        DB::count(pool, backing_off(DB::now_plus_ms("1500000"))).await,
        1,
        "k1's head is due in half an hour or more (an hour, jittered)"
    );
    // Its backoff over (its due time moved to now), k1's three go out.
    DB::exec(
        pool,
        format!(
            "UPDATE {table} SET next_attempt_at = {now} WHERE next_attempt_at > {now}",
            now = DB::NOW
        ),
    )
    .await;
    assert_eq!(DB::count(pool, backing_off(DB::NOW.to_owned())).await, 0);
    let pass = relay.run_once().await.unwrap();
    assert_eq!(pass.published, 3, "{pass:?}");
    let ids: Vec<_> = broker.stored().into_iter().map(|(.., id)| id).collect();
    assert_eq!(ids, ["k2-1", "k2-2", "k2-3", "k1-1", "k1-2", "k1-3"]);
    drop_tables(outbox).await;
}

async fn racing_relays_publish_each_key_in_order_one_at_a_time<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    let outbox = outbox(&pool).await;
    let (keys, per_key) = (6, 25);
    // Enqueued by concurrent writers, one writer per key (so each key's
    // events are in enqueue order), while the relays already run.
    let writers: Vec<_> = (0..keys)
        .map(|k| {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                for n in 1..=per_key {
                    enqueue_committed(&outbox, &event(&format!("key{k}"), n)).await;
                }
            })
        })
        .collect();
    let broker = Broker::failing_every(7, Duration::from_millis(1));
    let relays: Vec<_> = (0..4)
        .map(|r| {
            let relay = Relay::new(outbox.clone(), To(broker.clone()))
                .name(&format!("relay{r}"))
                .batch(8)
                .backoff(Duration::from_millis(5), Duration::from_millis(20));
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    let pass = relay.run_once().await.unwrap();
                    if pass.claimed == 0 {
                        if relay.outbox().unsent().await.unwrap() == 0 {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                panic!("the relays did not drain the outbox in a minute");
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    for relay in relays {
        relay.await.unwrap();
    }
    // A relay may have seen the outbox empty before the last writer
    // committed: drain what is left.
    let last = Relay::new(outbox.clone(), To(broker.clone()));
    while outbox.unsent().await.unwrap() > 0 {
        last.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let stored = broker.stored();
    assert_eq!(stored.len(), keys * per_key, "each event stored once");
    let ids: HashSet<_> = stored.iter().map(|(.., id)| id.clone()).collect();
    assert_eq!(ids.len(), keys * per_key, "no event stored twice");
    let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
    for (key, _, id) in &stored {
        let n = id.rsplit('-').next().unwrap().parse().unwrap();
        by_key.entry(key).or_default().push(n);
    }
    for (key, ns) in by_key {
        assert_eq!(ns, (1..=per_key).collect::<Vec<_>>(), "{key} out of order");
    }
    assert_eq!(
        *broker.overlaps.lock().unwrap(),
        0,
        "two publishes of one key overlapped"
    );
    assert!(
        *broker.attempts.lock().unwrap() > keys * per_key,
        "the injected failures were retried"
    );
    drop_tables(outbox).await;
}

async fn a_relay_that_dies_mid_batch_leaves_its_events_after_its_lease<DB: GuardDb + TestSql>(
    pool: Pool<DB>,
) {
    let outbox = outbox(&pool).await;
    for n in 1..=5 {
        enqueue_committed(&outbox, &event("k", n)).await;
    }
    // The dying relay is stopped mid-publish: once it has been handed the
    // first event, so once its claim of the batch committed, however long
    // that took. Its lease is long enough for the heir's first pass to
    // come within it on a loaded machine.
    let lease = Duration::from_secs(3);
    let stuck = Stuck::default();
    let handed = Arc::clone(&stuck.handed);
    let dying = Relay::new(outbox.clone(), stuck).lease(lease);
    tokio::select! {
        pass = dying.run_once() => panic!("a publish that never answers ended: {pass:?}"),
        () = handed.notified() => {}
    }

    let broker = Broker::failing_every(0, Duration::ZERO);
    let heir = Relay::new(outbox.clone(), To(broker.clone()));
    assert_eq!(
        heir.run_once().await.unwrap().claimed,
        0,
        "the lease still holds the batch"
    );
    let started = Instant::now();
    let pass = loop {
        let pass = heir.run_once().await.unwrap();
        if pass.claimed > 0 {
            break pass;
        }
        assert!(
            started.elapsed() < lease + Duration::from_secs(20),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(pass.published, 5, "{pass:?}");
    let ids: Vec<_> = broker.stored().into_iter().map(|(.., id)| id).collect();
    assert_eq!(ids, ["k-1", "k-2", "k-3", "k-4", "k-5"]);
    drop_tables(outbox).await;
}

async fn a_publish_never_outlives_the_lease<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let outbox = outbox(&pool).await;
    enqueue_committed(&outbox, &event("slow", 1)).await;
    // The publish timeout is ten seconds; the lease is 500 ms, so the
    // publish is given up at four fifths of it (the bound below leaves room
    // for a loaded machine, and is far below the ten seconds).
    let relay = Relay::new(outbox.clone(), Stuck::default())
        .lease(Duration::from_millis(500))
        .publish_timeout(Duration::from_secs(10));
    let started = Instant::now();
    let pass = relay.run_once().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the publish waited for its own timeout, past the lease: {:?}",
        started.elapsed()
    );
    assert_eq!((pass.published, pass.retried), (0, 1), "{pass:?}");
    assert_eq!(outbox.unsent().await.unwrap(), 1, "put back for a retry");
    drop_tables(outbox).await;
}

async fn sent_events_are_purged_in_bounded_batches<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let outbox = outbox(&pool).await;
    for n in 1..=25 {
        enqueue_committed(&outbox, &event("p", n)).await;
    }
    enqueue_committed(&outbox, &event("q", 1)).await;
    let broker = Broker::failing_every(0, Duration::ZERO);
    let relay = Relay::new(outbox.clone(), To(broker)).batch(25);
    assert_eq!(relay.run_once().await.unwrap().published, 25);
    assert_eq!(outbox.unsent().await.unwrap(), 1, "q-1 is still to send");

    let recent = outbox
        .purge_sent(Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert_eq!(recent, 0, "nothing was sent an hour ago");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut purged = Vec::new();
    loop {
        let rows = outbox
            .purge_sent(Duration::from_millis(1), 10)
            .await
            .unwrap();
        purged.push(rows);
        if rows == 0 {
            break;
        }
    }
    assert_eq!(purged, [10, 10, 5, 0]);
    assert_eq!(outbox.unsent().await.unwrap(), 1, "unsent events are kept");
    drop_tables(outbox).await;
}

/// `Relay::run` reports what it does: events published and retried by
/// topic, and the lag of the oldest unsent event, through the `metrics`
/// facade. (A current-thread runtime: the recorder is this thread's own.)
/// A relay lease meant as forever (`Duration::MAX`) is taken as a century:
/// the pass publishes, with no overflow in its deadline nor an expiry the
/// database refuses.
#[tokio::test(flavor = "current_thread")]
async fn a_relay_lease_meant_as_forever_publishes() {
    let pool = sqlite().await.expect("SQLite needs no server");
    let outbox = outbox(&pool).await;
    enqueue_committed(&outbox, &event("f", 1)).await;
    let broker = Arc::new(Broker::default());
    let relay = Relay::new(outbox.clone(), To(broker.clone())).lease(Duration::MAX);
    let pass = relay.run_once().await.expect("a pass");
    assert_eq!(pass.published, 1, "{pass:?}");
    assert_eq!(broker.stored().len(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn the_relay_counts_published_and_retried_events_and_sets_the_lag() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let pool = sqlite().await.expect("SQLite needs no server");
    let outbox = outbox(&pool).await;
    for n in 1..=4 {
        enqueue_committed(&outbox, &event("m", n)).await;
    }
    let broker = Arc::new(Broker {
        fail_first: 1,
        ..Broker::default()
    });
    let relay = Relay::new(outbox.clone(), To(broker.clone()))
        .idle(Duration::from_millis(10))
        .backoff(Duration::from_millis(20), Duration::from_millis(20));
    let drained = async {
        while broker.stored().len() < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // One idle pass more, which records the lag.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::timeout(Duration::from_secs(10), relay.run(drained))
        .await
        .expect("the relay drained the outbox and stopped");

    let text = scrape.render();
    let line = |name: &str| {
        text.lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .to_owned()
    };
    assert_eq!(
        line("idem_outbox_published_total"),
        r#"idem_outbox_published_total{topic="orders.created"} 4"#
    );
    assert_eq!(
        line("idem_outbox_retried_total"),
        r#"idem_outbox_retried_total{topic="orders.created"} 1"#
    );
    assert_eq!(line("idem_outbox_lag_seconds"), "idem_outbox_lag_seconds 0");
    drop_tables(outbox).await;
}

/// Event ids that differ only by case (or a trailing space) are different
/// events: each is enqueued and published, under its own id. (MySQL's
/// default collations took them for one: the outbox dropped a new event as
/// already queued.)
async fn event_ids_differing_only_by_case_are_each_enqueued<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let outbox = outbox(&pool).await;
    let with_id = |id: &str| {
        Event::new("orders.created", "k", "{}")
            .unwrap()
            .with_id(id)
            .unwrap()
    };
    let ids = ["x:aB", "x:Ab", "x:ab", "x:ab "];
    for id in ids {
        assert_eq!(
            enqueue(&outbox, &with_id(id)).await,
            Enqueued::New,
            "{id:?}"
        );
    }
    assert_eq!(
        enqueue(&outbox, &with_id("x:Ab")).await,
        Enqueued::AlreadyQueued
    );
    assert_eq!(outbox.unsent().await.unwrap(), 4);

    let broker = Arc::new(Broker::default());
    let pass = Relay::new(outbox.clone(), To(broker.clone()))
        .run_once()
        .await
        .unwrap();
    assert_eq!(pass.published, 4, "{pass:?}");
    let published: Vec<_> = broker.stored().into_iter().map(|(.., id)| id).collect();
    assert_eq!(published, ids);
    drop_tables(outbox).await;
}

/// An event with a 70,000-byte header value and a 100 KiB payload comes
/// back from the relay's claim as it was enqueued, and an event of another
/// key in the same batch is published too. (MySQL's `TEXT` holds 64 KiB,
/// and `INSERT IGNORE` cut the rest off silently: the row could never be
/// read again.)
async fn large_headers_and_payload_round_trip<DB: GuardDb + TestSql>(pool: Pool<DB>) {
    let outbox = outbox(&pool).await;
    let value: String = (0..70_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let payload: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
    let big = Event::new("orders.created", "big", payload)
        .unwrap()
        .header("x-large", value)
        .expect("a valid header");
    enqueue_committed(&outbox, &big).await;
    let small = Event::new("orders.created", "small", "{}").unwrap();
    enqueue_committed(&outbox, &small).await;

    let broker = Arc::new(Broker::default());
    let pass = Relay::new(outbox.clone(), To(broker.clone()))
        .run_once()
        .await
        .expect("the claim reads both events");
    assert_eq!((pass.claimed, pass.published), (2, 2), "{pass:?}");
    let published: Vec<Event> = broker.events().iter().map(|p| p.event().clone()).collect();
    assert_eq!(published, [big, small], "both, whole");
    assert_eq!(outbox.unsent().await.unwrap(), 0);
    drop_tables(outbox).await;
}

sql_cases!(
    event_ids_differing_only_by_case_are_each_enqueued,
    large_headers_and_payload_round_trip,
    only_committed_events_are_published,
    a_failed_publish_is_retried_and_holds_back_only_its_key,
    racing_relays_publish_each_key_in_order_one_at_a_time,
    a_relay_that_dies_mid_batch_leaves_its_events_after_its_lease,
    a_publish_never_outlives_the_lease,
    sent_events_are_purged_in_bounded_batches,
);
