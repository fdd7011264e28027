//! The completion channel's fd works with poll(2), as programs that put it
//! in an event loop need: not readable while nothing happened, readable
//! after a completion on an armed CQ, and `ibv_get_cq_event` then hands out
//! that CQ. The library is called in-process (its Rust functions are the C
//! entry points) from two network-namespace hosts exchanging a UD message.
//! Also: `ibv_create_cq_ex` with the extended polling API, and the SRQ
//! limit event through `ibv_get_async_event`, and multicast attach / detach.
//! Needs root; skips without it.

mod common;

use common::readable;

use std::ffi::c_void;
use std::ptr;

use ferroce_ibverbs_compat::{channel, devices, ffi, misc, qp, resources};

/// The handles of one side, as addresses (raw pointers are not Send).
#[derive(Clone, Copy)]
struct Side {
    ctx: usize,
    pd: usize,
    ch: usize,
    cq: usize,
    qp: usize,
    mr: usize,
    buf: usize,
    qpn: u32,
    srq: usize,
}

const LEN: usize = 4096;

/// Open the device of the calling thread's namespace and make a UD QP in RTS.
unsafe fn open_side(cq_ex: bool, with_srq: bool) -> Side {
    unsafe {
        let mut n = 0;
        let list = devices::ibv_get_device_list(&mut n);
        assert!(n >= 1, "no device");
        let ctx = devices::ibv_open_device(*list);
        assert!(!ctx.is_null(), "open");
        devices::ibv_free_device_list(list);
        let pd = resources::ibv_alloc_pd(ctx);
        let ch = channel::ibv_create_comp_channel(ctx);
        let cq = if cq_ex {
            // As the inline ibv_create_cq_ex does: through the verbs_context
            // that precedes the ibv_context.
            let off = std::mem::offset_of!(ffi::verbs_context, context);
            let vctx = &*((ctx as *mut u8).sub(off) as *const ffi::verbs_context);
            assert_eq!(vctx.sz, std::mem::size_of::<ffi::verbs_context>());
            let mut attr = ffi::ibv_cq_init_attr_ex {
                cqe: 16,
                channel: ch,
                wc_flags: u64::from(ffi::IBV_WC_STANDARD_FLAGS),
                ..Default::default()
            };
            let create = vctx.create_cq_ex.expect("create_cq_ex");
            create(ctx, &mut attr) as *mut ffi::ibv_cq
        } else {
            resources::ibv_create_cq(ctx, 16, ptr::null_mut(), ch, 0)
        };
        assert!(!pd.is_null() && !ch.is_null() && !cq.is_null());
        let buf = Box::leak(vec![0u8; LEN].into_boxed_slice()).as_mut_ptr();
        let mr = resources::ibv_reg_mr(pd, buf as *mut c_void, LEN, 1);
        assert!(!mr.is_null());
        let srq = if with_srq {
            let mut sa = ffi::ibv_srq_init_attr {
                attr: ffi::ibv_srq_attr {
                    max_wr: 8,
                    max_sge: 1,
                    srq_limit: 0,
                },
                ..Default::default()
            };
            resources::ibv_create_srq(pd, &mut sa)
        } else {
            ptr::null_mut()
        };
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            srq,
            cap: ffi::ibv_qp_cap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_UD,
            ..Default::default()
        };
        let q = qp::ibv_create_qp(pd, &mut init);
        assert!(!q.is_null());
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_INIT,
            port_num: 1,
            qkey: 0x1111_1111,
            ..Default::default()
        };
        let m = ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_QKEY;
        assert_eq!(qp::ibv_modify_qp(q, &mut a, m as i32), 0);
        a.qp_state = ffi::IBV_QPS_RTR;
        assert_eq!(qp::ibv_modify_qp(q, &mut a, ffi::IBV_QP_STATE as i32), 0);
        a.qp_state = ffi::IBV_QPS_RTS;
        let m = ffi::IBV_QP_STATE | ffi::IBV_QP_SQ_PSN;
        assert_eq!(qp::ibv_modify_qp(q, &mut a, m as i32), 0);
        Side {
            ctx: ctx as usize,
            pd: pd as usize,
            ch: ch as usize,
            cq: cq as usize,
            qp: q as usize,
            mr: mr as usize,
            buf: buf as usize,
            qpn: (*q).qp_num,
            srq: srq as usize,
        }
    }
}

#[test]
fn channel_fd_is_pollable() {
    if common::can_run("channel_fd_is_pollable", &[]) {
        exchange("cchan", false);
    }
}

/// The same with the receiving CQ made by `ibv_create_cq_ex` and read with
/// the extended polling API (`ibv_start_poll`, `ibv_wc_read_*`).
#[test]
fn cq_ex_polling() {
    if common::can_run("cq_ex_polling", &[]) {
        exchange("ccqex", true);
    }
}

fn exchange(tag: &str, cq_ex: bool) {
    let topo = common::topology(tag);
    // Both namespaces name their interface veth0; each thread opens its own.
    std::env::set_var("FERROCE_DEVICE", &topo.host(0).ifname);
    std::env::set_var("FERROCE_BACKEND", common::backend());
    // SAFETY: the library's C entry points, called as a C program would.
    let a = topo
        .run_in(0, || unsafe { open_side(false, false) })
        .unwrap();
    let b = topo
        .run_in(1, move || unsafe { open_side(cq_ex, false) })
        .unwrap();
    let dgid = topo.host(1).ipv4.to_ipv6_mapped().octets();
    let bqpn = b.qpn;
    // B: a receive posted, the CQ armed; the fd must stay quiet.
    // SAFETY: live handles of side B.
    unsafe {
        let lkey = (*(b.mr as *mut ffi::ibv_mr)).lkey;
        let mut sge = ffi::ibv_sge {
            addr: b.buf as u64,
            length: LEN as u32,
            lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: 7,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        let mut bad = ptr::null_mut();
        let q = b.qp as *mut ffi::ibv_qp;
        let post = (*(*q).context).ops.post_recv.unwrap();
        assert_eq!(post(q, &mut wr, &mut bad), 0);
        let cq = b.cq as *mut ffi::ibv_cq;
        let arm = (*(*cq).context).ops.req_notify_cq.unwrap();
        assert_eq!(arm(cq, 0), 0);
    }
    // SAFETY: B's channel is live.
    let bfd = unsafe { (*(b.ch as *mut ffi::ibv_comp_channel)).fd };
    assert!(!readable(bfd, 200), "readable before anything arrived");
    // A sends 100 bytes to B (address handle made in A's namespace).
    send(&topo, a, dgid, bqpn, 1);
    assert!(readable(bfd, 5000), "the channel fd never became readable");
    // SAFETY: live handles of side B.
    unsafe {
        let mut got: *mut ffi::ibv_cq = ptr::null_mut();
        let mut cctx: *mut c_void = ptr::null_mut();
        let ch = b.ch as *mut ffi::ibv_comp_channel;
        assert_eq!(channel::ibv_get_cq_event(ch, &mut got, &mut cctx), 0);
        assert_eq!(got as usize, b.cq);
        resources::ibv_ack_cq_events(got, 1);
        if cq_ex {
            let cx = got as *mut ffi::ibv_cq_ex;
            let mut pa = ffi::ibv_poll_cq_attr::default();
            assert_eq!((*cx).start_poll.unwrap()(cx, &mut pa), 0);
            assert_eq!((*cx).status, ffi::IBV_WC_SUCCESS);
            assert_eq!((*cx).wr_id, 7);
            assert_eq!((*cx).read_opcode.unwrap()(cx), ffi::IBV_WC_RECV);
            assert_eq!((*cx).read_byte_len.unwrap()(cx), 100 + 40);
            assert_ne!((*cx).read_wc_flags.unwrap()(cx) & ffi::IBV_WC_GRH, 0);
            assert_eq!((*cx).next_poll.unwrap()(cx), libc::ENOENT);
            (*cx).end_poll.unwrap()(cx);
        } else {
            let mut wc = ffi::ibv_wc::default();
            let poll = (*(*got).context).ops.poll_cq.unwrap();
            assert_eq!(poll(got, 1, &mut wc), 1);
            assert_eq!(wc.status, ffi::IBV_WC_SUCCESS);
            assert_eq!(wc.wr_id, 7);
            assert_eq!(wc.byte_len, 100 + 40, "payload and the GRH area");
        }
        assert_eq!(*((b.buf + 40) as *const u8), 0x5a);
        // Event taken: quiet again.
        assert!(
            !readable(bfd, 100),
            "still readable after the event was taken"
        );
    }
    let _ = (a.ctx, b.ctx);
}

/// Side A sends `count` 100-byte UD messages to B's QP.
fn send(topo: &ferroce_nic::netns::Topology, a: Side, dgid: [u8; 16], bqpn: u32, count: u64) {
    topo.run_in(0, move || {
        // SAFETY: live handles of side A.
        unsafe {
            let pd = a.pd as *mut ffi::ibv_pd;
            let mut ah_attr = ffi::ibv_ah_attr {
                is_global: 1,
                port_num: 1,
                grh: ffi::ibv_global_route {
                    dgid: ffi::ibv_gid { raw: dgid },
                    sgid_index: 1,
                    hop_limit: 64,
                    ..Default::default()
                },
                ..Default::default()
            };
            let ah = resources::ibv_create_ah(pd, &mut ah_attr);
            assert!(!ah.is_null(), "create_ah");
            std::ptr::write_bytes(a.buf as *mut u8, 0x5a, 100);
            for i in 0..count {
                let mut sge = ffi::ibv_sge {
                    addr: a.buf as u64,
                    length: 100,
                    lkey: (*(a.mr as *mut ffi::ibv_mr)).lkey,
                };
                let mut wr = ffi::ibv_send_wr {
                    wr_id: i,
                    sg_list: &mut sge,
                    num_sge: 1,
                    opcode: ffi::IBV_WR_SEND,
                    send_flags: ffi::IBV_SEND_SIGNALED,
                    ..Default::default()
                };
                wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                    ah,
                    remote_qpn: bqpn,
                    remote_qkey: 0x1111_1111,
                };
                let mut bad = ptr::null_mut();
                let q = a.qp as *mut ffi::ibv_qp;
                let post = (*(*q).context).ops.post_send.unwrap();
                assert_eq!(post(q, &mut wr, &mut bad), 0);
            }
        }
    })
    .unwrap();
}

/// An SRQ whose armed limit is crossed raises IBV_EVENT_SRQ_LIMIT_REACHED
/// through `ibv_get_async_event`, naming the SRQ.
#[test]
fn srq_limit_async_event() {
    if !common::can_run("srq_limit_async_event", &[]) {
        return;
    }
    let topo = common::topology("csrql");
    std::env::set_var("FERROCE_DEVICE", &topo.host(0).ifname);
    std::env::set_var("FERROCE_BACKEND", common::backend());
    // SAFETY: the library's C entry points, called as a C program would.
    let a = topo
        .run_in(0, || unsafe { open_side(false, false) })
        .unwrap();
    let b = topo
        .run_in(1, || unsafe { open_side(false, true) })
        .unwrap();
    assert_ne!(b.srq, 0, "create_srq");
    // SAFETY: live handles of side B.
    unsafe {
        let srq = b.srq as *mut ffi::ibv_srq;
        let lkey = (*(b.mr as *mut ffi::ibv_mr)).lkey;
        for i in 0..3u64 {
            let mut sge = ffi::ibv_sge {
                addr: b.buf as u64 + i * 1024,
                length: 1024,
                lkey,
            };
            let mut wr = ffi::ibv_recv_wr {
                wr_id: i,
                sg_list: &mut sge,
                num_sge: 1,
                ..Default::default()
            };
            let mut bad = ptr::null_mut();
            let post = (*(*srq).context).ops.post_srq_recv.unwrap();
            assert_eq!(post(srq, &mut wr, &mut bad), 0);
        }
        let mut attr = ffi::ibv_srq_attr {
            srq_limit: 2,
            ..Default::default()
        };
        assert_eq!(
            resources::ibv_modify_srq(srq, &mut attr, ffi::IBV_SRQ_LIMIT as i32),
            0
        );
        // Nothing yet: non-blocking returns EAGAIN.
        let ctx = b.ctx as *mut ffi::ibv_context;
        let fd = (*ctx).async_fd;
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
        let mut ev = ffi::ibv_async_event::default();
        assert_eq!(misc::ibv_get_async_event(ctx, &mut ev), -1);
    }
    let dgid = topo.host(1).ipv4.to_ipv6_mapped().octets();
    send(&topo, a, dgid, b.qpn, 2);
    // SAFETY: live handles of side B.
    unsafe {
        let ctx = b.ctx as *mut ffi::ibv_context;
        let mut ev = ffi::ibv_async_event::default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while misc::ibv_get_async_event(ctx, &mut ev) != 0 {
            assert!(std::time::Instant::now() < deadline, "no SRQ limit event");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(ev.event_type, ffi::IBV_EVENT_SRQ_LIMIT_REACHED);
        assert_eq!(ev.element.srq as usize, b.srq);
        misc::ibv_ack_async_event(&mut ev);
    }
}

/// `ibv_attach_mcast` / `ibv_detach_mcast` answer as rdma-core over rxe does:
/// 0 for a UD QP and a multicast GID (twice is once), EINVAL for a unicast
/// GID or a group the QP is not in, EBUSY from `ibv_destroy_qp` while the QP
/// is in a group; `ibv_query_device` reports rxe's multicast limits.
#[test]
fn multicast_attach_and_detach() {
    if !common::can_run("multicast_attach_and_detach", &[]) {
        return;
    }
    let topo = common::topology("mcast");
    std::env::set_var("FERROCE_DEVICE", &topo.host(0).ifname);
    std::env::set_var("FERROCE_BACKEND", common::backend());
    topo.run_in(0, || {
        // SAFETY: the library's C entry points, called as a C program would.
        unsafe {
            let s = open_side(false, false);
            let q = s.qp as *mut ffi::ibv_qp;
            let group = ffi::ibv_gid {
                raw: std::net::Ipv4Addr::new(239, 1, 1, 1)
                    .to_ipv6_mapped()
                    .octets(),
            };
            let unicast = ffi::ibv_gid {
                raw: std::net::Ipv4Addr::new(198, 18, 0, 1)
                    .to_ipv6_mapped()
                    .octets(),
            };
            assert_eq!(qp::ibv_attach_mcast(q, &group, 0), 0);
            assert_eq!(qp::ibv_attach_mcast(q, &group, 0), 0);
            assert_eq!(qp::ibv_attach_mcast(q, &unicast, 0), libc::EINVAL);
            assert_eq!(qp::ibv_destroy_qp(q), libc::EBUSY);
            assert_eq!(qp::ibv_detach_mcast(q, &group, 0), 0);
            assert_eq!(qp::ibv_detach_mcast(q, &group, 0), libc::EINVAL);
            let mut attr = ffi::ibv_device_attr::default();
            let ctx = s.ctx as *mut ffi::ibv_context;
            assert_eq!(devices::ibv_query_device(ctx, &mut attr), 0);
            assert_eq!(
                (
                    attr.max_mcast_grp,
                    attr.max_mcast_qp_attach,
                    attr.max_total_mcast_qp_attach
                ),
                (8192, 56, 0x70000)
            );
            assert_eq!(qp::ibv_destroy_qp(q), 0);
        }
    })
    .unwrap();
}

/// When a device's interface goes away its engine stops, and the context's
/// async fd says so as rdma-core's does when rxe's netdev is removed: the fd
/// turns readable, `ibv_get_async_event` gives IBV_EVENT_DEVICE_FATAL once,
/// then fails with EIO; a completion channel's fd turns readable and
/// `ibv_get_cq_event` fails with EIO. (Raw backends only: they see the
/// interface go; the UDP backend looks after its interface too.)
#[test]
fn device_fatal_when_the_interface_goes() {
    if !common::can_run("device_fatal_when_the_interface_goes", &[]) {
        return;
    }
    if !matches!(common::backend().as_str(), "afpacket" | "afxdp" | "udp") {
        eprintln!("SKIP device_fatal_when_the_interface_goes: the mem backend has no interface");
        return;
    }
    let topo = common::topology("cfatal");
    std::env::set_var("FERROCE_DEVICE", &topo.host(0).ifname);
    std::env::set_var("FERROCE_BACKEND", common::backend());
    // SAFETY: the library's C entry points, called as a C program would.
    let a = topo
        .run_in(0, || unsafe { open_side(false, false) })
        .unwrap();
    let ctx = a.ctx as *mut ffi::ibv_context;
    // SAFETY: live context.
    let fd = unsafe { (*ctx).async_fd };
    // SAFETY: our fd; live context, a local event.
    unsafe {
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
        let mut ev = ffi::ibv_async_event::default();
        assert_eq!(misc::ibv_get_async_event(ctx, &mut ev), -1, "nothing yet");
        assert_eq!(*libc::__errno_location(), libc::EAGAIN);
    }
    assert!(!readable(fd, 0), "async fd quiet while the device works");
    let out = topo
        .command(0, "ip")
        .args(["link", "del", &topo.host(0).ifname])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip link del: {out:?}");
    let r = readable(fd, 5000);
    assert!(r, "async fd readable once the interface is gone");
    // SAFETY: live context, a local event.
    unsafe {
        let mut ev = ffi::ibv_async_event::default();
        assert_eq!(misc::ibv_get_async_event(ctx, &mut ev), 0);
        assert_eq!(ev.event_type, ffi::IBV_EVENT_DEVICE_FATAL);
        assert_eq!(ev.element.port_num, 0);
        misc::ibv_ack_async_event(&mut ev);
        assert_eq!(misc::ibv_get_async_event(ctx, &mut ev), -1, "once");
        assert_eq!(*libc::__errno_location(), libc::EIO);
        // The completion channel too: readable, and its call fails with EIO.
        let ch = a.ch as *mut ffi::ibv_comp_channel;
        assert!(readable((*ch).fd, 1000), "channel fd readable");
        let (mut cq, mut cq_ctx) = (ptr::null_mut(), ptr::null_mut());
        assert_eq!(channel::ibv_get_cq_event(ch, &mut cq, &mut cq_ctx), -1);
        assert_eq!(*libc::__errno_location(), libc::EIO);
        // Tear-down still works on a dead device.
        qp::ibv_destroy_qp(a.qp as *mut ffi::ibv_qp);
        resources::ibv_dereg_mr(a.mr as *mut ffi::ibv_mr);
        resources::ibv_destroy_cq(a.cq as *mut ffi::ibv_cq);
        channel::ibv_destroy_comp_channel(a.ch as *mut ffi::ibv_comp_channel);
        resources::ibv_dealloc_pd(a.pd as *mut ffi::ibv_pd);
        assert_eq!(devices::ibv_close_device(ctx), 0);
    }
}

/// The port follows its interface, as an rxe port its netdev: `ip link set
/// down` makes the async fd readable with IBV_EVENT_PORT_ERR and
/// ibv_query_port says PORT_DOWN (phys_state Disabled); the peer's end going
/// down (no carrier) keeps ours up, phys_state Polling; back up, PORT_ACTIVE
/// and its event. Each event read leaves the fd quiet again.
#[test]
fn port_events_follow_the_link() {
    if !common::can_run("port_events_follow_the_link", &[]) {
        return;
    }
    let topo = common::topology("cport");
    let ifname = topo.host(0).ifname.clone();
    let peer_if = topo.host(1).ifname.clone();
    std::env::set_var("FERROCE_DEVICE", &ifname);
    std::env::set_var("FERROCE_BACKEND", common::backend());
    // SAFETY: the library's C entry points, called as a C program would.
    let a = topo
        .run_in(0, || unsafe { open_side(false, false) })
        .unwrap();
    let ctx = a.ctx as *mut ffi::ibv_context;
    // SAFETY: live context.
    let fd = unsafe { (*ctx).async_fd };
    let port = || {
        // The old entry point fills the fields of ibv_port_attr before `flags`.
        let mut attr = ffi::ibv_port_attr::default();
        let compat = (&mut attr as *mut ffi::ibv_port_attr).cast::<ffi::_compat_ibv_port_attr>();
        // SAFETY: live context; a local with room for what it writes.
        assert_eq!(unsafe { devices::ibv_query_port(ctx, 1, compat) }, 0);
        (attr.state, attr.phys_state)
    };
    let take_event = |want: ffi::ibv_event_type, what: &str, last: bool| {
        assert!(readable(fd, 3000), "async fd readable: {what}");
        let mut ev = ffi::ibv_async_event::default();
        // SAFETY: live context, a local event.
        assert_eq!(
            unsafe { misc::ibv_get_async_event(ctx, &mut ev) },
            0,
            "{what}"
        );
        assert_eq!(ev.event_type, want, "{what}");
        // SAFETY: the union's port arm, which port events fill.
        assert_eq!(unsafe { ev.element.port_num }, 1, "{what}");
        misc::ibv_ack_async_event(&mut ev);
        if last {
            assert!(!readable(fd, 0), "async fd quiet once taken: {what}");
        }
    };
    let next_event = |want: ffi::ibv_event_type, what: &str| take_event(want, what, true);
    let ip = |host: usize, args: &[&str]| {
        let out = topo.command(host, "ip").args(args).output().unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    };
    assert_eq!(port(), (ffi::IBV_PORT_ACTIVE, 5));
    assert!(!readable(fd, 300), "no event while the link stays up");
    ip(0, &["link", "set", &ifname, "down"]);
    next_event(ffi::IBV_EVENT_PORT_ERR, "our end down");
    assert_eq!(port(), (ffi::IBV_PORT_DOWN, 3), "down: Disabled");
    ip(0, &["link", "set", &ifname, "up"]);
    next_event(ffi::IBV_EVENT_PORT_ACTIVE, "our end up again");
    assert_eq!(port(), (ffi::IBV_PORT_ACTIVE, 5));
    ip(1, &["link", "set", &peer_if, "down"]);
    next_event(ffi::IBV_EVENT_PORT_ERR, "the peer's end down");
    assert_eq!(port(), (ffi::IBV_PORT_DOWN, 2), "no carrier: Polling");
    ip(1, &["link", "set", &peer_if, "up"]);
    next_event(ffi::IBV_EVENT_PORT_ACTIVE, "the peer's end up again");
    // Down and up again within one look at the link (every 100 ms): both events, as rxe's
    // netdev notifier gives them.
    let flap = format!("ip link set {ifname} down && ip link set {ifname} up");
    let out = topo.command(0, "sh").args(["-c", &flap]).output().unwrap();
    assert!(out.status.success(), "{flap}: {out:?}");
    // (The up may come with the down or at the next look.)
    take_event(ffi::IBV_EVENT_PORT_ERR, "a flap's down", false);
    next_event(ffi::IBV_EVENT_PORT_ACTIVE, "a flap's up");
    assert_eq!(port(), (ffi::IBV_PORT_ACTIVE, 5));
    // SAFETY: live objects, destroyed once.
    unsafe {
        qp::ibv_destroy_qp(a.qp as *mut ffi::ibv_qp);
        resources::ibv_dereg_mr(a.mr as *mut ffi::ibv_mr);
        resources::ibv_destroy_cq(a.cq as *mut ffi::ibv_cq);
        channel::ibv_destroy_comp_channel(a.ch as *mut ffi::ibv_comp_channel);
        resources::ibv_dealloc_pd(a.pd as *mut ffi::ibv_pd);
        assert_eq!(devices::ibv_close_device(ctx), 0);
    }
}
