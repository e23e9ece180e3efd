//! An `orders` process (the reference app's binary) for tests that need
//! the real thing: a crash, or several instances sharing the stores; the
//! requests they send it; and [`Spawned`], any other process a test
//! starts, waits for, reads and kills. The binary's path is the test's
//! `env!("CARGO_BIN_EXE_orders")`, which only idem-app's tests have.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// An `orders` process on a loopback port.
pub struct Orders {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Orders {
    /// Starts the `orders` binary at `bin` with `--chaos` on `database`
    /// (and `--redis` if given) on an ephemeral loopback port, with
    /// `extra` arguments (`--lease-ms 1000`), and waits until it says where
    /// it listens.
    pub fn start(bin: &str, database: &str, redis: Option<&str>, extra: &[&str]) -> Self {
        Self::start_wrapped(bin, &[], "127.0.0.1:0", database, redis, extra)
    }

    /// [`Orders::start`], run through `wrapper` (`ip netns exec NAME`: on a
    /// host of its own) and listening on `listen`.
    pub fn start_wrapped(
        bin: &str,
        wrapper: &[String],
        listen: &str,
        database: &str,
        redis: Option<&str>,
        extra: &[&str],
    ) -> Self {
        let mut command = match wrapper {
            [] => Command::new(bin),
            [program, args @ ..] => {
                let mut command = Command::new(program);
                command.args(args).arg(bin);
                command
            }
        };
        command.args(["--listen", listen, "--database", database, "--chaos"]);
        if let Some(redis) = redis {
            command.args(["--redis", redis]);
        }
        command.args(extra);
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the orders binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep reading so the child never blocks on a full pipe; until
            // it listens, pass on what it says, for the failure message.
            let mut listening = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !listening {
                    listening = line.starts_with("orders listening on ");
                    let _ = tx.send(line);
                }
            }
        });
        let mut said = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let base = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => match line.strip_prefix("orders listening on ") {
                    Some(addr) => break addr.to_owned(),
                    None => said.push(line),
                },
                Err(err) => panic!(
                    "orders did not say where it listens ({err}); it said:\n{}",
                    said.join("\n")
                ),
            }
        };
        Self { child, base }
    }

    /// SIGKILL: no destructor, no rollback, no goodbye.
    pub fn kill_9(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }
}

impl Drop for Orders {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process started by a test: what it said on stderr is kept, so a test
/// can count log lines (before and after a kill).
pub struct Spawned {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Spawned {
    /// Starts `command` and waits (up to a minute) until a line of its
    /// stderr contains `ready`.
    pub fn start(mut command: Command, ready: &str) -> Self {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("start {command:?}: {err}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn({
            let (lines, ready) = (lines.clone(), ready.to_owned());
            move || {
                // Keep reading so the child never blocks on a full pipe.
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let is_ready = line.contains(&ready);
                    lines.lock().expect("lines").push(line);
                    if is_ready {
                        let _ = tx.send(());
                    }
                }
            }
        });
        if let Err(err) = rx.recv_timeout(Duration::from_secs(60)) {
            let said = lines.lock().expect("lines").join("\n");
            panic!("{command:?} did not say {ready:?} ({err}); it said:\n{said}");
        }
        Self { child, lines }
    }

    /// How many of its stderr lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        let lines = self.lines.lock().expect("lines");
        lines.iter().filter(|line| line.contains(needle)).count()
    }

    /// The rest of its first stderr line that starts with `prefix`.
    pub fn said(&self, prefix: &str) -> Option<String> {
        let lines = self.lines.lock().expect("lines");
        lines
            .iter()
            .find_map(|line| line.strip_prefix(prefix).map(str::to_owned))
    }

    /// SIGKILL, and reap it. What it said stays readable.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        self.child.wait().expect("reap");
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client with a timeout longer than any chaos delay the tests use.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .expect("client")
}

/// `POST /orders` for `user` of `tenant` with `key`: one book at `price`
/// cents.
pub fn order(
    base: &str,
    key: &str,
    tenant: &str,
    user: &str,
    price: i64,
) -> reqwest::RequestBuilder {
    client()
        .post(format!("{base}/orders"))
        .header("idempotency-key", key)
        .header("x-tenant-id", tenant)
        .header("authorization", format!("Bearer {user}"))
        .json(&json!({"sku": "book", "qty": 1, "amount_cents": price}))
}

/// The user's order count and balance, from `GET /orders`.
pub async fn account(base: &str, tenant: &str, user: &str) -> (u64, i64) {
    let json: Value = client()
        .get(format!("{base}/orders?tenant={tenant}&user={user}"))
        .send()
        .await
        .expect("GET /orders")
        .json()
        .await
        .expect("JSON");
    (
        json["count"].as_u64().unwrap(),
        json["balance_cents"].as_i64().unwrap(),
    )
}

/// `GET /metrics`, as Prometheus text.
pub async fn scrape(base: &str) -> String {
    let reply = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(reply.status(), 200);
    reply.text().await.expect("text")
}

/// How many times the orders handler was entered, by the app's counter.
pub async fn handler_calls(base: &str) -> f64 {
    metric(&scrape(base).await, "orders_handler_calls_total", &[]).expect("the counter")
}

use crate::prometheus::metric;
