//! Hosts of the suite's own: network namespaces (`ip netns`), each joined
//! to the suite's namespace by a veth pair with a /30 of 10.213.0.0/16 on
//! it (`10.213.N.1` on the suite's side, `10.213.N.2` inside). A namespace
//! has that link and its loopback, no other route: nothing in it reaches
//! beyond the suite's side of its link, and nothing leaves the machine.
//!
//! A host is cut from a server (its packets to that port dropped with
//! iptables inside the namespace), from its clients (packets to its own
//! port dropped), and healed (its rules flushed). Dropped, not refused: a
//! partition, where nothing answers and connections hang.
//!
//! Namespaces are named `idemf-PID-N`; dropping a host deletes its
//! namespace (and with it the veth pair), and [`Host::create`] first
//! deletes those of runs whose process is gone (a killed run).
//!
//! Self-contained (std only), so it can move to a shared test-support
//! crate.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

const PREFIX: &str = "idemf-";

/// A network namespace of the suite's own.
pub struct Host {
    name: String,
    index: u8,
}

impl Host {
    /// Creates host `index` (1 to 250): the namespace, the veth pair, the
    /// addresses, the links up. `None` (the scenario skipped, said why) if
    /// `ip` or `iptables` is missing or namespaces cannot be made (not
    /// root), unless `CI=true`.
    pub fn create(index: u8) -> Option<Self> {
        let have = |program: &str| {
            Command::new(program)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        };
        if !have("ip") || !have("iptables") {
            crate::missing("ip and iptables (iproute2, iptables)");
            return None;
        }
        remove_stale();
        let pid = std::process::id();
        let host = Self {
            name: format!("{PREFIX}{pid}-{index}"),
            index,
        };
        // Interface names: at most 15 bytes.
        let outside = format!("idf{}o{index}", pid % 100_000);
        let inside = format!("idf{}i{index}", pid % 100_000);
        let made = ip(&["netns", "add", &host.name]);
        if !made {
            crate::missing("network namespaces (ip netns add: root needed)");
            return None;
        }
        let n = index;
        for args in [
            vec![
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ],
            vec!["link", "set", &inside, "netns", &host.name],
            vec!["addr", "add", &format!("10.213.{n}.1/30"), "dev", &outside],
            vec!["link", "set", &outside, "up"],
            vec![
                "-n",
                &host.name,
                "addr",
                "add",
                &format!("10.213.{n}.2/30"),
                "dev",
                &inside,
            ],
            vec!["-n", &host.name, "link", "set", &inside, "up"],
            vec!["-n", &host.name, "link", "set", "lo", "up"],
        ] {
            assert!(ip(&args), "ip {}", args.join(" "));
        }
        Some(host)
    }

    /// The host's address, inside its namespace.
    pub fn address(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.index, 2)
    }

    /// The suite's side of its link: where the host reaches the servers.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.index, 1)
    }

    /// `ip netns exec NAME`: the prefix that runs a program on the host.
    pub fn exec_prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .map(str::to_owned)
            .to_vec()
    }

    /// Drops every packet the host sends to `port` on its gateway: cut
    /// from the server the gateway forwards that port to.
    pub fn cut_from(&self, port: u16) {
        let gateway = self.gateway().to_string();
        self.iptables(&[
            "-A",
            "OUTPUT",
            "-d",
            &gateway,
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
            "-j",
            "DROP",
        ]);
    }

    /// Drops every packet that comes to the host's `port`: cut from its
    /// clients.
    pub fn cut_clients_of(&self, port: u16) {
        self.iptables(&[
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
            "-j",
            "DROP",
        ]);
    }

    /// Every cut healed.
    pub fn heal(&self) {
        self.iptables(&["-F"]);
    }

    fn iptables(&self, args: &[&str]) {
        let status = Command::new("ip")
            .args(["netns", "exec", &self.name, "iptables", "-w"])
            .args(args)
            .status()
            .expect("iptables");
        assert!(
            status.success(),
            "iptables {} in {}",
            args.join(" "),
            self.name
        );
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // The veth pair goes with the namespace.
        ip(&["netns", "delete", &self.name]);
    }
}

/// `count` host indices whose 10.213.N.0/30 no interface of the machine
/// uses now (another run's hosts, say).
pub fn free_indices(count: usize) -> Vec<u8> {
    let used = Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    (1..=250u8)
        .filter(|n| !used.contains(&format!("10.213.{n}.")))
        .take(count)
        .collect()
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Deletes the namespaces of earlier runs whose process is gone.
fn remove_stale() {
    let Ok(listed) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            ip(&["netns", "delete", name]);
        }
    }
}
