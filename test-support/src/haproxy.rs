//! An HAProxy of the suite's own (Debian's `haproxy`) in front of the
//! PostgreSQL nodes of a Patroni cluster, the way Patroni's users reach the
//! primary: one TCP port, each node checked every half second on its
//! Patroni REST API (`GET /primary` answers 200 on the primary alone), a
//! node marked down after two failed checks with its sessions shut, so
//! that after a failover every connection goes to the new primary.
//!
//! Self-contained but for `daemon.rs` and the port picker, so it can move
//! to a shared test-support crate.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, private_dir};
use crate::free_port;
use crate::unique;

/// A PostgreSQL node behind the proxy: its port and its Patroni's REST
/// API port.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    /// PostgreSQL's port.
    pub postgres: u16,
    /// Patroni's REST API port.
    pub api: u16,
}

/// A running HAProxy; killed and its directory removed on drop.
pub struct HaProxy {
    dir: PathBuf,
    port: u16,
    daemon: Daemon,
}

impl HaProxy {
    /// Starts one in front of `backends` and waits until it routes to a
    /// primary. `None` (the scenario skipped, said why) if `haproxy` is not
    /// installed, unless `CI=true`.
    pub async fn start(backends: &[Backend]) -> Option<Self> {
        if Command::new("haproxy").arg("-v").output().is_err() {
            crate::missing("haproxy (Debian's package)");
            return None;
        }
        let dir = private_dir(&unique("idem-faults-haproxy"));
        let port = free_port();
        let servers: String = backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                format!(
                    "  server node{i} 127.0.0.1:{} check port {}\n",
                    b.postgres, b.api
                )
            })
            .collect();
        let config = format!(
            "global\n  maxconn 2000\n\
             defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30m\n  \
             timeout server 30m\n  timeout check 1s\n\
             listen primary\n  bind 127.0.0.1:{port}\n  option httpchk GET /primary\n  \
             http-check expect status 200\n  \
             default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n\
             {servers}"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config).expect("haproxy.cfg");
        let mut command = Command::new("haproxy");
        command.arg("-db").arg("-f").arg(&path);
        let daemon = Daemon::spawn(command, &dir.join("haproxy.log"), false);
        let proxy = Self { dir, port, daemon };
        // HAProxy counts every server up until its checks fail (twice,
        // half a second apart): wait until connections reach the primary
        // alone, eight in a row.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut in_a_row = 0;
        while in_a_row < 8 {
            in_a_row = if proxy.reaches_primary().await {
                in_a_row + 1
            } else {
                0
            };
            assert!(
                Instant::now() < deadline,
                "HAProxy did not route to the primary alone within 30 s: {}",
                proxy.daemon.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(proxy)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: the primary, whichever
    /// node it is.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Waits until a connection through it reaches a primary (a server not
    /// in recovery); how long that took.
    ///
    /// # Panics
    ///
    /// If none does within `within`.
    pub async fn wait_for_primary(&self, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            if self.reaches_primary().await {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "no primary through HAProxy within {within:?}: {}",
                self.daemon.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl HaProxy {
    /// Whether a new connection through it reaches a primary (a server
    /// not in recovery) within 2 s.
    async fn reaches_primary(&self) -> bool {
        use sqlx::{Connection, PgConnection};
        let reached = tokio::time::timeout(Duration::from_secs(2), async {
            let mut conn = PgConnection::connect(&self.url()).await.ok()?;
            let recovering: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await
                .ok()?;
            let _ = conn.close().await;
            Some(!recovering)
        })
        .await;
        matches!(reached, Ok(Some(true)))
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        self.daemon.kill_9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
