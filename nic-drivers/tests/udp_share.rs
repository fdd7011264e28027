//! Several UDP devices on one address and port (ranks of a job on one host):
//! each datagram reaches the device whose QPN prefix its BTH destination QP
//! carries, also after a device leaves and the kernel reorders the group.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ferroce_nic::{frame, PacketIo, UdpConfig, UdpIo};

/// A loopback address and port no other test binds: a port the kernel
/// just handed out, on an address of this test's own.
fn shared_addr(last: u8) -> SocketAddr {
    let probe = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
    let port = probe.local_addr().unwrap().port();
    format!("127.61.{}.{last}:{port}", std::process::id() % 250)
        .parse()
        .unwrap()
}

fn join(at: SocketAddr) -> UdpIo {
    UdpIo::bind(UdpConfig::new(at)).unwrap()
}

/// A datagram that looks like a BTH to QPN `qpn` (the steering reads only
/// the destination QP), with `tag` after it.
fn send_to_qpn(from: &UdpSocket, at: SocketAddr, qpn: u32, tag: u8) {
    let mut p = [0u8; 40];
    p[0] = 0x04; // RC SEND ONLY
    p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    p[12] = tag;
    from.send_to(&p, at).unwrap();
}

/// The tags of what `io` received (the byte after the BTH, behind the
/// synthesised Ethernet/IP/UDP headers).
fn tags(io: &mut UdpIo) -> Vec<u8> {
    let at = frame::header_len(io.local_addr().is_ipv6()) + 12;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        let mut frames = Vec::new();
        io.recv_owned(64, &mut frames).unwrap();
        out.extend(frames.iter().filter_map(|f| f.get(at).copied()));
        std::thread::sleep(Duration::from_millis(5));
    }
    out
}

#[test]
fn datagrams_reach_the_device_that_owns_the_qpn() {
    let at = shared_addr(1);
    let mut a = join(at);
    let mut b = join(at);
    let mut c = join(at);
    let prefixes: Vec<_> = [&a, &b, &c].iter().map(|d| d.qpn_prefix()).collect();
    assert_eq!(prefixes, [Some(0), Some(1), Some(2)]);
    assert_eq!(c.share().map(|s| s.members()), Some(3));
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for round in 0..4u8 {
        send_to_qpn(&tx, at, 0x00_0011, 10 + round);
        send_to_qpn(&tx, at, 0x01_0012, 20 + round);
        send_to_qpn(&tx, at, 0x02_0013, 30 + round);
    }
    assert_eq!(tags(&mut a), [10, 11, 12, 13]);
    assert_eq!(tags(&mut b), [20, 21, 22, 23]);
    assert_eq!(tags(&mut c), [30, 31, 32, 33]);

    // The first leaves: the kernel moves the last socket into its place,
    // and the leaver told the group so before it closed.
    drop(a);
    for round in 0..3u8 {
        send_to_qpn(&tx, at, 0x01_0012, 40 + round);
        send_to_qpn(&tx, at, 0x02_0013, 50 + round);
    }
    assert_eq!(tags(&mut b), [40, 41, 42]);
    assert_eq!(tags(&mut c), [50, 51, 52]);
    // The periodic checks agree (and count the device at position 0 now).
    assert_eq!(c.share().map(|s| s.position()), Some(0));
    assert_eq!(c.share().map(|s| s.members()), Some(2));

    // A newcomer takes the prefix that is free again.
    let mut d = join(at);
    assert_eq!(d.qpn_prefix(), Some(0));
    send_to_qpn(&tx, at, 0x00_0011, 60);
    send_to_qpn(&tx, at, 0x01_0011, 61);
    send_to_qpn(&tx, at, 0x02_0011, 62);
    assert_eq!(tags(&mut d), [60]);
    assert_eq!(tags(&mut b), [61]);
    assert_eq!(tags(&mut c), [62]);
}

#[test]
fn a_lone_device_keeps_gro_and_its_qpns() {
    let at = shared_addr(2);
    let a = join(at);
    assert_eq!(a.qpn_prefix(), Some(0));
    assert_eq!(a.share().map(|s| (s.members(), s.position())), Some((1, 0)));
    // An ephemeral port is never shared.
    let e = join("127.0.0.1:0".parse().unwrap());
    assert_eq!(e.qpn_prefix(), None);
    // The last member out removes the group's table.
    assert!(table_exists(at));
    drop(a);
    assert!(!table_exists(at));
}

/// GRO stays on for a device whose only fellow members take no GRO (a raw
/// device's loopback-only socket for its local peers), goes off on both
/// when a second device that would take it joins, and comes back when that
/// one leaves.
#[test]
fn gro_is_off_only_while_another_member_would_take_it() {
    let at = shared_addr(4);
    let mut a = join(at);
    assert!(a.gro_on());
    let mut lo = UdpConfig::new(at);
    lo.loopback_only = true;
    lo.gro = false;
    lo.share_prefix = Some(9);
    let mut peers = UdpIo::bind(lo).unwrap();
    // Checks run every CHECK_EVERY from the receive path.
    let settle = |ios: &mut [&mut UdpIo]| {
        let deadline = Instant::now() + 3 * ferroce_nic::port_share::CHECK_EVERY;
        while Instant::now() < deadline {
            for io in ios.iter_mut() {
                io.recv_owned(64, &mut Vec::new()).unwrap();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    settle(&mut [&mut a, &mut peers]);
    assert_eq!(a.share().map(|s| s.members()), Some(2));
    assert!(a.gro_on(), "beside a member that takes no GRO");
    assert!(!peers.gro_on());
    let mut b = join(at);
    assert!(!b.gro_on(), "joined beside a member that takes GRO");
    settle(&mut [&mut a, &mut peers, &mut b]);
    assert!(
        !a.gro_on() && !b.gro_on(),
        "two members that would take GRO"
    );
    drop(b);
    settle(&mut [&mut a, &mut peers]);
    assert!(a.gro_on(), "alone again with GRO");
}

/// Whether a shared-port table for `at` exists.
fn table_exists(at: SocketAddr) -> bool {
    let name = format!("-{}-{}.members", at.ip(), at.port());
    ["/dev/shm".into(), std::env::temp_dir()]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(Result::ok)
        .any(|f| f.file_name().to_string_lossy().ends_with(&name))
}

#[test]
fn sharing_off_keeps_the_port_to_itself() {
    let at = shared_addr(3);
    let mut cfg = UdpConfig::new(at);
    cfg.share_port = false;
    let _a = UdpIo::bind(cfg).unwrap();
    assert!(UdpIo::bind(UdpConfig::new(at)).is_err());
    // The refused one leaves no table behind.
    assert!(!table_exists(at));
}

/// The same over IPv6, and on a wildcard address (probes then go to
/// loopback, where the wildcard sockets' group answers too).
#[test]
fn ipv6_and_wildcard_groups_steer_too() {
    for (bind, to) in [
        ("[::1]", "[::1]"),
        ("0.0.0.0", "127.0.0.1"),
        ("[::]", "[::1]"),
    ] {
        let probe = UdpSocket::bind(format!("{to}:0")).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let at: SocketAddr = format!("{bind}:{port}").parse().unwrap();
        let dst: SocketAddr = format!("{to}:{port}").parse().unwrap();
        let mut a = join(at);
        let mut b = join(at);
        assert_eq!(
            (a.qpn_prefix(), b.qpn_prefix()),
            (Some(0), Some(1)),
            "{bind}"
        );
        let tx = UdpSocket::bind(format!("{to}:0")).unwrap();
        send_to_qpn(&tx, dst, 0x00_0011, 1);
        send_to_qpn(&tx, dst, 0x01_0011, 2);
        send_to_qpn(&tx, dst, 0x00_0012, 3);
        assert_eq!(tags(&mut a), [1, 3], "{bind}");
        assert_eq!(tags(&mut b), [2], "{bind}");
    }
}

/// A GSO send queued whole at a lone device (UDP GRO on) and read after a
/// second device joined (GRO off, so the kernel reports no segment size):
/// its datagrams still come out one by one. They were dropped whole
/// before, and at the start of every run between two processes on one
/// host RC paid a go-back-N and UC lost its first messages.
#[test]
fn a_gso_send_queued_before_sharing_began_comes_out_in_datagrams() {
    use std::os::fd::AsRawFd;
    let at = shared_addr(7);
    let mut a = join(at);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    // linux/udp.h UDP_SEGMENT
    let seg: libc::c_int = 1040;
    // SAFETY: a valid socket and a c_int option value.
    let r = unsafe {
        libc::setsockopt(
            tx.as_raw_fd(),
            libc::SOL_UDP,
            103,
            (&seg as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        eprintln!("SKIP: no UDP GSO here");
        return;
    }
    // Ten BTHs to QPN 0x11 (device a's prefix 0), consecutive PSNs, the last one shorter.
    let mut blob = Vec::new();
    for i in 0..10u32 {
        let mut p = vec![0u8; if i == 9 { 300 } else { 1040 }];
        p[0] = 0x01; // RC SEND MIDDLE
        p[5..8].copy_from_slice(&0x00_0011u32.to_be_bytes()[1..]);
        p[9..12].copy_from_slice(&(0x00ff_fffa + i).to_be_bytes()[1..]);
        p[12] = i as u8;
        blob.extend(p);
    }
    tx.send_to(&blob, at).unwrap();
    // And two short segments, together shorter than a frame (taken as one
    // frame before, which failed its ICRC).
    tx.send_to(&blob[..2 * 1040], at).unwrap();
    let b = join(at);
    assert_eq!(b.share().map(|s| s.members()), Some(2));
    // a's next receive runs its periodic check first: it sees b and turns GRO off.
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(tags(&mut a), (0..10).chain(0..2).collect::<Vec<u8>>());
}

/// A process that exits with its devices open (librdmacm's, a C program's)
/// takes them out of the table first (`leave_shared`), as closing them
/// would: the others are steered right once its socket is gone, and the
/// last one out removes the table.
#[test]
fn leaving_at_exit_hands_the_place_on_and_the_last_removes_the_table() {
    let at = shared_addr(8);
    let mut a = join(at);
    let mut b = join(at);
    assert_eq!(b.qpn_prefix(), Some(1));
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();

    a.leave_shared();
    assert!(a.share().is_none());
    assert!(table_exists(at));
    // The process exits: its socket closes, the kernel moves b into its place.
    drop(a);
    for round in 0..3u8 {
        send_to_qpn(&tx, at, 0x01_0012, 60 + round);
    }
    assert_eq!(tags(&mut b), [60, 61, 62]);

    b.leave_shared();
    assert!(!table_exists(at));
    // Alone, it still gets its datagrams until it closes.
    send_to_qpn(&tx, at, 0x01_0012, 70);
    assert_eq!(tags(&mut b), [70]);
}

/// A socket in the port's `SO_REUSEPORT` group that no member's table line
/// names: one just closed that the kernel has not let go of yet (an
/// io_uring request held it: some tens of ms after its process exits).
fn lingering_socket(at: SocketAddr) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = at else {
        panic!("IPv4 only")
    };
    // SAFETY: plain socket calls on a fresh fd with valid arguments.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0);
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let one: libc::c_int = 1;
        for opt in [libc::SO_REUSEPORT, libc::SO_REUSEADDR] {
            let r = libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            assert_eq!(r, 0);
        }
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(v4.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        let r = libc::bind(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        owned
    }
}

/// Sockets lingering in the group take the probes a joining device sends
/// to find its place; it sends them again until they are gone (a device
/// opened just after another process's closed failed to open before).
#[test]
fn a_join_outlasts_sockets_lingering_in_the_group() {
    let at = shared_addr(9);
    let lingering: Vec<_> = (0..8).map(|_| lingering_socket(at)).collect();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(lingering);
    });
    let mut io = UdpIo::bind(UdpConfig::new(at)).expect("joins once they are gone");
    closer.join().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    send_to_qpn(&tx, at, 0x00_0011, 7);
    assert_eq!(tags(&mut io), vec![7]);
}
