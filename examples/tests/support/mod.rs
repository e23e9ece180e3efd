//! An `orders` process for tests that need the real binary: a crash, or
//! several instances sharing the stores.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// An `orders` process on a loopback port.
pub(crate) struct Orders {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
}

impl Orders {
    /// Starts `orders --chaos` on `database` (and `--redis` if given) on an
    /// ephemeral loopback port, and waits until it says where it listens.
    pub(crate) fn start(database: &str, redis: Option<&str>) -> Self {
        Self::start_with(database, redis, &[])
    }

    /// [`Orders::start`], with more arguments (`--lease-ms 1000`).
    pub(crate) fn start_with(database: &str, redis: Option<&str>, extra: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_orders"));
        command.args(["--listen", "127.0.0.1:0", "--database", database, "--chaos"]);
        if let Some(redis) = redis {
            command.args(["--redis", redis]);
        }
        command.args(extra);
        let mut child = command
            .env("RUST_LOG", "warn")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the orders binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep reading so the child never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("orders listening on ") {
                    let _ = tx.send(addr.to_owned());
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("orders printed where it listens");
        Self { child, base }
    }

    /// SIGKILL: no destructor, no rollback, no goodbye.
    pub(crate) fn kill_9(mut self) {
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

/// The sum of the samples of `name` in Prometheus text whose labels include
/// every pair of `labels` (in any order, among any others), as PromQL's
/// `sum(name{labels})` would read it; `None` when no sample matches.
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<f64> = samples(text)
        .filter(|sample| sample.name == name)
        .filter(|sample| {
            labels
                .iter()
                .all(|(k, v)| sample.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .map(|sample| sample.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// One line of the Prometheus text format: `name{k="v",...} value`.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

/// The samples in Prometheus text (comments skipped). Panics on a line that
/// is not a sample: what `/metrics` serves must parse.
pub(crate) fn samples(text: &str) -> impl Iterator<Item = Sample> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| parse_sample(line).unwrap_or_else(|| panic!("not a sample: {line:?}")))
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(mut inner) = rest.strip_prefix('{') {
        // `key="value"` pairs, separated by commas, up to the closing `}`.
        loop {
            inner = inner.trim_start_matches([',', ' ']);
            if let Some(tail) = inner.strip_prefix('}') {
                rest = tail;
                break;
            }
            let (key, after_key) = inner.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after_key.char_indices();
            let close = loop {
                match chars.next()? {
                    (at, '"') => break at,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    (_, other) => value.push(other),
                }
            };
            labels.push((key.trim().to_owned(), value));
            inner = &after_key[close + 1..];
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}
