//! Neighbour resolution for the raw backends: the peer MAC for a destination
//! IP, from the kernel's neighbour table (what rxe gets through the kernel's
//! route/neighbour lookup). First step: read `ip neigh` (iproute2) rather than
//! speak rtnetlink; resolution is triggered by a UDP datagram to the discard
//! port, which makes the kernel run ARP / neighbour discovery.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

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
    let out = run(
        "ip",
        &["neigh", "show", "to", &ip.to_string(), "dev", ifname],
    )?;
    Ok(parse_neigh_line(&out))
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
