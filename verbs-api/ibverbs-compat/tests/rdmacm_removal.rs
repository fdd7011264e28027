//! The drop-in librdmacm when a device's interface goes away: as rdma_cm
//! does for a removed device, every ID on it — a listener and an ID with a
//! resolved address here — gets RDMA_CM_EVENT_DEVICE_REMOVAL, and the
//! device's CM thread stops instead of spinning on the dead device (it
//! looped at full speed, printing the engine's error each time). The
//! library is called in-process (its Rust functions are the C entry
//! points) in a network-namespace host. Needs root; skips without it.

mod common;

use common::readable;

use std::ffi::c_void;
use std::net::Ipv4Addr;
use std::ptr;
use std::time::Duration;

use ferroce_ibverbs_compat::ffi;
use ferroce_ibverbs_compat::rdmacm::{channel, id};

fn sockaddr(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// The next event of `ch` within `ms`: its type and ID, acknowledged.
fn next_event(ch: usize, ms: i32) -> Option<(u32, usize)> {
    let ch = ch as *mut ffi::rdma_event_channel;
    // SAFETY: a live channel.
    if !readable(unsafe { (*ch).fd }, ms) {
        return None;
    }
    let mut ev = ptr::null_mut();
    // SAFETY: a live channel, an out pointer; the event is acknowledged once.
    unsafe {
        assert_eq!(channel::rdma_get_cm_event(ch, &mut ev), 0);
        let got = ((*ev).event, (*ev).id as usize);
        assert_eq!(channel::rdma_ack_cm_event(ev), 0);
        Some(got)
    }
}

/// User plus system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: a zeroed rusage is a valid out-buffer.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

#[test]
fn ids_hear_of_their_device_going_away() {
    if !common::can_run("ids_hear_of_their_device_going_away", &[]) {
        return;
    }
    if !matches!(common::backend().as_str(), "afpacket" | "afxdp") {
        eprintln!("SKIP ids_hear_of_their_device_going_away: a raw backend sees its interface go");
        return;
    }
    let topo = common::topology("cmrm");
    std::env::set_var("FERROCE_BACKEND", common::backend());
    let (a, b) = (topo.host(0).ipv4, topo.host(1).ipv4);
    // SAFETY: the library's C entry points, called as a C program would.
    let (ch, listener, resolver) = topo
        .run_in(0, move || unsafe {
            let ch = channel::rdma_create_event_channel();
            assert!(!ch.is_null());
            let (mut l, mut r) = (ptr::null_mut(), ptr::null_mut());
            let tcp = ffi::RDMA_PS_TCP;
            assert_eq!(
                id::rdma_create_id(ch, &mut l, ptr::null_mut::<c_void>(), tcp),
                0
            );
            assert_eq!(
                id::rdma_create_id(ch, &mut r, ptr::null_mut::<c_void>(), tcp),
                0
            );
            let mut at = sockaddr(a, 7471);
            assert_eq!(
                id::rdma_bind_addr(l, (&mut at as *mut libc::sockaddr_in).cast()),
                0
            );
            assert_eq!(id::rdma_listen(l, 1), 0);
            let mut to = sockaddr(b, 7471);
            let dst = (&mut to as *mut libc::sockaddr_in).cast();
            assert_eq!(id::rdma_resolve_addr(r, ptr::null_mut(), dst, 1000), 0);
            (ch as usize, l as usize, r as usize)
        })
        .unwrap();
    assert_eq!(
        next_event(ch, 2000),
        Some((ffi::RDMA_CM_EVENT_ADDR_RESOLVED, resolver))
    );
    let del = topo
        .command(0, "ip")
        .args(["link", "del", &topo.host(0).ifname])
        .status();
    assert!(del.is_ok_and(|s| s.success()), "ip link del");
    let mut removed = Vec::new();
    while let Some((event, id)) = next_event(ch, 5000) {
        assert_eq!(event, ffi::RDMA_CM_EVENT_DEVICE_REMOVAL, "id {id:#x}");
        removed.push(id);
        if removed.len() == 2 {
            break;
        }
    }
    removed.sort_unstable();
    let mut want = vec![listener, resolver];
    want.sort_unstable();
    assert_eq!(removed, want, "both IDs told");
    assert_eq!(next_event(ch, 200), None, "once each");
    // The CM thread no longer spins on the dead device.
    let before = cpu_time();
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_time() - before;
    assert!(
        used < Duration::from_millis(200),
        "{used:?} of CPU in 500 ms"
    );
    // SAFETY: live IDs whose events were acknowledged, then their channel.
    unsafe {
        assert_eq!(id::rdma_destroy_id(listener as *mut ffi::rdma_cm_id), 0);
        assert_eq!(id::rdma_destroy_id(resolver as *mut ffi::rdma_cm_id), 0);
        channel::rdma_destroy_event_channel(ch as *mut ffi::rdma_event_channel);
    }
}
