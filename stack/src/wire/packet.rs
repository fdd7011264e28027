//! A whole RoCE v2 frame: Ethernet (optionally one 802.1Q tag) / IPv4 or IPv6 /
//! UDP 4791 / BTH / extension headers / payload / pad / ICRC.
//!
//! [`ParsedPacket::parse`] checks everything a receiver must check, in the
//! order a receiver meets it: framing (Ethernet, IP, UDP lengths and port),
//! then the ICRC over the whole transport packet, then the BTH, the opcode,
//! the extension headers, pad and payload length. Each failure is its own
//! [`Error`] variant. [`PacketRepr::emit`] writes a frame into a caller's
//! buffer, filling in lengths, the IPv4 header checksum, pad and ICRC.
//!
//! Ethernet, IPv4, IPv6 and UDP go through smoltcp's `wire` views; smoltcp
//! has no 802.1Q support, so the four-byte tag is handled here.

use core::net::{Ipv4Addr, Ipv6Addr};

use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet,
    Ipv6Packet, UdpPacket,
};

use super::error::{check_len, Error, Layer, Result};
use super::opcode::{Ext, OpcodeInfo};
use super::{aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, icrc, ieth, immdt, reth};

/// The RoCE v2 UDP destination port (IANA; IBTA Annex A17.2.1).
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Largest payload of one packet: the largest IB path MTU.
pub const MAX_PAYLOAD: usize = 4096;
const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const TPID_8021Q: u16 = 0x8100;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
/// IPv4 TTL / IPv6 hop limit rxe uses by default (Linux net.ipv4.ip_default_ttl).
pub const DEFAULT_TTL: u8 = 64;

/// One 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

impl VlanTag {
    fn tci(&self) -> u16 {
        (u16::from(self.pcp & 7) << 13) | (u16::from(self.dei) << 12) | (self.vid & 0x0fff)
    }
    fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }
}

/// The Ethernet header fields of a RoCE v2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct EthernetHeader {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub vlan: Option<VlanTag>,
}

impl EthernetHeader {
    pub const fn header_len(&self) -> usize {
        ETH_LEN + if self.vlan.is_some() { VLAN_LEN } else { 0 }
    }
}

/// The IP header fields of a RoCE v2 frame (lengths and checksums are derived).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum IpHeader {
    V4 {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        /// 6-bit DSCP.
        dscp: u8,
        /// 2-bit ECN (IBTA A17.9: CE marks congestion).
        ecn: u8,
        ttl: u8,
        ident: u16,
    },
    V6 {
        src: Ipv6Addr,
        dst: Ipv6Addr,
        traffic_class: u8,
        /// 20-bit flow label.
        flow_label: u32,
        hop_limit: u8,
    },
}

impl IpHeader {
    /// An IPv4 header with rxe's defaults (TTL 64, DSCP/ECN 0).
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr) -> IpHeader {
        IpHeader::V4 {
            src,
            dst,
            dscp: 0,
            ecn: 0,
            ttl: DEFAULT_TTL,
            ident: 0,
        }
    }
    /// An IPv6 header with rxe's defaults (hop limit 64, class and label 0).
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr) -> IpHeader {
        IpHeader::V6 {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: DEFAULT_TTL,
        }
    }
    pub const fn header_len(&self) -> usize {
        match self {
            IpHeader::V4 { .. } => IPV4_LEN,
            IpHeader::V6 { .. } => IPV6_LEN,
        }
    }
    pub const fn is_ipv6(&self) -> bool {
        matches!(self, IpHeader::V6 { .. })
    }
    /// Source address as an IPv6 address (IPv4 mapped as `::ffff:a.b.c.d`, as in a GID).
    pub fn src_gid(&self) -> Ipv6Addr {
        match *self {
            IpHeader::V4 { src, .. } => src.to_ipv6_mapped(),
            IpHeader::V6 { src, .. } => src,
        }
    }
    /// Destination address as an IPv6 address (IPv4 mapped).
    pub fn dst_gid(&self) -> Ipv6Addr {
        match *self {
            IpHeader::V4 { dst, .. } => dst.to_ipv6_mapped(),
            IpHeader::V6 { dst, .. } => dst,
        }
    }
}

/// The extension headers present in a packet (which ones depends on the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ExtHeaders {
    pub reth: Option<reth::Repr>,
    pub aeth: Option<aeth::Repr>,
    pub atomic_eth: Option<atomic_eth::Repr>,
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    pub immdt: Option<immdt::Repr>,
    pub ieth: Option<ieth::Repr>,
    pub deth: Option<deth::Repr>,
    pub cnp: Option<cnp::Repr>,
}

impl ExtHeaders {
    fn has(&self, ext: Ext) -> bool {
        match ext {
            Ext::Reth => self.reth.is_some(),
            Ext::Aeth => self.aeth.is_some(),
            Ext::AtomicEth => self.atomic_eth.is_some(),
            Ext::AtomicAckEth => self.atomic_ack_eth.is_some(),
            Ext::ImmDt => self.immdt.is_some(),
            Ext::Ieth => self.ieth.is_some(),
            Ext::Deth => self.deth.is_some(),
            Ext::Cnp => self.cnp.is_some(),
        }
    }
    fn count(&self) -> usize {
        [
            self.reth.is_some(),
            self.aeth.is_some(),
            self.atomic_eth.is_some(),
            self.atomic_ack_eth.is_some(),
            self.immdt.is_some(),
            self.ieth.is_some(),
            self.deth.is_some(),
            self.cnp.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count()
    }
}

/// Everything in a RoCE v2 frame except the payload bytes: what the
/// transport fills in to send, and what a parse gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PacketRepr {
    pub eth: EthernetHeader,
    pub ip: IpHeader,
    /// UDP source port: per-flow entropy (rxe: 0xC000 | hash of the QPNs).
    pub udp_src_port: u16,
    pub bth: bth::Repr,
    pub ext: ExtHeaders,
}

/// Pad bytes that round `payload_len` up to a multiple of 4.
pub const fn pad_for(payload_len: usize) -> usize {
    (4 - (payload_len & 3)) & 3
}

impl PacketRepr {
    /// Ethernet, IP, UDP, BTH and extension headers, in bytes.
    pub fn header_len(&self) -> Result<usize> {
        Ok(self.eth.header_len()
            + self.ip.header_len()
            + UDP_LEN
            + self.bth.opcode.info()?.header_len())
    }

    /// The whole frame length for a payload of `payload_len` bytes (headers,
    /// payload, pad, ICRC; no Ethernet FCS).
    pub fn buffer_len(&self, payload_len: usize) -> Result<usize> {
        Ok(self.header_len()? + payload_len + pad_for(payload_len) + icrc::ICRC_LEN)
    }

    /// Emit a frame carrying `payload`; returns its length.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        self.emit_with(buf, payload.len(), |dst| dst.copy_from_slice(payload))
    }

    /// Emit a frame whose `payload_len` payload bytes `fill` writes in place
    /// (so the transport can copy straight from a memory region into the
    /// frame). Sets the BTH pad count, the lengths, the IPv4 checksum and the
    /// ICRC; the UDP checksum is 0 as rxe sends it. Returns the frame length.
    pub fn emit_with(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        let total = self.buffer_len(payload_len)?;
        if buf.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                have: buf.len(),
            });
        }
        let buf = &mut buf[..total];
        let (l3_at, at, variant) = self.emit_headers(buf, payload_len, total)?;
        let pad = pad_for(payload_len);
        fill(&mut buf[at..at + payload_len]);
        let end = at + payload_len;
        buf[end..end + pad].fill(0);
        let crc = icrc::compute_masked(&buf[l3_at..end + pad]);
        icrc::unmask(&mut buf[l3_at..], variant);
        buf[end + pad..end + pad + icrc::ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(total)
    }

    /// Emit a frame carrying `payload` without copying it: the headers go to
    /// `buf[..head]` and the pad and ICRC right after them, to
    /// `buf[head..head + tail]`; the frame on the wire is `buf[..head]`,
    /// `payload`, `buf[head..head + tail]`. Returns `(head, tail)`. For a
    /// backend that hands the payload to the kernel where it lies.
    pub fn emit_split(&self, buf: &mut [u8], payload: &[u8]) -> Result<(usize, usize)> {
        let payload_len = payload.len();
        let pad = pad_for(payload_len);
        let head = self.header_len()?;
        let tail = pad + icrc::ICRC_LEN;
        if buf.len() < head + tail {
            return Err(Error::BufferTooSmall {
                needed: head + tail,
                have: buf.len(),
            });
        }
        let (l3_at, at, variant) =
            self.emit_headers(&mut buf[..head], payload_len, head + payload_len + tail)?;
        debug_assert_eq!(at, head);
        let mut h = icrc::lrh_hasher();
        h.update(&buf[l3_at..head]);
        h.update(payload);
        h.update(&[0u8; 3][..pad]);
        let crc = h.finalize();
        icrc::unmask(&mut buf[l3_at..], variant);
        buf[head..head + pad].fill(0);
        buf[head + pad..head + tail].copy_from_slice(&crc.to_le_bytes());
        Ok((head, tail))
    }

    /// Writes the headers of a frame with a `payload_len`-byte payload and
    /// `total` bytes in all (the caller's [`PacketRepr::buffer_len`]) into
    /// `buf` (at least the headers long), with the ICRC's variant fields
    /// masked to ones. Returns where the IP header and the payload start,
    /// and the masked fields to put back after hashing.
    fn emit_headers(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        total: usize,
    ) -> Result<(usize, usize, icrc::Variant)> {
        let info = self.bth.opcode.info()?;
        self.check_headers(info, payload_len)?;
        let pad = pad_for(payload_len);
        let l3_at = self.emit_ethernet(buf);
        let udp_at = l3_at + self.ip.header_len();
        let udp_len = total - udp_at;
        self.emit_ip(&mut buf[l3_at..], udp_len);
        {
            let mut udp = UdpPacket::new_unchecked(&mut buf[udp_at..udp_at + UDP_LEN]);
            udp.set_src_port(self.udp_src_port);
            udp.set_dst_port(ROCEV2_UDP_PORT);
            udp.set_len(udp_len as u16);
            udp.set_checksum(0);
        }
        let bth_at = udp_at + UDP_LEN;
        let mut b = self.bth;
        b.pad_count = pad as u8;
        b.emit(&mut bth::Packet::new_unchecked(&mut buf[bth_at..]));
        let mut at = bth_at + bth::HEADER_LEN;
        for ext in info.headers {
            self.emit_ext(*ext, &mut buf[at..]);
            at += ext.header_len();
        }
        // The ICRC's variant fields go to ones now and back after the CRC,
        // so the packet is hashed in one pass without copying its headers.
        let variant =
            icrc::mask_in_place(&mut buf[l3_at..], self.ip.is_ipv6()).ok_or(Error::Truncated {
                layer: Layer::Icrc,
                needed: at,
                have: buf.len(),
            })?;
        Ok((l3_at, at, variant))
    }

    fn check_headers(&self, info: &OpcodeInfo, payload_len: usize) -> Result<()> {
        for ext in info.headers {
            if !self.ext.has(*ext) {
                return Err(Error::HeaderMismatch {
                    opcode: info.opcode.0,
                });
            }
        }
        if self.ext.count() != info.headers.len() {
            return Err(Error::HeaderMismatch {
                opcode: info.opcode.0,
            });
        }
        if !info.has_payload && payload_len != 0 {
            return Err(Error::UnexpectedPayload {
                opcode: info.opcode.0,
                len: payload_len,
            });
        }
        if payload_len > MAX_PAYLOAD {
            return Err(Error::PayloadTooLong(payload_len));
        }
        Ok(())
    }

    fn emit_ethernet(&self, buf: &mut [u8]) -> usize {
        let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.set_dst_addr(EthernetAddress(self.eth.dst));
        eth.set_src_addr(EthernetAddress(self.eth.src));
        let inner = match self.ip {
            IpHeader::V4 { .. } => EthernetProtocol::Ipv4,
            IpHeader::V6 { .. } => EthernetProtocol::Ipv6,
        };
        match self.eth.vlan {
            None => {
                eth.set_ethertype(inner);
                ETH_LEN
            }
            Some(tag) => {
                eth.set_ethertype(EthernetProtocol::Unknown(TPID_8021Q));
                buf[ETH_LEN..ETH_LEN + 2].copy_from_slice(&tag.tci().to_be_bytes());
                buf[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&u16::from(inner).to_be_bytes());
                ETH_LEN + VLAN_LEN
            }
        }
    }

    fn emit_ip(&self, buf: &mut [u8], udp_len: usize) {
        match self.ip {
            IpHeader::V4 {
                src,
                dst,
                dscp,
                ecn,
                ttl,
                ident,
            } => {
                // The header as its ten 16-bit words (RFC 791), so the
                // checksum is summed from values, not read back from `buf`.
                let (s, d) = (u32::from(src), u32::from(dst));
                let mut words = [
                    // Version 4, IHL 5 words; DSCP and ECN.
                    u16::from_be_bytes([0x45, (dscp << 2) | (ecn & 0x03)]),
                    (IPV4_LEN + udp_len) as u16,
                    ident,
                    // DF set, offset 0: rxe sets DF (rxe_net.c
                    // prepare_ipv4_hdr), RoCE is never fragmented.
                    0x4000,
                    u16::from_be_bytes([ttl, u8::from(IpProtocol::Udp)]),
                    0, // the checksum, summed as zero
                    (s >> 16) as u16,
                    s as u16,
                    (d >> 16) as u16,
                    d as u16,
                ];
                words[5] = !fold_ones_sum(words.iter().map(|w| u64::from(*w)).sum());
                for (b, w) in buf[..IPV4_LEN].chunks_exact_mut(2).zip(words) {
                    b.copy_from_slice(&w.to_be_bytes());
                }
            }
            IpHeader::V6 {
                src,
                dst,
                traffic_class,
                flow_label,
                hop_limit,
            } => {
                let mut ip = Ipv6Packet::new_unchecked(&mut buf[..IPV6_LEN]);
                ip.set_version(6);
                ip.set_traffic_class(traffic_class);
                ip.set_flow_label(flow_label & 0x000f_ffff);
                ip.set_payload_len(udp_len as u16);
                ip.set_next_header(IpProtocol::Udp);
                ip.set_hop_limit(hop_limit);
                ip.set_src_addr(src);
                ip.set_dst_addr(dst);
            }
        }
    }

    fn emit_ext(&self, ext: Ext, buf: &mut [u8]) {
        let e = &self.ext;
        match ext {
            Ext::Reth => {
                if let Some(r) = e.reth {
                    r.emit(&mut reth::Packet::new_unchecked(buf))
                }
            }
            Ext::Aeth => {
                if let Some(r) = e.aeth {
                    r.emit(&mut aeth::Packet::new_unchecked(buf))
                }
            }
            Ext::AtomicEth => {
                if let Some(r) = e.atomic_eth {
                    r.emit(&mut atomic_eth::Packet::new_unchecked(buf))
                }
            }
            Ext::AtomicAckEth => {
                if let Some(r) = e.atomic_ack_eth {
                    r.emit(&mut atomic_ack_eth::Packet::new_unchecked(buf))
                }
            }
            Ext::ImmDt => {
                if let Some(r) = e.immdt {
                    r.emit(&mut immdt::Packet::new_unchecked(buf))
                }
            }
            Ext::Ieth => {
                if let Some(r) = e.ieth {
                    r.emit(&mut ieth::Packet::new_unchecked(buf))
                }
            }
            Ext::Deth => {
                if let Some(r) = e.deth {
                    r.emit(&mut deth::Packet::new_unchecked(buf))
                }
            }
            Ext::Cnp => {
                if let Some(r) = e.cnp {
                    r.emit(&mut cnp::Packet::new_unchecked(buf))
                }
            }
        }
    }
}

/// A parsed RoCE v2 frame borrowing its payload from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedPacket<'a> {
    pub repr: PacketRepr,
    /// The payload, without pad.
    pub payload: &'a [u8],
    /// Offset of the payload within the frame.
    pub payload_offset: usize,
    /// The ICRC as received.
    pub icrc: u32,
}

/// Where the layers of a frame lie, once Ethernet, IP and UDP are checked.
struct Framing {
    eth: EthernetHeader,
    ip: IpHeader,
    udp_src_port: u16,
    /// Offset of the IP header.
    l3: usize,
    /// Offset of the BTH.
    bth: usize,
    /// Offset one past the ICRC (end of the UDP datagram).
    end: usize,
}

impl<'a> ParsedPacket<'a> {
    /// Parse and fully check a frame, ICRC included.
    #[inline]
    pub fn parse(frame: &'a [u8]) -> Result<ParsedPacket<'a>> {
        let f = parse_framing(frame)?;
        let received = read_icrc(frame, &f)?;
        let computed = compute_icrc(frame, &f)?;
        if computed != received {
            return Err(Error::Icrc { computed, received });
        }
        parse_transport(frame, f, received)
    }

    /// [`ParsedPacket::parse`] for a receiver that keeps an
    /// [`icrc::PrefixCache`]: the same checks and result, with the ICRC
    /// of a run of packets from one flow computed in one pass each.
    #[inline]
    pub fn parse_cached(
        frame: &'a [u8],
        cache: &mut icrc::PrefixCache,
    ) -> Result<ParsedPacket<'a>> {
        let f = parse_framing(frame)?;
        let received = read_icrc(frame, &f)?;
        let computed = frame
            .get(f.l3..f.end - icrc::ICRC_LEN)
            .and_then(|l3| icrc::compute_cached(l3, f.ip.is_ipv6(), cache))
            .ok_or(Error::Truncated {
                layer: Layer::Bth,
                needed: f.bth + bth::HEADER_LEN,
                have: frame.len(),
            })?;
        if computed != received {
            return Err(Error::Icrc { computed, received });
        }
        parse_transport(frame, f, received)
    }

    /// [`ParsedPacket::parse`] for a frame whose ICRC its receiver has
    /// already verified (the UDP socket backend does, recovering the IPv4
    /// ID): every check but that one, and no pass over the payload.
    #[inline]
    pub fn parse_icrc_verified(frame: &'a [u8]) -> Result<ParsedPacket<'a>> {
        let f = parse_framing(frame)?;
        let received = read_icrc(frame, &f)?;
        parse_transport(frame, f, received)
    }

    /// Parse and check everything but the ICRC; also return whether the ICRC
    /// is correct. For tools that show bad packets instead of dropping them.
    pub fn parse_report_icrc(frame: &'a [u8]) -> Result<(ParsedPacket<'a>, bool)> {
        let f = parse_framing(frame)?;
        let received = read_icrc(frame, &f)?;
        let ok = compute_icrc(frame, &f)? == received;
        Ok((parse_transport(frame, f, received)?, ok))
    }

    pub fn opcode_info(&self) -> &'static OpcodeInfo {
        // parse_transport already looked the opcode up successfully.
        match self.repr.bth.opcode.info() {
            Ok(i) => i,
            Err(_) => &super::opcode::OPCODES[0],
        }
    }
}

#[inline]
fn read_icrc(frame: &[u8], f: &Framing) -> Result<u32> {
    let b = frame
        .get(f.end - icrc::ICRC_LEN..f.end)
        .ok_or(Error::Truncated {
            layer: Layer::Icrc,
            needed: f.end,
            have: frame.len(),
        })?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[inline]
fn compute_icrc(frame: &[u8], f: &Framing) -> Result<u32> {
    frame
        .get(f.l3..f.end - icrc::ICRC_LEN)
        .and_then(|l3| icrc::compute(l3, f.ip.is_ipv6()))
        .ok_or(Error::Truncated {
            layer: Layer::Bth,
            needed: f.bth + bth::HEADER_LEN,
            have: frame.len(),
        })
}

#[inline(always)]
fn parse_framing(frame: &[u8]) -> Result<Framing> {
    check_len(Layer::Ethernet, frame, ETH_LEN)?;
    let eth = EthernetFrame::new_unchecked(frame);
    let mut hdr = EthernetHeader {
        dst: eth.dst_addr().0,
        src: eth.src_addr().0,
        vlan: None,
    };
    let mut ethertype = u16::from(eth.ethertype());
    let mut l3 = ETH_LEN;
    if ethertype == TPID_8021Q {
        check_len(Layer::Vlan, frame, ETH_LEN + VLAN_LEN)?;
        hdr.vlan = Some(VlanTag::from_tci(u16::from_be_bytes([
            frame[14], frame[15],
        ])));
        ethertype = u16::from_be_bytes([frame[16], frame[17]]);
        l3 += VLAN_LEN;
    }
    let ip_bytes = &frame[l3..];
    let (ip, udp_at, ip_end) = match EthernetProtocol::from(ethertype) {
        EthernetProtocol::Ipv4 => parse_ipv4(ip_bytes)?,
        EthernetProtocol::Ipv6 => parse_ipv6(ip_bytes)?,
        _ => return Err(Error::EtherType(ethertype)),
    };
    // Offsets so far are relative to the IP header.
    let udp_bytes = &ip_bytes[udp_at..ip_end];
    check_len(Layer::Udp, udp_bytes, UDP_LEN)?;
    let udp = UdpPacket::new_unchecked(udp_bytes);
    let udp_len = usize::from(udp.len());
    if udp_len != udp_bytes.len() {
        return Err(Error::Length {
            layer: Layer::Udp,
            declared: udp_len,
            actual: udp_bytes.len(),
        });
    }
    if udp.dst_port() != ROCEV2_UDP_PORT {
        return Err(Error::UdpPort(udp.dst_port()));
    }
    if udp.checksum() != 0 {
        let (s, d) = match ip {
            IpHeader::V4 { src, dst, .. } => (IpAddress::Ipv4(src), IpAddress::Ipv4(dst)),
            IpHeader::V6 { src, dst, .. } => (IpAddress::Ipv6(src), IpAddress::Ipv6(dst)),
        };
        if !udp.verify_checksum(&s, &d) {
            return Err(Error::UdpChecksum);
        }
    }
    let bth_at = l3 + udp_at + UDP_LEN;
    let end = l3 + ip_end;
    if end < bth_at + bth::HEADER_LEN + icrc::ICRC_LEN {
        return Err(Error::Truncated {
            layer: Layer::Bth,
            needed: bth::HEADER_LEN + icrc::ICRC_LEN,
            have: end - bth_at,
        });
    }
    Ok(Framing {
        eth: hdr,
        ip,
        udp_src_port: udp.src_port(),
        l3,
        bth: bth_at,
        end,
    })
}

/// The RFC 1071 ones'-complement sum of an IPv4 header, carries folded in:
/// what smoltcp's `verify_checksum` computes, written for the fixed 20
/// bytes (smoltcp's general loop was 2% of a 4 KiB WRITE).
/// Summed as five 32-bit words, which folds to the same 16-bit sum (RFC 1071 §2).
#[inline]
fn ones_sum(header: &[u8; IPV4_LEN]) -> u16 {
    fold_ones_sum(
        header
            .chunks_exact(4)
            .map(|w| u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
            .sum(),
    )
}

/// Fold the carries of a ones'-complement sum back in (RFC 1071).
#[inline]
fn fold_ones_sum(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Returns the header, the offset of the UDP header and the end of the IP
/// packet, both relative to the IP header.
#[inline]
fn parse_ipv4(b: &[u8]) -> Result<(IpHeader, usize, usize)> {
    check_len(Layer::Ipv4, b, IPV4_LEN)?;
    let ip = Ipv4Packet::new_unchecked(b);
    if ip.version() != 4 {
        return Err(Error::IpVersion(ip.version()));
    }
    let hlen = usize::from(ip.header_len());
    if hlen != IPV4_LEN {
        return Err(Error::Ipv4Options(hlen));
    }
    let total = usize::from(ip.total_len());
    // The frame may be longer (Ethernet pads to 60 bytes), never shorter.
    if total < IPV4_LEN || total > b.len() {
        return Err(Error::Length {
            layer: Layer::Ipv4,
            declared: total,
            actual: b.len(),
        });
    }
    if b.first_chunk::<IPV4_LEN>().map(ones_sum) != Some(!0) {
        return Err(Error::Ipv4Checksum);
    }
    if ip.more_frags() || ip.frag_offset() != 0 {
        return Err(Error::Ipv4Fragment);
    }
    if ip.next_header() != IpProtocol::Udp {
        return Err(Error::NotUdp(u8::from(ip.next_header())));
    }
    let hdr = IpHeader::V4 {
        src: ip.src_addr(),
        dst: ip.dst_addr(),
        dscp: ip.dscp(),
        ecn: ip.ecn(),
        ttl: ip.hop_limit(),
        ident: ip.ident(),
    };
    Ok((hdr, IPV4_LEN, total))
}

#[inline]
fn parse_ipv6(b: &[u8]) -> Result<(IpHeader, usize, usize)> {
    check_len(Layer::Ipv6, b, IPV6_LEN)?;
    let ip = Ipv6Packet::new_unchecked(b);
    if ip.version() != 6 {
        return Err(Error::IpVersion(ip.version()));
    }
    let total = IPV6_LEN + usize::from(ip.payload_len());
    if total > b.len() {
        return Err(Error::Length {
            layer: Layer::Ipv6,
            declared: total,
            actual: b.len(),
        });
    }
    // RoCE v2 senders put UDP right after the fixed header (no extension headers).
    if ip.next_header() != IpProtocol::Udp {
        return Err(Error::NotUdp(u8::from(ip.next_header())));
    }
    let hdr = IpHeader::V6 {
        src: ip.src_addr(),
        dst: ip.dst_addr(),
        traffic_class: ip.traffic_class(),
        flow_label: ip.flow_label(),
        hop_limit: ip.hop_limit(),
    };
    Ok((hdr, IPV6_LEN, total))
}

fn ext_layer(ext: Ext) -> Layer {
    match ext {
        Ext::Reth => Layer::Reth,
        Ext::Aeth => Layer::Aeth,
        Ext::AtomicEth => Layer::AtomicEth,
        Ext::AtomicAckEth => Layer::AtomicAckEth,
        Ext::ImmDt => Layer::ImmDt,
        Ext::Ieth => Layer::Ieth,
        Ext::Deth => Layer::Deth,
        Ext::Cnp => Layer::Cnp,
    }
}

#[inline(always)]
fn parse_transport(frame: &[u8], f: Framing, icrc_rx: u32) -> Result<ParsedPacket<'_>> {
    // Everything between the BTH and the ICRC; framing guaranteed the range.
    let body = &frame[f.bth..f.end - icrc::ICRC_LEN];
    let bth = bth::Repr::parse(&bth::Packet::new_checked(body)?)?;
    let info = bth.opcode.info()?;
    let mut ext = ExtHeaders::default();
    let mut at = bth::HEADER_LEN;
    for e in info.headers {
        let need = at + e.header_len();
        let hb = body.get(at..need).ok_or(Error::Truncated {
            layer: ext_layer(*e),
            needed: need,
            have: body.len(),
        })?;
        match e {
            Ext::Reth => ext.reth = Some(reth::Repr::parse(&reth::Packet::new_checked(hb)?)?),
            Ext::Aeth => ext.aeth = Some(aeth::Repr::parse(&aeth::Packet::new_checked(hb)?)?),
            Ext::AtomicEth => {
                ext.atomic_eth = Some(atomic_eth::Repr::parse(&atomic_eth::Packet::new_checked(
                    hb,
                )?)?)
            }
            Ext::AtomicAckEth => {
                ext.atomic_ack_eth = Some(atomic_ack_eth::Repr::parse(
                    &atomic_ack_eth::Packet::new_checked(hb)?,
                )?)
            }
            Ext::ImmDt => ext.immdt = Some(immdt::Repr::parse(&immdt::Packet::new_checked(hb)?)?),
            Ext::Ieth => ext.ieth = Some(ieth::Repr::parse(&ieth::Packet::new_checked(hb)?)?),
            Ext::Deth => ext.deth = Some(deth::Repr::parse(&deth::Packet::new_checked(hb)?)?),
            Ext::Cnp => ext.cnp = Some(cnp::Repr::parse(&cnp::Packet::new_checked(hb)?)?),
        }
        at = need;
    }
    let padded = body.len() - at;
    let pad = usize::from(bth.pad_count);
    if !info.has_payload {
        if padded != 0 {
            return Err(Error::UnexpectedPayload {
                opcode: bth.opcode.0,
                len: padded,
            });
        }
        if pad != 0 {
            return Err(Error::Pad {
                pad: bth.pad_count,
                len: padded,
            });
        }
    } else if !padded.is_multiple_of(4) || pad > padded {
        return Err(Error::Pad {
            pad: bth.pad_count,
            len: padded,
        });
    }
    let payload_len = padded - pad;
    if payload_len > MAX_PAYLOAD {
        return Err(Error::PayloadTooLong(payload_len));
    }
    let payload_offset = f.bth + at;
    Ok(ParsedPacket {
        repr: PacketRepr {
            eth: f.eth,
            ip: f.ip,
            udp_src_port: f.udp_src_port,
            bth,
            ext,
        },
        payload: &frame[payload_offset..payload_offset + payload_len],
        payload_offset,
        icrc: icrc_rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sample::SplitMix;

    #[test]
    fn ipv4_header_is_smoltcps() {
        let mut r = SplitMix::new(6);
        for _ in 0..1000 {
            let ip = IpHeader::V4 {
                src: Ipv4Addr::from(r.next_u32()),
                dst: Ipv4Addr::from(r.next_u32()),
                dscp: r.next_u32() as u8,
                ecn: r.next_u32() as u8,
                ttl: r.next_u32() as u8,
                ident: r.next_u32() as u16,
            };
            let IpHeader::V4 {
                src,
                dst,
                dscp,
                ecn,
                ttl,
                ident,
            } = ip
            else {
                unreachable!()
            };
            let udp_len = (r.next_u32() % 4200) as usize;
            let mut repr = sample_repr_v4();
            repr.ip = ip;
            let mut ours = [0u8; IPV4_LEN];
            repr.emit_ip(&mut ours, udp_len);
            let mut theirs = [0x5au8; IPV4_LEN];
            let mut p = Ipv4Packet::new_unchecked(&mut theirs[..]);
            p.set_version(4);
            p.set_header_len(IPV4_LEN as u8);
            p.set_dscp(dscp);
            p.set_ecn(ecn);
            p.set_total_len((IPV4_LEN + udp_len) as u16);
            p.set_ident(ident);
            p.clear_flags();
            p.set_dont_frag(true);
            p.set_frag_offset(0);
            p.set_hop_limit(ttl);
            p.set_next_header(IpProtocol::Udp);
            p.set_src_addr(src);
            p.set_dst_addr(dst);
            p.fill_checksum();
            assert_eq!(ours, theirs);
        }
    }

    fn sample_repr_v4() -> PacketRepr {
        crate::wire::sample::sample_repr(crate::wire::Opcode::RC_SEND_ONLY, false, false, 1)
            .unwrap()
    }

    #[test]
    fn ones_sum_is_smoltcps_checksum() {
        let mut r = SplitMix::new(5);
        for _ in 0..1000 {
            let mut h = [0u8; IPV4_LEN];
            r.fill(&mut h);
            h[0] = 0x45; // smoltcp sums as many bytes as the IHL says
            Ipv4Packet::new_unchecked(&mut h[..]).fill_checksum();
            let want = Ipv4Packet::new_unchecked(&h[..]).checksum();
            h[10..12].fill(0);
            assert_eq!(!ones_sum(&h), want);
            h[10..12].copy_from_slice(&want.to_be_bytes());
            assert_eq!(
                ones_sum(&h) == !0,
                Ipv4Packet::new_unchecked(&h[..]).verify_checksum()
            );
            h[3] ^= 0x10;
            assert_eq!(
                ones_sum(&h) == !0,
                Ipv4Packet::new_unchecked(&h[..]).verify_checksum()
            );
        }
    }
}
