//! Finishing what a local UDP sender left to a NIC that veth does not have.
//!
//! A local UDP socket's datagrams (our UDP backend, or rxe's kernel socket)
//! cross a veth pair as the kernel built them for offload, and a raw receiver
//! (AF_PACKET, AF_XDP) sees them that way:
//! - with CHECKSUM_PARTIAL: the checksum field holds only the folded
//!   pseudo-header sum, so a stack that checks UDP checksums, like ours or a
//!   peer's, would drop every such frame. AF_PACKET flags those frames
//!   (TP_STATUS_CSUMNOTREADY) and [`clear_partial`] sets the field to 0
//!   ("none": the ICRC checks the frame end to end); AF_XDP says
//!   nothing, so [`partial_finish`] recognises the form itself and, in the
//!   same pass over the datagram, works out the finished checksum.
//! - with UDP GSO (UDP_SEGMENT): one frame carries many datagrams back to back,
//!   never cut into wire frames. AF_PACKET reports the segment size in the
//!   virtio-net header (PACKET_VNET_HDR) and [`segment_udp`] cuts it, in
//!   place, as the kernel's software GSO would. (veth with an XDP program attached turns its
//!   peer's GSO off, so AF_XDP receives wire frames.)

/// Where a frame's UDP datagram lies and its pseudo-header sum (RFC 768).
struct Udp {
    ip_at: usize,
    v6: bool,
    at: usize,
    len: usize,
    pseudo: u64,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Adds big-endian 16-bit words (odd tail padded with zero) to `sum`.
fn add_words(mut sum: u64, b: &[u8]) -> u64 {
    let mut words = b.chunks_exact(2);
    for w in &mut words {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

fn fold(mut sum: u64) -> u16 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

/// The checksum field for a datagram (pseudo-header included) summing to
/// `sum`: its complement, with 0 sent as 0xFFFF (RFC 768).
fn finish(sum: u64) -> u16 {
    match !fold(sum) {
        0 => 0xFFFF,
        c => c,
    }
}

/// Finds the UDP datagram of an Ethernet (optionally one VLAN tag) IPv4 or
/// IPv6 frame; None for anything else or anything truncated.
fn locate(f: &[u8]) -> Option<Udp> {
    locate_headers(f).filter(|u| u.at + u.len <= f.len())
}

/// [`locate`] without requiring the datagram to lie in `f`.
fn locate_headers(f: &[u8]) -> Option<Udp> {
    let mut ip_at = 14;
    let mut ethertype = be16(f, 12)?;
    if ethertype == 0x8100 || ethertype == 0x88A8 {
        ethertype = be16(f, 16)?;
        ip_at = 18;
    }
    let (at, src_dst) = match ethertype {
        0x0800 if f.get(ip_at)? >> 4 == 4 => {
            let ihl = usize::from(f.get(ip_at)? & 0x0F) * 4;
            // Not UDP, or a fragment (its checksum spans other frames).
            if *f.get(ip_at + 9)? != 17 || be16(f, ip_at + 6)? & 0x3FFF != 0 || ihl < 20 {
                return None;
            }
            (ip_at + ihl, f.get(ip_at + 12..ip_at + 20)?)
        }
        // No extension headers: RoCE v2 frames carry none.
        0x86DD if *f.get(ip_at + 6)? == 17 && f.get(ip_at)? >> 4 == 6 => {
            (ip_at + 40, f.get(ip_at + 8..ip_at + 40)?)
        }
        _ => return None,
    };
    let len = usize::from(be16(f, at + 4)?);
    if len < 8 {
        return None;
    }
    let pseudo = add_words(0, src_dst) + 17 + len as u64;
    Some(Udp {
        ip_at,
        v6: ethertype == 0x86DD,
        at,
        len,
        pseudo,
    })
}

/// A finished UDP checksum and where in its frame it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    field_at: usize,
    checksum: u16,
}

impl Finish {
    /// Writes the checksum into `f`: the frame it was worked out from, or a
    /// copy of it. False (untouched) when `f` is too short for that.
    pub fn apply(self, f: &mut [u8]) -> bool {
        match f.get_mut(self.field_at..self.field_at + 2) {
            Some(field) => {
                field.copy_from_slice(&self.checksum.to_be_bytes());
                true
            }
            None => false,
        }
    }
}

/// The kernel's partial form of the frame's UDP checksum (the folded
/// pseudo-header sum, for the UDP length the frame declares): what a
/// CHECKSUM_PARTIAL frame carries for the device to finish. None when the
/// frame is not UDP over IP.
pub fn partial_form(f: &[u8]) -> Option<u16> {
    locate(f).map(|u| fold(u.pseudo))
}

/// [`partial_form`] from the Ethernet, IP and UDP headers alone (`h` may
/// end at the UDP header; the datagram's bytes may lie elsewhere).
pub fn partial_form_of_headers(h: &[u8]) -> Option<u16> {
    locate_headers(h).map(|u| fold(u.pseudo))
}

/// When the frame's UDP checksum field holds the kernel's partial form (the
/// folded pseudo-header sum) and the datagram does not already verify with
/// it, the checksum that finishes it, as [`complete`] would write; else None.
/// One pass over the datagram; cheap for anything else (a zero field, as rxe
/// and ferroce send over IPv4, costs a header parse).
pub fn partial_finish(f: &[u8]) -> Option<Finish> {
    let u = locate(f)?;
    let field = be16(f, u.at + 6)?;
    if field == 0 || field != fold(u.pseudo) {
        return None;
    }
    // The datagram's sum with the field as it is (it already holds the
    // pseudo-header's part), in a u64 that cannot wrap (at most 2^15 words).
    let data = add_words(0, f.get(u.at..u.at + u.len)?);
    // A full checksum that happens to equal the pseudo sum (1 in 65 536)
    // verifies as it is: with the pseudo-header, the sum folds to all ones.
    if fold(u.pseudo + data) == 0xFFFF {
        return None;
    }
    Some(Finish {
        field_at: u.at + 6,
        checksum: finish(data),
    })
}

/// True when [`partial_finish`] has a checksum for the frame: it needs
/// finishing.
pub fn looks_partial(f: &[u8]) -> bool {
    partial_finish(f).is_some()
}

/// Finishes a partial UDP checksum in place, as skb_checksum_help would: the
/// one's complement sum of the datagram with the field as it is (which already
/// holds the pseudo-header sum), complemented; 0 is sent as 0xFFFF (RFC 768).
/// Returns false (frame untouched) when the frame is not UDP over IP.
pub fn complete(f: &mut [u8]) -> bool {
    let Some(u) = locate(f) else { return false };
    let Some(d) = f.get(u.at..u.at + u.len) else {
        return false;
    };
    Finish {
        field_at: u.at + 6,
        checksum: finish(add_words(0, d)),
    }
    .apply(f)
}

/// The finished UDP checksum of `datagram` (its checksum field zeroed), given
/// the sum of the pseudo-header's addresses.
fn finished(pseudo_addrs: u64, datagram: &[u8]) -> u16 {
    finish(add_words(
        pseudo_addrs + 17 + datagram.len() as u64,
        datagram,
    ))
}

/// Longest Ethernet (one VLAN tag) + IP (options included) + UDP headers.
const MAX_HDR: usize = 18 + 60 + 8;

/// Cuts a UDP GSO super-frame (`gso_size`-byte datagrams back to back behind
/// one set of headers) into the frames the kernel's software GSO would have
/// sent, in place: each segment's headers are written over the last bytes of
/// the segment before it, which `emit` has had by then. Each frame gets its IP
/// length, UDP length, a consecutive IPv4 ID (the kernel numbers GSO segments
/// that way, and the RoCE ICRC covers the ID) and the IPv4 header checksum.
/// The UDP checksum: with `partial` (the kernel left it to the device:
/// TP_STATUS_CSUMNOTREADY) it is set to 0, "none" (the frame never crossed a
/// wire; the ICRC still covers every byte end to end, and a NIC's finished
/// checksum would be checked by nobody but us); otherwise, unless the
/// super-frame had none (0 over IPv4), it is finished over the segment.
/// Returns how many frames `emit` got, or None (nothing emitted) when the
/// frame is not UDP over IP.
pub fn segment_udp(
    f: &mut [u8],
    gso_size: usize,
    partial: bool,
    emit: &mut dyn FnMut(&mut [u8]),
) -> Option<usize> {
    let u = locate(f)?;
    let hl = u.at + 8;
    if gso_size == 0 || hl > MAX_HDR {
        return None;
    }
    let mut hdr = [0u8; MAX_HDR];
    hdr[..hl].copy_from_slice(f.get(..hl)?);
    let checksummed = u.v6 || be16(f, u.at + 6)? != 0;
    let addrs = u.pseudo - 17 - u.len as u64;
    let ihl = u.at - u.ip_at;
    let first_id = be16(f, u.ip_at + 4)?;
    let (ip, udp) = (u.ip_at, u.at);
    let payload_end = u.at + u.len;
    let mut n = 0;
    let mut start = hl;
    while start < payload_end {
        let chunk = gso_size.min(payload_end - start);
        let at = start - hl;
        let out = f.get_mut(at..start + chunk)?;
        if n > 0 {
            out[..hl].copy_from_slice(&hdr[..hl]);
        }
        let ulen = (8 + chunk) as u16;
        if u.v6 {
            out[ip + 4..ip + 6].copy_from_slice(&ulen.to_be_bytes());
        } else {
            let total = (ihl + 8 + chunk) as u16;
            out[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
            let id = first_id.wrapping_add(n as u16);
            out[ip + 4..ip + 6].copy_from_slice(&id.to_be_bytes());
            out[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
            let c = crate::frame::ipv4_checksum(&out[ip..ip + ihl]);
            out[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        }
        out[udp + 4..udp + 6].copy_from_slice(&ulen.to_be_bytes());
        if partial || checksummed {
            out[udp + 6..udp + 8].copy_from_slice(&[0, 0]);
        }
        if checksummed && !partial {
            let c = finished(addrs, &out[udp..]);
            out[udp + 6..udp + 8].copy_from_slice(&c.to_be_bytes());
        }
        emit(out);
        n += 1;
        start += chunk;
    }
    Some(n)
}

/// Sets a partial UDP checksum (the kernel left it to the device:
/// TP_STATUS_CSUMNOTREADY) to 0, "none", in place: the frame came from a
/// socket on this host and crossed no wire, and the RoCE ICRC checks it end
/// to end. Finishing it instead ([`complete`]) is a pass over the datagram
/// that only our own check would read. False when the frame is not UDP over IP.
pub fn clear_partial(f: &mut [u8]) -> bool {
    let Some(u) = locate(f) else { return false };
    match f.get_mut(u.at + 6..u.at + 8) {
        Some(field) => {
            field.fill(0);
            true
        }
        None => false,
    }
}

/// True when the frame's UDP checksum verifies (or is 0 over IPv4, "none").
pub fn udp_checksum_ok(f: &[u8]) -> bool {
    let Some(u) = locate(f) else { return false };
    let Some(field) = be16(f, u.at + 6) else {
        return false;
    };
    let v4 = f.get(12..14) == Some(&[0x08, 0x00]) || f.get(16..18) == Some(&[0x08, 0x00]);
    if field == 0 && v4 {
        return true;
    }
    f.get(u.at..u.at + u.len)
        .is_some_and(|d| fold(add_words(u.pseudo, d)) == 0xFFFF)
}

/// The segment size of `p`, the UDP payloads of a GSO send back to back
/// (all of one size but the last, which may be shorter): the first size, up
/// to `max`, at every multiple of which a packet of the first one's stream
/// starts: a BTH with its destination QP, transport version 0 and a later
/// PSN than the packet before (by one, or by more after a READ request,
/// whose responses take PSNs too). None if there is none: not RoCE, or not
/// such a send.
pub fn roce_segment_len(p: &[u8], max: usize) -> Option<usize> {
    // BTH (IBTA 9.2): TVer in byte 1's low nibble, DestQP bytes 5-7, PSN bytes 9-11.
    const BTH: usize = 12;
    const ICRC: usize = 4;
    let first = p.get(..BTH)?;
    let psn = |b: &[u8]| u32::from_be_bytes([0, b[9], b[10], b[11]]);
    // Later within half the 24-bit PSN space (IBTA 9.7.2's window rule).
    let follows = |b: &[u8], before: u32| {
        let ahead = psn(b).wrapping_sub(before) & 0x00ff_ffff;
        b[1] & 0x0f == 0 && b[5..8] == first[5..8] && ahead > 0 && ahead < 0x0080_0000
    };
    (BTH + ICRC..=max.min(p.len().saturating_sub(BTH))).find(|&s| {
        let mut before = psn(first);
        let mut at = s;
        while at < p.len() {
            match p.get(at..at + BTH) {
                Some(b) if follows(b, before) => before = psn(b),
                _ => return false,
            }
            at += s;
        }
        true
    })
}

/// The size of the datagrams a GSO super-frame `f` joins behind one set of
/// headers, when the kernel does not say (a local UDP socket's GSO send
/// crossing veth, on Linux before 6.2): worked out from the RoCE packets
/// inside, none longer than `max_payload`. None for a single datagram, or a
/// frame that is not RoCE over UDP.
pub fn infer_gso_size(f: &[u8], max_payload: usize) -> Option<usize> {
    let u = locate(f)?;
    let payload = f.get(u.at + 8..u.at + u.len)?;
    roce_segment_len(payload, max_payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{build_udp_frame, HeaderSpec};

    fn frame(v6: bool, len: usize, vlan: bool) -> Vec<u8> {
        let (s, d) = if v6 {
            ("[fd00::1]:4791", "[fd00::2]:4791")
        } else {
            ("198.18.0.1:4791", "198.18.0.2:4791")
        };
        let spec = HeaderSpec {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            src: s.parse().unwrap(),
            dst: d.parse().unwrap(),
            tos: 0,
            ttl: 64,
        };
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let mut f = build_udp_frame(&spec, &payload).unwrap();
        if vlan {
            f.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        }
        f
    }

    /// Puts the kernel's partial form in the field: the folded pseudo sum.
    fn make_partial(f: &mut [u8]) -> usize {
        let u = locate(f).unwrap();
        let p = fold(u.pseudo);
        f[u.at + 6..u.at + 8].copy_from_slice(&p.to_be_bytes());
        u.at
    }

    #[test]
    fn completing_a_partial_checksum_gives_the_full_one() {
        for v6 in [false, true] {
            for vlan in [false, true] {
                for len in [0, 1, 13, 1500, 4113, 8900] {
                    let mut f = frame(v6, len, vlan);
                    let at = make_partial(&mut f);
                    assert!(looks_partial(&f), "v6={v6} vlan={vlan} len={len}");
                    assert!(complete(&mut f));
                    assert!(udp_checksum_ok(&f), "v6={v6} vlan={vlan} len={len}");
                    assert!(!looks_partial(&f));
                    assert_ne!(&f[at + 6..at + 8], &[0, 0]);
                }
            }
        }
    }

    /// The AF_XDP path as it was: one pass to rule out a full checksum that
    /// equals the pseudo sum, a second to finish.
    fn two_pass(f: &[u8]) -> Option<Vec<u8>> {
        let u = locate(f)?;
        let field = be16(f, u.at + 6)?;
        if field == 0 || field != fold(u.pseudo) {
            return None;
        }
        let whole = f
            .get(u.at..u.at + u.len)
            .map_or(0, |d| add_words(u.pseudo, d));
        if fold(whole) == 0xFFFF {
            return None;
        }
        // The second pass: the old `complete`, word for word.
        let d = f.get(u.at..u.at + u.len)?;
        let c = match !fold(add_words(0, d)) {
            0 => 0xFFFF,
            c => c,
        };
        let mut g = f.to_vec();
        g[u.at + 6..u.at + 8].copy_from_slice(&c.to_be_bytes());
        Some(g)
    }

    fn one_pass(f: &[u8]) -> Option<Vec<u8>> {
        let fin = partial_finish(f)?;
        let mut g = f.to_vec();
        assert!(fin.apply(&mut g));
        Some(g)
    }

    /// xorshift64: repeatable random bytes without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> usize {
            (self.next() % n) as usize
        }
    }

    #[test]
    fn one_pass_finishes_as_the_two_passes_did() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut partial = 0;
        for i in 0..3000 {
            let v6 = i % 2 == 1;
            let vlan = i % 5 == 0;
            // Odd and even lengths, small and jumbo.
            let len = match i % 4 {
                0 => rng.below(16),
                1 => rng.below(1500),
                _ => rng.below(9000),
            };
            let mut f = frame(v6, len, vlan);
            let u = locate(&f).unwrap();
            let ip = u.ip_at;
            // Random addresses, so the pseudo sum takes every value.
            let addrs = if v6 {
                ip + 8..ip + 40
            } else {
                ip + 12..ip + 20
            };
            for b in &mut f[addrs.clone()] {
                *b = rng.next() as u8;
            }
            for b in &mut f[u.at + 8..] {
                *b = rng.next() as u8;
            }
            let u = locate(&f).unwrap();
            if i % 7 == 0 {
                // The pseudo sum folds to 0xFFFF: fix one source word.
                let w = addrs.start;
                f[w..w + 2].copy_from_slice(&[0, 0]);
                let rest = fold(locate(&f).unwrap().pseudo);
                let need = 0xFFFF - rest;
                f[w..w + 2].copy_from_slice(&need.to_be_bytes());
                assert_eq!(fold(locate(&f).unwrap().pseudo), 0xFFFF);
            }
            let u2 = locate(&f).unwrap();
            assert_eq!(u2.at, u.at);
            let p = fold(u2.pseudo);
            let at = u.at + 6;
            let mut full = f.clone();
            full[at..at + 2].copy_from_slice(&[0, 0]);
            let full_sum = finished(u2.pseudo - 17 - u2.len as u64, &full[u.at..]);
            for field in [0, 0xFFFF, p, full_sum, rng.next() as u16] {
                let mut g = f.clone();
                g[at..at + 2].copy_from_slice(&field.to_be_bytes());
                let old = two_pass(&g);
                assert_eq!(
                    one_pass(&g),
                    old,
                    "i={i} v6={v6} len={len} field={field:#x}"
                );
                assert_eq!(looks_partial(&g), old.is_some());
                if let Some(done) = old {
                    partial += 1;
                    assert!(udp_checksum_ok(&done), "i={i} v6={v6} len={len}");
                    let mut h = g.clone();
                    assert!(complete(&mut h));
                    assert_eq!(h, done, "AF_PACKET's complete agrees");
                }
            }
            // A full checksum equal to the pseudo sum (1 in 65 536): set
            // the field to it, then make the datagram verify by one payload
            // word, which then needs no finishing.
            if len >= 2 {
                let mut g = f.clone();
                g[at..at + 2].copy_from_slice(&p.to_be_bytes());
                let w = u.at + 8;
                g[w..w + 2].copy_from_slice(&[0, 0]);
                let rest = fold(add_words(u2.pseudo, &g[u.at..u.at + u.len]));
                g[w..w + 2].copy_from_slice(&(0xFFFF - rest).to_be_bytes());
                assert!(udp_checksum_ok(&g), "i={i}");
                assert_eq!(two_pass(&g), None);
                assert_eq!(one_pass(&g), None);
            }
        }
        assert!(partial > 2500, "{partial} partial frames finished");
    }

    #[test]
    fn a_gso_super_frame_is_cut_as_the_kernel_would() {
        for v6 in [false, true] {
            for vlan in [false, true] {
                for partial in [false, true] {
                    for (total, gso) in [
                        (4112 * 3 + 100, 4112),
                        (4112 * 2, 4112),
                        (50, 4112),
                        (0, 1000),
                        (7, 1),
                    ] {
                        let mut f = frame(v6, total, vlan);
                        let ip = if vlan { 18 } else { 14 };
                        if !v6 {
                            f[ip + 4..ip + 6].copy_from_slice(&0xFFFEu16.to_be_bytes());
                        }
                        if partial {
                            make_partial(&mut f);
                        }
                        let payload = f[f.len() - total..].to_vec();
                        let mut segs: Vec<Vec<u8>> = Vec::new();
                        let n = segment_udp(&mut f, gso, partial, &mut |s| segs.push(s.to_vec()));
                        let want: Vec<&[u8]> = payload.chunks(gso).collect();
                        let what = format!("v6={v6} vlan={vlan} partial={partial} total={total}");
                        assert_eq!(n, Some(want.len()), "{what}");
                        assert_eq!(segs.len(), want.len(), "{what}");
                        for (i, (s, chunk)) in segs.iter().zip(&want).enumerate() {
                            let u = locate(s).expect("a segment parses");
                            assert_eq!(&s[u.at + 8..], *chunk, "{what} segment {i}");
                            assert_eq!(u.len, 8 + chunk.len());
                            let field = u16::from_be_bytes([s[u.at + 6], s[u.at + 7]]);
                            if partial {
                                assert_eq!(field, 0, "{what}: a partial checksum is cleared");
                            } else {
                                assert!(udp_checksum_ok(s), "{what} segment {i} UDP checksum");
                                if v6 {
                                    assert_ne!(field, 0, "{what}");
                                }
                            }
                            if !v6 {
                                assert_eq!(crate::frame::ipv4_checksum(&s[ip..ip + 20]), 0);
                                let id = u16::from_be_bytes([s[ip + 4], s[ip + 5]]);
                                assert_eq!(id, 0xFFFEu16.wrapping_add(i as u16));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(segment_udp(&mut [0u8; 30], 100, true, &mut |_| {}), None);
    }

    #[test]
    fn clearing_a_partial_checksum_leaves_the_rest() {
        for v6 in [false, true] {
            let mut f = frame(v6, 300, false);
            let at = make_partial(&mut f);
            let before = f.clone();
            assert!(clear_partial(&mut f));
            assert_eq!(&f[at + 6..at + 8], &[0, 0]);
            assert_eq!(&f[..at + 6], &before[..at + 6]);
            assert_eq!(&f[at + 8..], &before[at + 8..]);
        }
        assert!(!clear_partial(&mut [0u8; 20]));
    }

    #[test]
    fn zero_and_garbage_are_left_alone() {
        let mut f = frame(false, 100, false);
        let at = locate(&f).unwrap().at;
        f[at + 6..at + 8].copy_from_slice(&[0, 0]);
        assert!(!looks_partial(&f));
        assert!(udp_checksum_ok(&f));
        f[at + 6] ^= 0x55;
        assert!(!looks_partial(&f), "a wrong checksum is not a partial one");
        assert!(!udp_checksum_ok(&f));
        for cut in 0..f.len() {
            assert!(!looks_partial(&f[..cut]));
            let mut g = f[..cut].to_vec();
            let _ = complete(&mut g);
        }
        // A UDP length beyond the frame.
        f[at + 4..at + 6].copy_from_slice(&0xFFFFu16.to_be_bytes());
        assert!(!complete(&mut f.clone()));
    }

    /// A RoCE packet of `len` bytes: BTH with `qp` and `psn`, filler after.
    fn packet(len: usize, qp: u32, psn: u32, fill: u8) -> Vec<u8> {
        let mut p = vec![fill; len];
        p[0] = 0x01; // SEND middle
        p[1] = 0x00;
        p[5..8].copy_from_slice(&qp.to_be_bytes()[1..]);
        p[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
        p
    }

    #[test]
    fn finds_the_segment_size_of_a_gso_blob() {
        for (seg, last, psn) in [(4112, 4112, 7), (4112, 100, 0x00ff_fffe), (1040, 600, 3)] {
            let mut blob = Vec::new();
            for i in 0..14u32 {
                blob.extend(packet(
                    seg,
                    0x12_3456,
                    (psn + i) & 0x00ff_ffff,
                    (i * 7) as u8,
                ));
            }
            blob.extend(packet(last, 0x12_3456, (psn + 14) & 0x00ff_ffff, 0x11));
            assert_eq!(roce_segment_len(&blob, 8982), Some(seg), "{seg} {last}");
        }
    }

    #[test]
    fn finds_the_size_of_read_requests_apart_in_psn() {
        // A READ request takes a PSN for each response packet: 8 KiB reads at
        // MTU 4096 are two PSNs apart.
        let mut blob = Vec::new();
        for i in 0..5u32 {
            blob.extend(packet(32, 0x11, (0x00ff_fffc + 2 * i) & 0x00ff_ffff, 0));
        }
        assert_eq!(roce_segment_len(&blob, 8982), Some(32));
    }

    #[test]
    fn no_segment_size_without_following_packets() {
        // Another QP's packet next, a PSN that does not move on (or goes
        // back), a run that breaks off later, too short, not RoCE.
        let mut other = packet(4112, 1, 5, 0);
        other.extend(packet(4112, 2, 6, 0));
        let mut same = packet(4112, 1, 5, 0);
        same.extend(packet(4112, 1, 5, 0));
        let mut back = packet(4112, 1, 5, 0);
        back.extend(packet(4112, 1, 4, 0));
        let mut broken = packet(1040, 1, 5, 0);
        broken.extend(packet(1040, 1, 6, 0));
        broken.extend(packet(1040, 2, 7, 0));
        for blob in [other, same, back, broken, vec![0u8; 11], vec![0xffu8; 9000]] {
            assert_eq!(roce_segment_len(&blob, 8982), None);
        }
    }
}
