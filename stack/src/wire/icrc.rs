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

use std::sync::OnceLock;

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
    let mut h = lrh_hasher();
    h.update(&buf[..masked_len]);
    h.update(rest);
    Some(h.finalize())
}

/// Bytes of an IPv4 packet up to and including the last variant field
/// (the BTH's FECN/BECN byte): IP and UDP headers and the BTH's opcode,
/// flags and P_Key, the same in every data packet of one flow.
const V4_PREFIX: usize = 20 + UDP_LEN + bth::ECN_BYTE + 1;

/// A receiver's memory of the last IPv4 packet's first 33 bytes (IP and
/// UDP headers, the BTH up to its FECN/BECN byte) and the CRC state after
/// them, so a run of packets of one flow (a long WRITE, a stream of SENDs)
/// hashes only what follows: one CRC call per packet instead of a masked
/// header copy plus two. The state is a
/// function of those bytes alone and they are compared whole, so a packet
/// that differs anywhere in them (another flow, a corrupted header, a
/// changing IP ID) just recomputes it.
#[derive(Clone, Default)]
pub struct PrefixCache {
    /// The prefix but its last byte (FECN/BECN: all ones in the hash
    /// whatever it holds), and the hasher that has taken the masked prefix
    /// (cloned per packet: a new hasher would test the CPU's features again).
    prefix: Option<([u8; V4_PREFIX - 1], crc32fast::Hasher)>,
}

impl core::fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PrefixCache")
            .field("cached", &self.prefix.is_some())
            .finish()
    }
}

/// A hasher that has taken the LRH stand-in, for hashing a masked packet
/// (whole, as [`compute_masked`] does, or in pieces). Made once and cloned:
/// `Hasher::new` checks the CPU's features on every call (half a dozen
/// branches), a clone does not.
pub fn lrh_hasher() -> crc32fast::Hasher {
    static H: OnceLock<crc32fast::Hasher> = OnceLock::new();
    H.get_or_init(|| crc32fast::Hasher::new_with_initial(LRH_STANDIN_CRC))
        .clone()
}

/// [`compute`], reusing `cache` for the headers when they match the last packet's.
pub fn compute_cached(l3: &[u8], ipv6: bool, cache: &mut PrefixCache) -> Option<u32> {
    if ipv6 || l3.len() < masked_len(false) {
        return compute(l3, ipv6);
    }
    let (head, rest) = l3.split_first_chunk::<V4_PREFIX>()?;
    let key = head.first_chunk::<{ V4_PREFIX - 1 }>()?;
    let mut h = match &cache.prefix {
        Some((p, h)) if p == key => h.clone(),
        _ => {
            let mut masked = *head;
            for &(at, ones) in &V4_VARIANT {
                masked[at] |= ones;
            }
            let mut h = lrh_hasher();
            h.update(&masked);
            cache.prefix = Some((*key, h.clone()));
            h
        }
    };
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
#[inline]
pub fn mask_in_place(l3: &mut [u8], ipv6: bool) -> Option<Variant> {
    let mut v = Variant {
        ipv6,
        bytes: [0; 8],
    };
    // Arrays of known length and offsets: the loops unroll to plain byte
    // moves with no bounds checks.
    if ipv6 {
        mask::<V6_MASKED, 8>(l3.first_chunk_mut()?, &V6_VARIANT, &mut v.bytes);
    } else {
        mask::<V4_MASKED, 7>(l3.first_chunk_mut()?, &V4_VARIANT, &mut v.bytes);
    }
    Some(v)
}

const V4_MASKED: usize = 20 + UDP_LEN + bth::HEADER_LEN;
const V6_MASKED: usize = 40 + UDP_LEN + bth::HEADER_LEN;

#[inline(always)]
fn mask<const L: usize, const N: usize>(
    head: &mut [u8; L],
    fields: &[(usize, u8); N],
    saved: &mut [u8; 8],
) {
    for (s, &(at, ones)) in saved.iter_mut().zip(fields) {
        *s = head[at];
        head[at] |= ones;
    }
}

#[inline(always)]
fn restore<const L: usize, const N: usize>(
    head: &mut [u8; L],
    fields: &[(usize, u8); N],
    saved: &[u8; 8],
) {
    for (s, &(at, _)) in saved.iter().zip(fields) {
        head[at] = *s;
    }
}

/// The ICRC of `l3` (as [`compute`]) whose variant fields [`mask_in_place`] already set to ones.
#[inline]
pub fn compute_masked(l3: &[u8]) -> u32 {
    let mut h = lrh_hasher();
    h.update(l3);
    h.finalize()
}

/// Put back the fields [`mask_in_place`] set to ones.
#[inline]
pub fn unmask(l3: &mut [u8], v: Variant) {
    if v.ipv6 {
        if let Some(head) = l3.first_chunk_mut() {
            restore::<V6_MASKED, 8>(head, &V6_VARIANT, &v.bytes);
        }
    } else if let Some(head) = l3.first_chunk_mut() {
        restore::<V4_MASKED, 7>(head, &V4_VARIANT, &v.bytes);
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
    fn cached_prefix_agrees_whatever_comes() {
        let base = unhex(RXE_SEND_ONLY_V4);
        let mut cache = PrefixCache::default();
        let mut r = crate::wire::sample::SplitMix::new(3);
        for i in 0..2000 {
            let mut l3 = base.clone();
            // Mostly the same flow with new PSNs and payload; sometimes a
            // changed header byte, sometimes another length.
            r.fill(&mut l3[36..]);
            if i % 7 == 0 {
                let at = (r.next_u32() as usize) % 40;
                l3[at] ^= 1 << (r.next_u32() % 8);
            }
            if i % 11 == 0 {
                l3.truncate(40 + (r.next_u32() as usize) % 20);
            }
            assert_eq!(
                compute_cached(&l3, false, &mut cache),
                compute(&l3, false),
                "round {i}"
            );
        }
        let v6 = [0x60u8; 64];
        assert_eq!(compute_cached(&v6, true, &mut cache), compute(&v6, true));
        assert_eq!(compute_cached(&base[..39], false, &mut cache), None);
    }

    #[test]
    fn too_short_is_none() {
        assert_eq!(compute(&[0u8; 39], false), None);
        assert_eq!(compute(&[0u8; 59], true), None);
        assert!(compute(&[0u8; 40], false).is_some());
    }
}
