//! The RoCE v2 invariant CRC (IBTA Annex A17.3.3; Linux rxe_icrc.c).
//!
//! CRC-32 (the Ethernet polynomial, reflected; what `crc32fast` and zlib
//! compute, initial value and final complement included) over:
//! 8 bytes of 0xFF standing in for the LRH, the IP header with its mutable
//! fields (IPv4 ToS, TTL, header checksum; IPv6 traffic class, flow label,
//! hop limit) set to ones, the UDP header with its checksum set to ones, the
//! BTH with byte 4 (FECN/BECN/resv) set to ones, then the rest of the packet
//! up to and including the pad. Stored little-endian in the last 4 bytes.
//! The Ethernet header is not covered.
//!
//! The masked headers are copied into one small stack buffer (at most 68
//! bytes); the payload is hashed where it lies, so the frame is never copied.

use super::bth;

const UDP_LEN: usize = 8;
const MAX_MASKED: usize = 40 + UDP_LEN + bth::HEADER_LEN;
/// CRC-32 of the 8 bytes of 0xFF that stand in for the InfiniBand LRH, so
/// each packet starts from it instead of hashing them again (rxe does the
/// same with its uncomplemented seed 0xDEBB20E3).
const LRH_STANDIN_CRC: u32 = !0xdebb_20e3;

/// ICRC length in bytes.
pub const ICRC_LEN: usize = 4;

/// The variant fields, as (offset from the IP header, bits set to one).
/// IPv4: DSCP + ECN, TTL, header checksum; IPv6: traffic class and flow
/// label (the version nibble stays), hop limit; then the UDP checksum and
/// the BTH's FECN/BECN/reserved byte.
const V4_VARIANT: [(usize, u8); 7] = [
    (1, 0xff),
    (8, 0xff),
    (10, 0xff),
    (11, 0xff),
    (20 + 6, 0xff),
    (20 + 7, 0xff),
    (20 + UDP_LEN + bth::ECN_BYTE, 0xff),
];
const V6_VARIANT: [(usize, u8); 8] = [
    (0, 0x0f),
    (1, 0xff),
    (2, 0xff),
    (3, 0xff),
    (7, 0xff),
    (40 + 6, 0xff),
    (40 + 7, 0xff),
    (40 + UDP_LEN + bth::ECN_BYTE, 0xff),
];

fn variant(ipv6: bool) -> &'static [(usize, u8)] {
    if ipv6 {
        &V6_VARIANT
    } else {
        &V4_VARIANT
    }
}

fn masked_len(ipv6: bool) -> usize {
    (if ipv6 { 40 } else { 20 }) + UDP_LEN + bth::HEADER_LEN
}

/// Compute the ICRC of a RoCE v2 packet.
///
/// `l3` starts at the IP header and ends just before the ICRC (it holds the
/// IP header, UDP header, BTH, extension headers, payload and pad). `ipv6`
/// selects the header layout. Returns `None` if `l3` is too short to hold the
/// IP and UDP headers and a BTH.
pub fn compute(l3: &[u8], ipv6: bool) -> Option<u32> {
    let masked_len = masked_len(ipv6);
    let (head, rest) = (l3.get(..masked_len)?, l3.get(masked_len..)?);

    let mut buf = [0u8; MAX_MASKED];
    let masked = &mut buf[..masked_len];
    masked.copy_from_slice(head);
    for &(at, ones) in variant(ipv6) {
        masked[at] |= ones;
    }
    let mut h = crc32fast::Hasher::new_with_initial(LRH_STANDIN_CRC);
    h.update(&buf[..masked_len]);
    h.update(rest);
    Some(h.finalize())
}

/// The variant fields' bytes of a packet being built, kept by
/// [`mask_in_place`] while the packet carries ones there.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    ipv6: bool,
    bytes: [u8; 8],
}

/// For a sender: set the variant fields of the headers in `l3` to ones,
/// returning what they held, so that once the payload is in place
/// [`compute_masked`] hashes the packet in one pass with no copy of its
/// headers; [`unmask`] then puts the fields back. Done before the payload
/// is written, these byte stores have reached the cache by the time the
/// CRC's wide loads read them. `None` if `l3` cannot hold the headers.
pub fn mask_in_place(l3: &mut [u8], ipv6: bool) -> Option<Variant> {
    let head = l3.get_mut(..masked_len(ipv6))?;
    let mut v = Variant {
        ipv6,
        bytes: [0; 8],
    };
    for (saved, &(at, ones)) in v.bytes.iter_mut().zip(variant(ipv6)) {
        *saved = head[at];
        head[at] |= ones;
    }
    Some(v)
}

/// The ICRC of `l3` (as [`compute`]) whose variant fields [`mask_in_place`] already set to ones.
pub fn compute_masked(l3: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(LRH_STANDIN_CRC);
    h.update(l3);
    h.finalize()
}

/// Put back the fields [`mask_in_place`] set to ones.
pub fn unmask(l3: &mut [u8], v: Variant) {
    if let Some(head) = l3.get_mut(..masked_len(v.ipv6)) {
        for (saved, &(at, _)) in v.bytes.iter().zip(variant(v.ipv6)) {
            head[at] = *saved;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RC SEND_ONLY over IPv4, from the IP header to the end of the pad
    /// (the ICRC itself excluded).
    const RXE_SEND_ONLY_V4: &str = "\
4500003c7c794000401194fdc612000ac612000b\
c00112b700280000\
0440ffff0000001180000001\
68656c6c6f2072786521212121212121";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn masks_only_the_variant_fields() {
        let l3 = unhex(RXE_SEND_ONLY_V4);
        let base = compute(&l3, false).unwrap();
        // Changing a masked field does not change the ICRC...
        for (at, v) in [
            (1, 0x02u8),
            (8, 0x01),
            (10, 0x00),
            (11, 0x00),
            (26, 0x12),
            (27, 0x34),
            (32, 0xc0),
        ] {
            let mut m = l3.clone();
            m[at] = v;
            assert_eq!(
                compute(&m, false).unwrap(),
                base,
                "byte {at} should be masked"
            );
        }
        // ...changing any other byte does.
        for at in [
            0usize,
            2,
            9,
            12,
            19,
            20,
            22,
            24,
            28,
            31,
            33,
            40,
            l3.len() - 1,
        ] {
            let mut m = l3.clone();
            m[at] ^= 0x01;
            assert_ne!(
                compute(&m, false).unwrap(),
                base,
                "byte {at} must be covered"
            );
        }
    }

    #[test]
    fn lrh_standin_matches_rxe_seed() {
        // rxe seeds its CRC with 0xDEBB20E3: the (uncomplemented) CRC state
        // after the 8 0xFF bytes. crc32fast reports the complemented state.
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        assert_eq!(!h.clone().finalize(), 0xdebb_20e3);
        assert_eq!(h.finalize(), LRH_STANDIN_CRC);
    }

    #[test]
    fn in_place_masking_agrees_and_restores() {
        let v4 = unhex(RXE_SEND_ONLY_V4);
        let mut v6 = vec![0x6au8; 40];
        v6.extend_from_slice(&v4[20..]);
        for (l3, ipv6) in [(v4, false), (v6, true)] {
            let want = compute(&l3, ipv6).unwrap();
            let mut m = l3.clone();
            let saved = mask_in_place(&mut m, ipv6).unwrap();
            assert_ne!(m, l3);
            assert_eq!(compute_masked(&m), want, "ipv6 {ipv6}");
            unmask(&mut m, saved);
            assert_eq!(m, l3, "ipv6 {ipv6}");
        }
        assert!(mask_in_place(&mut [0u8; 39], false).is_none());
    }

    #[test]
    fn too_short_is_none() {
        assert_eq!(compute(&[0u8; 39], false), None);
        assert_eq!(compute(&[0u8; 59], true), None);
        assert!(compute(&[0u8; 40], false).is_some());
    }
}
