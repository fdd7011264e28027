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

/// Compute the ICRC of a RoCE v2 packet.
///
/// `l3` starts at the IP header and ends just before the ICRC (it holds the
/// IP header, UDP header, BTH, extension headers, payload and pad). `ipv6`
/// selects the header layout. Returns `None` if `l3` is too short to hold the
/// IP and UDP headers and a BTH.
pub fn compute(l3: &[u8], ipv6: bool) -> Option<u32> {
    let ip_len = if ipv6 { 40 } else { 20 };
    let masked_len = ip_len + UDP_LEN + bth::HEADER_LEN;
    let (head, rest) = (l3.get(..masked_len)?, l3.get(masked_len..)?);

    let mut buf = [0u8; MAX_MASKED];
    let masked = &mut buf[..masked_len];
    masked.copy_from_slice(head);
    if ipv6 {
        // Version nibble stays; traffic class and flow label become ones.
        masked[0] |= 0x0f;
        masked[1..4].fill(0xff);
        masked[7] = 0xff; // hop limit
    } else {
        masked[1] = 0xff; // DSCP + ECN
        masked[8] = 0xff; // TTL
        masked[10..12].fill(0xff); // header checksum
    }
    let udp = ip_len;
    masked[udp + 6..udp + 8].fill(0xff); // UDP checksum
    masked[udp + UDP_LEN + bth::ECN_BYTE] = 0xff; // FECN, BECN, reserved

    let mut h = crc32fast::Hasher::new_with_initial(LRH_STANDIN_CRC);
    h.update(&buf[..masked_len]);
    h.update(rest);
    Some(h.finalize())
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
    fn too_short_is_none() {
        assert_eq!(compute(&[0u8; 39], false), None);
        assert_eq!(compute(&[0u8; 59], true), None);
        assert!(compute(&[0u8; 40], false).is_some());
    }
}
