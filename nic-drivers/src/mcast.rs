//! IP multicast group membership for the backends.
//!
//! RoCE v2 multicast is IP multicast to UDP port 4791. Whatever carries the
//! frames, the host must be a member of the group on the interface, as the
//! kernel's rdma_cm makes it for rxe (cma_iboe_join_multicast →
//! ip_mc_inc_group): that programs the NIC's multicast filter and answers
//! IGMP/MLD queries, so switches that snoop forward the group to us. A
//! membership is a UDP socket with IP_ADD_MEMBERSHIP / IPV6_ADD_MEMBERSHIP;
//! closing it leaves the group. Raw backends (AF_PACKET, AF_XDP) see the
//! frames on the wire and only need the membership; the UDP backend also
//! receives through the socket, which it binds to the group and port.
//!
//! A backend opened inside a network namespace may be asked to join from a
//! thread outside it: the sockets are made in the namespace the backend was
//! opened in (kept as a file at creation).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

use crate::netns;
use crate::sys;
use crate::NicError;

/// The Ethernet address an IP multicast group is sent to: 01:00:5e and the
/// low 23 bits of an IPv4 group (RFC 1112 6.4), 33:33 and the low 32 bits of
/// an IPv6 one (RFC 2464 7); `None` for a unicast address.
pub fn multicast_mac(ip: IpAddr) -> Option<[u8; 6]> {
    match ip {
        IpAddr::V4(a) if a.is_multicast() => {
            let o = a.octets();
            Some([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
        }
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => multicast_mac(IpAddr::V4(v4)),
            None if a.is_multicast() => {
                let o = a.octets();
                Some([0x33, 0x33, o[12], o[13], o[14], o[15]])
            }
            None => None,
        },
        IpAddr::V4(_) => None,
    }
}

/// Receive buffer of a socket that receives a group's datagrams.
const RECEIVE_BUFFER: usize = 8 << 20;

/// The groups one backend has joined, each counted (several QPs may attach
/// to one group; the last detach leaves it).
#[derive(Debug)]
pub(crate) struct Memberships {
    /// The namespace the backend was opened in.
    netns: Option<File>,
    /// Interface to join on (0: the kernel picks by route).
    ifindex: u32,
    /// An IPv4 address of that interface, for IPv4 joins by address.
    local_v4: Option<std::net::Ipv4Addr>,
    /// Bind each membership socket to (group, port) so that it receives.
    receive_port: Option<u16>,
    groups: BTreeMap<IpAddr, Group>,
}

#[derive(Debug)]
struct Group {
    sock: OwnedFd,
    /// Whether `sock` is bound to the group and receives its datagrams.
    receives: bool,
    refs: usize,
}

impl Memberships {
    /// Memberships on interface `ifindex` (0: by route, or by `local` for
    /// IPv4). With `receive_port`, each membership socket also binds the
    /// group and port and its datagrams are the backend's to read.
    /// Call it in the namespace the backend lives in.
    pub(crate) fn new(ifindex: u32, local: Option<IpAddr>, receive_port: Option<u16>) -> Self {
        let local_v4 = match local {
            Some(IpAddr::V4(a)) if !a.is_unspecified() => Some(a),
            Some(IpAddr::V6(a)) => a.to_ipv4_mapped(),
            _ => None,
        };
        let ifindex = if ifindex == 0 {
            local
                .filter(|a| !a.is_unspecified())
                .and_then(ifindex_of_addr)
                .unwrap_or(0)
        } else {
            ifindex
        };
        Memberships {
            netns: File::open("/proc/thread-self/ns/net").ok(),
            ifindex,
            local_v4,
            receive_port,
            groups: BTreeMap::new(),
        }
    }

    /// Joins `group` (or counts one more user of it).
    pub(crate) fn join(&mut self, group: IpAddr) -> Result<(), NicError> {
        let group = unmapped(group);
        if !group.is_multicast() {
            return Err(NicError::Config(format!(
                "{group} is not a multicast group"
            )));
        }
        if let Some(g) = self.groups.get_mut(&group) {
            g.refs += 1;
            return Ok(());
        }
        let (ifindex, local_v4, port) = (self.ifindex, self.local_v4, self.receive_port);
        let open = move || membership_socket(group, ifindex, local_v4, port);
        let (sock, receives) = match &self.netns {
            Some(ns) if !in_netns(ns) => netns::run_in(ns, open)??,
            _ => open()?,
        };
        self.groups.insert(
            group,
            Group {
                sock,
                receives,
                refs: 1,
            },
        );
        Ok(())
    }

    /// Leaves `group` once its last user has (an error if it was not
    /// joined), handing back the socket that held the membership then.
    pub(crate) fn leave(&mut self, group: IpAddr) -> Result<Option<OwnedFd>, NicError> {
        let group = unmapped(group);
        let Some(g) = self.groups.get_mut(&group) else {
            return Err(NicError::Config(format!("group {group} was not joined")));
        };
        g.refs -= 1;
        if g.refs > 0 {
            return Ok(None);
        }
        let g = self.groups.remove(&group);
        Ok(g.map(|g| g.sock))
    }

    /// The receiving socket of `group` (with a receive port, and when the
    /// bind succeeded).
    pub(crate) fn receive_fd(&self, group: IpAddr) -> Option<RawFd> {
        self.groups
            .get(&unmapped(group))
            .filter(|g| g.receives)
            .map(|g| g.sock.as_raw_fd())
    }
}

fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether the calling thread is in the namespace `ns` (taken as so when
/// the namespace file cannot be read).
fn in_netns(ns: &File) -> bool {
    match ns.metadata() {
        Ok(m) => m.ino() == netns::current_net_ino(),
        Err(_) => true,
    }
}

/// A UDP socket that is a member of `group` on the interface, bound to
/// (group, port) when `port` is given and that bind succeeds (a wildcard
/// socket on the port, e.g. a dual-stack UDP device on `[::]`, receives
/// the group's datagrams itself, and the bind then fails: membership only).
fn membership_socket(
    group: IpAddr,
    ifindex: u32,
    local_v4: Option<std::net::Ipv4Addr>,
    port: Option<u16>,
) -> Result<(OwnedFd, bool), NicError> {
    let v6 = group.is_ipv6();
    let sock = sys::udp_socket(v6, "socket(UDP, multicast)")?;
    let raw = sock.as_raw_fd();
    let one: libc::c_int = 1;
    let mut receives = false;
    if let Some(port) = port {
        // Other processes' devices on this host may join the same group
        // (each gets a copy, as each rxe QP would).
        sys::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one,
            "SO_REUSEADDR",
        )?;
        if v6 {
            sys::setsockopt(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                &one,
                "IPV6_V6ONLY",
            )?;
        }
        crate::udp::report_rx_headers(raw, v6)?;
        // Room for a burst, as the UDP backend's own socket has
        // (`UdpConfig::socket_buffer`): with the default ~208 KiB a
        // descheduled receiver lost part of perftest's 500-message UD
        // multicast burst (`ib_send_bw -c UD -g` beside another test), and
        // a UD receiver then waits for ever for what was lost.
        sys::set_socket_buffer(
            raw,
            sys::SO_RCVBUFFORCE,
            libc::SO_RCVBUF,
            RECEIVE_BUFFER,
            "SO_RCVBUF (multicast)",
        );
        // An interface- or link-local group (ff01::/16, ff02::/16: scope
        // 1 or 2, RFC 4291 2.7) is bound with its interface, as a link-local
        // address is; perftest's default MGID is ff01:0:2:c985::.
        let at = match group {
            IpAddr::V6(g) if matches!(g.segments()[0] & 0xf, 1 | 2) => {
                SocketAddr::V6(std::net::SocketAddrV6::new(g, port, 0, ifindex))
            }
            _ => SocketAddr::new(group, port),
        };
        let (ss, len) = crate::udp::to_sockaddr(&at);
        // SAFETY: ss holds a valid sockaddr of `len` bytes.
        let r = unsafe { libc::bind(raw, (&ss as *const libc::sockaddr_storage).cast(), len) };
        match sys::cvt(r, "bind multicast group") {
            Ok(_) => receives = true,
            Err(NicError::Sys { source, .. })
                if source.raw_os_error() == Some(libc::EADDRINUSE) => {}
            Err(e) => return Err(e),
        }
    }
    match group {
        IpAddr::V4(g) => {
            let mreq = libc::ip_mreqn {
                imr_multiaddr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(g.octets()),
                },
                imr_address: libc::in_addr {
                    s_addr: u32::from_ne_bytes(local_v4.map_or([0; 4], |a| a.octets())),
                },
                imr_ifindex: ifindex as libc::c_int,
            };
            sys::setsockopt(
                raw,
                libc::IPPROTO_IP,
                libc::IP_ADD_MEMBERSHIP,
                &mreq,
                &format!("IP_ADD_MEMBERSHIP {g}"),
            )?;
            // Only this group's datagrams on this socket (the default
            // would hand it every group the host joined, to its port).
            let zero: libc::c_int = 0;
            let _ = sys::setsockopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, &zero, "");
        }
        IpAddr::V6(g) => {
            let mreq = libc::ipv6_mreq {
                ipv6mr_multiaddr: libc::in6_addr {
                    s6_addr: g.octets(),
                },
                ipv6mr_interface: ifindex,
            };
            sys::setsockopt(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_ADD_MEMBERSHIP,
                &mreq,
                &format!("IPV6_ADD_MEMBERSHIP {g}"),
            )?;
        }
    }
    Ok((sock, receives))
}

/// The index of the interface that has address `ip` (in the calling
/// thread's namespace).
pub(crate) fn ifindex_of_addr(ip: IpAddr) -> Option<u32> {
    let ip = unmapped(ip);
    crate::ifaces::links()
        .ok()?
        .into_iter()
        .find(|l| l.addrs.iter().any(|(a, _)| *a == ip))
        .map(|l| l.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_macs() {
        let m = |s: &str| multicast_mac(s.parse().unwrap());
        assert_eq!(m("239.129.2.3"), Some([0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]));
        assert_eq!(
            m("::ffff:224.0.0.251"),
            Some([0x01, 0x00, 0x5e, 0, 0, 0xfb])
        );
        assert_eq!(m("ff0e::1:2:3:4"), Some([0x33, 0x33, 0, 3, 0, 4]));
        assert_eq!(m("198.18.0.1"), None);
        assert_eq!(m("fd00::1"), None);
    }

    /// perftest's default MGID is interface-local (ff01:0:2:c985::): the
    /// receiving socket binds it with its interface as the scope.
    #[test]
    fn a_scoped_ipv6_group_binds_with_its_interface() {
        let Some(lo) = ifindex_of_addr("::1".parse().unwrap()) else {
            eprintln!("SKIP a_scoped_ipv6_group_binds_with_its_interface: lo has no ::1");
            return;
        };
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .unwrap()
            .port();
        let mut m = Memberships::new(lo, Some("::1".parse().unwrap()), Some(port));
        for g in ["ff01:0:2:c985::", "ff02::1:7"] {
            let g: IpAddr = g.parse().unwrap();
            m.join(g).unwrap();
            assert!(m.receive_fd(g).is_some(), "{g}");
        }
    }

    #[test]
    fn loopback_has_an_index_and_joins_a_group() {
        let lo = ifindex_of_addr("127.0.0.1".parse().unwrap());
        assert!(lo.is_some());
        let mut m = Memberships::new(0, Some("127.0.0.1".parse().unwrap()), None);
        let g: IpAddr = "239.255.7.1".parse().unwrap();
        m.join(g).unwrap();
        m.join(g).unwrap();
        assert!(m.join("198.18.0.1".parse().unwrap()).is_err());
        assert!(m.leave(g).unwrap().is_none());
        assert!(m.leave(g).unwrap().is_some());
        assert!(m.leave(g).is_err());
        assert!(m.groups.is_empty());
    }
}
