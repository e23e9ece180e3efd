//! `redis-server` processes of a test's own: primaries, replicas, cluster
//! nodes and sentinels on free loopback ports, in a temporary directory,
//! killed (and the directory removed) when dropped, or, for a server kept
//! in a static (never dropped), once the test binary has exited
//! ([`RedisServer::stop_when_this_process_exits`]). It speaks just enough
//! RESP itself ([`query`]).
//!
//! Without `redis-server` on the PATH, `start` returns `None` after saying
//! the test is skipped, or panics under `CI=true`.

use std::collections::HashSet;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to answer `PING` after it is started.
const STARTUP: Duration = Duration::from_secs(10);

/// A loopback port that is free now, that this process has not handed out
/// before, and whose `+ 10000` (a Redis Cluster node's bus port) is free
/// too.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("an ephemeral loopback port");
        if !(1024..55535).contains(&port) || TcpListener::bind(("127.0.0.1", port + 10000)).is_err()
        {
            continue;
        }
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.get_or_insert_with(HashSet::new).insert(port) {
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

/// `None` after saying why the test is skipped, if `redis-server` is not
/// installed.
///
/// # Panics
///
/// Under `CI=true`, if it is not.
fn redis_server_installed() -> Option<()> {
    match Command::new("redis-server").arg("--version").output() {
        Ok(_) => Some(()),
        Err(err) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("redis-server is required on the PATH when CI=true: {err}");
            }
            eprintln!(
                "skipped: redis-server is not on the PATH ({err}); install Redis to run this test"
            );
            None
        }
    }
}

/// A directory of the server's own in the temp directory.
fn server_dir(port: u16) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "idem-redis-{}-{port}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("a directory for redis-server");
    dir
}

/// A running `redis-server` (or sentinel) process.
#[derive(Debug)]
struct Process {
    port: u16,
    dir: PathBuf,
    log: &'static str,
    args: Vec<String>,
    child: Option<Child>,
}

impl Process {
    /// Spawns `redis-server ARGS` in `dir` and waits until it answers `PING`.
    fn spawn(port: u16, dir: PathBuf, log: &'static str, args: &[String]) -> Self {
        let mut process = Self {
            port,
            dir,
            log,
            args: args.to_vec(),
            child: None,
        };
        process.run();
        process
    }

    /// Starts the process (again), with the arguments it was made with.
    fn run(&mut self) {
        let child = Command::new("redis-server")
            .args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let (port, process) = (self.port, self);
        let deadline = Instant::now() + STARTUP;
        loop {
            if matches!(query(port, &["PING"]), Ok(Reply::Status(pong)) if pong == "PONG") {
                return;
            }
            let exited = process
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "redis-server on port {port} exited ({status}) before answering: {}",
                    process.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not answer PING within {STARTUP:?}: {}",
                process.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join(self.log)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, and reaped.
    fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server is running");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill_9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis server owned by one test.
#[derive(Debug)]
pub struct RedisServer {
    process: Process,
}

impl RedisServer {
    /// Starts a server on a free port, with `extra_args` as `redis-server`
    /// takes them (`&["--replicaof", "127.0.0.1", "6379"]`); no persistence.
    /// `None` if `redis-server` is not installed (a panic under `CI=true`).
    pub fn start(extra_args: &[&str]) -> Option<Self> {
        Self::start_on(free_port(), extra_args)
    }

    /// [`start`](Self::start) on `port`: a server killed with
    /// [`kill_9`](Self::kill_9) can be started again where it was.
    pub fn start_on(port: u16, extra_args: &[&str]) -> Option<Self> {
        redis_server_installed()?;
        let dir = server_dir(port);
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            // A replica syncs at once, not after the default 5 s wait for
            // more replicas to share the transfer.
            "--repl-diskless-sync-delay",
            "0",
            "--dir",
            &dir.display().to_string(),
            "--logfile",
            "redis.log",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        args.extend(extra_args.iter().map(|arg| (*arg).to_owned()));
        Some(Self {
            process: Process::spawn(port, dir, "redis.log", &args),
        })
    }

    /// Starts a replica of the server on `primary_port` and waits until it
    /// has synced (`master_link_status:up`).
    pub fn replica_of(primary_port: u16) -> Option<Self> {
        let replica = Self::start(&["--replicaof", "127.0.0.1", &primary_port.to_string()])?;
        let deadline = Instant::now() + STARTUP;
        while !replica
            .info("replication")
            .contains("master_link_status:up")
        {
            assert!(
                Instant::now() < deadline,
                "the replica on port {} never synced with {primary_port}: {}",
                replica.port(),
                replica.process.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(replica)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.process.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// Has it stopped, and its directory removed, once this process has
    /// exited, however it ends: for a server a test binary keeps in a
    /// static, which is never dropped, and for a binary killed before its
    /// servers are. A shell of its own waits for this process to go, then
    /// shuts the server down by its port (its pid may by then be another
    /// process's). CI fails if a test's server outlives the tests
    /// (`.ci/run`).
    #[allow(clippy::zombie_processes)] // outlives this process, whose exit it waits for
    pub fn stop_when_this_process_exits(&self) {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             redis-cli -p {port} shutdown nosave >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            port = self.port(),
            dir = self.process.dir.display(),
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the server's watchdog");
    }

    /// Kills it with SIGKILL: no goodbye to its clients, no shutdown.
    pub fn kill_9(&mut self) {
        self.process.kill_9();
    }

    /// Stops it as [`kill_9`](Self::kill_9) does and waits until its port
    /// refuses connections.
    pub fn stop(&mut self) {
        self.process.kill_9();
        let port = self.port();
        wait_until("redis-server stopping", || {
            TcpStream::connect(("127.0.0.1", port)).is_err()
        });
    }

    /// Starts it again on its port, with its arguments, empty (it keeps
    /// nothing on disk).
    pub fn restart(&mut self) {
        self.process.run();
    }

    /// Stops it (SIGSTOP): its connections stay open and nothing answers.
    pub fn pause(&self) {
        self.process.signal("-STOP");
    }

    /// Lets a [`pause`](Self::pause)d server run again (SIGCONT).
    pub fn resume(&self) {
        self.process.signal("-CONT");
    }

    /// Runs one command on it, on a connection of its own.
    pub fn query(&self, args: &[&str]) -> io::Result<Reply> {
        query(self.port(), args)
    }

    /// `INFO section`, or an empty string if it does not answer.
    pub fn info(&self, section: &str) -> String {
        match self.query(&["INFO", section]) {
            Ok(Reply::Bulk(Some(info))) => info,
            _ => String::new(),
        }
    }
}

/// A Redis Sentinel monitoring one primary, owned by one test.
#[derive(Debug)]
pub struct Sentinel {
    process: Process,
    service: String,
}

impl Sentinel {
    /// Starts a sentinel that monitors the primary on `primary_port` as
    /// `service_name`, with a quorum of one, the primary judged down after
    /// `down_after_ms` and a failover timeout of twice that (at least a
    /// second). `None` if `redis-server` is not installed (a panic under
    /// `CI=true`).
    pub fn start(service_name: &str, primary_port: u16, down_after_ms: u64) -> Option<Self> {
        Self::start_on(free_port(), service_name, primary_port, down_after_ms)
    }

    /// [`start`](Self::start) on `port`: for a client given the address
    /// before the sentinel runs.
    pub fn start_on(
        port: u16,
        service_name: &str,
        primary_port: u16,
        down_after_ms: u64,
    ) -> Option<Self> {
        redis_server_installed()?;
        let dir = server_dir(port);
        let failover_timeout = (down_after_ms * 2).max(1000);
        let conf = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             dir {dir}\n\
             logfile sentinel.log\n\
             sentinel monitor {service_name} 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds {service_name} {down_after_ms}\n\
             sentinel failover-timeout {service_name} {failover_timeout}\n\
             sentinel parallel-syncs {service_name} 1\n",
            dir = dir.display()
        );
        let conf_path = dir.join("sentinel.conf");
        std::fs::write(&conf_path, conf).expect("write sentinel.conf");
        let args = [conf_path.display().to_string(), "--sentinel".to_owned()];
        Some(Self {
            process: Process::spawn(port, dir, "sentinel.log", &args),
            service: service_name.to_owned(),
        })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.process.port
    }

    /// `redis+sentinel://127.0.0.1:PORT/SERVICE_NAME`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{}",
            self.port(),
            self.service
        )
    }

    /// The service's name.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Kills it with SIGKILL.
    pub fn kill_9(&mut self) {
        self.process.kill_9();
    }

    /// Runs one command on it, on a connection of its own.
    pub fn query(&self, args: &[&str]) -> io::Result<Reply> {
        query(self.port(), args)
    }

    /// `SENTINEL FAILOVER name`: the sentinel's answer, `Err` with its
    /// error (`NOGOODSLAVE`, `INPROG`, ...) if it refused.
    pub fn failover(&self) -> Result<(), String> {
        match query(self.port(), &["SENTINEL", "FAILOVER", &self.service]) {
            Ok(Reply::Status(_)) => Ok(()),
            Ok(Reply::Error(err)) => Err(err),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(err) => Err(err.to_string()),
        }
    }

    /// The port of the primary the sentinel reports now, if it reports one.
    pub fn primary_port(&self) -> Option<u16> {
        let reply = query(
            self.port(),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.service],
        )
        .ok()?;
        match reply {
            Reply::Array(Some(parts)) => match parts.as_slice() {
                [_, Reply::Bulk(Some(port))] => port.parse().ok(),
                _ => None,
            },
            _ => None,
        }
    }

    /// How many replicas the sentinel knows and considers healthy (not
    /// down or disconnected, their link to the primary up).
    pub fn healthy_replicas(&self) -> usize {
        let Ok(Reply::Array(Some(replicas))) =
            query(self.port(), &["SENTINEL", "REPLICAS", &self.service])
        else {
            return 0;
        };
        replicas
            .iter()
            .filter(|replica| {
                let Reply::Array(Some(fields)) = replica else {
                    return false;
                };
                let field = |name: &str| {
                    fields.chunks(2).find_map(|pair| match pair {
                        [Reply::Bulk(Some(k)), Reply::Bulk(Some(v))] if k == name => {
                            Some(v.as_str())
                        }
                        _ => None,
                    })
                };
                field("flags") == Some("slave") && field("master-link-status") == Some("ok")
            })
            .count()
    }

    /// Waits until the sentinel reports the primary at `port`.
    ///
    /// # Panics
    ///
    /// If it does not within `within`, saying what it reports instead.
    pub async fn wait_for_primary(&self, port: u16, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let reported = self.primary_port();
            if reported == Some(port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel did not report the primary at port {port} within {within:?} \
                 (it reports {reported:?}): {}",
                self.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the sentinel knows `count` healthy replicas, so a
    /// failover has one to promote.
    ///
    /// # Panics
    ///
    /// If it does not within `within`.
    pub async fn wait_for_replicas(&self, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let healthy = self.healthy_replicas();
            if healthy >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel knows {healthy} healthy replicas after {within:?}, not {count}: {}",
                self.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Asks for a failover until the sentinel starts one, or says one is
    /// already running (it refuses while it has no replica it trusts).
    ///
    /// # Panics
    ///
    /// If it keeps refusing for `within`.
    pub async fn start_failover(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            match self.failover() {
                Ok(()) => return,
                Err(err) if err.starts_with("INPROG") => return,
                Err(err) => assert!(
                    Instant::now() < deadline,
                    "the sentinel refused a failover for {within:?}, last with {err}: {}",
                    self.process.log_tail()
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`start_failover`](Self::start_failover), then
    /// [`wait_for_primary`](Self::wait_for_primary) at `new_primary`, all
    /// within `within`.
    pub async fn fail_over_to(&self, new_primary: u16, within: Duration) {
        let deadline = Instant::now() + within;
        self.start_failover(within).await;
        self.wait_for_primary(
            new_primary,
            deadline.saturating_duration_since(Instant::now()),
        )
        .await;
    }
}

/// A RESP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Status(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Integer(i64),
    /// `$...`, `None` for a null bulk string.
    Bulk(Option<String>),
    /// `*...`, `None` for a null array.
    Array(Option<Vec<Reply>>),
}

/// Runs one command on the server at `127.0.0.1:port`, on a connection of
/// its own, with one-second timeouts.
pub fn query(port: u16, args: &[&str]) -> io::Result<Reply> {
    let timeout = Duration::from_secs(1);
    let stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    (&stream).write_all(&request)?;
    read_reply(&mut BufReader::new(&stream))
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at_checked(1).unwrap_or(("", ""));
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad reply line {line:?}"),
        )
    };
    let length = || rest.parse::<i64>().map_err(|_| bad());
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Integer(length()?),
        "$" => match usize::try_from(length()?) {
            Err(_) => Reply::Bulk(None),
            Ok(len) => {
                let mut bytes = vec![0; len + 2];
                reader.read_exact(&mut bytes)?;
                bytes.truncate(len);
                Reply::Bulk(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
        },
        "*" => match usize::try_from(length()?) {
            Err(_) => Reply::Array(None),
            Ok(len) => Reply::Array(Some(
                (0..len)
                    .map(|_| read_reply(reader))
                    .collect::<io::Result<_>>()?,
            )),
        },
        _ => return Err(bad()),
    })
}
