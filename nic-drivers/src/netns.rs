//! Test network: N hosts as network namespaces, joined by one veth pair (2
//! hosts) or a Linux bridge (any number), MTU 9000, IPv4 from the RFC 2544
//! benchmarking range 198.18.0.0/15 and IPv6 from fd00::/8 (ULA).
//!
//! Names are unique per process and topology (`frc-<pid>-<n>-h<i>`), so tests
//! run in parallel. Everything is removed on drop (also while unwinding from a
//! panic); [`down`] removes whatever a killed process left behind. Uses
//! iproute2 (`ip`, `tc`) and needs root; check [`crate::is_root`] first.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::NicError;

/// Prefix of every namespace this module creates.
pub const PREFIX: &str = "frc-";
/// Interface name inside each host namespace.
pub const IFNAME: &str = "veth0";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Topology settings.
#[derive(Debug, Clone)]
pub struct TopologyConfig {
    /// Number of hosts (≥ 2).
    pub hosts: usize,
    /// Link MTU (9000 lets RoCE use a 4096-byte path MTU).
    pub mtu: u32,
    /// Join the hosts through a bridge even when there are only two.
    pub bridge: bool,
    /// Install permanent neighbour entries for every peer (IPv4 and IPv6), so
    /// no ARP/ND is needed.
    pub static_neighbours: bool,
    /// `tc netem` arguments applied on every host's interface, e.g.
    /// `"delay 1ms loss 1%"`.
    pub netem: Option<String>,
    /// Namespace name tag (`frc-<pid>-<tag>`); default: a per-process counter.
    pub tag: Option<String>,
    /// A fixed name instead (`frc-<name>`), for topologies that outlive the
    /// process (`ferroce netns up`); crash clean-up leaves these alone and
    /// [`down`] removes them.
    pub name: Option<String>,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        TopologyConfig {
            hosts: 2,
            mtu: 9000,
            bridge: false,
            static_neighbours: true,
            netem: None,
            tag: None,
            name: None,
        }
    }
}

/// One host of the topology.
#[derive(Debug, Clone)]
pub struct Host {
    /// Namespace name (`ip netns exec <ns> ...`).
    pub ns: String,
    /// Its interface ([`IFNAME`]).
    pub ifname: String,
    /// IPv4 address (198.18.0.<i+1>/24).
    pub ipv4: Ipv4Addr,
    /// IPv6 address (fd00::<i+1>/64).
    pub ipv6: Ipv6Addr,
    /// MAC address (02:fe:00:00:00:<i+1>).
    pub mac: [u8; 6],
}

impl Host {
    /// The host's address of the requested family.
    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.ipv6.into()
        } else {
            self.ipv4.into()
        }
    }
}

/// A running topology; removed on drop.
#[derive(Debug)]
pub struct Topology {
    name: String,
    hosts: Vec<Host>,
    bridge_ns: Option<String>,
}

fn mac_str(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs a command, failing with its stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<String, NicError> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| NicError::io(format!("spawn {cmd}"), e))?;
    if !out.status.success() {
        return Err(NicError::Command {
            cmd: format!("{cmd} {}", args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, NicError> {
    run("ip", args)
}

fn in_ns(ns: &str, args: &[&str]) -> Result<String, NicError> {
    let mut v = vec!["netns", "exec", ns];
    v.extend_from_slice(args);
    ip(&v)
}

/// Namespaces that exist now (`ip netns list`).
pub fn list_namespaces() -> Result<Vec<String>, NicError> {
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// Removes every namespace this module created in any process (`prefix`
/// defaults to [`PREFIX`]). Returns the names removed.
pub fn down(prefix: Option<&str>) -> Result<Vec<String>, NicError> {
    let prefix = prefix.unwrap_or(PREFIX);
    let mut gone = Vec::new();
    for ns in list_namespaces()? {
        if ns.starts_with(prefix) {
            // Deleting the namespace deletes the veth ends in it too.
            if ip(&["netns", "del", &ns]).is_ok() {
                gone.push(ns);
            }
        }
    }
    Ok(gone)
}

/// Removes `frc-<pid>-*` namespaces whose process is gone (crash leftovers).
fn remove_stale() {
    let Ok(list) = list_namespaces() else {
        return;
    };
    for ns in list {
        let Some(rest) = ns.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

impl Topology {
    /// Creates the namespaces, links and addresses.
    pub fn up(cfg: &TopologyConfig) -> Result<Self, NicError> {
        if cfg.hosts < 2 || cfg.hosts > 250 {
            return Err(NicError::Config(format!("netns hosts = {}", cfg.hosts)));
        }
        if !crate::is_root() {
            return Err(NicError::NeedsPrivilege("netns topology"));
        }
        remove_stale();
        let tag = cfg
            .tag
            .clone()
            .unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed).to_string());
        let name = match &cfg.name {
            Some(n) => format!("{PREFIX}{n}"),
            None => format!("{PREFIX}{}-{tag}", std::process::id()),
        };
        let hosts: Vec<Host> = (0..cfg.hosts)
            .map(|i| Host {
                ns: format!("{name}-h{i}"),
                ifname: IFNAME.to_string(),
                ipv4: Ipv4Addr::new(198, 18, 0, i as u8 + 1),
                ipv6: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i as u16 + 1),
                mac: [0x02, 0xfe, 0, 0, 0, i as u8 + 1],
            })
            .collect();
        let bridged = cfg.bridge || cfg.hosts > 2;
        // Build the struct first so a failure half-way is cleaned up by Drop.
        let mut topo = Topology {
            name,
            hosts: Vec::new(),
            bridge_ns: None,
        };
        for h in &hosts {
            ip(&["netns", "add", &h.ns])?;
            topo.hosts.push(h.clone());
            in_ns(&h.ns, &["ip", "link", "set", "lo", "up"])?;
        }
        let mtu = cfg.mtu.to_string();
        if bridged {
            let br = format!("{}-br", topo.name);
            ip(&["netns", "add", &br])?;
            topo.bridge_ns = Some(br.clone());
            in_ns(
                &br,
                &["ip", "link", "add", "br0", "mtu", &mtu, "type", "bridge"],
            )?;
            for (i, h) in hosts.iter().enumerate() {
                let port = format!("p{i}");
                ip(&[
                    "link", "add", "name", IFNAME, "netns", &h.ns, "mtu", &mtu, "type", "veth",
                    "peer", "name", &port, "netns", &br, "mtu", &mtu,
                ])?;
                in_ns(&br, &["ip", "link", "set", &port, "master", "br0", "up"])?;
            }
            in_ns(&br, &["ip", "link", "set", "br0", "up"])?;
        } else {
            let (a, b) = (&hosts[0], &hosts[1]);
            ip(&[
                "link", "add", "name", IFNAME, "netns", &a.ns, "mtu", &mtu, "type", "veth", "peer",
                "name", IFNAME, "netns", &b.ns, "mtu", &mtu,
            ])?;
        }
        for h in &hosts {
            let mac = mac_str(&h.mac);
            in_ns(&h.ns, &["ip", "link", "set", IFNAME, "address", &mac])?;
            in_ns(
                &h.ns,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/24", h.ipv4),
                    "dev",
                    IFNAME,
                ],
            )?;
            in_ns(
                &h.ns,
                &[
                    "ip",
                    "-6",
                    "addr",
                    "add",
                    &format!("{}/64", h.ipv6),
                    "dev",
                    IFNAME,
                    "nodad",
                ],
            )?;
            in_ns(&h.ns, &["ip", "link", "set", IFNAME, "up"])?;
            if let Some(netem) = &cfg.netem {
                let mut args = vec!["tc", "qdisc", "add", "dev", IFNAME, "root", "netem"];
                args.extend(netem.split_whitespace());
                in_ns(&h.ns, &args).map_err(|e| match e {
                    // Kernels without sch_netem (this VM boots with `nomodule`).
                    NicError::Command { stderr, .. } if stderr.contains("unknown") => {
                        NicError::Unsupported(format!("tc netem: {stderr}"))
                    }
                    e => e,
                })?;
            }
        }
        if cfg.static_neighbours {
            for h in &hosts {
                for p in hosts.iter().filter(|p| p.ns != h.ns) {
                    let mac = mac_str(&p.mac);
                    for addr in [p.ipv4.to_string(), p.ipv6.to_string()] {
                        in_ns(
                            &h.ns,
                            &[
                                "ip",
                                "neigh",
                                "replace",
                                &addr,
                                "lladdr",
                                &mac,
                                "dev",
                                IFNAME,
                                "nud",
                                "permanent",
                            ],
                        )?;
                    }
                }
            }
        }
        Ok(topo)
    }

    /// Keeps the namespaces after this value is dropped (for `ferroce netns
    /// up`); returns the hosts. [`down`] removes them later.
    pub fn persist(mut self) -> Vec<Host> {
        self.bridge_ns = None;
        std::mem::take(&mut self.hosts)
    }

    /// The topology's name (prefix of its namespaces).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All hosts.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `i`. Panics if out of range (test helper).
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// A `Command` that runs `program` inside host `i`'s namespace.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i].ns, program]);
        c
    }

    /// Runs `f` on a new thread that has entered host `i`'s namespace, and
    /// returns its result. Sockets (and XDP attachments) made inside stay in
    /// that namespace after the thread ends, so a backend opened here can be
    /// used from any thread.
    pub fn run_in<R: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, NicError> {
        let ns = self
            .hosts
            .get(i)
            .ok_or_else(|| NicError::Config(format!("no host {i}")))?
            .ns
            .clone();
        enter_and_run(&ns, f)
    }
}

/// Runs `f` on a fresh thread inside namespace `ns` (by name, /run/netns).
pub fn enter_and_run<R: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, NicError> {
    let path = format!("/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|e| NicError::io(format!("open {path}"), e))?;
    run_in(&file, f)
}

/// Runs `f` on a fresh thread inside the network namespace `ns`, an open
/// namespace file (`/run/netns/NAME`, or one a backend kept of its own).
pub(crate) fn run_in<R: Send>(
    ns: &std::fs::File,
    f: impl FnOnce() -> R + Send,
) -> Result<R, NicError> {
    std::thread::scope(|s| {
        let h = s.spawn(|| -> Result<R, NicError> {
            // SAFETY: ns is an open netns fd; setns only changes this thread's
            // network namespace, which ends with the thread.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            crate::sys::cvt(r, "setns")?;
            Ok(f())
        });
        match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

/// The network namespace the calling thread is in (its inode number).
pub fn current_net_ino() -> u64 {
    ns_ino(&["/proc/thread-self/ns/net", "/proc/self/ns/net"])
}

/// The inode of the first of `paths` (namespace links) that exists, or 0.
pub(crate) fn ns_ino(paths: &[&str]) -> u64 {
    paths
        .iter()
        .find_map(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

impl Drop for Topology {
    fn drop(&mut self) {
        for h in &self.hosts {
            if let Err(e) = ip(&["netns", "del", &h.ns]) {
                tracing::warn!("removing {}: {e}", h.ns);
            }
        }
        if let Some(br) = &self.bridge_ns {
            let _ = ip(&["netns", "del", br]);
        }
    }
}

/// `ferroce netns up [HOSTS] [NAME]` / `ferroce netns down`: the command-line
/// entry the `ferroce` binary forwards to. Returns what to print.
pub fn cli(args: &[String]) -> Result<String, NicError> {
    match args.first().map(String::as_str) {
        Some("up") => {
            let hosts = match args.get(1) {
                Some(h) => h
                    .parse()
                    .map_err(|_| NicError::Config(format!("hosts: {h:?} is not a number")))?,
                None => 2,
            };
            let name = args.get(2).cloned().unwrap_or_else(|| "up".to_string());
            let t = Topology::up(&TopologyConfig {
                hosts,
                name: Some(name),
                ..TopologyConfig::default()
            })?;
            let mut out = String::new();
            for h in t.persist() {
                out.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    h.ns,
                    h.ifname,
                    h.ipv4,
                    h.ipv6,
                    mac_str(&h.mac)
                ));
            }
            Ok(out)
        }
        Some("down") => Ok(down(None)?.join("\n")),
        _ => Err(NicError::Config(
            "usage: netns up [HOSTS] [NAME] | netns down".into(),
        )),
    }
}
