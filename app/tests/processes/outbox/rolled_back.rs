//! An order rolled back leaves nothing behind it: no outbox row, nothing
//! on the stream, no rewards entry; a committed one, exactly one of each,
//! on each database.

use super::*;

/// One committed order; one failing after its writes; one killed with the
/// orders process mid-transaction; one more committed after the restart.
async fn a_rolled_back_order_publishes_nothing(backend: Backend) {
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let started = Instant::now();
    let tenant = unique("rollback");
    let first = support::start_orders(&db.url, None);
    let relay = relay(&db, &nats, "relay-a", &[]);
    let consumer = consumer(&db, &nats, 1);
    let ledger = Ledger::connect(&db.consumer_url).await.expect("ledger");
    let place = async |base: &str, key: &str, headers: &[(&str, &str)]| {
        post_order(base, &tenant, "user-1", key, 1_500, headers).await
    };

    let (status, body) = place(&first.base, "committed-1", &[]).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let committed_1 = body["order_id"].as_u64().unwrap();

    let fail = [("x-chaos-fail-after-write", "500")];
    let (status, _) = place(&first.base, "rolled-back", &fail).await.unwrap();
    assert_eq!(status, 500, "the handler failed after its writes");

    let doomed = tokio::spawn({
        let (base, tenant) = (first.base.clone(), tenant.clone());
        async move {
            let delay = [("x-chaos-delay-ms", "60000")];
            post_order(&base, &tenant, "user-1", "killed", 1_500, &delay).await
        }
    });
    // Inside the third handler: it counts itself, writes, then sleeps.
    wait_for("the third handler", Duration::from_secs(30), async || {
        handler_calls(&first.base).await >= 3.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.kill_9();
    assert!(doomed.await.unwrap().is_err(), "the client saw it die");

    let second = support::start_orders(&db.url, None);
    let (status, body) = place(&second.base, "committed-2", &[]).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let committed_2 = body["order_id"].as_u64().unwrap();

    let placed: Vec<Placed> = [committed_1, committed_2]
        .into_iter()
        .map(|order_id| Placed {
            order_id,
            user: "user-1".to_owned(),
            amount_cents: 1_500,
        })
        .collect();
    each_order_booked_once(&db, &ledger, &tenant, &placed).await;
    assert_eq!(
        db.outbox_rows().await,
        2,
        "an outbox row per committed order only"
    );
    assert_eq!(db.sent().await, 2);
    assert_eq!(nats.stored().await, 2, "nothing else on the stream");
    report(
        &format!("rollback-{backend:?}"),
        started,
        &nats,
        &[&relay],
        &consumer,
        2,
    )
    .await;
    drop((second, relay, consumer, ledger));
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_rolled_back_order_publishes_nothing() {
    a_rolled_back_order_publishes_nothing(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_rolled_back_order_publishes_nothing() {
    a_rolled_back_order_publishes_nothing(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_rolled_back_order_publishes_nothing() {
    a_rolled_back_order_publishes_nothing(Backend::Sqlite).await;
}
