//! Devices: an interface plus a packet backend, and the GID table built from
//! the interface's addresses the way rxe builds its own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ferroce_nic::afpacket::{AfPacketConfig, AfPacketIo, Gather};
use ferroce_nic::afxdp::{AfXdpConfig, AfXdpIo, XdpMode};
use ferroce_nic::{PacketIo, UdpConfig, UdpIo};

use crate::error::{Error, Result};

/// Which packet engine carries the frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// AF_XDP with an XDP redirect program (root).
    AfXdp,
    /// AF_PACKET with TPACKET_V3 rings (root or CAP_NET_RAW).
    AfPacket,
    /// A kernel UDP socket on port 4791 (no privileges).
    Udp,
    /// The fastest that opens with the privileges at hand: AF_XDP where it
    /// binds zero-copy, then AF_PACKET, then AF_XDP in copy mode, then UDP
    /// (before Linux 6.2, whose AF_PACKET sends no GSO super-frames: AF_XDP,
    /// AF_PACKET, UDP).
    Auto,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Backend, String> {
        match s {
            "afxdp" | "xdp" => Ok(Backend::AfXdp),
            "afpacket" | "packet" => Ok(Backend::AfPacket),
            "udp" => Ok(Backend::Udp),
            "auto" => Ok(Backend::Auto),
            other => Err(format!(
                "unknown backend {other:?} (afxdp, afpacket, udp, auto)"
            )),
        }
    }
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::AfXdp => "afxdp",
            Backend::AfPacket => "afpacket",
            Backend::Udp => "udp",
            Backend::Auto => "auto",
        }
    }
}

/// One address of an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfAddr {
    pub ip: IpAddr,
    pub prefix: u8,
}

/// What ferroce knows of a network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Up with a carrier (IFF_RUNNING): a port on it is ACTIVE, as rxe's.
    pub running: bool,
    pub addrs: Vec<IfAddr>,
}

/// The interfaces of the calling thread's network namespace
/// ([`ferroce_nic::ifaces`]: no privileges, no `ip` binary needed).
pub fn interfaces() -> Result<Vec<Interface>> {
    let links = ferroce_nic::ifaces::links().map_err(Error::Nic)?;
    Ok(links
        .into_iter()
        .map(|l| Interface {
            name: l.name,
            mac: l.mac,
            mtu: l.mtu,
            up: l.up,
            running: l.running,
            addrs: l
                .addrs
                .into_iter()
                .map(|(ip, prefix)| IfAddr { ip, prefix })
                .collect(),
        })
        .collect())
}

/// One interface by name.
pub fn interface(name: &str) -> Result<Interface> {
    interfaces()?
        .into_iter()
        .find(|i| i.name == name)
        .ok_or_else(|| Error::NoDevice(format!("no interface named {name:?}")))
}

/// The link-local GID rxe puts at index 0: fe80::/64 with the modified EUI-64 of the MAC.
pub fn link_local_gid(mac: [u8; 6]) -> Ipv6Addr {
    let m = mac;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// The GID table of an interface as rxe builds it: index 0 the MAC-derived
/// link-local GID, then every IPv4 address mapped (`::ffff:a.b.c.d`), then
/// the other IPv6 addresses.
pub fn gid_table(iface: &Interface) -> Vec<Ipv6Addr> {
    let mut gids = vec![link_local_gid(iface.mac)];
    for a in &iface.addrs {
        if let IpAddr::V4(v4) = a.ip {
            gids.push(v4.to_ipv6_mapped());
        }
    }
    for a in &iface.addrs {
        if let IpAddr::V6(v6) = a.ip {
            if !gids.contains(&v6) {
                gids.push(v6);
            }
        }
    }
    gids
}

/// How to open a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The interface (in the calling thread's network namespace).
    pub ifname: String,
    pub backend: Backend,
    /// UDP backend: the local address to bind (default: the interface's first
    /// IPv4 address, port 4791).
    pub udp_bind: Option<SocketAddr>,
    /// Seed for the keys and PSNs the core draws.
    pub seed: u64,
    /// The network namespace (under /run/netns) the interface lives in, when
    /// the device is opened from a thread that entered it: later neighbour
    /// look-ups run there too.
    pub netns: Option<String>,
    /// Record every frame sent and received to this pcap file.
    pub pcap: Option<std::path::PathBuf>,
    /// Inject seeded loss, duplication, reordering, corruption and delay on
    /// receive (where `tc netem` is not available, as on this kernel).
    pub faults: Option<ferroce_nic::FaultConfig>,
}

impl DeviceConfig {
    pub fn new(ifname: &str, backend: Backend) -> DeviceConfig {
        DeviceConfig {
            ifname: ifname.to_string(),
            backend,
            udp_bind: None,
            seed: seed_from_os(),
            netns: None,
            pcap: None,
            faults: None,
        }
    }
}

/// The node GUID of an interface with `mac`: its modified EUI-64 (the
/// universal/local bit flipped, ff:fe in the middle), as rxe derives it.
pub fn node_guid(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// A seed from the OS clock and process id: the core itself never reads either.
pub fn seed_from_os() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15
}

/// An opened backend with the facts the device needs from it.
pub(crate) struct OpenedIo {
    pub io: Box<dyn PacketIo>,
    pub backend: Backend,
    pub iface: Interface,
    /// For the UDP backend: the address frames leave from (its GIDs).
    pub udp_local: Option<SocketAddr>,
    /// For a raw backend: the UDP sockets its peers on this host reach it
    /// through ([`ferroce_nic::local_peers`]), one per address family.
    pub local_peers: Vec<SocketAddr>,
}

/// Whether AF_PACKET devices send runs of frames as UDP GSO super-frames
/// (Linux >= 6.2); `FERROCE_AFPACKET_GSO=0` sends each frame on its own, e.g.
/// so a capture on a veth shows wire frames.
fn afpacket_gso() -> bool {
    std::env::var("FERROCE_AFPACKET_GSO").map_or(true, |v| v != "0")
}

/// Whether AF_PACKET devices opened now send GSO super-frames: not turned
/// off by `FERROCE_AFPACKET_GSO=0`, and taken by this kernel (Linux >= 6.2).
pub fn afpacket_sends_gso() -> bool {
    afpacket_gso() && ferroce_nic::afpacket::gso_supported()
}

/// `FERROCE_XDP_MODE`: how an AF_XDP device attaches its program: `drv`
/// (native, in the driver), `skb` (generic, after the kernel built the
/// socket buffer), or `auto` (native, else generic; the default). On veth a
/// native program makes the kernel take GSO off the peer, so a UDP device
/// beside it sends every frame alone; a generic one leaves that alone.
fn xdp_mode() -> Result<XdpMode> {
    xdp_mode_of(std::env::var("FERROCE_XDP_MODE").ok().as_deref())
}

fn xdp_mode_of(v: Option<&str>) -> Result<XdpMode> {
    match v {
        None | Some("") | Some("auto") => Ok(XdpMode::Auto),
        Some("drv") | Some("native") => Ok(XdpMode::Driver),
        Some("skb") | Some("generic") => Ok(XdpMode::Skb),
        Some(o) => Err(Error::NoDevice(format!(
            "FERROCE_XDP_MODE={o:?} (auto, drv or skb)"
        ))),
    }
}

/// The backends to try, in order, each with whether an AF_XDP socket must
/// bind zero-copy. `auto` takes AF_XDP first where its sockets bind zero-copy
/// (a NIC whose driver supports it); a copy-mode socket (veth, virtio-net,
/// most VMs) comes after AF_PACKET when AF_PACKET sends GSO super-frames:
/// over veth that moved about twice AF_XDP's WRITE bandwidth at no worse
/// latency (`scripts/bench-verbs.sh`: 12.9-15.4 against 6.6-7.5 Gbit/s, 4.4-6.2
/// against 4.9-5.4 us). UDP comes last: it needs no privileges.
fn attempts(backend: Backend, afpacket_gso: bool) -> &'static [(Backend, bool)] {
    match backend {
        Backend::Auto if afpacket_gso => &[
            (Backend::AfXdp, true),
            (Backend::AfPacket, false),
            (Backend::AfXdp, false),
            (Backend::Udp, false),
        ],
        Backend::Auto => &[
            (Backend::AfXdp, false),
            (Backend::AfPacket, false),
            (Backend::Udp, false),
        ],
        Backend::AfXdp => &[(Backend::AfXdp, false)],
        Backend::AfPacket => &[(Backend::AfPacket, false)],
        Backend::Udp => &[(Backend::Udp, false)],
    }
}

pub(crate) fn open_io(cfg: &DeviceConfig) -> Result<OpenedIo> {
    let iface = interface(&cfg.ifname)?;
    let gso = afpacket_gso();
    let order = attempts(cfg.backend, afpacket_sends_gso());
    let mut errors = Vec::new();
    for &(b, zero_copy_only) in order {
        let r: Result<(Box<dyn PacketIo>, Option<SocketAddr>)> = match b {
            // Other processes' devices on the interface take other QPN
            // prefixes (ferroce_nic::raw_share).
            Backend::AfXdp => xdp_mode()
                .and_then(|mode| {
                    AfXdpIo::open(AfXdpConfig {
                        share_qpns: true,
                        zero_copy_only,
                        mode,
                        ..AfXdpConfig::new(&cfg.ifname)
                    })
                    .map_err(Error::from)
                })
                .map(|io| (Box::new(io) as Box<dyn PacketIo>, None)),
            Backend::AfPacket => AfPacketIo::open(AfPacketConfig {
                // A TPACKET_V3 block reaches user space only when full or
                // after its 1 ms retire timer, which puts ~1 ms on every
                // round trip; V2 hands over each frame at once.
                rx_ring: ferroce_nic::afpacket::RxRing::V2,
                share_qpns: true,
                // Only the transport core fills this backend's frames, and its ICRCs are right.
                tx_icrc_valid: true,
                gso,
                // Payloads copied by the kernel straight from the regions
                // on veth, through the TX ring elsewhere (afpacket::Gather);
                // FERROCE_AFPACKET_GATHER=1 or 0 forces one way.
                gather: match std::env::var("FERROCE_AFPACKET_GATHER").as_deref() {
                    Ok("1") => Gather::Always,
                    Ok("0") => Gather::Never,
                    _ => Gather::Auto,
                },
                ..AfPacketConfig::new(&cfg.ifname)
            })
            .map(|io| (Box::new(io) as Box<dyn PacketIo>, None))
            .map_err(Error::from),
            Backend::Udp => {
                let bind = cfg.udp_bind.or_else(|| {
                    iface
                        .addrs
                        .iter()
                        .find(|a| a.ip.is_ipv4())
                        .map(|a| SocketAddr::new(a.ip, ferroce_nic::ROCE_V2_PORT))
                });
                match bind {
                    None => Err(Error::NoDevice(format!(
                        "{} has no IPv4 address to bind the UDP backend to",
                        cfg.ifname
                    ))),
                    Some(bind) => {
                        let mut c = UdpConfig::new(bind);
                        c.mac = iface.mac;
                        // The device goes with its interface (DEVICE_FATAL), as rxe's.
                        c.ifindex = ferroce_nic::ifaces::index(&cfg.ifname).unwrap_or(0);
                        // Only the transport core fills this backend's frames, and its ICRCs are right.
                        c.tx_icrc_valid = true;
                        // The kernel copies payloads straight from the regions
                        // (UdpConfig::gather); FERROCE_UDP_GATHER=0 joins each
                        // frame in user space first, for comparison.
                        c.gather = std::env::var("FERROCE_UDP_GATHER").map_or(true, |v| v != "0");
                        // Other processes' devices may bind the same address
                        // (ferroce_nic::port_share); FERROCE_UDP_SHARE=0 keeps
                        // the port to this one, as a second bind then fails.
                        c.share_port =
                            std::env::var("FERROCE_UDP_SHARE").map_or(true, |v| v != "0");
                        // Datagrams taken by an armed io_uring multishot receive
                        // (UdpConfig::multishot): FERROCE_UDP_MULTISHOT=1.
                        c.multishot =
                            std::env::var("FERROCE_UDP_MULTISHOT").is_ok_and(|v| v == "1");
                        UdpIo::bind(c)
                            .map(|io| {
                                let local = io.local_addr();
                                (Box::new(io) as Box<dyn PacketIo>, Some(local))
                            })
                            .map_err(Error::from)
                    }
                }
            }
            Backend::Auto => continue,
        };
        match r {
            Ok((io, udp_local)) => {
                let (io, local_peers) = if udp_local.is_none() {
                    with_local_peers(io, &iface)
                } else {
                    (io, Vec::new())
                };
                let io = match cfg.faults {
                    None => io,
                    Some(f) => Box::new(ferroce_nic::FaultIo::new(io, f)?) as Box<dyn PacketIo>,
                };
                let io = match &cfg.pcap {
                    None => io,
                    Some(path) => {
                        let file = std::fs::File::create(path)
                            .map_err(|e| Error::Io("creating the pcap file", e))?;
                        Box::new(ferroce_nic::PcapIo::new(
                            io,
                            std::io::BufWriter::new(file),
                            ferroce_nic::middleware::pcap::PcapMode::Both,
                        )?) as Box<dyn PacketIo>
                    }
                };
                return Ok(OpenedIo {
                    io,
                    backend: b,
                    iface,
                    udp_local,
                    local_peers,
                });
            }
            // A later copy-mode attempt says why AF_XDP would not open at all.
            Err(e) if zero_copy_only => tracing::debug!("{}: {e}", b.name()),
            Err(e) => errors.push(format!("{}: {e}", b.name())),
        }
    }
    Err(Error::NoDevice(format!(
        "{}: {}",
        cfg.ifname,
        errors.join("; ")
    )))
}

/// Gives a raw backend its UDP sockets for peers on this host: on the
/// interface's first IPv4 address and on its first IPv6 address that is not
/// link-local (the GIDs such peers use; rxe reaches them through the
/// kernel's loopback). Without either, or when no socket can be had
/// (`FERROCE_LOCAL_PEERS=0`, a UDP device holding the port on the wildcard
/// address), the device works as before and a path to a local address is
/// refused with the reason.
fn with_local_peers(
    io: Box<dyn PacketIo>,
    iface: &Interface,
) -> (Box<dyn PacketIo>, Vec<SocketAddr>) {
    let usable = |ip: &IpAddr| match ip {
        IpAddr::V4(a) => !a.is_loopback(),
        // fe80::/10 needs a scope to bind; rxe's index-0 GID is link-local too, but the
        // tools use the IPv4 (or a global IPv6) one.
        IpAddr::V6(a) => {
            !a.is_loopback() && !a.is_multicast() && a.segments()[0] & 0xffc0 != 0xfe80
        }
    };
    let first = |v6: bool| {
        iface
            .addrs
            .iter()
            .find(|a| a.ip.is_ipv6() == v6 && usable(&a.ip))
            .map(|a| SocketAddr::new(a.ip, ferroce_nic::ROCE_V2_PORT))
    };
    let binds: Vec<SocketAddr> = [first(false), first(true)].into_iter().flatten().collect();
    // A raw device on `lo` itself gets back what it sends there: a socket
    // beside it would hand it every local frame twice.
    let wanted =
        iface.name != "lo" && std::env::var("FERROCE_LOCAL_PEERS").map_or(true, |v| v != "0");
    let Some((&bind, more)) = binds.split_first().filter(|_| wanted) else {
        return (io, Vec::new());
    };
    let cfg = |bind| UdpConfig {
        // Only the transport core fills these frames, and its ICRCs are right.
        tx_icrc_valid: true,
        // Loopback traffic only: a small batch keeps the socket's buffers small.
        batch: 16,
        ..UdpConfig::new(bind)
    };
    match ferroce_nic::LocalPeersIo::new(io, cfg(bind)) {
        Ok(mut lp) => {
            for &b in more {
                if let Err(e) = lp.add_socket(cfg(b)) {
                    tracing::info!(
                        "{}: no path to peers on this host from {b} ({e})",
                        iface.name
                    );
                }
            }
            let at = lp.local_addrs();
            (Box::new(lp) as Box<dyn PacketIo>, at)
        }
        Err((io, e)) => {
            tracing::info!("{}: no path to peers on this host ({e})", iface.name);
            (io, Vec::new())
        }
    }
}

/// The largest IB path MTU an Ethernet MTU allows (rxe: largest ≤ MTU − 80, so 1500 → 1024).
pub fn ib_mtu_for(eth_mtu: u32) -> u32 {
    let room = eth_mtu.saturating_sub(80);
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| *m <= room)
        .unwrap_or(256)
}

/// An IB path MTU as the `ibv_mtu` / IBTA enumeration (1: 256 ... 5: 4096);
/// between two MTUs it takes the smaller.
pub fn ib_mtu_enum(bytes: u32) -> u8 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

/// An IPv4 GID's address, if it is IPv4-mapped.
pub fn gid_ipv4(gid: Ipv6Addr) -> Option<Ipv4Addr> {
    gid.to_ipv4_mapped()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_mode_names() {
        for (v, m) in [
            (None, XdpMode::Auto),
            (Some(""), XdpMode::Auto),
            (Some("auto"), XdpMode::Auto),
            (Some("drv"), XdpMode::Driver),
            (Some("native"), XdpMode::Driver),
            (Some("skb"), XdpMode::Skb),
            (Some("generic"), XdpMode::Skb),
        ] {
            assert_eq!(xdp_mode_of(v).unwrap(), m, "{v:?}");
        }
        let e = xdp_mode_of(Some("offload")).unwrap_err().to_string();
        assert!(e.contains("FERROCE_XDP_MODE=\"offload\""), "{e}");
    }

    #[test]
    fn auto_puts_copy_mode_af_xdp_after_afpacket_with_gso() {
        use Backend::*;
        let with_gso: Vec<_> = attempts(Auto, true).to_vec();
        assert_eq!(
            with_gso,
            [
                (AfXdp, true),
                (AfPacket, false),
                (AfXdp, false),
                (Udp, false)
            ]
        );
        let without: Vec<_> = attempts(Auto, false).to_vec();
        assert_eq!(without, [(AfXdp, false), (AfPacket, false), (Udp, false)]);
        // A backend asked for by name is the only one tried, in any mode.
        for b in [AfXdp, AfPacket, Udp] {
            for gso in [false, true] {
                assert_eq!(attempts(b, gso), &[(b, false)]);
            }
        }
    }

    #[test]
    fn mtu_mapping_matches_rxe() {
        assert_eq!(ib_mtu_for(1500), 1024);
        assert_eq!(ib_mtu_for(9000), 4096);
        assert_eq!(ib_mtu_for(4200), 4096);
        assert_eq!(ib_mtu_for(4175), 2048);
        assert_eq!(ib_mtu_for(576), 256);
        let enums: Vec<u8> = [256, 512, 1024, 2048, 4096].map(ib_mtu_enum).to_vec();
        assert_eq!(enums, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn gid_table_order() {
        let iface = Interface {
            name: "veth0".into(),
            mac: [0x02, 0x11, 0x22, 0x33, 0x44, 0x55],
            mtu: 9000,
            up: true,
            running: true,
            addrs: vec![
                IfAddr {
                    ip: "fd00::1".parse().unwrap(),
                    prefix: 64,
                },
                IfAddr {
                    ip: "198.18.0.1".parse().unwrap(),
                    prefix: 24,
                },
            ],
        };
        let g = gid_table(&iface);
        assert_eq!(g[0], "fe80::11:22ff:fe33:4455".parse::<Ipv6Addr>().unwrap());
        assert_eq!(g[1], "::ffff:198.18.0.1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(g[2], "fd00::1".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn loopback_is_listed() {
        let all = interfaces().unwrap();
        let lo = all.iter().find(|i| i.name == "lo").unwrap();
        assert!(lo
            .addrs
            .iter()
            .any(|a| a.ip == IpAddr::from([127, 0, 0, 1])));
    }
}
