//! Just enough Ethernet / VLAN / IPv4 / IPv6 / UDP to classify frames, strip
//! headers (UDP backend TX), and synthesise them (UDP backend RX, tests). The
//! full header types live in `ferroce-stack`; this crate stays independent.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::NicError;

/// RoCE v2 UDP destination port (IANA; IBTA Annex A17).
pub const ROCE_V2_PORT: u16 = 4791;
/// Ethernet header without VLAN tag.
pub const ETH_HLEN: usize = 14;
/// IPv4 header without options.
pub const IPV4_HLEN: usize = 20;
/// IPv6 fixed header.
pub const IPV6_HLEN: usize = 40;
/// UDP header.
pub const UDP_HLEN: usize = 8;
/// EtherTypes (IEEE 802 numbers, linux/if_ether.h).
pub const ETH_P_IP: u16 = 0x0800;
/// IPv6 EtherType.
pub const ETH_P_IPV6: u16 = 0x86DD;
/// 802.1Q VLAN tag EtherType.
pub const ETH_P_8021Q: u16 = 0x8100;
/// 802.1ad service VLAN tag EtherType.
pub const ETH_P_8021AD: u16 = 0x88A8;
const IPPROTO_UDP: u8 = 17;

/// What a UDP-over-IP frame says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// VLAN id and priority (TCI) when one 802.1Q tag is present.
    pub vlan_tci: Option<u16>,
    /// Source address and UDP port.
    pub src: SocketAddr,
    /// Destination address and UDP port.
    pub dst: SocketAddr,
    /// IPv4 ToS / IPv6 traffic class (DSCP + ECN).
    pub tos: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub ttl: u8,
    /// Offset of the UDP payload in the frame.
    pub payload_offset: usize,
    /// UDP payload length (from the UDP header, bounded by the frame).
    pub payload_len: usize,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parses an Ethernet (optionally one VLAN tag) / IPv4 or IPv6 / UDP frame.
/// IPv6 extension headers and IPv4 fragments are refused (RoCE uses neither).
pub fn parse_udp(frame: &[u8]) -> Result<FrameInfo, NicError> {
    parse_udp_of(frame, frame.len())
}

/// [`parse_udp`] for a frame of `len` bytes of which only the first part,
/// `frame` (at least up to the UDP header), is at hand: a gathered frame
/// whose payload lies elsewhere.
pub fn parse_udp_of(frame: &[u8], len: usize) -> Result<FrameInfo, NicError> {
    udp_of(frame, len).map_err(NicError::Malformed)
}

// The reasons stay plain `&'static str` until the end: an eagerly built
// `NicError` in every `ok_or` was dropped again on every good frame, ~1 %
// of a sender's time (the TX path parses each frame it sends).
fn udp_of(frame: &[u8], len: usize) -> Result<FrameInfo, &'static str> {
    let mut off = ETH_HLEN;
    let mut ethertype = be16(frame, 12).ok_or("shorter than Ethernet header")?;
    let mut vlan_tci = None;
    if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        vlan_tci = Some(be16(frame, 14).ok_or("truncated VLAN tag")?);
        ethertype = be16(frame, 16).ok_or("truncated VLAN tag")?;
        off += 4;
    }
    let mut dst_mac = [0u8; 6];
    let mut src_mac = [0u8; 6];
    dst_mac.copy_from_slice(frame.get(0..6).ok_or("short")?);
    src_mac.copy_from_slice(frame.get(6..12).ok_or("short")?);
    let ip = frame.get(off..).ok_or("no IP header")?;
    let (src_ip, dst_ip, tos, ttl, udp_off): (IpAddr, IpAddr, u8, u8, usize) = match ethertype {
        ETH_P_IP => {
            let h = ip.get(..IPV4_HLEN).ok_or("truncated IPv4 header")?;
            if h[0] >> 4 != 4 {
                return Err("IPv4 version field is not 4");
            }
            let ihl = usize::from(h[0] & 0x0F) * 4;
            if ihl < IPV4_HLEN || ip.len() < ihl {
                return Err("bad IPv4 header length");
            }
            if h[9] != IPPROTO_UDP {
                return Err("IPv4 payload is not UDP");
            }
            if u16::from_be_bytes([h[6], h[7]]) & 0x3FFF != 0 {
                return Err("IPv4 fragment");
            }
            let s = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
            let d = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
            (s.into(), d.into(), h[1], h[8], off + ihl)
        }
        ETH_P_IPV6 => {
            let h = ip.get(..IPV6_HLEN).ok_or("truncated IPv6 header")?;
            if h[0] >> 4 != 6 {
                return Err("IPv6 version field is not 6");
            }
            if h[6] != IPPROTO_UDP {
                return Err("IPv6 next header is not UDP");
            }
            let tc = (h[0] << 4) | (h[1] >> 4);
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&h[8..24]);
            d.copy_from_slice(&h[24..40]);
            (
                Ipv6Addr::from(s).into(),
                Ipv6Addr::from(d).into(),
                tc,
                h[7],
                off + IPV6_HLEN,
            )
        }
        _ => return Err("not IPv4 or IPv6"),
    };
    let udp = frame
        .get(udp_off..udp_off + UDP_HLEN)
        .ok_or("truncated UDP header")?;
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    let dport = u16::from_be_bytes([udp[2], udp[3]]);
    let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    let payload_offset = udp_off + UDP_HLEN;
    let avail = len.saturating_sub(payload_offset);
    if ulen < UDP_HLEN || ulen - UDP_HLEN > avail {
        return Err("UDP length disagrees with the frame");
    }
    Ok(FrameInfo {
        dst_mac,
        src_mac,
        vlan_tci,
        src: SocketAddr::new(src_ip, sport),
        dst: SocketAddr::new(dst_ip, dport),
        tos,
        ttl,
        payload_offset,
        payload_len: ulen - UDP_HLEN,
    })
}

/// Whether a `len`-byte frame starting with `head` fits a link of `mtu`:
/// an untagged frame may carry `mtu` bytes after its 14-byte Ethernet header,
/// one with an 802.1Q/802.1ad tag 4 bytes more (the kernel's own rule,
/// net/packet/af_packet.c packet_extra_vlan_len_allowed). Too short → false.
pub fn fits_mtu(head: &[u8], len: usize, mtu: usize) -> bool {
    if len < ETH_HLEN || head.len() < ETH_HLEN {
        return false;
    }
    let tagged = matches!(
        u16::from_be_bytes([head[12], head[13]]),
        ETH_P_8021Q | ETH_P_8021AD
    );
    len <= ETH_HLEN + mtu + if tagged { 4 } else { 0 }
}

/// Length of the Ethernet/IP/UDP headers `write_headers` emits.
pub fn header_len(ipv6: bool) -> usize {
    ETH_HLEN + if ipv6 { IPV6_HLEN } else { IPV4_HLEN } + UDP_HLEN
}

/// The 16-bit one's complement sum used by the IPv4 header checksum (RFC 1071).
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in h.chunks(2) {
        let w = match c {
            [a, b] => u16::from_be_bytes([*a, *b]),
            [a] => u16::from_be_bytes([*a, 0]),
            _ => 0,
        };
        sum += u32::from(w);
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// Header values for [`write_headers`].
#[derive(Debug, Clone, Copy)]
pub struct HeaderSpec {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Source IP and UDP port.
    pub src: SocketAddr,
    /// Destination IP and UDP port (both must be the same family as `src`).
    pub dst: SocketAddr,
    /// ToS / traffic class.
    pub tos: u8,
    /// TTL / hop limit.
    pub ttl: u8,
}

/// Writes Ethernet/IP/UDP headers for a `payload_len`-byte UDP payload at the
/// start of `buf`, as rxe emits them (IPv4 DF set, id 0, UDP checksum 0).
/// Returns the header length. The IPv4 header checksum is computed.
pub fn write_headers(
    buf: &mut [u8],
    spec: &HeaderSpec,
    payload_len: usize,
) -> Result<usize, NicError> {
    let v6 = match (spec.src.ip(), spec.dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => false,
        (IpAddr::V6(_), IpAddr::V6(_)) => true,
        _ => {
            return Err(NicError::Malformed(
                "source and destination families differ",
            ))
        }
    };
    let hlen = header_len(v6);
    let ip_len = if v6 { IPV6_HLEN } else { IPV4_HLEN };
    let udp_len = UDP_HLEN + payload_len;
    if udp_len > usize::from(u16::MAX) || (!v6 && udp_len + IPV4_HLEN > usize::from(u16::MAX)) {
        return Err(NicError::FrameTooLong {
            len: hlen + payload_len,
            max: usize::from(u16::MAX),
        });
    }
    let blen = buf.len();
    let h = buf.get_mut(..hlen).ok_or(NicError::FrameTooLong {
        len: hlen,
        max: blen,
    })?;
    h[0..6].copy_from_slice(&spec.dst_mac);
    h[6..12].copy_from_slice(&spec.src_mac);
    let (ip, udp) = h[ETH_HLEN..].split_at_mut(ip_len);
    match (spec.src.ip(), spec.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ip[0] = 0x45;
            ip[1] = spec.tos;
            ip[2..4].copy_from_slice(&((IPV4_HLEN + udp_len) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&[0, 0]);
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF, as rxe sets it
            ip[8] = spec.ttl;
            ip[9] = IPPROTO_UDP;
            ip[10..12].copy_from_slice(&[0, 0]);
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = ipv4_checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ip[0] = 0x60 | (spec.tos >> 4);
            ip[1] = spec.tos << 4;
            ip[2..4].copy_from_slice(&[0, 0]);
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = IPPROTO_UDP;
            ip[7] = spec.ttl;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
        }
        _ => {
            return Err(NicError::Malformed(
                "source and destination families differ",
            ))
        }
    }
    udp[0..2].copy_from_slice(&spec.src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&spec.dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]); // rxe sends UDP checksum 0; the ICRC protects the payload
    let et = if v6 { ETH_P_IPV6 } else { ETH_P_IP };
    h[12..14].copy_from_slice(&et.to_be_bytes());
    Ok(hlen)
}

/// Builds a whole frame (headers + `payload`) into a new Vec: for tests and
/// the bench.
pub fn build_udp_frame(spec: &HeaderSpec, payload: &[u8]) -> Result<Vec<u8>, NicError> {
    let v6 = spec.src.is_ipv6();
    let mut v = vec![0u8; header_len(v6) + payload.len()];
    let h = write_headers(&mut v, spec, payload.len())?;
    v[h..].copy_from_slice(payload);
    Ok(v)
}

/// A locally administered MAC derived from an IP address, for backends that
/// have no link layer (UDP) and for tests. Stable: same IP, same MAC.
pub fn mac_for_ip(ip: IpAddr) -> [u8; 6] {
    let o: [u8; 16] = match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    // FNV-1a over the address; 0x02 = locally administered, unicast.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in o {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    [0x02, b[1], b[2], b[3], b[4], b[5]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(src: &str, dst: &str) -> HeaderSpec {
        HeaderSpec {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            tos: 0x02,
            ttl: 64,
        }
    }

    #[test]
    fn v4_roundtrip_and_golden_bytes() {
        let f = build_udp_frame(&spec("198.18.0.1:49152", "198.18.0.2:4791"), &[0xAA; 4]).unwrap();
        assert_eq!(f.len(), 14 + 20 + 8 + 4);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        // version/IHL, ToS, total length 32, id 0, DF, TTL 64, UDP
        assert_eq!(
            &f[14..24],
            &[0x45, 0x02, 0x00, 0x20, 0, 0, 0x40, 0x00, 64, 17]
        );
        assert_eq!(ipv4_checksum(&f[14..34]), 0, "checksum verifies");
        assert_eq!(&f[34..42], &[0xC0, 0x00, 0x12, 0xB7, 0x00, 0x0C, 0, 0]);
        let i = parse_udp(&f).unwrap();
        assert_eq!(i.src, "198.18.0.1:49152".parse().unwrap());
        assert_eq!(i.dst.port(), ROCE_V2_PORT);
        assert_eq!(
            (i.tos, i.ttl, i.payload_offset, i.payload_len),
            (2, 64, 42, 4)
        );
    }

    #[test]
    fn v6_roundtrip() {
        let f = build_udp_frame(&spec("[fd00::1]:1000", "[fd00::2]:4791"), &[1, 2, 3]).unwrap();
        assert_eq!(f.len(), 14 + 40 + 8 + 3);
        assert_eq!(&f[12..14], &[0x86, 0xDD]);
        assert_eq!(
            &f[14..16],
            &[0x60, 0x20],
            "traffic class 0x02 split across bytes"
        );
        let i = parse_udp(&f).unwrap();
        assert_eq!((i.tos, i.ttl, i.payload_len), (2, 64, 3));
        assert_eq!(i.dst, "[fd00::2]:4791".parse().unwrap());
    }

    #[test]
    fn mtu_rule_allows_four_more_bytes_when_tagged() {
        let mut f = vec![0u8; 9018];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        assert!(fits_mtu(&f, 9014, 9000));
        assert!(!fits_mtu(&f, 9015, 9000));
        f[12..14].copy_from_slice(&[0x81, 0x00]);
        assert!(fits_mtu(&f, 9018, 9000));
        assert!(!fits_mtu(&f, 9019, 9000));
        assert!(!fits_mtu(&f[..10], 10, 9000));
    }

    #[test]
    fn vlan_and_garbage() {
        let mut f = build_udp_frame(&spec("10.0.0.1:1", "10.0.0.2:4791"), &[0; 8]).unwrap();
        f.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        let i = parse_udp(&f).unwrap();
        assert_eq!(i.vlan_tci, Some(5));
        assert_eq!(i.payload_offset, 46);
        for n in 0..f.len() {
            // Every truncation is an error, never a panic.
            assert!(parse_udp(&f[..n]).is_err(), "len {n}");
        }
    }
}
