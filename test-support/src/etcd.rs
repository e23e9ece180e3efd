//! An etcd of the suite's own (Debian's `etcd-server`), one member on free
//! loopback ports in a temporary directory: the store Patroni keeps its
//! leader lock in.
//!
//! Self-contained but for `daemon.rs` and the port picker, so it can move
//! to a shared test-support crate.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, private_dir};
use crate::free_port;
use crate::unique;

/// A running etcd; killed and its directory removed on drop.
pub struct Etcd {
    dir: PathBuf,
    port: u16,
    daemon: Daemon,
}

impl Etcd {
    /// Starts one member and waits until it says it is healthy. `None`
    /// (the scenario skipped, said why) if `etcd` is not installed, unless
    /// `CI=true`.
    pub async fn start() -> Option<Self> {
        if Command::new("etcd").arg("--version").output().is_err() {
            crate::missing("etcd (Debian's etcd-server)");
            return None;
        }
        let dir = private_dir(&unique("idem-faults-etcd"));
        let (port, peer) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer}");
        let mut command = Command::new("etcd");
        command
            .args(["--name", "idem"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("idem={peer}")])
            .args(["--log-level", "warn"]);
        let daemon = Daemon::spawn(command, &dir.join("etcd.log"), false);
        let etcd = Self { dir, port, daemon };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let health = reqwest::get(format!("{client}/health")).await;
            if let Ok(answer) = health
                && answer.text().await.is_ok_and(|t| t.contains("true"))
            {
                return Some(etcd);
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy: {}",
                etcd.daemon.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `127.0.0.1:PORT`, its client address.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.daemon.kill_9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
