//! Several raw devices (AF_PACKET, AF_XDP) on one interface, as two
//! processes of one host each open one: every frame reaches only the device
//! whose QPN prefix its BTH destination QP carries. Before, both saw every
//! frame (AF_PACKET) or the first took them all (AF_XDP), and two `ferroce
//! bench` pairs between the same two hosts broke each other. A raw device
//! also reaches devices of its own host through its UDP socket
//! (`ferroce_nic::local_peers`).

mod common;

use std::net::SocketAddr;

use common::*;
use ferroce_nic::afpacket::{AfPacketConfig, AfPacketIo};
use ferroce_nic::afxdp::{AfXdpConfig, AfXdpIo};
use ferroce_nic::frame::ROCE_V2_PORT;
use ferroce_nic::{LocalPeersIo, UdpConfig, UdpIo};

fn open_shared(kind: &str, ifname: &str) -> Io {
    match kind {
        "afpacket" => Box::new(
            AfPacketIo::open(AfPacketConfig {
                share_qpns: true,
                ..AfPacketConfig::new(ifname)
            })
            .unwrap(),
        ),
        _ => Box::new(
            AfXdpIo::open(AfXdpConfig {
                share_qpns: true,
                ..AfXdpConfig::new(ifname)
            })
            .unwrap(),
        ),
    }
}

/// Sequence number `n` of a frame to QPN prefix `p`: `common::frame` puts
/// the sequence number where a BTH has its destination QP (payload bytes 4..8).
fn seq(p: u8, n: u32) -> u32 {
    (u32::from(p) << 16) | n
}

/// A plain AF_PACKET device on host 1 (no prefix), the frames' sender.
fn sender(t: &ferroce_nic::netns::Topology) -> Io {
    let ifb = t.host(1).ifname.clone();
    t.run_in(1, move || {
        Box::new(AfPacketIo::open(AfPacketConfig::new(&ifb)).unwrap()) as Io
    })
    .unwrap()
}

/// Sends `n` frames from `from` to `to` for each of `prefixes`, interleaved.
fn send_to_prefixes(tx: &mut Io, prefixes: &[u8], n: u32, from: End, to: End) {
    let frames: Vec<Vec<u8>> = (0..n)
        .flat_map(|i| {
            prefixes
                .iter()
                .map(move |&p| frame(from, to, seq(p, i), 300))
        })
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut sent = 0;
    while sent < refs.len() {
        sent += tx.send_frames(&refs[sent..]).unwrap();
    }
}

/// The sequence numbers `io` receives (sorted) until it has `upto` or 2 s
/// pass.
fn received(io: &mut Io, upto: usize, from: End, to: End) -> Vec<u32> {
    let mut got: Vec<u32> = recv_until(io, upto, from, to, 2)
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    got.sort_unstable();
    got
}

/// The two hosts, their IPv4 ends and host 0's interface; `None` (the test
/// skips, saying `what`) without root.
fn hosts(what: &str) -> Option<(ferroce_nic::netns::Topology, End, End, String)> {
    if !root_or_skip(what) {
        return None;
    }
    let t = topo();
    let (ea, eb) = ends(&t, false);
    let ifa = t.host(0).ifname.clone();
    Some((t, ea, eb, ifa))
}

fn want(p: u8, n: u32) -> Vec<u32> {
    (0..n).map(|i| seq(p, i)).collect()
}

fn two_devices_split_the_interface(first: &'static str, second: &'static str) {
    let Some((t, ea, eb, ifa)) = hosts("raw devices sharing an interface") else {
        return;
    };
    let (mut x, mut y) = t
        .run_in(0, move || {
            let x = open_shared(first, &ifa);
            if first == "afxdp" {
                // A queue takes one AF_XDP socket: a second device on it is
                // refused, and `--backend auto` goes on to AF_PACKET.
                let again = AfXdpIo::open(AfXdpConfig {
                    share_qpns: true,
                    ..AfXdpConfig::new(&ifa)
                });
                assert!(again.is_err(), "a second AF_XDP device on one queue");
            }
            (x, open_shared(second, &ifa))
        })
        .unwrap();
    let (px, py) = (x.qpn_prefix().unwrap(), y.qpn_prefix().unwrap());
    assert_ne!(px, py, "{first} and {second} took one prefix");
    let stray = (0..=254u8).find(|p| ![px, py].contains(p)).unwrap();
    let mut tx = sender(&t);
    const N: u32 = 50;
    send_to_prefixes(&mut tx, &[px, py, stray], N, eb, ea);
    // One more than each should get: the wait runs out, so a stray one shows.
    let n = N as usize + 1;
    assert_eq!(
        received(&mut x, n, eb, ea),
        want(px, N),
        "{first} (prefix {px})"
    );
    assert_eq!(
        received(&mut y, n, eb, ea),
        want(py, N),
        "{second} (prefix {py})"
    );
}

#[test]
fn two_afpacket_devices_split_the_interface() {
    two_devices_split_the_interface("afpacket", "afpacket");
}

#[test]
fn afxdp_and_afpacket_devices_split_the_interface() {
    two_devices_split_the_interface("afxdp", "afpacket");
}

/// A UDP-backend device and a raw one on one interface, opened in either
/// order: both bind (the raw device's sink socket on the port's wildcard
/// address used to refuse the UDP device's bind), they take distinct
/// prefixes, and the raw one sees only its own frames. (The UDP socket gets
/// every datagram to its address; its core drops other prefixes' frames as
/// for unknown QPs, as rxe does.)
fn udp_and_raw_devices_share_the_interface(udp_first: bool) {
    let Some((t, ea, eb, ifa)) = hosts("UDP and raw devices on one interface") else {
        return;
    };
    let (mut raw, mut udp) = t
        .run_in(0, move || {
            let udp = || -> Io {
                Box::new(UdpIo::bind(UdpConfig::new(SocketAddr::new(ea.ip, ROCE_V2_PORT))).unwrap())
            };
            if udp_first {
                let u = udp();
                (open_shared("afpacket", &ifa), u)
            } else {
                let r = open_shared("afpacket", &ifa);
                (r, udp())
            }
        })
        .unwrap();
    let (pr, pu) = (raw.qpn_prefix().unwrap(), udp.qpn_prefix().unwrap());
    assert_ne!(pr, pu, "raw and UDP devices took one prefix");
    let mut tx = sender(&t);
    const N: u32 = 30;
    send_to_prefixes(&mut tx, &[pr, pu], N, eb, ea);
    assert_eq!(received(&mut raw, N as usize + 1, eb, ea), want(pr, N));
    let got_udp = received(&mut udp, 2 * N as usize, eb, ea);
    for n in 0..N {
        assert!(got_udp.contains(&seq(pu, n)), "UDP device lost {n}");
    }
}

#[test]
fn a_udp_device_binds_beside_a_raw_one() {
    udp_and_raw_devices_share_the_interface(false);
}

#[test]
fn a_raw_device_opens_beside_a_udp_one() {
    udp_and_raw_devices_share_the_interface(true);
}

/// A raw device with its socket for peers on this host, beside a UDP device
/// on the same address: frames go between them through the kernel's
/// loopback both ways, and frames from the wire reach the raw device once
/// (its socket drops the kernel's copy of them, which the port's group
/// steers to it by prefix).
#[test]
fn a_raw_device_reaches_local_peers_through_its_socket() {
    let Some((t, ea, eb, ifa)) = hosts("a raw device's local peers") else {
        return;
    };
    let (mut raw, mut udp) = t
        .run_in(0, move || {
            let bind = SocketAddr::new(ea.ip, ROCE_V2_PORT);
            let raw = LocalPeersIo::new(open_shared("afpacket", &ifa), UdpConfig::new(bind))
                .map_err(|(_, e)| e)
                .unwrap();
            let udp = UdpIo::bind(UdpConfig::new(bind)).unwrap();
            (Box::new(raw) as Io, Box::new(udp) as Io)
        })
        .unwrap();
    let (pr, pu) = (raw.qpn_prefix().unwrap(), udp.qpn_prefix().unwrap());
    assert_ne!(pr, pu, "raw and UDP devices took one prefix");
    // GRO finds a wire frame's socket by address: with UDP_GRO on this one,
    // Linux before 6.2 coalesced the raw device's own back-to-back frames and
    // then dropped the super-frames at the AF_PACKET ring. From 6.2 the ring
    // takes them (virtio-net header), and the socket asks for GRO so that a
    // peer's GSO send is not cut up to be dropped there; the frames below
    // must arrive either way.
    let sock = raw.second_poll_fd().expect("the local peers' socket");
    assert_eq!(
        udp_gro(sock),
        i32::from(raw.receives_super_frames()),
        "UDP_GRO on the local peers' socket"
    );
    assert_eq!(
        raw.receives_super_frames(),
        ferroce_nic::afpacket::gso_supported()
    );
    const N: u32 = 30;
    let mut tx = sender(&t);
    send_to_prefixes(&mut tx, &[pr], N, eb, ea);
    assert_eq!(
        received(&mut raw, N as usize + 1, eb, ea),
        want(pr, N),
        "from the wire"
    );
    send_to_prefixes(&mut udp, &[pr], N, ea, ea);
    assert_eq!(
        received(&mut raw, N as usize + 1, ea, ea),
        want(pr, N),
        "from the UDP device"
    );
    // The wire frames reached the socket's group too, and its filter turned
    // them away: by design, not a loss (the local datagrams carried the
    // kernel's drop count that includes them).
    assert_eq!(
        raw.stats().rx_dropped,
        0,
        "filtered wire frames counted as drops"
    );
    // Addressed to the raw device's own MAC: out through its socket.
    send_to_prefixes(&mut raw, &[pu], N, ea, ea);
    assert_eq!(
        received(&mut udp, N as usize + 1, ea, ea),
        want(pu, N),
        "from the raw device"
    );
}

/// The socket's UDP_GRO setting (linux/udp.h: 104).
fn udp_gro(fd: std::os::fd::RawFd) -> libc::c_int {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are live locals of the sizes the kernel is told.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_UDP,
            104,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(
        r,
        0,
        "getsockopt(UDP_GRO): {}",
        std::io::Error::last_os_error()
    );
    v
}
