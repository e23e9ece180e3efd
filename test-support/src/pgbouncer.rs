//! A PgBouncer of a test's own, in transaction pooling in front of a
//! PostgreSQL, on a free loopback port, so that killing it touches
//! nothing else. As root it runs as the `postgres` user (PgBouncer refuses
//! to run as root).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, missing, unique};

/// A private PgBouncer; killed and its directory removed on drop.
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    as_postgres: bool,
}

impl PgBouncer {
    /// Starts one in front of PostgreSQL on `pg_port`; `None` (the
    /// scenario skipped, said why) if `pgbouncer` is not installed, unless
    /// `CI=true`.
    pub async fn start(pg_port: u16) -> Option<Self> {
        if Command::new("pgbouncer").arg("--version").output().is_err() {
            missing("pgbouncer (Debian's package)");
            return None;
        }
        let as_postgres = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(1)
            == 0;
        let dir = std::env::temp_dir().join(unique("idem-faults-pgbouncer"));
        std::fs::create_dir_all(&dir).expect("a directory");
        let port = free_port();
        let config = format!(
            "[databases]\n* = host=127.0.0.1 port={pg_port} user=postgres\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = any\npool_mode = transaction\ndefault_pool_size = 8\n\
             max_client_conn = 2000\nignore_startup_parameters = extra_float_digits\n\
             server_reset_query =\nlogfile = {log}\n",
            log = dir.join("pgbouncer.log").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), config).expect("its config");
        if as_postgres {
            let chown = Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&dir)
                .status();
            assert!(chown.is_ok_and(|s| s.success()), "chown {}", dir.display());
        }
        let mut bouncer = Self {
            dir,
            port,
            child: None,
            as_postgres,
        };
        bouncer.start_again().await;
        Some(bouncer)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres?pooler=transaction`:
    /// the `orders` app's URL for the database through this pooler.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?pooler=transaction",
            self.port
        )
    }

    /// Starts it (again) on its port, waiting until it accepts connections.
    pub async fn start_again(&mut self) {
        let config = self.dir.join("pgbouncer.ini");
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--", "pgbouncer"]);
            command
        } else {
            Command::new("pgbouncer")
        };
        let child = command
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "PgBouncer did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills it as a crash would: every client and server connection cut.
    /// Returns once its port refuses connections.
    pub async fn crash(&mut self) {
        self.kill_9();
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_ok()
        {
            assert!(Instant::now() < deadline, "PgBouncer outlived kill -9");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // runuser passes the signal on; pkill reaches pgbouncer itself.
            let _ = Command::new("pkill")
                .args(["-KILL", "-f"])
                .arg(self.dir.join("pgbouncer.ini"))
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.kill_9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
