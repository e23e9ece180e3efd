//! Relays killed mid-batch, the NATS server restarted mid-run, two relays
//! racing: every order placed is booked exactly once and the outbox ends
//! with nothing unsent; one user's events are booked in order.

use super::*;

const ORDERS: usize = 150;

/// A relay that sleeps 5 ms before each publish and 15 ms after JetStream
/// acknowledged it (before it marks the event sent), killed with SIGKILL
/// while it holds a batch; a second relay takes over once the lease runs
/// out, and publishes again whatever the first had published but not
/// marked: JetStream drops those re-publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_relay_killed_mid_batch_loses_nothing() {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("relay-kill");
    let orders = support::start_orders(&db.url, None);
    let slow = [
        "--batch",
        "50",
        "--chaos-publish-delay-ms",
        "5",
        "--chaos-acked-delay-ms",
        "15",
    ];
    let mut doomed = relay(&db, &nats, "relay-doomed", &slow);
    let consumer = consumer(&db, &nats, 4);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");

    let placing = tokio::spawn({
        let (base, tenant) = (orders.base.clone(), tenant.clone());
        async move { place_concurrently(&base, &tenant, 10, ORDERS, 16).await }
    });
    wait_for("the first publishes", Duration::from_secs(30), async || {
        db.sent().await >= 20
    })
    .await;
    // Aim the kill between an acknowledgement and the mark (15 ms of every
    // 20 or so); whenever it lands, the counts below are read after it.
    let js = nats.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while stored(&js).await <= db.sent().await as u64 && Instant::now() < deadline {}
    doomed.kill_9();
    let leased = db.leased().await;
    assert!(leased > 0, "killed holding a batch");
    // What the dead relay wrote before it died may still be arriving (a
    // publish or a mark in a socket's buffer): read the counts once they
    // have held still for a while.
    let mut counts = (db.sent().await, stored(&js).await);
    let mut still_since = Instant::now();
    while still_since.elapsed() < Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = (db.sent().await, stored(&js).await);
        if now != counts {
            (counts, still_since) = (now, Instant::now());
        }
    }
    let (sent_at_kill, stored_at_kill) = counts;
    // Published (stored by JetStream) but not marked sent: 0 or 1.
    let stored_unmarked = stored_at_kill - sent_at_kill as u64;
    let takeover = relay(&db, &nats, "relay-takeover", &[]);
    let placed = placing.await.expect("placing");

    each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    // Dropped by JetStream: what the dead relay had published but not
    // marked, and a publish of the takeover's own that JetStream stored but
    // acknowledged too late (put back, published again).
    let dropped = takeover.count(JETSTREAM_DUPLICATE) as u64;
    let own_retries = takeover.count(PUBLISH_FAILED) as u64;
    assert!(
        (stored_unmarked..=stored_unmarked + own_retries).contains(&dropped),
        "what the dead relay had published but not marked ({stored_unmarked}) was published \
         again, and dropped: {dropped} dropped, {own_retries} of the takeover's publishes retried"
    );
    eprintln!(
        "outbox/relay-kill: killed holding {leased} events, {sent_at_kill} sent, \
         {stored_unmarked} published but not marked"
    );
    report(
        "relay-kill",
        started,
        &nats,
        &[&doomed, &takeover],
        &consumer,
        ORDERS,
    )
    .await;
    drop((orders, doomed, takeover, consumer, ledger));
    db.drop_database().await;
}

/// The NATS server killed with SIGKILL mid-run and started again a second
/// later on the same port and store, while orders keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_nats_restart_mid_run_loses_nothing() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("nats-restart");
    let orders = support::start_orders(&db.url, None);
    let paced = ["--batch", "20", "--chaos-publish-delay-ms", "10"];
    let relay = relay(&db, &nats, "relay-a", &paced);
    let consumer = consumer(&db, &nats, 4);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");

    let placing = tokio::spawn({
        let (base, tenant) = (orders.base.clone(), tenant.clone());
        async move { place_concurrently(&base, &tenant, 10, ORDERS, 8).await }
    });
    wait_for("the first publishes", Duration::from_secs(30), async || {
        db.sent().await >= 30
    })
    .await;
    let sent_at_kill = db.sent().await;
    nats.kill_9_and_restart(Duration::from_secs(1)).await;
    let placed = placing.await.expect("placing");

    each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    assert!(
        relay.count(PUBLISH_FAILED) > 0,
        "the relay saw the server gone"
    );
    eprintln!("outbox/nats-restart: killed the server with {sent_at_kill} events sent");
    report("nats-restart", started, &nats, &[&relay], &consumer, ORDERS).await;
    drop((orders, relay, consumer, ledger));
    db.drop_database().await;
}

/// Two relays on one outbox, small batches: each event published by one of
/// them (their `idem_outbox_published_total` add up to the orders), each
/// order booked once. Also the relay's `GET /metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_racing_relays_publish_each_event_once_and_serve_metrics() {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("two-relays");
    let orders = support::start_orders(&db.url, None);
    let racing = [
        "--batch",
        "10",
        "--chaos-publish-delay-ms",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let relays = [
        relay(&db, &nats, "relay-a", &racing),
        relay(&db, &nats, "relay-b", &racing),
    ];
    let consumer = consumer(&db, &nats, 4);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");
    let count = 200;

    let placed = place_concurrently(&orders.base, &tenant, 20, count, 16).await;
    each_order_booked_once(&db, &ledger, &tenant, &placed).await;

    let topic = [("topic", "orders.created")];
    let mut published = Vec::new();
    for relay in &relays {
        let base = relay
            .said("relay metrics on ")
            .expect("its metrics address");
        let text = scrape(&base).await;
        published.push(metric(&text, "idem_outbox_published_total", &topic).expect("published"));
        assert!(
            metric(&text, "idem_outbox_retried_total", &topic).is_some(),
            "{text}"
        );
        assert!(
            metric(&text, "idem_outbox_purged_total", &[]).is_some(),
            "{text}"
        );
        let lag = metric(&text, "idem_outbox_lag_seconds", &[]).expect("the lag gauge");
        assert!((0.0..60.0).contains(&lag), "{text}");
        assert!(
            text.contains("# TYPE idem_outbox_lag_seconds gauge"),
            "{text}"
        );
    }
    assert_eq!(
        published.iter().sum::<f64>(),
        count as f64,
        "each event marked sent by one relay: {published:?}"
    );
    assert!(
        published.iter().all(|&p| p > 0.0),
        "both relays published: {published:?}"
    );
    eprintln!("outbox/two-relays: published {published:?}");
    report(
        "two-relays",
        started,
        &nats,
        &[&relays[0], &relays[1]],
        &consumer,
        count,
    )
    .await;
    drop((orders, relays, consumer, ledger));
    db.drop_database().await;
}

/// Each user's orders placed one after another (users side by side), two
/// relays with small batches, one consumer handling one message at a time:
/// each user's rewards are booked in `order_id` order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_one_users_events_are_consumed_in_order() {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("in-order");
    let orders = support::start_orders(&db.url, None);
    let relays = [
        relay(
            &db,
            &nats,
            "relay-a",
            &["--batch", "7", "--chaos-publish-delay-ms", "3"],
        ),
        relay(&db, &nats, "relay-b", &["--batch", "5"]),
    ];
    let consumer = consumer(&db, &nats, 1);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");
    let (users, each) = (4, 25);

    let placed: Vec<Placed> = futures_util::future::join_all((0..users).map(|u| {
        let (base, tenant) = (&orders.base, &tenant);
        async move {
            let user = format!("user-{u}");
            let mut placed = Vec::new();
            for i in 0..each {
                let amount_cents = price(i);
                let key = format!("order-{u}-{i}");
                let (status, body) = post_order(base, tenant, &user, &key, amount_cents, &[])
                    .await
                    .expect("POST /orders");
                assert_eq!(status, 201, "{body}");
                let order_id = body["order_id"].as_u64().unwrap();
                placed.push(Placed {
                    order_id,
                    user: user.clone(),
                    amount_cents,
                });
            }
            placed
        }
    }))
    .await
    .into_iter()
    .flatten()
    .collect();

    let rewards = each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    for u in 0..users {
        let user = format!("user-{u}");
        let booked: Vec<u64> = rewards
            .iter()
            .filter(|r| r.user == user)
            .map(|r| r.order_id)
            .collect();
        assert_eq!(booked.len(), each);
        assert!(
            booked.windows(2).all(|w| w[0] < w[1]),
            "{user}'s orders booked in order: {booked:?}"
        );
    }
    report(
        "in-order",
        started,
        &nats,
        &[&relays[0], &relays[1]],
        &consumer,
        users * each,
    )
    .await;
    drop((orders, relays, consumer, ledger));
    db.drop_database().await;
}
