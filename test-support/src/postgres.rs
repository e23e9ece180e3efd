//! A PostgreSQL server of a test's own (initdb in a temporary directory,
//! a free loopback port), so that crashing it mid-load touches nothing
//! else on the machine. The binaries come from `IDEM_TEST_PG_BINDIR`, or
//! the newest `/usr/lib/postgresql/*/bin`. As root, the server runs as the
//! `postgres` user (PostgreSQL refuses to run as root).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{free_port, missing, unique};

/// A private PostgreSQL server; stopped and removed on drop.
pub struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Run its commands as `postgres` (the suite runs as root).
    as_postgres: bool,
}

impl Postgres {
    /// Creates a cluster and starts it; `None` (the suite skipped, said
    /// why) if PostgreSQL's server binaries are not here, unless `CI=true`.
    pub fn start() -> Option<Self> {
        let Some(bin) = bindir() else {
            missing("PostgreSQL server binaries (initdb, pg_ctl)");
            return None;
        };
        let as_postgres = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(1)
            == 0;
        let dir = std::env::temp_dir().join(unique("idem-faults-pg"));
        std::fs::create_dir_all(&dir).expect("a data directory");
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(&dir));
        }
        let server = Self {
            bin,
            dir,
            port: free_port(),
            as_postgres,
        };
        let data = server.data();
        run(server.command("initdb").args([
            "-D",
            &data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]));
        server.start_again();
        Some(server)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    /// The same database reached through another port (a proxy's).
    pub fn url_via(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the server (again), waiting until it accepts connections.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off \
             -c full_page_writes=off",
            self.port,
            self.data()
        );
        let log = self.dir.join("server.log");
        run(self.command("pg_ctl").args([
            "-D",
            &self.data(),
            "-o",
            &options,
            "-l",
            &log.to_string_lossy(),
            "-w",
            "-t",
            "60",
            "start",
        ]));
    }

    /// Stops it as a crash would (`pg_ctl stop -m immediate`): every
    /// session is cut, nothing is flushed, recovery runs at the next start.
    pub fn crash(&self) {
        run(self
            .command("pg_ctl")
            .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"]));
    }

    fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().into_owned()
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        };
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        command
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where `initdb` and `pg_ctl` are.
pub(crate) fn bindir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("IDEM_TEST_PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    found.sort_by_key(|bin| version(bin));
    found.pop()
}

/// `/usr/lib/postgresql/15/bin` -> 15.
fn version(bin: &Path) -> u32 {
    bin.parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str()?.parse().ok())
        .unwrap_or(0)
}

/// Runs `command` to its end; panics with what it said if it failed.
fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("{command:?}: {err}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
