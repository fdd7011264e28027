//! A UDP-socket backend on one host and a raw backend (AF_PACKET, AF_XDP) on
//! the other: the kernel hands a local UDP socket's datagrams to veth with the
//! checksum not yet filled in (CHECKSUM_PARTIAL), and a raw receiver must still
//! deliver frames whose UDP checksum verifies or is 0 ("none", which the stack
//! takes in both IP families: the ICRC covers the frame), or the stack drops
//! them as corrupt and the peers never talk.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use ferroce_nic::frame::ROCE_V2_PORT;
use ferroce_nic::{PacketIo, UdpConfig, UdpIo};

/// RFC 768 checksum over the pseudo-header and the UDP datagram, computed
/// from scratch; true when the frame's checksum field agrees or is 0, "none"
/// (AF_PACKET clears a partial checksum rather than finish it:
/// `ferroce_nic::offload::clear_partial`).
fn udp_checksum_ok(f: &[u8]) -> bool {
    let (ip_at, v6) = match f.get(12..14) {
        Some([0x08, 0x00]) => (14, false),
        Some([0x86, 0xDD]) => (14, true),
        _ => return false,
    };
    let (udp_at, src, dst) = if v6 {
        (
            ip_at + 40,
            &f[ip_at + 8..ip_at + 24],
            &f[ip_at + 24..ip_at + 40],
        )
    } else {
        (
            ip_at + 20,
            &f[ip_at + 12..ip_at + 16],
            &f[ip_at + 16..ip_at + 20],
        )
    };
    let ulen = usize::from(u16::from_be_bytes([f[udp_at + 4], f[udp_at + 5]]));
    let field = u16::from_be_bytes([f[udp_at + 6], f[udp_at + 7]]);
    if field == 0 {
        return true;
    }
    let mut sum = 0u64;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(src);
    add(dst);
    add(&[0, 17]);
    add(&(ulen as u16).to_be_bytes());
    add(&f[udp_at..udp_at + 6]);
    add(&f[udp_at + 8..udp_at + ulen]);
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    let want = match !(sum as u16) {
        0 => 0xFFFF,
        c => c,
    };
    field == want
}

fn raw_receives_udp_backend(kind: &str, v6: bool, open: fn(&str) -> Io) {
    if !root_or_skip("mixed backend test") {
        return;
    }
    let t = topo();
    let (ea, eb) = ends(&t, v6);
    let ifb = t.host(1).ifname.clone();
    let mut a: Io = t
        .run_in(0, move || {
            Box::new(UdpIo::bind(UdpConfig::new(SocketAddr::new(ea.ip, ROCE_V2_PORT))).unwrap())
                as Io
        })
        .unwrap();
    let mut b: Io = t.run_in(1, move || open(&ifb)).unwrap();
    let sizes = [60usize, 300, 1500, 4200, 8000];
    // Mixed sizes, then runs of one size, which the UDP backend sends as GSO
    // super-frames (a shorter last datagram allowed).
    let lens = (0..40)
        .map(|i| sizes[i % sizes.len()])
        .chain([4200; 16])
        .chain([1500; 9])
        .chain([300])
        .chain([1082; 70]);
    let frames: Vec<Vec<u8>> = lens
        .enumerate()
        .map(|(i, len)| frame(ea, eb, i as u32 + 1, len))
        .collect();
    send_all(&mut a, &frames);
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < frames.len() && t0.elapsed() < Duration::from_secs(5) {
        let n = b
            .recv(64, &mut |f: &[u8]| {
                if check(f, ea, eb).is_some() {
                    got.push(f.to_vec());
                }
            })
            .unwrap();
        if n == 0 {
            b.wait(Some(Duration::from_millis(20))).unwrap();
        }
    }
    assert_eq!(got.len(), frames.len(), "{kind}: every frame arrives");
    for (i, f) in got.iter().enumerate() {
        assert!(
            udp_checksum_ok(f),
            "{kind} v6={v6}: frame {i} ({} B) has a wrong UDP checksum",
            f.len()
        );
    }
    drop(a);
    drop(b);
    drop(t);
}

#[test]
fn afpacket_receives_udp_backend_v4() {
    raw_receives_udp_backend("afpacket", false, raw_afpacket);
}

#[test]
fn afpacket_receives_udp_backend_v6() {
    raw_receives_udp_backend("afpacket", true, raw_afpacket);
}

#[test]
fn afpacket_v2_receives_udp_backend_v4() {
    raw_receives_udp_backend("afpacket-v2", false, raw_afpacket_v2);
}

#[test]
fn afpacket_v2_receives_udp_backend_v6() {
    raw_receives_udp_backend("afpacket-v2", true, raw_afpacket_v2);
}

#[test]
fn afxdp_receives_udp_backend_v4() {
    raw_receives_udp_backend("afxdp", false, raw_afxdp);
}

#[test]
fn afxdp_receives_udp_backend_v6() {
    raw_receives_udp_backend("afxdp", true, raw_afxdp);
}
