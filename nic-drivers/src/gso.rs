//! UDP GSO super-frames for raw transmit (AF_PACKET with PACKET_VNET_HDR).
//!
//! Consecutive frames of one flow (same Ethernet, IP and UDP headers but for
//! lengths, IPv4 ID and checksums; same destination QP; same UDP payload size,
//! the last may be shorter) travel as one frame: the first frame's headers,
//! then every frame's UDP payload back to back, behind a virtio-net header
//! that asks for UDP GSO (`VIRTIO_NET_HDR_GSO_UDP_L4`, Linux 6.2 and later).
//! The kernel cuts it into the original frames (in software, or on a NIC with
//! UDP segmentation offload) after one pass through its transmit path instead
//! of one per frame; over veth the super-frame reaches the peer uncut and a
//! raw receiver cuts it ([`crate::offload::segment_udp`]).
//!
//! What the kernel writes into each segment (Linux `__udp_gso_segment`,
//! `inet_gso_segment`): IP total / payload length, UDP length, the UDP
//! checksum (the header asks the device for it), and for IPv4 the ID of the
//! super-frame plus the segment's index, with the header checksum. The RoCE
//! ICRC covers the IPv4 ID, so segment `k` must have been built for ID
//! `first + k` before it joins ([`crate::ipv4_id`] rewrites its ICRC).

use crate::frame::{self, ETH_HLEN};

/// struct virtio_net_hdr (linux/virtio_net.h): flags, gso_type, hdr_len,
/// gso_size, csum_start, csum_offset; little-endian.
pub const VNET_HDR_LEN: usize = 10;
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
/// gso_type's ECN flag (`VIRTIO_NET_HDR_GSO_ECN`).
const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;
/// The kernel refuses more segments in one UDP GSO frame (`UDP_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: usize = 64;
/// IPv4 total length / IPv6 payload length are 16 bits.
const MAX_IP_LEN: usize = 0xFFFF;
/// Longest headers a run keeps (Ethernet + IPv6 + UDP).
const MAX_HDR: usize = ETH_HLEN + 40 + 8;
/// Where the IP header starts: runs are of untagged frames only.
const IP_AT: usize = ETH_HLEN;
/// Offset of the destination QP in the BTH (IBTA 9.2).
const BTH_DEST_QP: usize = 5;

/// The virtio-net header of a plain frame: no GSO, no checksum to finish.
pub const PLAIN: [u8; VNET_HDR_LEN] = [0; VNET_HDR_LEN];

/// The segment size a received frame's virtio-net header gives it when it is
/// a UDP GSO super-frame; 0 for anything else.
pub fn udp_gso_size(vnet: &[u8]) -> usize {
    match vnet {
        [_, kind, _, _, lo, hi, ..]
            if kind & !VIRTIO_NET_HDR_GSO_ECN == VIRTIO_NET_HDR_GSO_UDP_L4 =>
        {
            usize::from(u16::from_le_bytes([*lo, *hi]))
        }
        _ => 0,
    }
}

/// Frames being joined: the first one's headers and what joined so far.
#[derive(Debug, Clone)]
pub struct Run {
    hdr: [u8; MAX_HDR],
    /// Ethernet + IP + UDP header length.
    hl: usize,
    v6: bool,
    /// UDP payload of a segment (the first frame's).
    seg: usize,
    segs: usize,
    /// UDP payload bytes joined.
    payload: usize,
    /// A shorter frame joined: it must be the last.
    closed: bool,
    first_id: u16,
    /// The BTH destination QP of the first frame: a super-frame goes to one
    /// device's filter at the peer (crate::raw_share), so to one QP.
    qp: [u8; 3],
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

impl Run {
    /// A run that starts with `f` (a whole frame), if `f` can lead one: an
    /// untagged IPv4 (no options) or IPv6 (no extension headers) UDP frame
    /// whose datagram ends the frame and carries at least a BTH's first 8
    /// bytes.
    pub fn start(f: &[u8]) -> Option<Run> {
        Run::start_split(f, f.len())
    }

    /// [`Run::start`] for a `len`-byte frame of which `h` holds the start
    /// (its headers and at least the BTH's first 8 bytes); the rest may lie
    /// elsewhere (a gathered send).
    pub fn start_split(h: &[u8], len: usize) -> Option<Run> {
        let (v6, hl) = match be16(h, 12)? {
            0x0800 if *h.get(ETH_HLEN)? == 0x45 && *h.get(ETH_HLEN + 9)? == 17 => {
                // Not a fragment (the filter at the peer refuses them anyway).
                if be16(h, ETH_HLEN + 6)? & 0x3FFF != 0 {
                    return None;
                }
                (false, ETH_HLEN + 20 + 8)
            }
            0x86DD if *h.get(ETH_HLEN + 6)? == 17 => (true, ETH_HLEN + 40 + 8),
            _ => return None,
        };
        let udp_len = usize::from(be16(h, hl - 4)?);
        if len < hl + BTH_DEST_QP + 3 || udp_len != len - (hl - 8) || h.len() > len {
            return None;
        }
        let mut hdr = [0u8; MAX_HDR];
        hdr[..hl].copy_from_slice(h.get(..hl)?);
        let first_id = if v6 { 0 } else { be16(h, ETH_HLEN + 4)? };
        let mut qp = [0u8; 3];
        qp.copy_from_slice(h.get(hl + BTH_DEST_QP..hl + BTH_DEST_QP + 3)?);
        Some(Run {
            qp,
            hdr,
            hl,
            v6,
            seg: len - hl,
            segs: 1,
            payload: len - hl,
            closed: false,
            first_id,
        })
    }

    /// Length of the Ethernet, IP and UDP headers (a joining frame's are
    /// written over the last bytes of the run, then put back).
    pub fn header_len(&self) -> usize {
        self.hl
    }

    /// Bytes of the super-frame so far (headers and every payload).
    pub fn frame_len(&self) -> usize {
        self.hl + self.payload
    }

    /// Segments joined.
    pub fn segments(&self) -> usize {
        self.segs
    }

    /// Whether nothing more may join (a shorter segment came, or the kernel's
    /// segment limit is reached).
    pub fn is_closed(&self) -> bool {
        self.closed || self.segs >= MAX_SEGMENTS
    }

    /// The IPv4 ID a joining frame must carry (the kernel numbers segments
    /// from the first frame's ID); None over IPv6.
    pub fn next_id(&self) -> Option<u16> {
        (!self.v6).then(|| self.first_id.wrapping_add(self.segs as u16))
    }

    /// Whether `f` (a whole frame) may join, once its IPv4 ID is
    /// [`Run::next_id`]: same headers but for the fields the kernel rewrites,
    /// same destination QP, a UDP payload no longer than the first one's, and
    /// a super-frame that stays within `cap` bytes and the IP length limit.
    pub fn admits(&self, f: &[u8], cap: usize) -> bool {
        self.admits_split(f, f.len(), cap)
    }

    /// [`Run::admits`] for a `len`-byte frame of which `h` holds the start
    /// (see [`Run::start_split`]).
    pub fn admits_split(&self, h: &[u8], len: usize, cap: usize) -> bool {
        if self.is_closed() || len <= self.hl || h.len() > len {
            return false;
        }
        let plen = len - self.hl;
        if plen > self.seg
            || self.frame_len() + plen > cap
            || self.hl - IP_AT + self.payload + plen > MAX_IP_LEN
        {
            return false;
        }
        let (ip, udp) = (IP_AT, self.hl - 8);
        // Fields the kernel writes per segment, or that follow from the length.
        let rewritten = |i: usize| {
            (udp + 4..udp + 8).contains(&i)
                || if self.v6 {
                    (ip + 4..ip + 6).contains(&i)
                } else {
                    (ip + 2..ip + 6).contains(&i) || (ip + 10..ip + 12).contains(&i)
                }
        };
        let Some(hh) = h.get(..self.hl) else {
            return false;
        };
        let same = hh
            .iter()
            .zip(&self.hdr[..self.hl])
            .enumerate()
            .all(|(i, (a, b))| a == b || rewritten(i));
        let udp_len = be16(h, udp + 4).map(usize::from);
        let qp = self.hl + BTH_DEST_QP;
        same && udp_len == Some(plen + 8) && h.get(qp..qp + 3) == Some(&self.qp[..])
    }

    /// Counts a frame that joined with a `plen`-byte UDP payload.
    pub fn push(&mut self, plen: usize) {
        self.payload += plen;
        self.segs += 1;
        if plen < self.seg {
            self.closed = true;
        }
    }

    /// Writes the virtio-net header for the run into `vnet` and fixes the
    /// super-frame's headers (at the start of `f`, its first frame's) to its
    /// whole length, as a UDP socket's GSO send would have them: lengths, the
    /// IPv4 header checksum, and the UDP checksum field holding the
    /// pseudo-header sum (the device finishes it, `NEEDS_CSUM`). A run of one
    /// frame is sent as it came, with a plain header. `f` needs to hold the
    /// headers only (the payloads may lie elsewhere).
    pub fn finish(&self, vnet: &mut [u8], f: &mut [u8]) {
        if vnet.len() < VNET_HDR_LEN || f.len() < self.hl {
            return;
        }
        if self.segs < 2 {
            vnet[..VNET_HDR_LEN].copy_from_slice(&PLAIN);
            return;
        }
        let (ip, udp) = (IP_AT, self.hl - 8);
        let udp_len = 8 + self.payload;
        if self.v6 {
            f[ip + 4..ip + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        } else {
            let total = (20 + udp_len) as u16;
            f[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
            f[ip + 10..ip + 12].fill(0);
            let c = frame::ipv4_checksum(&f[ip..ip + 20]);
            f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        }
        f[udp + 4..udp + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        if let Some(c) = crate::offload::partial_form_of_headers(&f[..self.hl]) {
            f[udp + 6..udp + 8].copy_from_slice(&c.to_be_bytes());
        }
        vnet[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
        vnet[1] = VIRTIO_NET_HDR_GSO_UDP_L4;
        vnet[2..4].copy_from_slice(&(self.hl as u16).to_le_bytes());
        vnet[4..6].copy_from_slice(&(self.seg as u16).to_le_bytes());
        vnet[6..8].copy_from_slice(&(udp as u16).to_le_bytes());
        // The UDP checksum field's offset in its header (RFC 768).
        vnet[8..10].copy_from_slice(&6u16.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{build_udp_frame, HeaderSpec};

    fn frame(v6: bool, qp: u8, plen: usize, port: u16) -> Vec<u8> {
        let (s, d) = if v6 {
            ("[fd00::1]:49152", "[fd00::2]:4791")
        } else {
            ("198.18.0.1:49152", "198.18.0.2:4791")
        };
        let mut dst: std::net::SocketAddr = d.parse().unwrap();
        dst.set_port(port);
        let spec = HeaderSpec {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            src: s.parse().unwrap(),
            dst,
            tos: 0,
            ttl: 64,
        };
        let mut udp = vec![0u8; plen];
        udp[7] = qp;
        build_udp_frame(&spec, &udp).unwrap()
    }

    #[test]
    fn frames_of_one_flow_join_and_others_do_not() {
        for v6 in [false, true] {
            let first = frame(v6, 1, 4112, 4791);
            let mut r = Run::start(&first).expect("a run starts");
            let cap = 65494;
            assert!(r.admits(&frame(v6, 1, 4112, 4791), cap));
            assert!(
                r.admits(&frame(v6, 1, 100, 4791), cap),
                "a shorter last one"
            );
            assert!(!r.admits(&frame(v6, 2, 4112, 4791), cap), "another QP");
            assert!(!r.admits(&frame(v6, 1, 4113, 4791), cap), "longer");
            assert!(!r.admits(&frame(v6, 1, 4112, 4792), cap), "another port");
            let mut other_ttl = frame(v6, 1, 4112, 4791);
            other_ttl[if v6 { 14 + 7 } else { 14 + 8 }] = 9;
            assert!(!r.admits(&other_ttl, cap));
            for _ in 0..13 {
                r.push(4112);
            }
            assert_eq!(r.segments(), 14);
            assert!(!r.admits(&frame(v6, 1, 4112, 4791), r.frame_len() + 4111));
            r.push(100);
            assert!(r.is_closed(), "nothing after a shorter segment");
            assert!(!r.admits(&frame(v6, 1, 100, 4791), cap));
        }
        let mut tagged = frame(false, 1, 100, 4791);
        tagged.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        assert!(Run::start(&tagged).is_none(), "VLAN-tagged frames go alone");
        let f = frame(false, 1, 100, 4791);
        assert!(Run::start(&f[..f.len() - 1]).is_none(), "cut short");
        assert!(Run::start(&[0u8; 10]).is_none());
    }

    #[test]
    fn a_finished_run_is_cut_back_into_its_frames() {
        for v6 in [false, true] {
            let sizes = [1040usize, 1040, 1040, 500];
            let frames: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let mut f = frame(v6, 1, n, 4791);
                    let hl = f.len() - n;
                    for (i, b) in f[hl + 12..].iter_mut().enumerate() {
                        *b = (i * 3 + k) as u8;
                    }
                    if !v6 {
                        // The ID the kernel gives segment k.
                        f[14 + 4..14 + 6].copy_from_slice(&(k as u16).to_be_bytes());
                    }
                    f
                })
                .collect();
            let mut r = Run::start(&frames[0]).unwrap();
            let mut sup = frames[0].clone();
            for f in &frames[1..] {
                assert!(r.admits(f, 65494));
                r.push(f.len() - r.header_len());
                sup.extend_from_slice(&f[r.header_len()..]);
            }
            assert_eq!(sup.len(), r.frame_len());
            let mut vnet = [0u8; VNET_HDR_LEN];
            r.finish(&mut vnet, &mut sup);
            assert_eq!(vnet[0], VIRTIO_NET_HDR_F_NEEDS_CSUM);
            assert_eq!(vnet[1], VIRTIO_NET_HDR_GSO_UDP_L4);
            let hl = r.header_len();
            assert_eq!(usize::from(u16::from_le_bytes([vnet[2], vnet[3]])), hl);
            assert_eq!(u16::from_le_bytes([vnet[4], vnet[5]]), 1040);
            assert_eq!(usize::from(u16::from_le_bytes([vnet[6], vnet[7]])), hl - 8);
            assert_eq!(u16::from_le_bytes([vnet[8], vnet[9]]), 6);
            assert_eq!(udp_gso_size(&vnet), 1040, "read back as a receiver would");
            vnet[1] |= VIRTIO_NET_HDR_GSO_ECN;
            assert_eq!(udp_gso_size(&vnet), 1040, "ECN flag ignored");
            // What the kernel's software GSO (and a raw receiver) makes of it.
            let mut segs = Vec::new();
            let n =
                crate::offload::segment_udp(&mut sup, 1040, true, &mut |s| segs.push(s.to_vec()));
            assert_eq!(n, Some(frames.len()));
            for (k, (s, f)) in segs.iter().zip(&frames).enumerate() {
                let mut want = f.clone();
                // The checksum the device was left: "none" at a raw receiver.
                want[hl - 2..hl].fill(0);
                if !v6 {
                    want[14 + 10..14 + 12].fill(0);
                    let c = frame::ipv4_checksum(&want[14..34]);
                    want[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
                }
                assert_eq!(s, &want, "v6={v6} segment {k}");
            }
        }
    }

    #[test]
    fn a_run_of_one_goes_plain() {
        let mut f = frame(false, 1, 300, 4791);
        let before = f.clone();
        let r = Run::start(&f).unwrap();
        let mut vnet = [9u8; VNET_HDR_LEN];
        r.finish(&mut vnet, &mut f);
        assert_eq!(vnet, PLAIN);
        assert_eq!(udp_gso_size(&vnet), 0);
        assert_eq!(udp_gso_size(&vnet[..4]), 0, "short");
        assert_eq!(f, before);
    }
}
