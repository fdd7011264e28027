//! AF_PACKET transmit with UDP GSO (crate::gso): runs of RoCE frames of one
//! flow leave as super-frames, and every kind of receiver on the other end
//! of the veth gets the original frames back, each with a right ICRC (the
//! kernel numbers a super-frame's IPv4 segments, so the sender must have
//! built segment k's ICRC for ID k). The same with the frames' payloads
//! gathered from elsewhere (`transmit_gather`: sendmmsg, no TX ring).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use ferroce_nic::afpacket::{AfPacketConfig, AfPacketIo};
use ferroce_nic::frame::{build_udp_frame, parse_udp, HeaderSpec, ROCE_V2_PORT};
use ferroce_nic::{PacketIo, UdpConfig, UdpIo};
use ferroce_stack::wire::icrc;

/// BTH (IBTA 9.2) + payload + ICRC: an RC SEND_MIDDLE to `qp` with PSN
/// `psn`, `plen` payload bytes derived from the PSN, in an Ethernet frame.
fn roce(from: End, to: End, qp: u32, psn: u32, plen: usize) -> Vec<u8> {
    let mut udp = vec![0u8; 12 + plen + 4];
    udp[0] = 0x01; // RC SEND_MIDDLE
    udp[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes()); // P_Key
    udp[5..8].copy_from_slice(&qp.to_be_bytes()[1..]);
    udp[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
    for (i, b) in udp[12..12 + plen].iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(7).wrapping_add(psn) as u8;
    }
    let spec = HeaderSpec {
        dst_mac: to.mac,
        src_mac: from.mac,
        src: SocketAddr::new(from.ip, 49152),
        dst: SocketAddr::new(to.ip, ROCE_V2_PORT),
        tos: 0,
        ttl: 64,
    };
    let mut f = build_udp_frame(&spec, &udp).unwrap();
    let v6 = from.ip.is_ipv6();
    let end = f.len() - 4;
    let crc = icrc::compute(&f[14..end], v6).unwrap();
    f[end..].copy_from_slice(&crc.to_le_bytes());
    f
}

/// (QP, PSN) of a received frame whose ICRC is right; None otherwise.
fn received(f: &[u8], v6: bool) -> Option<(u32, u32, Vec<u8>)> {
    let i = parse_udp(f).ok()?;
    let udp = f.get(i.payload_offset..i.payload_offset + i.payload_len)?;
    let end = 14 + (i.payload_offset - 14) + udp.len() - 4;
    let crc = icrc::compute(f.get(14..end)?, v6)?;
    if f.get(end..end + 4)? != crc.to_le_bytes() {
        return None;
    }
    let qp = u32::from_be_bytes([0, udp[5], udp[6], udp[7]]);
    let psn = u32::from_be_bytes([0, udp[9], udp[10], udp[11]]);
    Some((qp, psn, udp[12..udp.len() - 4].to_vec()))
}

fn gso_sender(ifname: &str) -> Io {
    let c = AfPacketConfig {
        tx_icrc_valid: true,
        ..AfPacketConfig::new(ifname)
    };
    Box::new(AfPacketIo::open(c).unwrap())
}

fn send_and_check(kind: &str, v6: bool, gathered: bool, open_rx: fn(&str, End) -> Io) {
    if !root_or_skip("afpacket GSO test") {
        return;
    }
    let t = topo();
    let (ea, eb) = ends(&t, v6);
    let (ifa, ifb) = (t.host(0).ifname.clone(), t.host(1).ifname.clone());
    let mut a: Io = t.run_in(0, move || gso_sender(&ifa)).unwrap();
    let mut b: Io = t.run_in(1, move || open_rx(&ifb, eb)).unwrap();
    // Runs of full frames to one QP (MTU 4096 and 1024 payloads), a shorter
    // last one, a run broken by frames to another QP, lone small frames.
    let mut plan: Vec<(u32, usize)> = Vec::new();
    plan.extend([(0x11, 4096); 20]);
    plan.push((0x11, 1000));
    plan.extend([(0x11, 1024); 70]);
    for i in 0..30 {
        plan.push((if i % 3 == 0 { 0x22 } else { 0x11 }, 4096));
    }
    plan.extend([(0x33, 0); 5]);
    plan.extend([(0x11, 4096); 9]);
    let frames: Vec<Vec<u8>> = plan
        .iter()
        .enumerate()
        .map(|(psn, &(qp, len))| roce(ea, eb, qp, psn as u32, len))
        .collect();
    let before = a.stats();
    if gathered {
        assert!(a.gathers());
        send_gathered(&mut a, &frames);
    } else {
        send_all(&mut a, &frames);
    }
    let mut got = Vec::new();
    let mut bad = 0;
    let t0 = Instant::now();
    while got.len() < frames.len() && t0.elapsed() < Duration::from_secs(5) {
        let n = b
            .recv(64, &mut |f: &[u8]| match received(f, v6) {
                Some(r) => got.push(r),
                None => bad += 1,
            })
            .unwrap();
        if n == 0 {
            b.wait(Some(Duration::from_millis(20))).unwrap();
        }
    }
    let kind = format!("{kind} gathered={gathered}");
    assert_eq!(bad, 0, "{kind} v6={v6}: frames with a wrong ICRC");
    let psns: Vec<u32> = got.iter().map(|g| g.1).collect();
    assert_eq!(
        got.len(),
        frames.len(),
        "{kind} v6={v6}: every frame arrives: {psns:?}"
    );
    for (psn, (&(qp, len), (gqp, gpsn, payload))) in plan.iter().zip(&got).enumerate() {
        assert_eq!((*gqp, *gpsn), (qp, psn as u32), "{kind} v6={v6}: in order");
        assert_eq!(payload.len(), len);
        let want = roce(ea, eb, qp, psn as u32, len);
        let i = parse_udp(&want).unwrap();
        assert_eq!(payload[..], want[i.payload_offset + 12..want.len() - 4]);
    }
    let st = a.stats().since(&before);
    assert_eq!(st.tx_frames, frames.len() as u64);
    assert_eq!(st.tx_dropped, 0);
    if gso_expected() {
        assert!(st.tx_gso >= 5, "{kind} v6={v6}: {st:?}");
    }
    drop(a);
    drop(b);
    drop(t);
}

/// Linux 6.2 took UDP GSO frames from packet sockets.
fn gso_expected() -> bool {
    ferroce_nic::kernel_version().is_some_and(|v| v >= (6, 2))
}

fn udp(_ifname: &str, e: End) -> Io {
    let c = UdpConfig::new(SocketAddr::new(e.ip, ROCE_V2_PORT));
    Box::new(UdpIo::bind(c).unwrap())
}

type Open = fn(&str, End) -> Io;

/// Every kind of receiver, over IPv4 and IPv6. With an XDP program on the
/// receiving veth the kernel cuts the sender's super-frames in software
/// (veth turns GSO off towards an XDP peer); AF_XDP runs over IPv4 only here
/// (the conformance suite covers its IPv6).
#[test]
fn every_kind_of_receiver_gets_the_frames() {
    let receivers: [(&str, bool, Open); 7] = [
        ("afpacket v3", false, |i, _| raw_afpacket(i)),
        ("afpacket v3", true, |i, _| raw_afpacket(i)),
        ("afpacket v2", false, |i, _| raw_afpacket_v2(i)),
        ("afpacket v2", true, |i, _| raw_afpacket_v2(i)),
        ("udp", false, udp),
        ("udp", true, udp),
        ("afxdp", false, |i, _| raw_afxdp(i)),
    ];
    for gathered in [false, true] {
        for (kind, v6, open) in receivers {
            send_and_check(kind, v6, gathered, open);
        }
    }
}
