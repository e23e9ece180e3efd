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
        let mut command = Command::new(env!("CARGO_BIN_EXE_orders"));
        command.args(["--listen", "127.0.0.1:0", "--database", database, "--chaos"]);
        if let Some(redis) = redis {
            command.args(["--redis", redis]);
        }
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
