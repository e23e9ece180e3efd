//! The idempotent consumer against a real NATS JetStream and each SQL
//! database: every transfer published three times with one message id, some
//! re-published under a new message id, handler failures injected, and the
//! consumer *process* killed with SIGKILL mid-stream and restarted. Each
//! transfer is credited exactly once and none is lost.
//!
//! `IDEM_TEST_NATS_URL` (default `nats://127.0.0.1:4222`), and the SQL URLs
//! of the other suites.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use idem_app::consumer::{Ledger, Summary, Transfer, publish, stream};
use idem_test_support::{mysql_url, postgres_url, server_missing, server_url};

/// Transfers published before the first consumer starts, and after it is
/// killed.
const FIRST_BATCH: u64 = 60;
const SECOND_BATCH: u64 = 40;

fn nonce() -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "{:016x}",
        RandomState::new().hash_one(std::time::SystemTime::now())
    )
}

/// A consumer process.
struct Consumer {
    child: Child,
}

impl Consumer {
    fn start(nats: &str, database: &str, run: &Run) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_consumer"))
            .args(["--nats", nats, "--database", database])
            .args(["--stream", &run.stream, "--subject", &run.subject])
            .args(["--durable", &run.durable])
            .args(["--ack-wait-ms", "1500", "--concurrency", "4"])
            .args(["--chaos-fail-percent", "10", "--chaos-delay-ms", "25"])
            .env("RUST_LOG", "warn")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the consumer binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep reading so the child never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with("consumer ready") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the consumer said it is ready");
        Self { child }
    }

    /// SIGKILL: no destructor, no rollback, no acknowledgement.
    fn kill_9(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Names of one test run.
struct Run {
    stream: String,
    subject: String,
    durable: String,
    accounts: String,
}

impl Run {
    fn new(db: &str) -> Self {
        let n = nonce();
        Self {
            stream: format!("IDEM_TEST_{db}_{n}"),
            subject: format!("idem-test.{db}.{n}.transfers"),
            durable: format!("ledger-{db}-{n}"),
            accounts: format!("acct-{db}-{n}-"),
        }
    }

    fn transfer(&self, i: u64) -> Transfer {
        Transfer {
            transfer_id: format!("T-{i}"),
            account: format!("{}{}", self.accounts, i % 5),
            amount_cents: 100 + i as i64,
        }
    }

    /// Publishes transfers `range`: each three times under one message id,
    /// and every fourth once more under a new id (the event re-published).
    async fn publish(&self, js: &jetstream::Context, range: std::ops::Range<u64>) {
        for copy in 0..3 {
            for i in range.clone() {
                let transfer = self.transfer(i);
                publish(js, &self.subject, &format!("m-{i}"), &transfer)
                    .await
                    .unwrap_or_else(|e| panic!("publish copy {copy} of {i}: {e}"));
            }
        }
        for i in range.filter(|i| i % 4 == 0) {
            publish(
                js,
                &self.subject,
                &format!("m-{i}-republished"),
                &self.transfer(i),
            )
            .await
            .expect("re-publish");
        }
    }

    fn expected(&self, transfers: u64) -> Summary {
        let credited: i64 = (0..transfers).map(|i| self.transfer(i).amount_cents).sum();
        Summary {
            entries: transfers as i64,
            transfers: transfers as i64,
            credited_cents: credited,
            balance_cents: credited,
        }
    }
}

async fn wait_for(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn every_transfer_credited_once_across_a_kill_9(db: &str, database: &str) {
    let nats = server_url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222");
    let client = match async_nats::connect(&nats).await {
        Ok(client) => client,
        Err(err) => {
            server_missing::<()>("NATS", &nats, err);
            return;
        }
    };
    let js = jetstream::new(client);
    let run = Run::new(db);
    let mut stream = stream(&js, &run.stream, &run.subject)
        .await
        .expect("a JetStream stream (is the server running with -js?)");
    let ledger = Ledger::connect(database)
        .await
        .expect("the ledger database");

    run.publish(&js, 0..FIRST_BATCH).await;
    let first = Consumer::start(&nats, database, &run);
    // Mid-stream: some transfers credited, most not yet.
    wait_for("the first credits", Duration::from_secs(60), async || {
        ledger.summary(&run.accounts).await.unwrap().transfers >= 8
    })
    .await;
    first.kill_9();
    let at_kill = ledger.summary(&run.accounts).await.unwrap();
    assert!(
        at_kill.transfers < FIRST_BATCH as i64,
        "killed mid-stream: {at_kill:?}"
    );
    assert_eq!(
        at_kill.entries, at_kill.transfers,
        "no transfer credited twice, even at the kill"
    );

    run.publish(&js, FIRST_BATCH..FIRST_BATCH + SECOND_BATCH)
        .await;
    let _second = Consumer::start(&nats, database, &run);
    let total = FIRST_BATCH + SECOND_BATCH;
    wait_for("every transfer", Duration::from_secs(120), async || {
        ledger.summary(&run.accounts).await.unwrap().transfers >= total as i64
    })
    .await;
    // And every delivery acknowledged (duplicates included), so nothing is
    // left to redeliver.
    let mut consumer: jetstream::consumer::Consumer<pull::Config> = stream
        .get_consumer(&run.durable)
        .await
        .expect("the durable consumer");
    wait_for(
        "every acknowledgement",
        Duration::from_secs(60),
        async || {
            let info = consumer.info().await.expect("consumer info");
            info.num_pending == 0 && info.num_ack_pending == 0
        },
    )
    .await;
    assert_eq!(
        ledger.summary(&run.accounts).await.unwrap(),
        run.expected(total),
        "each transfer credited exactly once, balances matching"
    );
    let published = stream.info().await.expect("stream info").state.messages;
    assert_eq!(published, total * 3 + total / 4, "what was published");
    js.delete_stream(&run.stream).await.expect("delete stream");
}

async fn reachable(what: &str, url: &str, addr: &str) -> bool {
    match tokio::net::TcpStream::connect(addr).await {
        Ok(_) => true,
        Err(err) => server_missing::<()>(what, url, err).is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_consumer_credits_each_transfer_once_across_a_kill_9() {
    let path = std::env::temp_dir().join(format!("idem-consumer-{}.db", nonce()));
    every_transfer_credited_once_across_a_kill_9("sqlite", &format!("sqlite://{}", path.display()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_consumer_credits_each_transfer_once_across_a_kill_9() {
    let url = postgres_url();
    if reachable("PostgreSQL", &url, "127.0.0.1:5432").await {
        every_transfer_credited_once_across_a_kill_9("postgres", &url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_consumer_credits_each_transfer_once_across_a_kill_9() {
    let url = mysql_url();
    if reachable("MySQL/MariaDB", &url, "127.0.0.1:3306").await {
        every_transfer_credited_once_across_a_kill_9("mysql", &url).await;
    }
}
