//! The IPv4 Identification under a UDP socket.
//!
//! The RoCE v2 ICRC covers the IPv4 Identification (IBTA A17.3.3 masks only ToS, TTL and the
//! header checksum), but a UDP socket neither picks the ID of what it sends nor reports the ID of
//! what it receives.
//!
//! Transmit: with `IP_PMTUDISC_DO` an unconnected socket's datagrams carry ID 0 (Linux
//! `ip_select_ident_segs`: DF set and not `ignore_df`), and the segments of one UDP GSO send carry
//! IDs 0, 1, 2, ... (`inet_gso_segment` numbers them from the super-packet's ID); both seen with
//! tcpdump on a veth with software segmentation. So segment `k` of a send is given ID `k` and its
//! ICRC is computed over that ([`IdRecovery::set_id`]). Without `IP_PMTUDISC_DO` (the default
//! `IP_PMTUDISC_WANT` sets `ignore_df`) the kernel takes IDs from a shared hashed counter.
//!
//! Receive: the ICRC is a CRC-32, affine in the message, so for a frame of a given length
//! `ICRC(id) = ICRC(0) ^ L(id)` with `L` linear in the 16 ID bits. [`IdRecovery`] keeps, per
//! frame length, `L`'s 16 columns in echelon form and solves `L(id) = received ^ ICRC(0)` over
//! GF(2): a solution is the ID the sender used and goes into the synthesised header, so the
//! stack's ICRC check passes; with none the header keeps ID 0 and the stack drops the frame as a
//! bad ICRC. The price: for IPv4 frames received this way the 32-bit ICRC is a 16-bit check (a
//! random corruption passes with probability 2^-16); Ethernet's FCS, and the UDP checksum when
//! the sender set one (the kernel verifies it), still cover the frame.

use crate::frame;

const IPV4_HLEN: usize = 20;
/// Offset of the Identification in the IPv4 header (RFC 791).
const ID_AT: usize = 4;
/// Offset of the header checksum.
const CSUM_AT: usize = 10;
/// Frame lengths whose solver is kept (the MTU-sized data packets, ACKs, a few others).
const CACHE: usize = 16;

/// The ICRC of RoCE v2 packets, as `ferroce_stack::wire::icrc` computes it (this crate stays
/// independent of the stack; a test checks the two agree).
pub(crate) mod icrc {
    pub const ICRC_LEN: usize = 4;
    /// IP + UDP headers and the BTH: the part with masked fields.
    const MASKED_V4: usize = 20 + 8 + 12;
    const MASKED_V6: usize = 40 + 8 + 12;
    /// CRC-32 state after the 8 bytes of 0xFF standing in for the LRH (rxe's seed 0xDEBB20E3,
    /// uncomplemented).
    const LRH_STANDIN_CRC: u32 = !0xdebb_20e3;

    /// ICRC of `l3`: IP header to the end of the pad (the ICRC excluded). IBTA A17.3.3 masks
    /// to ones IPv4's ToS, TTL and header checksum, IPv6's traffic class, flow label and hop
    /// limit, then the UDP checksum and BTH byte 4.
    pub fn compute(l3: &[u8], ipv6: bool) -> Option<u32> {
        let n = if ipv6 { MASKED_V6 } else { MASKED_V4 };
        let (head, rest) = (l3.get(..n)?, l3.get(n..)?);
        let mut buf = [0u8; MASKED_V6];
        let m = &mut buf[..n];
        m.copy_from_slice(head);
        let ip = if ipv6 {
            m[0] |= 0x0f;
            m[1..4].fill(0xff);
            m[7] = 0xff;
            40
        } else {
            m[1] = 0xff;
            m[8] = 0xff;
            m[10..12].fill(0xff);
            20
        };
        m[ip + 6..ip + 8].fill(0xff);
        m[ip + 8 + 4] = 0xff;
        let mut h = crc32fast::Hasher::new_with_initial(LRH_STANDIN_CRC);
        h.update(m);
        h.update(rest);
        Some(h.finalize())
    }
}

/// The Identification of an IPv4 header.
pub fn id_of(l3: &[u8]) -> Option<u16> {
    l3.get(ID_AT..ID_AT + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// An IPv4 header without options followed by UDP and something shaped like a BTH: an opcode
/// of a defined transport (below 0xC0, the manufacturer-specific range) and transport header
/// version 0. Other payloads (tests push arbitrary ones through the backend) are left alone.
fn is_plain_ipv4(l3: &[u8]) -> bool {
    l3.first() == Some(&0x45)
        && l3.get(IPV4_HLEN + 8).is_some_and(|op| *op < 0xc0)
        && l3.get(IPV4_HLEN + 8 + 1).is_some_and(|b| b & 0x0f == 0)
}

/// Whether `l3` (IPv4 or IPv6 header to the end of the ICRC) is RoCE whose ICRC is right as it
/// stands.
pub fn icrc_ok(l3: &[u8]) -> bool {
    let Some(end) = l3.len().checked_sub(icrc::ICRC_LEN) else {
        return false;
    };
    let ipv6 = match l3.first().map(|b| b >> 4) {
        Some(4) if is_plain_ipv4(l3) => false,
        // A fixed header straight to UDP (next header 17) and a BTH shape.
        Some(6)
            if l3.get(6) == Some(&17)
                && l3.get(48).is_some_and(|op| *op < 0xc0)
                && l3.get(49).is_some_and(|b| b & 0x0f == 0) =>
        {
            true
        }
        _ => return false,
    };
    let rx = l3.get(end..).and_then(|c| <[u8; 4]>::try_from(c).ok());
    let want = l3.get(..end).and_then(|h| icrc::compute(h, ipv6));
    rx.is_some() && rx.map(u32::from_le_bytes) == want
}

/// Writes `id` and recomputes the header checksum.
fn write_id(l3: &mut [u8], id: u16) {
    l3[ID_AT..ID_AT + 2].copy_from_slice(&id.to_be_bytes());
    l3[CSUM_AT..CSUM_AT + 2].fill(0);
    let c = frame::ipv4_checksum(&l3[..IPV4_HLEN]);
    l3[CSUM_AT..CSUM_AT + 2].copy_from_slice(&c.to_be_bytes());
}

/// `L` for one frame length: basis vectors (ICRC difference, ID bits giving it, pivot bit), each
/// reduced by the ones before it.
#[derive(Debug, Clone)]
struct Solver {
    len: usize,
    cols: [u32; 16],
    basis: Vec<(u32, u16, u32)>,
}

impl Solver {
    /// From the 16 columns `cols[j] = ICRC(id = 1 << j) ^ ICRC(0)`.
    fn new(len: usize, cols: [u32; 16]) -> Solver {
        let mut basis: Vec<(u32, u16, u32)> = Vec::with_capacity(16);
        for (j, &c) in cols.iter().enumerate() {
            let (mut v, mut m) = (c, 1u16 << j);
            for &(bv, bm, p) in &basis {
                if v & p != 0 {
                    v ^= bv;
                    m ^= bm;
                }
            }
            if v != 0 {
                basis.push((v, m, 1 << (31 - v.leading_zeros())));
            }
        }
        Solver { len, cols, basis }
    }

    /// `L(x)`: how the ICRC changes when the ID changes by `x` (xor).
    fn delta(&self, x: u16) -> u32 {
        self.cols
            .iter()
            .enumerate()
            .filter(|(j, _)| x & (1 << j) != 0)
            .fold(0, |acc, (_, c)| acc ^ c)
    }

    /// The ID bits `m` with `L(m) = s`, if any.
    fn solve(&self, mut s: u32) -> Option<u16> {
        let mut m = 0u16;
        for &(bv, bm, p) in &self.basis {
            if s & p != 0 {
                s ^= bv;
                m ^= bm;
            }
        }
        (s == 0).then_some(m)
    }
}

/// Recovers the Identification of received IPv4 RoCE frames from their ICRC (see the module
/// documentation). Keeps the solvers of the last few frame lengths.
#[derive(Debug, Default)]
pub struct IdRecovery {
    solvers: Vec<Solver>,
    /// Frames whose ID was recovered (another than the stand-in they came with).
    pub recovered: u64,
    /// Frames no ID explains (left for the stack to drop as a bad ICRC).
    pub unexplained: u64,
}

impl IdRecovery {
    /// Gives the RoCE packet `l3` (IPv4 header to the end of the ICRC) the Identification `id`,
    /// with its header checksum and ICRC to match. Only a packet whose ICRC is right for its
    /// current ID is changed (so a payload that merely looks like RoCE is left alone); returns
    /// whether it was.
    pub fn set_id(&mut self, l3: &mut [u8], id: u16) -> bool {
        self.change_id(l3, id, true)
    }

    /// [`IdRecovery::set_id`] for a packet known to be RoCE with a right ICRC (one the
    /// transport core built): the ICRC is updated without being checked first, which saves a
    /// CRC pass over the packet. A packet that is not such gets its last 4 bytes changed.
    pub fn set_id_of_valid(&mut self, l3: &mut [u8], id: u16) -> bool {
        self.change_id(l3, id, false)
    }

    /// Gives `l3` the Identification `id` unless it has it already: with
    /// [`IdRecovery::set_id_of_valid`] when the caller knows its ICRC is right
    /// (`icrc_valid`), else with [`IdRecovery::set_id`]. Returns whether it
    /// carries `id` now.
    pub fn give_id(&mut self, l3: &mut [u8], id: u16, icrc_valid: bool) -> bool {
        if id_of(l3) == Some(id) {
            return true;
        }
        if icrc_valid {
            self.set_id_of_valid(l3, id)
        } else {
            self.set_id(l3, id)
        }
    }

    /// [`IdRecovery::set_id_of_valid`] for a packet in pieces: `head` is its
    /// start (IPv4 header, UDP header and BTH at least), `len` its whole
    /// length with the ICRC, and `icrc` its last 4 bytes. The bytes between
    /// are not needed: the change to the ICRC depends only on the length.
    pub fn set_id_of_valid_split(
        &mut self,
        head: &mut [u8],
        len: usize,
        icrc: &mut [u8],
        id: u16,
    ) -> bool {
        if !is_plain_ipv4(head) || len < IPV4_HLEN + icrc::ICRC_LEN || icrc.len() != 4 {
            return false;
        }
        let Some(cur) = id_of(head) else {
            return false;
        };
        if cur == id {
            return true;
        }
        let mut rx = [0u8; 4];
        rx.copy_from_slice(icrc);
        let end = len - icrc::ICRC_LEN;
        let Some(solver) = self.solver_for_len(end) else {
            return false;
        };
        let crc = u32::from_le_bytes(rx) ^ solver.delta(cur ^ id);
        write_id(head, id);
        icrc.copy_from_slice(&crc.to_le_bytes());
        true
    }

    /// Gives a packet whose payload lies elsewhere (a gathered send) the Identification `id`:
    /// `l3` is its head (IPv4 header, UDP header, BTH, ...; `head_len` bytes) followed by its
    /// tail (pad, ICRC), `len` its whole length. Its ICRC must be right (the transport core
    /// built it). Returns whether it carries `id` now.
    pub fn give_id_split(&mut self, l3: &mut [u8], head_len: usize, len: usize, id: u16) -> bool {
        let Some(icrc_at) = l3
            .len()
            .checked_sub(icrc::ICRC_LEN)
            .filter(|&at| at >= head_len)
        else {
            return false;
        };
        let (head, tail) = l3.split_at_mut(head_len);
        id_of(head) == Some(id)
            || self.set_id_of_valid_split(head, len, &mut tail[icrc_at - head_len..], id)
    }

    fn change_id(&mut self, l3: &mut [u8], id: u16, check: bool) -> bool {
        if !is_plain_ipv4(l3) || l3.len() < IPV4_HLEN + icrc::ICRC_LEN {
            return false;
        }
        let len = l3.len();
        let (head, crc) = l3.split_at_mut(len - icrc::ICRC_LEN);
        if check {
            let mut rx = [0u8; 4];
            rx.copy_from_slice(crc);
            if icrc::compute(head, false) != Some(u32::from_le_bytes(rx)) {
                return false;
            }
        }
        self.set_id_of_valid_split(head, len, crc, id)
    }

    /// `l3` (IPv4 header to the end of the ICRC) arrived with its Identification unknown (a
    /// stand-in in its place: 0, or a guess): unless the ICRC is right with the stand-in, finds
    /// the ID that makes it right and writes it (with the header checksum). Returns whether the
    /// ICRC is now right: then there is no need to check it again.
    pub fn fix(&mut self, l3: &mut [u8]) -> bool {
        if !is_plain_ipv4(l3) || l3.len() < IPV4_HLEN + icrc::ICRC_LEN {
            return false;
        }
        let Some(stand_in) = id_of(l3) else {
            return false;
        };
        let end = l3.len() - icrc::ICRC_LEN;
        let mut rx = [0u8; 4];
        rx.copy_from_slice(&l3[end..]);
        let received = u32::from_le_bytes(rx);
        let Some(at_stand_in) = icrc::compute(&l3[..end], false) else {
            return false;
        };
        if at_stand_in == received {
            return true;
        }
        // The solver gives the ID bits that differ from the stand-in's.
        match self
            .solver(l3, end)
            .and_then(|s| s.solve(received ^ at_stand_in))
        {
            Some(diff) => {
                let id = stand_in ^ diff;
                write_id(l3, id);
                self.recovered += 1;
                true
            }
            None => {
                self.unexplained += 1;
                false
            }
        }
    }

    /// The solver for packets of `end` bytes before the ICRC. The CRC is
    /// affine, so an ID's effect depends on the length alone: the columns
    /// are found on a stand-in packet of zeros shaped as RoCE over IPv4.
    fn solver_for_len(&mut self, end: usize) -> Option<&Solver> {
        if !self.solvers.iter().any(|s| s.len == end) {
            let mut stand_in = vec![0u8; end.max(IPV4_HLEN + 8 + 12)];
            stand_in[0] = 0x45;
            return self.solver(&mut stand_in, end);
        }
        self.solver(&mut [], end)
    }

    /// The solver for packets of `l3`'s length (built from `l3` itself: the columns do not
    /// depend on the contents; its ID bytes are restored).
    fn solver(&mut self, l3: &mut [u8], end: usize) -> Option<&Solver> {
        if let Some(i) = self.solvers.iter().position(|s| s.len == end) {
            // Most recently used first.
            let s = self.solvers.remove(i);
            self.solvers.insert(0, s);
            return self.solvers.first();
        }
        let saved = [l3[ID_AT], l3[ID_AT + 1]];
        let mut crc_with = |id: u16| {
            l3[ID_AT..ID_AT + 2].copy_from_slice(&id.to_be_bytes());
            icrc::compute(&l3[..end], false)
        };
        let zero = crc_with(0);
        let mut cols = [0u32; 16];
        for (j, c) in cols.iter_mut().enumerate() {
            *c = crc_with(1 << j).zip(zero).map_or(0, |(a, z)| a ^ z);
        }
        l3[ID_AT..ID_AT + 2].copy_from_slice(&saved);
        zero?;
        self.solvers.insert(0, Solver::new(end, cols));
        self.solvers.truncate(CACHE);
        self.solvers.first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RC SEND_ONLY over IPv4 (as in the stack's ICRC tests), IP header to the end of the pad,
    /// then room for the ICRC.
    fn packet(id: u16) -> Vec<u8> {
        let hex = "4500003c7c794000401194fdc612000ac612000bc00112b700280000\
                   0440ffff000000118000000168656c6c6f2072786521212121212121";
        let mut p: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        p.extend_from_slice(&[0; 4]);
        let end = p.len() - 4;
        let crc = icrc::compute(&p[..end], false).unwrap();
        p[end..].copy_from_slice(&crc.to_le_bytes());
        assert!(IdRecovery::default().set_id(&mut p, id));
        let crc = icrc::compute(&p[..end], false).unwrap();
        assert_eq!(p[end..], crc.to_le_bytes(), "set_id keeps the ICRC right");
        p
    }

    #[test]
    fn recovers_any_id() {
        let mut r = IdRecovery::default();
        for id in [0u16, 1, 2, 0x5de0, 0x8000, 0xffff, 12345] {
            let sent = packet(id);
            let mut got = sent.clone();
            write_id(&mut got, 0);
            r.fix(&mut got);
            assert_eq!(got, sent, "id {id:#x}");
        }
        assert_eq!(r.recovered, 6);
        assert_eq!(r.solvers.len(), 1);
    }

    #[test]
    fn a_corrupted_frame_mostly_stays_bad() {
        let mut r = IdRecovery::default();
        let mut bad = 0;
        // Byte 32 (BTH byte 4) is masked out of the ICRC.
        for byte in (28..60).filter(|b| *b != 32) {
            let mut got = packet(0x1234);
            got[byte] ^= 0x10;
            write_id(&mut got, 0);
            r.fix(&mut got);
            let end = got.len() - 4;
            let crc = icrc::compute(&got[..end], false).unwrap();
            if crc.to_le_bytes() != got[end..] {
                bad += 1;
            }
        }
        // A 16-bit check: single flipped bits are not explained by any ID here.
        assert_eq!(bad, 31);
        assert_eq!(r.unexplained, 31);
    }

    #[test]
    fn icrc_agrees_with_the_stack() {
        for id in [0u16, 9, 0xabcd] {
            let p = packet(id);
            let end = p.len() - 4;
            assert_eq!(
                icrc::compute(&p[..end], false),
                ferroce_stack::wire::icrc::compute(&p[..end], false)
            );
        }
        // IPv6: a fixed header (traffic class, flow label, hop limit set), UDP, a BTH, payload.
        let mut v6: Vec<u8> = vec![0x6a, 0xbc, 0xde, 0xf1, 0, 0, 17, 9];
        v6.extend((0..32).map(|i| i as u8 * 3));
        v6.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0, 0, 0x12, 0x34]);
        v6.extend_from_slice(&[0x04, 0x40, 0xff, 0xff, 0x5a, 0, 0, 0x11, 0x80, 0, 0, 7]);
        v6.extend((0..100).map(|i| i as u8));
        assert_eq!(
            icrc::compute(&v6, true),
            ferroce_stack::wire::icrc::compute(&v6, true)
        );
        let mut whole = v6.clone();
        whole.extend_from_slice(&icrc::compute(&v6, true).unwrap().to_le_bytes());
        assert!(icrc_ok(&whole));
        whole[70] ^= 1;
        assert!(!icrc_ok(&whole));
        let mut whole4 = packet(5);
        assert!(icrc_ok(&whole4));
        let n = whole4.len();
        whole4[n - 1] ^= 1;
        assert!(!icrc_ok(&whole4));
    }

    #[test]
    fn set_id_of_valid_matches_set_id_without_the_check() {
        let mut r = IdRecovery::default();
        for id in [1u16, 2, 63, 0xfffe] {
            let (mut a, mut b) = (packet(0), packet(0));
            assert!(r.set_id(&mut a, id));
            assert!(r.set_id_of_valid(&mut b, id));
            assert_eq!(a, b, "id {id}");
        }
        // It does not look at the ICRC: a wrong one stays wrong, by the same amount.
        let mut fake = packet(0);
        fake[50] ^= 1;
        let mut check = fake.clone();
        assert!(!r.set_id(&mut check, 3));
        assert!(r.set_id_of_valid(&mut fake, 3));
        let end = fake.len() - 4;
        let want = icrc::compute(&fake[..end], false).unwrap();
        assert_ne!(fake[end..], want.to_le_bytes());
        assert_eq!(id_of(&fake), Some(3));
    }

    #[test]
    fn set_id_of_valid_split_matches_the_whole_packet() {
        // A fresh recovery each time, so the split one builds its own solver.
        for id in [1u16, 2, 63, 0xfffe] {
            let mut whole = packet(0);
            assert!(IdRecovery::default().set_id_of_valid(&mut whole, id));
            let mut parts = packet(0);
            let len = parts.len();
            let (head, rest) = parts.split_at_mut(48);
            let at = rest.len() - 4;
            let icrc = &mut rest[at..];
            assert!(IdRecovery::default().set_id_of_valid_split(head, len, icrc, id));
            assert_eq!(parts, whole, "id {id}");
        }
        let mut v6 = vec![0x60u8; 80];
        let mut t = [0u8; 4];
        assert!(!IdRecovery::default().set_id_of_valid_split(&mut v6, 84, &mut t, 1));
    }

    #[test]
    fn set_id_rejects_non_ipv4_and_non_roce() {
        let mut r = IdRecovery::default();
        let mut v6 = vec![0x60u8; 80];
        assert!(!r.set_id(&mut v6, 1));
        let mut other = packet(0);
        other[28] = 0xf0;
        assert!(!r.set_id(&mut other, 1));
        // Looks like RoCE, but its ICRC is not one: left alone.
        let mut fake = packet(0);
        fake[50] ^= 1;
        let before = fake.clone();
        assert!(!r.set_id(&mut fake, 3));
        assert_eq!(fake, before);
        assert_eq!(id_of(&packet(7)), Some(7));
    }
}
