//! The network interfaces of the calling thread's namespace and their
//! addresses, from getifaddrs(3) (netlink underneath) and one ioctl per
//! interface for its MTU: no `ip` binary (minimal containers have none), no
//! privileges, no process started (rdma_resolve_addr asks on every call),
//! and the thread's own namespace even where `/sys` shows another's.

use std::net::IpAddr;

use crate::NicError;
use crate::{netlink, sys};

/// One network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub index: u32,
    /// The Ethernet address; zero for links of other kinds (loopback, tun).
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Up with a carrier (IFF_RUNNING): what an rxe port on it reports as ACTIVE.
    pub running: bool,
    /// Addresses and prefix lengths in the kernel's order: IPv4 first,
    /// primary before secondary, as `ip -o addr` lists them.
    pub addrs: Vec<(IpAddr, u8)>,
}

/// The index of the interface `name` in the calling thread's network
/// namespace; None if there is none.
pub fn index(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: name is a NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (i != 0).then_some(i)
}

/// An interface's state, as an rxe port follows its netdev's: the port is
/// active while the interface is up and has a carrier (netif_running and
/// netif_carrier_ok).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkState {
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Has a carrier: ethtool's link state (netif_carrier_ok, at once);
    /// where the driver does not give one, IFF_RUNNING (the operational
    /// state, which the kernel updates up to a second later).
    pub running: bool,
}

impl LinkState {
    /// What an rxe port on it reports as ACTIVE.
    pub fn active(&self) -> bool {
        self.up && self.running
    }
}

/// Asks after one interface, by index, through sockets of the namespace it
/// was made in (so any thread may ask, whatever its own namespace).
#[derive(Debug)]
pub struct LinkWatch {
    sock: std::os::fd::OwnedFd,
    /// The kernel's link messages (None where no netlink socket could be
    /// opened: then only the state at each look is seen).
    events: Option<std::os::fd::OwnedFd>,
    index: u32,
    /// The flag of a link message that gives the carrier, by the rule of
    /// [`LinkWatch::state`]: IFF_LOWER_UP (netif_carrier_ok) where the
    /// driver gives ethtool's link state, else IFF_RUNNING.
    carrier_flag: u32,
}

impl LinkWatch {
    /// Watches the interface `name` of the calling thread's namespace.
    pub fn new(name: &str) -> Result<LinkWatch, NicError> {
        let index = index(name).ok_or_else(|| NicError::NoSuchInterface(name.into()))?;
        let sock: std::os::fd::OwnedFd = ioctl_socket()?.into();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        let ethtool = sys::if_state_by_index(fd, index).is_some_and(|(_, c)| c.is_some());
        let carrier_flag = if ethtool {
            libc::IFF_LOWER_UP
        } else {
            libc::IFF_RUNNING
        } as u32;
        Ok(LinkWatch {
            sock,
            events: netlink::route_socket(libc::RTMGRP_LINK as u32, true).ok(),
            index,
            carrier_flag,
        })
    }

    /// The interface's state now; None once it is gone.
    pub fn state(&self) -> Option<LinkState> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.sock);
        let (flags, carrier) = sys::if_state_by_index(fd, self.index)?;
        Some(LinkState {
            up: flags & libc::IFF_UP != 0,
            running: carrier.unwrap_or(flags & libc::IFF_RUNNING != 0),
        })
    }

    /// The states the interface went through since the last call, oldest
    /// first (one per message the kernel sent about it, so a link that went
    /// down and up again between two looks shows both), then its state now.
    /// Empty once it is gone.
    pub fn states(&self) -> Vec<LinkState> {
        let mut out = Vec::new();
        if let Some(events) = &self.events {
            let mut buf = [0u8; 8192];
            loop {
                match netlink::recv(events, &mut buf) {
                    Ok(n) => link_messages(
                        buf.get(..n).unwrap_or(&[]),
                        self.index,
                        self.carrier_flag,
                        &mut out,
                    ),
                    // Messages lost to a full queue: the state now still ends the list.
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                    Err(_) => break,
                }
            }
        }
        match self.state() {
            Some(now) => out.push(now),
            None => out.clear(),
        }
        out
    }
}

/// Appends to `out` the state each RTM_NEWLINK in `msgs` (one datagram of
/// route netlink messages) gives interface `index`: IFF_UP, and the carrier
/// from `carrier_flag`. Layout: linux/rtnetlink.h (ifinfomsg: index at 4,
/// flags at 8). A bad message ends the datagram.
fn link_messages(msgs: &[u8], index: u32, carrier_flag: u32, out: &mut Vec<LinkState>) {
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    for (kind, body) in netlink::messages(msgs).map_while(Result::ok) {
        if kind != libc::RTM_NEWLINK {
            continue;
        }
        if let (Some(i), Some(flags)) = (word(body, 4), word(body, 8)) {
            if i == index {
                out.push(LinkState {
                    up: flags & libc::IFF_UP as u32 != 0,
                    running: flags & carrier_flag != 0,
                });
            }
        }
    }
}

/// The interfaces in index order, as `ip -o link` lists them.
pub fn links() -> Result<Vec<Link>, NicError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(NicError::last_os("getifaddrs"));
    }
    let mut out: Vec<Link> = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_name.is_null() || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points to a sockaddr of at least the family field.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family == libc::AF_PACKET {
            // glibc lists every link first, one AF_PACKET entry each, in
            // the kernel's (index) order.
            // SAFETY: an AF_PACKET entry's address is a sockaddr_ll.
            let ll = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_ll) };
            let mut mac = [0u8; 6];
            if ll.sll_hatype == libc::ARPHRD_ETHER && ll.sll_halen == 6 {
                mac.copy_from_slice(&ll.sll_addr[..6]);
            }
            out.push(Link {
                name,
                index: u32::try_from(ll.sll_ifindex).unwrap_or(0),
                mac,
                mtu: 0,
                up: ifa.ifa_flags & libc::IFF_UP as u32 != 0,
                running: ifa.ifa_flags & libc::IFF_RUNNING as u32 != 0,
                addrs: Vec::new(),
            });
            continue;
        }
        let (Some(ip), prefix) = (ip_of(ifa.ifa_addr), prefix_len(ifa.ifa_netmask)) else {
            continue;
        };
        // An IPv4 address with a label ("eth0:1") is listed under it.
        let owner = match out.iter().position(|l| l.name == name) {
            Some(i) => Some(i),
            None => name
                .split_once(':')
                .and_then(|(base, _)| out.iter().position(|l| l.name == base)),
        };
        if let Some(i) = owner {
            out[i].addrs.push((ip, prefix));
        }
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    let sock = ioctl_socket()?;
    for l in &mut out {
        // An interface gone since the listing keeps the default.
        l.mtu = sys::if_mtu(std::os::fd::AsRawFd::as_raw_fd(&sock), &l.name)
            .map_or(1500, |m| u32::try_from(m).unwrap_or(u32::MAX));
    }
    Ok(out)
}

/// A socket of the calling thread's namespace to ask interface ioctls through.
fn ioctl_socket() -> Result<std::net::UdpSocket, NicError> {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .or_else(|_| std::net::UdpSocket::bind("[::]:0"))
        .map_err(|e| NicError::io("socket for interface ioctls", e))
}

/// The IP address of an AF_INET / AF_INET6 sockaddr (None otherwise).
fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    // SAFETY: sa is non-null and starts with the family field; the family
    // says which struct the whole is.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                Some(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                Some(IpAddr::from(sin6.sin6_addr.s6_addr))
            }
            _ => None,
        }
    }
}

/// The prefix length of a netmask sockaddr (0 when absent).
fn prefix_len(mask: *const libc::sockaddr) -> u8 {
    if mask.is_null() {
        return 0;
    }
    let ones = match ip_of(mask) {
        Some(IpAddr::V4(m)) => u32::from(m).count_ones(),
        Some(IpAddr::V6(m)) => u128::from(m).count_ones(),
        None => 0,
    };
    ones as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_watched_active() {
        let w = LinkWatch::new("lo").unwrap();
        assert_eq!(
            w.state(),
            Some(LinkState {
                up: true,
                running: true
            })
        );
        assert!(LinkWatch::new("no-such-if0").is_err());
    }

    /// An RTM_NEWLINK (nlmsghdr + ifinfomsg, no attributes) for `index` with `flags`.
    fn newlink(index: u32, flags: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes());
        m.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[0, 0, 1, 0]);
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m
    }

    #[test]
    fn link_messages_give_each_state_of_the_interface_in_order() {
        let (up, lower, running) = (
            libc::IFF_UP as u32,
            libc::IFF_LOWER_UP as u32,
            libc::IFF_RUNNING as u32,
        );
        let mut msgs = newlink(7, 0);
        msgs.extend(newlink(8, up | lower));
        msgs.extend(newlink(7, up));
        msgs.extend(newlink(7, up | lower));
        let mut out = Vec::new();
        link_messages(&msgs, 7, lower, &mut out);
        let state = |up, running| LinkState { up, running };
        assert_eq!(
            out,
            [state(false, false), state(true, false), state(true, true)]
        );
        // Without ethtool's link state the carrier is IFF_RUNNING, as in state().
        out.clear();
        link_messages(&newlink(7, up | lower), 7, running, &mut out);
        link_messages(&newlink(7, up | running), 7, running, &mut out);
        assert_eq!(out, [state(true, false), state(true, true)]);
        // Cut short, a length past the end or below a header: nothing read, no panic.
        for bad in [&msgs[..20], &msgs[..35]] {
            out.clear();
            link_messages(bad, 7, lower, &mut out);
            assert!(out.len() <= 1, "{out:?}");
        }
        let mut short = newlink(7, up);
        short[0] = 8;
        out.clear();
        link_messages(&short, 7, lower, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn states_end_with_the_state_now() {
        let w = LinkWatch::new("lo").unwrap();
        assert_eq!(
            w.states().last(),
            Some(&LinkState {
                up: true,
                running: true
            })
        );
    }

    #[test]
    fn loopback_is_listed_up_with_its_addresses() {
        let links = links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").expect("lo");
        assert!(lo.up);
        assert_eq!(lo.mac, [0; 6]);
        assert!(lo.mtu >= 1280, "{lo:?}");
        assert!(
            lo.addrs.contains(&("127.0.0.1".parse().unwrap(), 8)),
            "{lo:?}"
        );
    }
}
