//! Malformed frames: each defect gives its own error variant and nothing panics.

use ferroce_stack::wire::icrc;
use ferroce_stack::wire::sample::sample_frame;
use ferroce_stack::wire::{Error, Layer, Opcode, ParsedPacket, OPCODES};

const L3: usize = 14;

/// Recompute IPv4 lengths and checksum, UDP length and ICRC after a test
/// edited an IPv4 frame without VLAN (frame = headers .. ICRC).
fn refresh_v4(f: &mut [u8]) {
    let total = (f.len() - L3) as u16;
    f[L3 + 2..L3 + 4].copy_from_slice(&total.to_be_bytes());
    f[L3 + 10..L3 + 12].fill(0);
    let mut sum = 0u32;
    for w in f[L3..L3 + 20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[L3 + 10..L3 + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let udp_len = (f.len() - L3 - 20) as u16;
    f[L3 + 24..L3 + 26].copy_from_slice(&udp_len.to_be_bytes());
    let end = f.len() - 4;
    let crc = icrc::compute(&f[L3..end], false).unwrap();
    f[end..].copy_from_slice(&crc.to_le_bytes());
}

fn frame(op: Opcode, payload: usize) -> Vec<u8> {
    sample_frame(op, false, false, payload, 1).unwrap()
}

#[test]
fn truncated_at_every_offset_is_an_error() {
    for info in OPCODES {
        for ipv6 in [false, true] {
            for vlan in [false, true] {
                let f = sample_frame(info.opcode, ipv6, vlan, 33, 5).unwrap();
                for n in 0..f.len() {
                    let e = ParsedPacket::parse(&f[..n]).unwrap_err();
                    assert!(
                        matches!(e, Error::Truncated { .. } | Error::Length { .. }),
                        "{} cut at {n}: {e:?}",
                        info.name
                    );
                }
                assert!(ParsedPacket::parse(&f).is_ok());
            }
        }
    }
}

#[test]
fn ethernet_padding_after_the_ip_packet_is_ignored() {
    let mut f = frame(Opcode::RC_ACKNOWLEDGE, 0);
    f.extend_from_slice(&[0u8; 6]);
    assert!(ParsedPacket::parse(&f).is_ok());
}

#[test]
fn length_fields_that_disagree() {
    let mut f = frame(Opcode::RC_SEND_ONLY, 16);
    f[L3 + 2..L3 + 4].copy_from_slice(&1000u16.to_be_bytes());
    assert!(matches!(
        ParsedPacket::parse(&f),
        Err(Error::Length {
            layer: Layer::Ipv4,
            declared: 1000,
            ..
        })
    ));
    let mut f = frame(Opcode::RC_SEND_ONLY, 16);
    f[L3 + 24..L3 + 26].copy_from_slice(&20u16.to_be_bytes());
    assert!(matches!(
        ParsedPacket::parse(&f),
        Err(Error::Length {
            layer: Layer::Udp,
            declared: 20,
            ..
        })
    ));
}

#[test]
fn bad_pad() {
    // An ACK carries no payload, so any pad is wrong.
    let mut f = frame(Opcode::RC_ACKNOWLEDGE, 0);
    f[L3 + 28 + 1] |= 0x10;
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::Pad { pad: 1, len: 0 }));
    // Payload + pad not a multiple of four: a 5-byte payload sent with one pad byte dropped.
    let mut f = frame(Opcode::RC_SEND_ONLY, 5);
    f.remove(f.len() - 5);
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::Pad { pad: 3, len: 7 }));
    // More pad than bytes.
    let mut f = frame(Opcode::RC_SEND_ONLY, 0);
    f[L3 + 28 + 1] |= 0x30;
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::Pad { pad: 3, len: 0 }));
}

#[test]
fn bad_icrc() {
    let mut f = frame(Opcode::RC_RDMA_WRITE_ONLY, 64);
    let n = f.len();
    f[n - 1] ^= 0x80;
    assert!(matches!(ParsedPacket::parse(&f), Err(Error::Icrc { .. })));
    let mut f = frame(Opcode::RC_RDMA_WRITE_ONLY, 64);
    f[L3 + 28 + 28 + 3] ^= 1; // a payload byte
    assert!(matches!(ParsedPacket::parse(&f), Err(Error::Icrc { .. })));
    let (p, ok) = ParsedPacket::parse_report_icrc(&f).unwrap();
    assert!(!ok);
    assert_eq!(p.payload.len(), 64);
}

#[test]
fn wrong_port_protocol_ethertype() {
    let mut f = frame(Opcode::RC_SEND_ONLY, 4);
    f[L3 + 22..L3 + 24].copy_from_slice(&4792u16.to_be_bytes());
    let e = ParsedPacket::parse(&f).unwrap_err();
    assert_eq!(e, Error::UdpPort(4792));
    assert!(e.is_not_roce());
    let mut f = frame(Opcode::RC_SEND_ONLY, 4);
    f[L3 + 9] = 6; // TCP
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::NotUdp(6)));
    let mut f = frame(Opcode::RC_SEND_ONLY, 4);
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(ParsedPacket::parse(&f), Err(Error::EtherType(0x0806)));
    let mut f = frame(Opcode::RC_SEND_ONLY, 4);
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    assert_eq!(ParsedPacket::parse(&f), Err(Error::IpVersion(4)));
}

#[test]
fn ipv4_checksum_options_fragments() {
    let mut f = frame(Opcode::RC_SEND_ONLY, 4);
    f[L3 + 8] ^= 1; // TTL, masked by the ICRC but not by the IP checksum
    assert_eq!(ParsedPacket::parse(&f), Err(Error::Ipv4Checksum));
    let mut f = frame(Opcode::RC_SEND_ONLY, 4);
    f[L3] = 0x46;
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::Ipv4Options(24)));
    let mut f = frame(Opcode::RC_SEND_ONLY, 4);
    f[L3 + 6] = 0x20; // MF
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::Ipv4Fragment));
}

#[test]
fn reserved_opcodes_and_tver() {
    for op in [
        0x15u8, 0x18, 0x1f, 0x2c, 0x40, 0x44, 0x63, 0x66, 0x80, 0x82, 0xff,
    ] {
        let mut f = frame(Opcode::RC_SEND_ONLY, 8);
        f[L3 + 28] = op;
        refresh_v4(&mut f);
        assert_eq!(ParsedPacket::parse(&f), Err(Error::UnknownOpcode(op)));
    }
    let mut f = frame(Opcode::RC_SEND_ONLY, 8);
    f[L3 + 28 + 1] |= 0x01;
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::BthVersion(1)));
}

#[test]
fn missing_extension_header() {
    // A WRITE_FIRST whose UDP datagram ends inside the RETH.
    let mut f = frame(Opcode::RC_RDMA_WRITE_FIRST, 0);
    f.truncate(L3 + 28 + 12 + 8);
    f.extend_from_slice(&[0; 4]);
    refresh_v4(&mut f);
    assert!(matches!(
        ParsedPacket::parse(&f),
        Err(Error::Truncated {
            layer: Layer::Reth,
            ..
        })
    ));
}

#[test]
fn oversize_and_unexpected_payload() {
    let mut f = frame(Opcode::RC_RDMA_WRITE_MIDDLE, 4096);
    let icrc_at = f.len() - 4;
    f.splice(icrc_at..icrc_at, [0u8; 4]);
    refresh_v4(&mut f);
    assert_eq!(ParsedPacket::parse(&f), Err(Error::PayloadTooLong(4100)));
    let mut f = frame(Opcode::RC_ACKNOWLEDGE, 0);
    let icrc_at = f.len() - 4;
    f.splice(icrc_at..icrc_at, [0u8; 4]);
    refresh_v4(&mut f);
    assert_eq!(
        ParsedPacket::parse(&f),
        Err(Error::UnexpectedPayload {
            opcode: 0x11,
            len: 4
        })
    );
}

#[test]
fn every_error_has_a_distinct_counter() {
    use std::collections::HashSet;
    let errors = [
        Error::Truncated {
            layer: Layer::Bth,
            needed: 1,
            have: 0,
        },
        Error::EtherType(0),
        Error::IpVersion(0),
        Error::Ipv4Options(0),
        Error::Ipv4Checksum,
        Error::Ipv4Fragment,
        Error::Length {
            layer: Layer::Udp,
            declared: 0,
            actual: 0,
        },
        Error::NotUdp(0),
        Error::UdpPort(0),
        Error::UdpChecksum,
        Error::BthVersion(0),
        Error::UnknownOpcode(0),
        Error::Pad { pad: 0, len: 0 },
        Error::PayloadTooLong(0),
        Error::UnexpectedPayload { opcode: 0, len: 0 },
        Error::Icrc {
            computed: 0,
            received: 0,
        },
        Error::HeaderMismatch { opcode: 0 },
        Error::BufferTooSmall { needed: 0, have: 0 },
    ];
    let names: HashSet<_> = errors.iter().map(|e| e.counter_name()).collect();
    assert_eq!(names.len(), errors.len());
}

#[test]
fn emit_refuses_wrong_headers_and_small_buffers() {
    use ferroce_stack::wire::sample::sample_repr;
    let mut r = sample_repr(Opcode::RC_RDMA_WRITE_FIRST, false, false, 3).unwrap();
    r.ext.reth = None;
    let mut buf = [0u8; 200];
    assert_eq!(
        r.emit(&mut buf, &[1, 2, 3]),
        Err(Error::HeaderMismatch { opcode: 0x06 })
    );
    let r = sample_repr(Opcode::RC_ACKNOWLEDGE, false, false, 3).unwrap();
    assert!(matches!(
        r.emit(&mut buf, &[1]),
        Err(Error::UnexpectedPayload { .. })
    ));
    assert!(matches!(
        r.emit(&mut buf[..40], &[]),
        Err(Error::BufferTooSmall { .. })
    ));
}
