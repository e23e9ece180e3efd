//! A `redis-server` of a test's own, on a free loopback port, that the test
//! may stop and start again (Redis outages are part of what idem promises to
//! survive). The server runs under a watchdog that stops it when the test
//! process exits, so nothing outlives the run.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Redis server owned by one test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

/// A loopback port that is free now, and whose `+ 10000` (a cluster node's
/// bus port) is free too.
pub fn free_port(taken: &[u16]) -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("an ephemeral port");
        let fits = (1024..55535).contains(&port)
            && !taken.contains(&port)
            && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok();
        if fits {
            return port;
        }
    }
}

/// Whether `redis-cli -p port COMMAND...` prints `expect`.
pub fn redis_cli_says(port: u16, command: &[&str], expect: &str) -> bool {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(command)
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(expect))
}

/// Polls `ready` every 50 ms for up to 30 s.
///
/// # Panics
///
/// If it never became true, naming `what`.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl RedisServer {
    /// Starts a server with `extra` arguments (such as
    /// `--cluster-enabled yes`); `None` if `redis-server` is not installed
    /// (a failure under `CI=true`).
    pub fn start(extra: &[&str]) -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            return super::server_missing("redis-server", "PATH", "not found");
        }
        let port = free_port(&[]);
        let dir = std::env::temp_dir().join(format!("idem-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the server");
        let server = Self {
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.run();
        Some(server)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops it at once (`SHUTDOWN NOSAVE`) and waits until the port is
    /// closed.
    pub fn stop(&self) {
        let _ = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "shutdown",
                "nosave",
            ])
            .output();
        wait_until("redis-server stopping", || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err()
        });
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&self) {
        self.run();
    }

    fn run(&self) {
        let me = std::process::id();
        let server = format!(
            "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no \
             --dir {dir} --logfile redis.log {extra}",
            port = self.port,
            dir = self.dir.display(),
            extra = self.extra.join(" ")
        );
        // The server runs in the foreground of a shell that stops it when
        // this process is gone.
        let watchdog = format!(
            "{server} & server=$!; \
             while kill -0 {me} 2>/dev/null && kill -0 $server 2>/dev/null; do sleep 1; done; \
             kill $server 2>/dev/null"
        );
        let mut shell = Command::new("sh")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        // Reaped whenever it ends, so it never lingers as a zombie.
        std::thread::spawn(move || shell.wait());
        wait_until("redis-server answering", || {
            redis_cli_says(self.port, &["ping"], "PONG")
        });
    }
}
