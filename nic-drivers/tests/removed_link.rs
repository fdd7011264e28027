//! AF_PACKET, AF_XDP and the UDP socket backend when their interface goes
//! away: the backend fails with an error that says so. AF_PACKET left the
//! kernel's error on its socket, which made every `poll` return at once and
//! an idle engine thread spin; an unbound AF_XDP socket never polled ready
//! again, and a UDP socket bound to the interface's address stays bound and
//! silent, so the engine slept and the application waited for ever.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferroce_nic::udp::{UdpConfig, UdpIo};

/// Receives (as an engine does, sleeping on the fd between) until the
/// backend fails, within `limit`; its error must say the interface is gone.
fn assert_gone(io: &mut Io, ring: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    let why = loop {
        assert!(
            Instant::now() < deadline,
            "{ring}: still no error {limit:?} after the interface went away"
        );
        let _ = ferroce_nic::wait_readable_any(&[io.poll_fd()], Some(Duration::from_millis(20)));
        match io.recv(64, &mut |_: &[u8]| ()) {
            Ok(_) => continue,
            Err(e) => break e.to_string(),
        }
    };
    assert!(why.contains("the interface is gone"), "{ring}: {why}");
}

#[test]
fn a_removed_interface_fails_the_backend() {
    if !root_or_skip("afpacket removed interface") {
        return;
    }
    for (ring, open) in [
        ("V3", raw_afpacket as fn(&str) -> Io),
        ("V2", raw_afpacket_v2),
        ("AF_XDP", raw_afxdp),
    ] {
        let t = topo();
        let ifname = t.host(0).ifname.clone();
        let name = ifname.clone();
        let mut io: Io = t.run_in(0, move || open(&name)).unwrap();
        // Idle: a poll sleeps its whole time-out.
        let t0 = Instant::now();
        let ready =
            ferroce_nic::wait_readable_any(&[io.poll_fd()], Some(Duration::from_millis(50)));
        assert!(
            matches!(ready, Ok(false)) && t0.elapsed() >= Duration::from_millis(40),
            "{ring}: an idle socket polled ready ({ready:?})"
        );
        let del = t.command(0, "ip").args(["link", "del", &ifname]).status();
        assert!(del.is_ok_and(|s| s.success()), "ip link del {ifname}");
        assert_gone(&mut io, ring, Duration::from_secs(5));
    }
}

/// A UDP socket on the interface's address: it outlives the address, so the
/// backend asks after the interface itself, in the socket's own namespace
/// (this test's thread is in another).
#[test]
fn a_removed_interface_fails_the_udp_backend() {
    if !root_or_skip("udp removed interface") {
        return;
    }
    let t = topo();
    let ifname = t.host(0).ifname.clone();
    let ip = t.host(0).ip(false);
    let name = ifname.clone();
    let mut io: Io = t
        .run_in(0, move || {
            let mut c = UdpConfig::new(std::net::SocketAddr::new(ip, 0));
            c.ifindex = ferroce_nic::ifaces::index(&name).expect("the interface's index");
            Box::new(UdpIo::bind(c).unwrap()) as Io
        })
        .unwrap();
    // A link that is only down keeps the backend.
    let down = t
        .command(0, "ip")
        .args(["link", "set", &ifname, "down"])
        .status();
    assert!(down.is_ok_and(|s| s.success()), "ip link set {ifname} down");
    for _ in 0..600 {
        let r = io.recv(64, &mut |_: &[u8]| ());
        assert!(r.is_ok(), "UDP: a link that is only down failed it: {r:?}");
    }
    let del = t.command(0, "ip").args(["link", "del", &ifname]).status();
    assert!(del.is_ok_and(|s| s.success()), "ip link del {ifname}");
    assert_gone(&mut io, "UDP", Duration::from_secs(5));
}

/// The kernel reports a link going down on the AF_PACKET socket, and its
/// removal later only by unbinding it: a backend that took the first report
/// for a link that is only down (and cleared it) must still see the second.
#[test]
fn an_interface_removed_after_going_down_still_fails_the_backend() {
    if !root_or_skip("afpacket interface down, then removed") {
        return;
    }
    for (ring, open) in [
        ("V3", raw_afpacket as fn(&str) -> Io),
        ("V2", raw_afpacket_v2),
    ] {
        let t = topo();
        let ifname = t.host(0).ifname.clone();
        let name = ifname.clone();
        let mut io: Io = t.run_in(0, move || open(&name)).unwrap();
        let down = t
            .command(0, "ip")
            .args(["link", "set", &ifname, "down"])
            .status();
        assert!(down.is_ok_and(|s| s.success()), "ip link set {ifname} down");
        // Empty receives until the backend has looked at the link (its
        // error is then gone): a link that is only down keeps the backend.
        for _ in 0..600 {
            let _ = ferroce_nic::wait_readable_any(&[io.poll_fd()], Some(Duration::from_millis(1)));
            let r = io.recv(64, &mut |_: &[u8]| ());
            assert!(
                r.is_ok(),
                "{ring}: a link that is only down failed it: {r:?}"
            );
        }
        let del = t.command(0, "ip").args(["link", "del", &ifname]).status();
        assert!(del.is_ok_and(|s| s.success()), "ip link del {ifname}");
        assert_gone(&mut io, ring, Duration::from_secs(2));
    }
}
