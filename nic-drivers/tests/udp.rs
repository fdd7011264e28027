//! UDP backend on loopback: frames in, frames out, headers synthesised right.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::send_gathered;

use ferroce_nic::frame::{build_udp_frame, parse_udp, HeaderSpec};
use ferroce_nic::{PacketIo, UdpConfig, UdpIo};

fn open(addr: &str, f: impl Fn(&mut UdpConfig)) -> UdpIo {
    let mut cfg = UdpConfig::new(addr.parse().unwrap());
    f(&mut cfg);
    UdpIo::bind(cfg).unwrap()
}

fn frame_to(from: &UdpIo, to: &UdpIo, seq: u32, len: usize, tos: u8) -> Vec<u8> {
    let spec = HeaderSpec {
        dst_mac: to.mac(),
        src_mac: from.mac(),
        // The core's entropy port: the UDP backend cannot carry it.
        src: SocketAddr::new(from.local_addr().ip(), 0xC123),
        dst: to.local_addr(),
        tos,
        ttl: 64,
    };
    let hl = ferroce_nic::frame::header_len(spec.src.is_ipv6());
    let mut payload: Vec<u8> = (0..len - hl).map(|i| (i as u32 ^ seq) as u8).collect();
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    build_udp_frame(&spec, &payload).unwrap()
}

fn drain(io: &mut UdpIo, want: usize, out: &mut Vec<Vec<u8>>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < want && Instant::now() < deadline {
        if io.recv_owned(64, out).unwrap() == 0 {
            io.wait(Some(Duration::from_millis(50))).unwrap();
        }
    }
}

fn roundtrip(a_addr: &str, b_addr: &str, cfg: impl Fn(&mut UdpConfig) + Copy) {
    let mut a = open(a_addr, cfg);
    let mut b = open(b_addr, cfg);
    let mut seq = 0u32;
    for batch in [1usize, 2, 7, 32, 64] {
        for len in [62usize, 64, 100, 1024, 1100, 4096, 4200, 9000] {
            let frames: Vec<Vec<u8>> = (0..batch)
                .map(|_| {
                    seq += 1;
                    frame_to(&a, &b, seq, len.max(70), 0x02)
                })
                .collect();
            let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
            assert_eq!(a.send_frames(&refs).unwrap(), batch);
            let mut got = Vec::new();
            drain(&mut b, batch, &mut got);
            assert_eq!(got.len(), batch, "batch {batch} len {len}");
            for (g, f) in got.iter().zip(&frames) {
                let gi = parse_udp(g).unwrap();
                let fi = parse_udp(f).unwrap();
                assert_eq!(
                    &g[gi.payload_offset..],
                    &f[fi.payload_offset..],
                    "payload intact"
                );
                assert_eq!(g.len(), f.len(), "same synthesised length");
                assert_eq!(gi.src, a.local_addr(), "real source address and port");
                assert_eq!(gi.dst, b.local_addr());
                assert_eq!(gi.tos, 0x02, "ToS (ECN) carried");
                assert_eq!(gi.ttl, 64);
                assert_eq!(gi.dst_mac, b.mac());
            }
        }
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_frames, sb.rx_frames);
    assert_eq!(sa.tx_bytes, sb.rx_bytes);
    assert_eq!(sb.rx_dropped, 0);
}

#[test]
fn ipv4_loopback_gso_gro() {
    roundtrip("127.0.0.1:0", "127.0.0.1:0", |_| {});
}

#[test]
fn ipv4_loopback_plain_mmsg() {
    roundtrip("127.0.0.1:0", "127.0.0.1:0", |c| {
        c.gso = false;
        c.gro = false;
    });
}

#[test]
fn ipv4_loopback_uring() {
    roundtrip("127.0.0.1:0", "127.0.0.1:0", |c| c.uring = true);
}

#[test]
fn ipv6_loopback() {
    roundtrip("[::1]:0", "[::1]:0", |_| {});
}

#[test]
fn dual_stack_socket_reports_v4_peers_as_v4() {
    let mut a = open("127.0.0.1:0", |_| {});
    let mut b = open("[::]:0", |_| {});
    let dst: SocketAddr = SocketAddr::new("127.0.0.1".parse().unwrap(), b.local_addr().port());
    let spec = HeaderSpec {
        dst_mac: b.mac(),
        src_mac: a.mac(),
        src: a.local_addr(),
        dst,
        tos: 0,
        ttl: 64,
    };
    let f = build_udp_frame(&spec, &[7u8; 100]).unwrap();
    a.send_frames(&[&f]).unwrap();
    let mut got = Vec::new();
    drain(&mut b, 1, &mut got);
    let gi = parse_udp(&got[0]).unwrap();
    assert_eq!(gi.src, a.local_addr());
    assert_eq!(gi.dst, dst, "local address from IP_PKTINFO, unmapped");
    // And the reply from the v6 socket reaches the v4 one.
    let reply = HeaderSpec {
        src: dst,
        dst: a.local_addr(),
        ..spec
    };
    b.send_frames(&[&build_udp_frame(&reply, &[8u8; 10]).unwrap()])
        .unwrap();
    let mut got = Vec::new();
    drain(&mut a, 1, &mut got);
    assert_eq!(parse_udp(&got[0]).unwrap().src, dst);
}

/// Frames with other header lengths in one batch (IPv4, IPv6, an 802.1Q tag) and dropped
/// ones between them: transmit places each payload after the previous one in its arena, so a
/// change of header length or a drop must not disturb the frames around it.
#[test]
fn mixed_header_lengths_in_one_batch() {
    let mut tx = open("[::]:0", |_| {});
    let mut rx4 = open("127.0.0.1:0", |_| {});
    let mut rx6 = open("[::1]:0", |_| {});
    let spec = |to: &UdpIo| HeaderSpec {
        dst_mac: to.mac(),
        src_mac: tx.mac(),
        src: SocketAddr::new(
            if to.local_addr().is_ipv6() {
                "::1".parse().unwrap()
            } else {
                "127.0.0.1".parse().unwrap()
            },
            0xC123,
        ),
        dst: to.local_addr(),
        tos: 0,
        ttl: 64,
    };
    let payload = |seq: u8, len: usize| -> Vec<u8> { (0..len).map(|i| (i as u8) ^ seq).collect() };
    let vlan = |f: Vec<u8>| -> Vec<u8> {
        let mut t = f[..12].to_vec();
        t.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        t.extend_from_slice(&f[12..]);
        t
    };
    // (to v6?, tagged?, payload length); a 60-byte garbage frame after every third.
    let plan = [
        (false, false, 1000),
        (false, false, 1000),
        (true, false, 1000),
        (false, true, 1000),
        (false, false, 1000),
        (true, false, 3000),
        (true, false, 3000),
        (false, false, 4000),
        (false, true, 1000),
        (true, false, 200),
    ];
    let mut frames = Vec::new();
    let (mut want4, mut want6) = (Vec::new(), Vec::new());
    for (i, &(v6, tagged, len)) in plan.iter().enumerate() {
        let p = payload(i as u8, len);
        let f = build_udp_frame(&spec(if v6 { &rx6 } else { &rx4 }), &p).unwrap();
        frames.push(if tagged { vlan(f) } else { f });
        if v6 { &mut want6 } else { &mut want4 }.push(p);
        if i % 3 == 2 {
            frames.push(vec![0u8; 60]);
        }
    }
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    assert_eq!(tx.send_frames(&refs).unwrap(), frames.len());
    assert_eq!(tx.stats().tx_dropped, 3);
    for (rx, want) in [(&mut rx4, want4), (&mut rx6, want6)] {
        let mut got = Vec::new();
        drain(rx, want.len(), &mut got);
        let got: Vec<Vec<u8>> = got
            .iter()
            .map(|g| g[parse_udp(g).unwrap().payload_offset..].to_vec())
            .collect();
        assert_eq!(got, want);
    }
}

/// RoCE frames over IPv4 in GSO sends: segment k leaves with IPv4 ID k, so transmit gives each
/// frame that ID and an ICRC to match (checked first, or with `tx_icrc_valid` updated without
/// the check); receive recovers the ID from the ICRC. Every frame arrives with a right ICRC.
#[test]
fn roce_icrc_survives_the_kernel_ids() {
    for valid in [false, true] {
        let mut tx = open("127.0.0.1:0", |c| c.tx_icrc_valid = valid);
        let mut rx = open("127.0.0.1:0", |_| {});
        let spec = spec_between(&tx, &rx);
        let frames: Vec<Vec<u8>> = (0..40u8)
            .map(|i| {
                // BTH: RDMA WRITE Middle (0x07), pkey 0xFFFF, QPN 0x11, PSN i; then data, ICRC.
                let mut p = vec![0x07, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, i];
                // The last one shorter: a GSO send's (and a GRO receive's) last segment may be.
                let len = if i == 39 { 512 } else { 1024u32 };
                p.extend((0..len).map(|j| (j as u8) ^ i));
                p.extend_from_slice(&[0; 4]);
                let mut f = build_udp_frame(&spec, &p).unwrap();
                let end = f.len() - 4;
                let crc = ferroce_stack::wire::icrc::compute(&f[14..end], false).unwrap();
                f[end..].copy_from_slice(&crc.to_le_bytes());
                f
            })
            .collect();
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
        assert_eq!(tx.send_frames(&refs).unwrap(), frames.len());
        let mut got = Vec::new();
        drain(&mut rx, frames.len(), &mut got);
        assert_eq!(got.len(), frames.len());
        let mut ids = Vec::new();
        for (g, f) in got.iter().zip(&frames) {
            let end = g.len() - 4;
            let crc = ferroce_stack::wire::icrc::compute(&g[14..end], false).unwrap();
            assert_eq!(
                g[end..],
                crc.to_le_bytes(),
                "ICRC right (tx_icrc_valid {valid})"
            );
            assert_eq!(g[42..end], f[42..end], "payload intact");
            ids.push(u16::from_be_bytes([g[18], g[19]]));
        }
        assert!(
            ids.iter().any(|id| *id > 0),
            "GSO segments carry IDs 1, 2, ...: {ids:?}"
        );
    }
}

#[test]
fn garbage_frames_are_counted_not_sent() {
    let mut a = open("127.0.0.1:0", |_| {});
    assert_eq!(a.send_frames(&[&[0u8; 60][..]]).unwrap(), 1);
    assert_eq!(a.stats().tx_dropped, 1);
    assert_eq!(a.stats().tx_frames, 0);
}

#[test]
fn works_without_privileges() {
    if std::env::var_os("FRC_UNPRIV_CHILD").is_some() {
        // Child: drop to nobody, then the UDP backend must still work and the
        // raw ones must say they need privileges.
        // SAFETY: plain syscalls on this (single-purpose) child process.
        unsafe {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setgid(65534), 0);
            assert_eq!(libc::setuid(65534), 0);
        }
        assert!(!ferroce_nic::is_root());
        roundtrip("127.0.0.1:0", "127.0.0.1:0", |_| {});
        let e = ferroce_nic::open("afpacket:lo")
            .err()
            .expect("AF_PACKET refused");
        assert!(matches!(e, ferroce_nic::NicError::NeedsPrivilege(_)), "{e}");
        println!("UNPRIV-OK");
        return;
    }
    if !ferroce_nic::is_root() {
        // Already unprivileged: the plain tests above prove the point.
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["works_without_privileges", "--exact", "--nocapture"])
        .env("FRC_UNPRIV_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("UNPRIV-OK"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn fault_middleware_over_a_real_backend() {
    use ferroce_nic::{FaultConfig, FaultIo};
    let a = open("127.0.0.1:0", |_| {});
    let b = open("127.0.0.1:0", |_| {});
    let frames: Vec<Vec<u8>> = (0..200).map(|i| frame_to(&a, &b, i, 200, 0)).collect();
    let mut a = a;
    let mut b = FaultIo::new(
        b,
        FaultConfig {
            loss: 0.25,
            delay: Duration::from_millis(2),
            ..FaultConfig::default()
        },
    )
    .unwrap();
    for f in &frames {
        a.send_frames(&[f]).unwrap();
    }
    let mut got = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(500) {
        if b.recv_owned(64, &mut got).unwrap() == 0 {
            b.wait(Some(Duration::from_millis(20))).unwrap();
        }
    }
    let lost = b.fault_stats().lost as usize;
    assert!(lost > 20 && lost < 90, "{lost}");
    assert_eq!(got.len() + lost, 200);
    assert_eq!(b.stats().rx_dropped, lost as u64);
}

#[test]
fn datagrams_larger_than_a_frame_are_dropped_and_counted() {
    for gro in [false, true] {
        let mut b = open("127.0.0.1:0", |c| c.gro = gro);
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(&[0u8; 10_000], b.local_addr()).unwrap();
        s.send_to(&[1u8; 100], b.local_addr()).unwrap();
        let mut got = Vec::new();
        drain(&mut b, 1, &mut got);
        std::thread::sleep(Duration::from_millis(20));
        b.recv_owned(64, &mut got).unwrap();
        assert_eq!(got.len(), 1, "gro={gro}: only the small one");
        assert_eq!(b.stats().rx_dropped, 1, "gro={gro}");
    }
}

/// The spec of frames from `tx` to `rx`, with the socket's own source port
/// (the ICRC covers it, and the UDP backend sends from it).
fn spec_between(tx: &UdpIo, rx: &UdpIo) -> HeaderSpec {
    HeaderSpec {
        dst_mac: rx.mac(),
        src_mac: tx.mac(),
        src: tx.local_addr(),
        dst: rx.local_addr(),
        tos: 0,
        ttl: 64,
    }
}

/// `n` RDMA WRITE Middle frames (opcode 0x07, QPN 0x11, PSN i) with right
/// ICRCs; frame i carries `len(i)` payload bytes.
fn roce_frames(spec: &HeaderSpec, n: u32, len: impl Fn(u32) -> u32) -> Vec<Vec<u8>> {
    let v6 = spec.src.is_ipv6();
    (0..n)
        .map(|i| {
            let mut p = vec![0x07, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, i as u8];
            p.extend((0..len(i)).map(|j| (j ^ i) as u8));
            p.extend_from_slice(&[0; 4]);
            let mut f = build_udp_frame(spec, &p).unwrap();
            let end = f.len() - 4;
            let crc = ferroce_stack::wire::icrc::compute(&f[14..end], v6).unwrap();
            f[end..].copy_from_slice(&crc.to_le_bytes());
            f
        })
        .collect()
}

/// Frames sent with their payloads gathered from elsewhere arrive as whole
/// frames do: right ICRC (IPv4 IDs of GSO segments accounted for), payload
/// intact, over IPv4 and IPv6, with and without GSO and io_uring; and so
/// do frames joined first (`gather` off, the path of backends that copy).
#[test]
fn gathered_frames_arrive_whole() {
    for (addr, gso, uring, gather) in [
        ("127.0.0.1:0", true, false, true),
        ("127.0.0.1:0", false, false, true),
        ("127.0.0.1:0", true, true, true),
        ("[::1]:0", true, false, true),
        ("127.0.0.1:0", true, false, false),
    ] {
        let mut tx = open(addr, |c| {
            c.gso = gso;
            c.uring = uring;
            c.gather = gather;
            c.tx_icrc_valid = true;
        });
        assert_eq!(tx.gathers(), gather);
        let mut rx = open(addr, |_| {});
        let spec = spec_between(&tx, &rx);
        let v6 = spec.src.is_ipv6();
        let l3 = 14;
        // A short one now and then.
        let frames = roce_frames(&spec, 150, |i| if i % 40 == 39 { 512 } else { 4096 });
        send_gathered(&mut tx, &frames);
        let mut got = Vec::new();
        drain(&mut rx, frames.len(), &mut got);
        assert_eq!(got.len(), frames.len(), "{addr} gso {gso} uring {uring}");
        for (g, f) in got.iter().zip(&frames) {
            let end = g.len() - 4;
            let crc = ferroce_stack::wire::icrc::compute(&g[l3..end], v6).unwrap();
            assert_eq!(g[end..], crc.to_le_bytes(), "ICRC right ({addr} gso {gso})");
            let at = parse_udp(g).unwrap().payload_offset;
            assert_eq!(g[at..end], f[at..end], "BTH and payload intact");
        }
        assert_eq!(tx.stats().tx_dropped, 0);
        assert_eq!(tx.stats().tx_frames, frames.len() as u64);
    }
}

/// Received IPv4 RoCE frames come out ICRC-verified (recovering the ID
/// checks it); a corrupted one, IPv6 ones and non-RoCE ones do not.
#[test]
fn recv_checked_flags_only_frames_whose_icrc_was_verified() {
    for addr in ["127.0.0.1:0", "[::1]:0"] {
        let mut tx = open(addr, |c| c.tx_icrc_valid = true);
        let mut rx = open(addr, |_| {});
        let spec = spec_between(&tx, &rx);
        let v6 = spec.src.is_ipv6();
        let mut frames = roce_frames(&spec, 20, |_| 1024);
        // A flipped payload bit, sent alone (so no GSO ID is in play).
        let bad = frames.len() - 1;
        let at = frames[bad].len() - 100;
        frames[bad][at] ^= 0x10;
        let refs: Vec<&[u8]> = frames[..bad].iter().map(|f| f.as_slice()).collect();
        assert_eq!(tx.send_frames(&refs).unwrap(), bad);
        assert_eq!(tx.send_frames(&[&frames[bad]]).unwrap(), 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut flags = Vec::new();
        while flags.len() < frames.len() && Instant::now() < deadline {
            let n = rx
                .recv_checked(64, &mut |_: &[u8], ok| flags.push(ok))
                .unwrap();
            if n == 0 {
                rx.wait(Some(Duration::from_millis(50))).unwrap();
            }
        }
        assert_eq!(flags.len(), frames.len(), "{addr}");
        if v6 {
            assert!(flags.iter().all(|ok| !ok), "IPv6: the stack checks");
        } else {
            assert!(flags[..bad].iter().all(|ok| *ok), "{flags:?}");
            assert!(!flags[bad], "the corrupted frame is left to the stack");
        }
    }
}

/// Whether this kernel lets us use io_uring (a sysctl may turn it off); the
/// multishot tests then skip, as the backend falls back to recvmmsg.
fn io_uring_allowed() -> bool {
    let off = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .is_ok_and(|v| v.trim() != "0");
    if off {
        eprintln!("SKIP: kernel.io_uring_disabled is set; the multishot receive falls back");
    }
    !off
}

fn multishot(c: &mut UdpConfig) {
    c.multishot = true;
}

#[test]
fn ipv4_loopback_multishot() {
    if !io_uring_allowed() {
        return;
    }
    assert!(open("127.0.0.1:0", multishot).uses_multishot());
    roundtrip("127.0.0.1:0", "127.0.0.1:0", multishot);
    roundtrip("127.0.0.1:0", "127.0.0.1:0", |c| {
        c.multishot = true;
        c.gso = false;
        c.gro = false;
    });
}

#[test]
fn ipv6_loopback_multishot() {
    if !io_uring_allowed() {
        return;
    }
    roundtrip("[::1]:0", "[::1]:0", multishot);
}

/// More datagrams than the ring has buffers, queued before the first
/// receive: the kernel ends the receive when it runs out (ENOBUFS), the
/// next poll arms it again, and nothing is lost or reordered.
#[test]
fn multishot_receive_outlasts_its_buffers() {
    if !io_uring_allowed() {
        return;
    }
    let cfg = |c: &mut UdpConfig| {
        c.multishot = true;
        c.gso = false;
        c.gro = false;
        c.batch = 8;
    };
    let mut a = open("127.0.0.1:0", cfg);
    let mut b = open("127.0.0.1:0", cfg);
    assert!(b.uses_multishot());
    // Armed now, before anything is sent.
    assert_eq!(b.recv_owned(64, &mut Vec::new()).unwrap(), 0);
    let frames: Vec<Vec<u8>> = (0..600u32).map(|i| frame_to(&a, &b, i, 300, 0)).collect();
    for chunk in frames.chunks(8) {
        let refs: Vec<&[u8]> = chunk.iter().map(|f| f.as_slice()).collect();
        assert_eq!(a.send_frames(&refs).unwrap(), chunk.len());
    }
    let mut got = Vec::new();
    drain(&mut b, frames.len(), &mut got);
    assert_eq!(got.len(), frames.len());
    for (g, f) in got.iter().zip(&frames) {
        assert_eq!(g[42..], f[42..], "in order, intact");
    }
    assert_eq!(b.stats().rx_dropped, 0);
}

/// A thread sleeping on the device's poll fd wakes when a datagram comes,
/// and a thread other than the one that armed the receive (which sleeps
/// meanwhile) gets the datagrams all the same.
#[test]
fn multishot_wakes_a_sleeper_and_follows_the_polling_thread() {
    if !io_uring_allowed() {
        return;
    }
    let mut a = open("127.0.0.1:0", |_| {});
    let mut b = open("127.0.0.1:0", multishot);
    assert!(b.uses_multishot());
    // Armed by this thread, which then only sleeps.
    assert_eq!(b.recv_owned(64, &mut Vec::new()).unwrap(), 0);
    let f1 = frame_to(&a, &b, 1, 200, 0);
    let f2 = frame_to(&a, &b, 2, 200, 0);
    let b = std::thread::scope(|s| {
        let poller = s.spawn(move || {
            let t0 = Instant::now();
            assert!(b.wait(Some(Duration::from_secs(5))).unwrap(), "woken");
            let woke = t0.elapsed();
            let mut got = Vec::new();
            drain(&mut b, 2, &mut got);
            (b, got, woke)
        });
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(a.send_frames(&[&f1]).unwrap(), 1);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(a.send_frames(&[&f2]).unwrap(), 1);
        let (b, got, woke) = poller.join().unwrap();
        assert!(woke < Duration::from_secs(2), "woke after {woke:?}");
        assert_eq!(got.len(), 2);
        assert_eq!((&got[0][42..], &got[1][42..]), (&f1[42..], &f2[42..]));
        b
    });
    assert_eq!(b.stats().rx_frames, 2);
}
