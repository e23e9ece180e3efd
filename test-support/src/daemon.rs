//! A server process the suite starts (etcd, Patroni, HAProxy): spawned
//! directly (no shell, no `runuser` in between, so its id is the server's),
//! as the `postgres` user when the suite runs as root (PostgreSQL and its
//! tools refuse root), its output in a log file; killed by its id.
//!
//! Self-contained (std only), so it can move to a shared test-support crate.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A spawned server; killed with SIGKILL on drop.
pub struct Daemon {
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `command` with its stdout and stderr appended to `log`, as
    /// the `postgres` user if the suite runs as root and `as_postgres`.
    pub fn spawn(mut command: Command, log: &Path, as_postgres: bool) -> Self {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|err| panic!("open {}: {err}", log.display()));
        let err = out.try_clone().expect("a second handle on the log");
        if as_postgres && let Some((uid, gid)) = postgres_user() {
            command.uid(uid).gid(gid).env("HOME", "/var/lib/postgresql");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|err| panic!("start {command:?}: {err}"));
        Self {
            child: Some(child),
            log: log.to_owned(),
        }
    }

    /// SIGKILL, and reaped.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last lines of its log, for a failure message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// Whether the suite runs as root.
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(1)
        == 0
}

/// The `postgres` user's uid and gid, when running as root.
pub fn postgres_user() -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let line = passwd.lines().find(|line| line.starts_with("postgres:"))?;
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
}

/// A directory of the suite's own, owned by `postgres` when running as
/// root.
pub fn private_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("a directory");
    if let Some((uid, gid)) = postgres_user() {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown to postgres");
    }
    dir
}

/// SIGKILL to the process `pid` and to its direct children (found by
/// their parent id in `/proc`), children first: a node's crash. Never by
/// name.
pub fn kill_9_tree(pid: u32) {
    for child in children(pid) {
        signal_kill(child);
    }
    signal_kill(pid);
}

fn signal_kill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The ids of the processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...: comm may hold spaces, so split
            // after its closing parenthesis.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                == Some(pid)
        })
        .collect()
}
