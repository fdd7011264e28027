//! Property tests of the whole-frame codec: every opcode round-trips, and
//! every single-bit flip in the bytes the ICRC (or the IPv4 checksum)
//! protects is caught.

use ferroce_stack::wire::sample::sample_frame;
use ferroce_stack::wire::{pad_for, ParsedPacket, OPCODES};
use proptest::prelude::*;

fn frame_strategy() -> impl Strategy<Value = (usize, bool, bool, usize, u64)> {
    (
        0..OPCODES.len(),
        any::<bool>(),
        any::<bool>(),
        0usize..=4096,
        any::<u64>(),
    )
}

/// Bits a network may change in transit, so the ICRC deliberately does not
/// cover them: the Ethernet header (the FCS guards it), IPv6 traffic class,
/// flow label and hop limit, the UDP checksum, and BTH byte 4 (FECN/BECN).
/// IPv4 ToS and TTL are also masked, but the IPv4 header checksum catches them.
fn is_mutable_bit(frame: &[u8], byte: usize, bit: u8) -> bool {
    let l3 = if u16::from_be_bytes([frame[12], frame[13]]) == 0x8100 {
        18
    } else {
        14
    };
    if byte < l3 {
        return true;
    }
    let ipv6 = frame[l3] >> 4 == 6;
    let ip_len = if ipv6 { 40 } else { 20 };
    let rel = byte - l3;
    if ipv6 && (rel == 0 && bit < 4 || (1..4).contains(&rel) || rel == 7) {
        return true;
    }
    let udp = ip_len;
    if rel == udp + 6 || rel == udp + 7 {
        return true;
    }
    rel == udp + 8 + 4
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn emit_parse_round_trip((op, ipv6, vlan, len, seed) in frame_strategy()) {
        let info = &OPCODES[op];
        let frame = sample_frame(info.opcode, ipv6, vlan, len, seed).unwrap();
        let p = ParsedPacket::parse(&frame).unwrap();
        let expect = ferroce_stack::wire::sample::sample_repr(info.opcode, ipv6, vlan, seed).unwrap();
        let len = if info.has_payload { len } else { 0 };
        prop_assert_eq!(p.payload.len(), len);
        prop_assert_eq!(usize::from(p.repr.bth.pad_count), pad_for(len));
        let mut got = p.repr;
        got.bth.pad_count = 0;
        prop_assert_eq!(got, expect);
        prop_assert_eq!(frame.len(), expect.buffer_len(len).unwrap());
    }

    #[test]
    fn any_protected_bit_flip_is_detected(
        (op, ipv6, vlan, len, seed) in frame_strategy(),
        pick in any::<prop::sample::Index>(),
    ) {
        let info = &OPCODES[op];
        let mut frame = sample_frame(info.opcode, ipv6, vlan, len % 300, seed).unwrap();
        let bit = pick.index(frame.len() * 8);
        let (byte, b) = (bit / 8, (bit % 8) as u8);
        prop_assume!(!is_mutable_bit(&frame, byte, b));
        frame[byte] ^= 1 << b;
        prop_assert!(ParsedPacket::parse(&frame).is_err(), "flip of byte {} bit {} undetected", byte, b);
    }
}

#[test]
fn every_protected_bit_of_one_frame_of_each_opcode() {
    // Exhaustive over bit positions (the property test samples them).
    for info in OPCODES {
        for ipv6 in [false, true] {
            let frame = sample_frame(info.opcode, ipv6, true, 13, 7).unwrap();
            for bit in 0..frame.len() * 8 {
                let (byte, b) = (bit / 8, (bit % 8) as u8);
                if is_mutable_bit(&frame, byte, b) {
                    continue;
                }
                let mut f = frame.clone();
                f[byte] ^= 1 << b;
                assert!(
                    ParsedPacket::parse(&f).is_err(),
                    "{} ipv6={ipv6}: flip of byte {byte} bit {b} undetected",
                    info.name
                );
            }
        }
    }
}
