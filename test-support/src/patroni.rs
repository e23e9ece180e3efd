//! A PostgreSQL cluster under Patroni (Debian's `patroni`), of the suite's
//! own: an etcd, a primary and standbys, each node a Patroni with its
//! PostgreSQL in a directory of its own (its data, its socket directory) on
//! free loopback ports, run as the `postgres` user.
//!
//! Each node is announced to the others (its standbys' replication, the
//! candidates' checks) through a TCP proxy of the suite's own, its *link*,
//! which can be cut: a standby then falls behind its primary, as an
//! asynchronous standby does under load or a network fault. Clients reach
//! the primary through HAProxy (`haproxy.rs`), not through the links.
//!
//! Self-contained but for `daemon.rs`, `etcd.rs`, `proxy.rs`, the port
//! picker and PostgreSQL's binaries, so it can move to a shared
//! test-support crate.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, kill_9_tree, private_dir};
use crate::etcd::Etcd;
use crate::fault_proxy::Proxy;
use crate::free_port;
use crate::haproxy::Backend;
use crate::unique;

/// Patroni's leader lock lives this long without a renewal (`ttl`); its
/// loop runs every `loop_wait`. With 10 s and 2 s a crashed primary's
/// standby is promoted about 9 s after the crash.
const TTL_SECS: u64 = 10;
const LOOP_WAIT_SECS: u64 = 2;

/// How the cluster replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_mode: true`: a commit is acknowledged once a standby
    /// has it, and Patroni promotes only that standby.
    Synchronous,
    /// PostgreSQL's default: a commit is acknowledged by the primary
    /// alone; a standby may lack the last ones when it is promoted.
    Asynchronous,
}

/// One Patroni node.
struct Node {
    name: String,
    dir: PathBuf,
    postgres: u16,
    api: u16,
    /// What the other nodes connect to: a proxy to `postgres`.
    link: Proxy,
    patroni: Option<Daemon>,
}

/// A running cluster; every node killed and every directory removed on
/// drop.
pub struct Patroni {
    nodes: Vec<Node>,
    _etcd: Etcd,
}

impl Patroni {
    /// Starts an etcd and `nodes` Patroni nodes replicating as `replication`
    /// says; returns once the first is primary and every other streams from
    /// it (and, synchronous, one is its synchronous standby). `None` (the
    /// scenario skipped, said why) if Patroni, etcd or PostgreSQL is not
    /// installed, unless `CI=true`.
    pub async fn start(nodes: usize, replication: Replication) -> Option<Self> {
        if Command::new("patroni").arg("--version").output().is_err() {
            crate::missing("patroni (Debian's package)");
            return None;
        }
        let Some(bin) = crate::postgres::bindir() else {
            crate::missing("PostgreSQL server binaries (initdb, pg_ctl)");
            return None;
        };
        let etcd = Etcd::start().await?;
        let scope = unique("idem");
        let mut cluster = Self {
            nodes: Vec::with_capacity(nodes),
            _etcd: etcd,
        };
        for i in 0..nodes {
            let name = format!("node{i}");
            let dir = private_dir(&format!("{scope}-{name}"));
            let postgres = free_port();
            let api = free_port();
            let link = Proxy::start(([127, 0, 0, 1], postgres).into()).await;
            let config = config(&ConfigOf {
                scope: &scope,
                name: &name,
                dir: &dir.display().to_string(),
                bin: &bin.display().to_string(),
                etcd: &cluster._etcd.endpoint(),
                postgres,
                api,
                link: link.addr.port(),
                synchronous: replication == Replication::Synchronous,
            });
            std::fs::write(dir.join("patroni.yml"), config).expect("patroni.yml");
            cluster.nodes.push(Node {
                name,
                dir,
                postgres,
                api,
                link,
                patroni: None,
            });
        }
        cluster.start_node(0);
        cluster
            .wait_for_role(0, "primary", Duration::from_secs(60))
            .await;
        for i in 1..nodes {
            cluster.start_node(i);
        }
        for i in 1..nodes {
            cluster
                .wait_for_role(i, "replica", Duration::from_secs(60))
                .await;
        }
        if replication == Replication::Synchronous {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !cluster.any_synchronous_standby().await {
                assert!(
                    Instant::now() < deadline,
                    "no synchronous standby within 30 s"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Some(cluster)
    }

    /// Each node's PostgreSQL and REST API ports, for HAProxy.
    pub fn backends(&self) -> Vec<Backend> {
        self.nodes
            .iter()
            .map(|node| Backend {
                postgres: node.postgres,
                api: node.api,
            })
            .collect()
    }

    /// The link the other nodes reach node `i` through.
    pub fn link(&self, i: usize) -> &Proxy {
        &self.nodes[i].link
    }

    /// A URL of node `i`'s PostgreSQL itself (not through HAProxy), on
    /// its `postgres` database.
    pub fn url(&self, i: usize) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.nodes[i].postgres
        )
    }

    /// How far node `i`'s WAL goes, in bytes from the start: a primary's
    /// written position, a standby's received one (what it replays before
    /// it is promoted). `None` if the node does not answer.
    pub async fn wal_position(&self, i: usize) -> Option<i64> {
        use sqlx::{Connection, PgConnection};

        let mut node = PgConnection::connect(&self.url(i)).await.ok()?;
        wal_position(&mut node).await
    }

    /// Node `i`'s name (`node0`, ...).
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// Node `i` crashes: its Patroni and its PostgreSQL (the postmaster and
    /// its children) killed with SIGKILL at once, as a machine that dies.
    /// Killing the postmaster alone is no crash: Patroni starts it again.
    pub fn crash(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let postmaster = postmaster_pid(&node.dir);
        if let Some(mut patroni) = node.patroni.take() {
            patroni.kill_9();
        }
        if let Some(pid) = postmaster {
            kill_9_tree(pid);
        }
    }

    /// A planned switchover from the primary, node `from`, to node `to`,
    /// through Patroni's REST API (`POST /switchover`, what `patronictl
    /// switchover` sends): the primary is shut down cleanly, its standby
    /// promoted, and it comes back as a standby.
    pub async fn switchover(&self, from: usize, to: usize) -> Result<String, String> {
        let body = serde_json::json!({
            "leader": self.nodes[from].name,
            "candidate": self.nodes[to].name,
        });
        let answer = reqwest::Client::new()
            .post(format!(
                "http://127.0.0.1:{}/switchover",
                self.nodes[from].api
            ))
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|err| err.to_string())?;
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        if status.is_success() {
            Ok(text)
        } else {
            Err(format!("{status}: {text}"))
        }
    }

    /// Waits until node `i`'s REST API says it is `role` (`primary`,
    /// `replica`); how long that took.
    ///
    /// # Panics
    ///
    /// If it does not within `within`.
    pub async fn wait_for_role(&self, i: usize, role: &str, within: Duration) -> Duration {
        let started = Instant::now();
        let url = format!("http://127.0.0.1:{}/{role}", self.nodes[i].api);
        loop {
            let answer = reqwest::Client::new()
                .get(&url)
                .timeout(Duration::from_secs(1))
                .send()
                .await;
            if answer.is_ok_and(|a| a.status() == 200) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "{} was not {role} within {within:?}: {}",
                self.nodes[i].name,
                self.nodes[i]
                    .patroni
                    .as_ref()
                    .map(Daemon::log_tail)
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every other node has replayed all that node `primary`
    /// has written so far (its WAL position now), and says how long that
    /// took. A scenario that cuts or promotes a standby calls it once its
    /// schema and setup are written: on a loaded machine a standby lags by
    /// seconds, and one promoted before it replayed the schema serves a
    /// database without the app's tables.
    ///
    /// # Panics
    ///
    /// If they do not within `within`.
    pub async fn wait_caught_up(&self, primary: usize, within: Duration) -> Duration {
        use sqlx::{Connection, PgConnection};

        let started = Instant::now();
        let url = |i: usize| self.url(i);
        let mut on_primary = PgConnection::connect(&url(primary))
            .await
            .unwrap_or_else(|err| panic!("{}: {err}", self.nodes[primary].name));
        let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut on_primary)
            .await
            .expect("the primary's WAL position");
        for i in (0..self.nodes.len()).filter(|&i| i != primary) {
            let mut standby = PgConnection::connect(&url(i))
                .await
                .unwrap_or_else(|err| panic!("{}: {err}", self.nodes[i].name));
            loop {
                let replayed: bool = sqlx::query_scalar(
                    "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)",
                )
                .bind(&written)
                .fetch_one(&mut standby)
                .await
                .expect("the standby's replay position");
                if replayed {
                    break;
                }
                assert!(
                    started.elapsed() < within,
                    "{} had not replayed {written} within {within:?}",
                    self.nodes[i].name
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        started.elapsed()
    }

    async fn any_synchronous_standby(&self) -> bool {
        for node in &self.nodes {
            let answer = reqwest::Client::new()
                .get(format!("http://127.0.0.1:{}/sync", node.api))
                .timeout(Duration::from_secs(1))
                .send()
                .await;
            if answer.is_ok_and(|a| a.status() == 200) {
                return true;
            }
        }
        false
    }

    fn start_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let mut command = Command::new("patroni");
        command.arg(node.dir.join("patroni.yml"));
        node.patroni = Some(Daemon::spawn(command, &node.dir.join("patroni.log"), true));
    }
}

impl Drop for Patroni {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.crash(i);
        }
        for node in &self.nodes {
            let _ = std::fs::remove_dir_all(&node.dir);
        }
    }
}

/// The postmaster's process id, from `postmaster.pid`.
fn postmaster_pid(dir: &std::path::Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("data").join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

struct ConfigOf<'a> {
    scope: &'a str,
    name: &'a str,
    dir: &'a str,
    bin: &'a str,
    etcd: &'a str,
    postgres: u16,
    api: u16,
    link: u16,
    synchronous: bool,
}

/// A node's `patroni.yml`. etcd through its v3 API (`etcd3:`), which
/// etcd 3.4 serves without the v2 one. `maximum_lag_on_failover` (1 MiB
/// by default) is raised to 256 MiB: a standby that fell behind while its
/// link was cut is still promoted, which is what shows what asynchronous
/// replication loses. Not strict synchronous mode: a primary left without
/// a standby (the other node crashed) goes on alone rather than refuse
/// every write.
fn config(c: &ConfigOf<'_>) -> String {
    format!(
        "scope: {scope}
namespace: /idem/
name: {name}
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  hosts: {etcd}
bootstrap:
  dcs:
    ttl: {TTL_SECS}
    loop_wait: {LOOP_WAIT_SECS}
    retry_timeout: 4
    maximum_lag_on_failover: 268435456
    synchronous_mode: {synchronous}
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      parameters:
        max_connections: 500
        fsync: 'off'
        wal_log_hints: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
  initdb:
  - encoding: UTF8
  - auth: trust
postgresql:
  listen: 127.0.0.1:{postgres}
  connect_address: 127.0.0.1:{link}
  data_dir: {dir}/data
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  use_unix_socket: true
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  parameters:
    unix_socket_directories: '{dir}'
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication replicator 127.0.0.1/32 trust
",
        scope = c.scope,
        name = c.name,
        api = c.api,
        etcd = c.etcd,
        synchronous = c.synchronous,
        postgres = c.postgres,
        link = c.link,
        dir = c.dir,
        bin = c.bin,
    )
}

/// How far the WAL of the server on `node` goes, in bytes from the start:
/// a primary's written position, a standby's received one. `None` if the
/// query fails.
pub async fn wal_position(node: &mut sqlx::PgConnection) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT (CASE WHEN pg_is_in_recovery() \
            THEN coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) \
            ELSE pg_current_wal_lsn() END - '0/0'::pg_lsn)::bigint",
    )
    .fetch_one(node)
    .await
    .ok()
}
