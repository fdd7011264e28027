//! Neighbour resolution for the raw backends: the peer MAC for a destination
//! IP, from the kernel's neighbour table (what rxe gets through the kernel's
//! route/neighbour lookup). Read with an rtnetlink RTM_GETNEIGH dump (falling
//! back to parsing `ip neigh`); resolution is triggered by a UDP datagram to
//! the discard port, which makes the kernel run ARP / neighbour discovery.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::netlink;
use crate::netns::run;
use crate::NicError;

/// Parses a MAC written as `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in mac.iter_mut() {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The MAC the kernel has for `ip` on `ifname`, if its entry is usable
/// (anything with a link-layer address except FAILED / INCOMPLETE).
pub fn lookup(ip: IpAddr, ifname: &str) -> Result<Option<[u8; 6]>, NicError> {
    let ifindex = crate::sys::if_index(ifname)?;
    match lookup_netlink(ip, ifindex) {
        Ok(m) => Ok(m),
        Err(e) => {
            tracing::debug!("rtnetlink neighbour dump failed ({e}); asking `ip neigh`");
            let out = run(
                "ip",
                &["neigh", "show", "to", &ip.to_string(), "dev", ifname],
            )?;
            Ok(parse_neigh_line(&out))
        }
    }
}

// linux/rtnetlink.h, linux/neighbour.h
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_DUMP: u16 = 0x300;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NUD_INCOMPLETE: u16 = 0x01;
const NUD_FAILED: u16 = 0x20;
const NDMSG_LEN: usize = 12;

/// RTM_GETNEIGH dump of one family, filtered here by interface and address.
pub fn lookup_netlink(ip: IpAddr, ifindex: u32) -> Result<Option<[u8; 6]>, NicError> {
    let fd = netlink::route_socket(0, false)?;
    let family = if ip.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    } as u8;
    let mut req = [0u8; netlink::HEADER_LEN + NDMSG_LEN];
    req[0..4].copy_from_slice(&((netlink::HEADER_LEN + NDMSG_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes()); // seq
    req[netlink::HEADER_LEN] = family; // ndm_family
    netlink::send(&fd, &req, "send RTM_GETNEIGH")?;
    let want: Vec<u8> = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut buf = vec![0u8; 1 << 16];
    let mut found = None;
    loop {
        let n = netlink::recv(&fd, &mut buf).map_err(|e| NicError::io("recv rtnetlink", e))?;
        if n == 0 {
            return Ok(found);
        }
        for m in netlink::messages(buf.get(..n).unwrap_or(&[])) {
            let (kind, body) = m.map_err(|_| NicError::Malformed("rtnetlink message length"))?;
            match kind {
                netlink::NLMSG_DONE => return Ok(found),
                netlink::NLMSG_ERROR => return Err(NicError::Malformed("rtnetlink error reply")),
                RTM_NEWNEIGH => {
                    if let Some(m) = parse_newneigh(body, ifindex, &want) {
                        found = Some(m);
                    }
                }
                _ => {}
            }
        }
    }
}

/// One RTM_NEWNEIGH body: the MAC if it is for `ifindex` / `want` and usable.
fn parse_newneigh(body: &[u8], ifindex: u32, want: &[u8]) -> Option<[u8; 6]> {
    let nd = body.get(..NDMSG_LEN)?;
    let idx = i32::from_ne_bytes([nd[4], nd[5], nd[6], nd[7]]);
    let state = u16::from_ne_bytes([nd[8], nd[9]]);
    if idx as u32 != ifindex || state & (NUD_INCOMPLETE | NUD_FAILED) != 0 {
        return None;
    }
    let (mut dst, mut lladdr) = (None, None);
    let mut off = NDMSG_LEN;
    while let Some(a) = body.get(off..off + 4) {
        let alen = usize::from(u16::from_ne_bytes([a[0], a[1]]));
        let aty = u16::from_ne_bytes([a[2], a[3]]);
        if alen < 4 {
            break;
        }
        let val = body.get(off + 4..off + alen)?;
        match aty {
            NDA_DST => dst = Some(val),
            NDA_LLADDR => lladdr = Some(val),
            _ => {}
        }
        off += netlink::align4(alen);
    }
    if dst? != want {
        return None;
    }
    let l = lladdr?;
    let mut mac = [0u8; 6];
    mac.copy_from_slice(l.get(..6)?);
    (l.len() == 6).then_some(mac)
}

fn parse_neigh_line(out: &str) -> Option<[u8; 6]> {
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.iter().any(|s| *s == "FAILED" || *s == "INCOMPLETE") {
            continue;
        }
        if let Some(i) = w.iter().position(|s| *s == "lladdr") {
            if let Some(mac) = w.get(i + 1).and_then(|m| parse_mac(m)) {
                return Some(mac);
            }
        }
    }
    None
}

/// Looks `ip` up, and when missing asks the kernel to resolve it and waits
/// up to `timeout`. Runs in the calling thread's network namespace.
pub fn resolve(ip: IpAddr, ifname: &str, timeout: Duration) -> Result<[u8; 6], NicError> {
    if let Some(mac) = lookup(ip, ifname)? {
        return Ok(mac);
    }
    // An address of our own never gets a neighbour entry: say so at once.
    if UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok() {
        return Err(NicError::LocalPeer(ip));
    }
    let deadline = Instant::now() + timeout;
    let mut next_probe = Instant::now();
    loop {
        if Instant::now() >= next_probe {
            // Discard port (RFC 863): the datagram only makes the kernel resolve
            // the neighbour; the peer drops it.
            let bind: SocketAddr = if ip.is_ipv6() {
                "[::]:0".parse().map_err(|_| NicError::Malformed("addr"))?
            } else {
                "0.0.0.0:0"
                    .parse()
                    .map_err(|_| NicError::Malformed("addr"))?
            };
            if let Ok(s) = UdpSocket::bind(bind) {
                let _ = s.send_to(&[], SocketAddr::new(ip, 9));
            }
            next_probe = Instant::now() + Duration::from_millis(200);
        }
        std::thread::sleep(Duration::from_millis(10));
        if let Some(mac) = lookup(ip, ifname)? {
            return Ok(mac);
        }
        if Instant::now() >= deadline {
            return Err(NicError::NoNeighbour(ip));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_of_this_host_is_refused_at_once() {
        // Without the check it would wait out the time-out for NoNeighbour.
        let r = resolve("127.0.0.1".parse().unwrap(), "lo", Duration::from_secs(5));
        assert!(matches!(r, Err(NicError::LocalPeer(_))), "{r:?}");
    }

    #[test]
    fn newneigh_parser_never_panics() {
        // ndmsg (family 2, ifindex 3, state REACHABLE) + NDA_DST + NDA_LLADDR
        let mut m = vec![2, 0, 0, 0];
        m.extend_from_slice(&3i32.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes());
        m.extend_from_slice(&[0, 1]);
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&1u16.to_ne_bytes());
        m.extend_from_slice(&[198, 18, 0, 2]);
        m.extend_from_slice(&10u16.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes());
        m.extend_from_slice(&[2, 0xfe, 0, 0, 0, 2, 0, 0]);
        assert_eq!(
            parse_newneigh(&m, 3, &[198, 18, 0, 2]),
            Some([2, 0xfe, 0, 0, 0, 2])
        );
        assert_eq!(parse_newneigh(&m, 4, &[198, 18, 0, 2]), None);
        assert_eq!(parse_newneigh(&m, 3, &[198, 18, 0, 3]), None);
        for n in 0..m.len() {
            let _ = parse_newneigh(&m[..n], 3, &[198, 18, 0, 2]);
        }
    }

    #[test]
    fn parses_ip_neigh_output() {
        let m = parse_neigh_line("198.18.0.2 lladdr 02:fe:00:00:00:02 PERMANENT\n");
        assert_eq!(m, Some([2, 0xfe, 0, 0, 0, 2]));
        assert_eq!(parse_neigh_line("198.18.0.2 INCOMPLETE\n"), None);
        assert_eq!(
            parse_neigh_line("198.18.0.2 lladdr 02:fe:00:00:00:02 FAILED\n"),
            None
        );
        assert_eq!(parse_neigh_line(""), None);
        assert_eq!(parse_mac("02:fe:00:00:00"), None);
    }
}
