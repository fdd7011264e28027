//! End to end through the verbs API over the in-memory switch: two devices,
//! every work-request kind, both engine modes.

use std::net::Ipv6Addr;
use std::time::Duration;

use ferroce_verbs::{
    AccessFlags, ConnectOptions, Context, EngineMode, OpenOptions, QpType, QueuePair, RecvWr,
    RemoteQp, SendOp, SendWr, WcOpcode, WcStatus,
};

const T: Duration = Duration::from_secs(10);

fn pair(mode: EngineMode) -> (Context, Context) {
    pair_modes(mode, EngineMode::Thread)
}

/// Device a runs in `mode_a`; b in `mode_b`. (Two polling devices in one
/// thread would only progress the one being polled.)
fn pair_modes(mode_a: EngineMode, mode_b: EngineMode) -> (Context, Context) {
    let (a, b) = ferroce_nic::mem::pair().unwrap();
    let ga: Ipv6Addr = "::ffff:198.18.0.1".parse().unwrap();
    let gb: Ipv6Addr = "::ffff:198.18.0.2".parse().unwrap();
    let oa = OpenOptions {
        mode: mode_a,
        ..Default::default()
    };
    let ob = OpenOptions {
        mode: mode_b,
        ..Default::default()
    };
    (
        Context::with_io(Box::new(a), "mem0", vec![ga], 1, oa).unwrap(),
        Context::with_io(Box::new(b), "mem1", vec![gb], 2, ob).unwrap(),
    )
}

/// Connects `qa` (PSN 1) and `qb` (PSN 2), each with `opts(its PSN)`.
fn connect_pair(
    (ca, qa): (&Context, &QueuePair<'_>),
    (cb, qb): (&Context, &QueuePair<'_>),
    opts: impl Fn(u32) -> ConnectOptions,
) {
    qa.to_init(&opts(1)).unwrap();
    qb.to_init(&opts(2)).unwrap();
    let remote = |qpn, psn, ctx: &Context| RemoteQp {
        qpn,
        psn,
        gid: ctx.query_gid(0).unwrap(),
    };
    qa.connect(ca, &remote(qb.qpn(), 2, cb), &opts(1)).unwrap();
    qb.connect(cb, &remote(qa.qpn(), 1, ca), &opts(2)).unwrap();
}

fn all_access() -> AccessFlags {
    ConnectOptions::default().access
}

fn rc_round_trip(mode: EngineMode, qp_type: QpType) {
    let (ca, cb) = pair(mode);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(256).unwrap(), cb.create_cq(256).unwrap());
    let qa = pa.create_qp().qp_type(qp_type).build(&cqa, &cqa).unwrap();
    let qb = pb.create_qp().qp_type(qp_type).build(&cqb, &cqb).unwrap();
    let ma = pa.reg_mr(1 << 20, all_access()).unwrap();
    let mb = pb.reg_mr(1 << 20, all_access()).unwrap();
    let opts_a = ConnectOptions {
        local_psn: 100,
        path_mtu: 1024,
        ..Default::default()
    };
    let opts_b = ConnectOptions {
        local_psn: 200,
        path_mtu: 1024,
        ..Default::default()
    };
    qa.to_init(&opts_a).unwrap();
    qb.to_init(&opts_b).unwrap();
    qa.connect(
        &ca,
        &RemoteQp {
            qpn: qb.qpn(),
            psn: 200,
            gid: cb.query_gid(0).unwrap(),
        },
        &opts_a,
    )
    .unwrap();
    qb.connect(
        &cb,
        &RemoteQp {
            qpn: qa.qpn(),
            psn: 100,
            gid: ca.query_gid(0).unwrap(),
        },
        &opts_b,
    )
    .unwrap();

    // SEND of 5000 bytes (multi-MTU) into a posted receive.
    let msg: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    ma.write(0, &msg).unwrap();
    let rsge = [mb.sge(0, 8192)];
    qb.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &rsge,
    }])
    .unwrap();
    let ssge = [ma.sge(0, 5000)];
    let mut wr = SendWr::new(1, SendOp::SendWithImm { imm: 0xabcd }, &ssge);
    wr.flags.signaled = true;
    qa.post_send(&[wr]).unwrap();
    let wc = cqb.poll_n(1, T).unwrap()[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm_data),
        (7, WcStatus::Success, 5000, Some(0xabcd))
    );
    assert_eq!(wc.opcode, WcOpcode::Recv);
    let wc = cqa.poll_n(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    let mut got = vec![0u8; 5000];
    mb.read(0, &mut got).unwrap();
    assert_eq!(got, msg);

    // RDMA WRITE 64 KiB into b at offset 100000.
    let data: Vec<u8> = (0..65536u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    ma.write(8192, &data).unwrap();
    let sge = [ma.sge(8192, 65536)];
    let mut wr = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: mb.addr() + 100_000,
            rkey: mb.rkey(),
        },
        &sge,
    );
    wr.flags.signaled = true;
    qa.post_send(&[wr]).unwrap();
    let wc = cqa.poll_n(1, T).unwrap()[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    if qp_type == QpType::Uc {
        // No ACK on UC: the write completes when sent; give it time to land.
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut got = vec![0u8; 65536];
    mb.read(100_000, &mut got).unwrap();
    assert_eq!(got, data);

    if qp_type == QpType::Rc {
        // RDMA READ it back into a at offset 200000.
        let sge = [ma.sge(200_000, 65536)];
        let mut wr = SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: mb.addr() + 100_000,
                rkey: mb.rkey(),
            },
            &sge,
        );
        wr.flags.signaled = true;
        qa.post_send(&[wr]).unwrap();
        let wc = cqa.poll_n(1, T).unwrap()[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (3, WcStatus::Success, WcOpcode::RdmaRead, 65536)
        );
        let mut got = vec![0u8; 65536];
        ma.read(200_000, &mut got).unwrap();
        assert_eq!(got, data);

        // Atomics on an 8-byte word of b.
        mb.write(512, &5u64.to_ne_bytes()).unwrap();
        let sge = [ma.sge(600, 8)];
        let mut wr = SendWr::new(
            4,
            SendOp::AtomicFetchAdd {
                remote_addr: mb.addr() + 512,
                rkey: mb.rkey(),
                add: 10,
            },
            &sge,
        );
        wr.flags.signaled = true;
        qa.post_send(&[wr]).unwrap();
        assert_eq!(cqa.poll_n(1, T).unwrap()[0].status, WcStatus::Success);
        let mut w = [0u8; 8];
        ma.read(600, &mut w).unwrap();
        assert_eq!(u64::from_ne_bytes(w), 5);
        mb.read(512, &mut w).unwrap();
        assert_eq!(u64::from_ne_bytes(w), 15);
        let mut wr = SendWr::new(
            5,
            SendOp::AtomicCmpSwp {
                remote_addr: mb.addr() + 512,
                rkey: mb.rkey(),
                compare: 15,
                swap: 99,
            },
            &sge,
        );
        wr.flags.signaled = true;
        qa.post_send(&[wr]).unwrap();
        assert_eq!(cqa.poll_n(1, T).unwrap()[0].status, WcStatus::Success);
        mb.read(512, &mut w).unwrap();
        assert_eq!(u64::from_ne_bytes(w), 99);

        // A WRITE with a wrong rkey: REM_ACCESS_ERR at the requester.
        let sge = [ma.sge(0, 16)];
        let mut wr = SendWr::new(
            6,
            SendOp::RdmaWrite {
                remote_addr: mb.addr(),
                rkey: mb.rkey() ^ 0x5a5a_0000,
            },
            &sge,
        );
        wr.flags.signaled = true;
        qa.post_send(&[wr]).unwrap();
        assert_eq!(cqa.poll_n(1, T).unwrap()[0].status, WcStatus::RemAccessErr);
    }
}

#[test]
fn rc_every_operation_thread_engine() {
    rc_round_trip(EngineMode::Thread, QpType::Rc);
}

#[test]
fn rc_every_operation_polling_engine() {
    rc_round_trip(EngineMode::Polling, QpType::Rc);
}

#[test]
fn uc_send_and_write() {
    rc_round_trip(EngineMode::Thread, QpType::Uc);
}

#[test]
fn ud_send() {
    let (ca, cb) = pair(EngineMode::Thread);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(16).unwrap(), cb.create_cq(16).unwrap());
    let qa = pa
        .create_qp()
        .qp_type(QpType::Ud)
        .build(&cqa, &cqa)
        .unwrap();
    let qb = pb
        .create_qp()
        .qp_type(QpType::Ud)
        .build(&cqb, &cqb)
        .unwrap();
    let opts = ConnectOptions::default();
    for (q, c) in [(&qa, &ca), (&qb, &cb)] {
        q.to_init(&opts).unwrap();
        q.connect(
            c,
            &RemoteQp {
                qpn: 0,
                psn: 0,
                gid: c.query_gid(0).unwrap(),
            },
            &opts,
        )
        .unwrap();
    }
    let ma = pa.reg_mr(4096, all_access()).unwrap();
    let mb = pb.reg_mr(4096, all_access()).unwrap();
    ma.write(0, b"hello over UD").unwrap();
    let rsge = [mb.sge(0, 40 + 1024)];
    qb.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &rsge,
    }])
    .unwrap();
    let sge = [ma.sge(0, 13)];
    let mut wr = SendWr::new(1, SendOp::Send, &sge);
    wr.flags.signaled = true;
    wr.ud = Some(ferroce_verbs::UdDest {
        path: ca.resolve_path(0, cb.query_gid(0).unwrap()).unwrap(),
        remote_qpn: qb.qpn(),
        remote_qkey: opts.qkey,
    });
    qa.post_send(&[wr]).unwrap();
    let wc = cqb.poll_n(1, T).unwrap()[0];
    assert_eq!(
        (wc.status, wc.byte_len, wc.src_qp),
        (WcStatus::Success, 40 + 13, qa.qpn())
    );
    let mut got = [0u8; 13];
    mb.read(40, &mut got).unwrap();
    assert_eq!(&got, b"hello over UD");
}

/// `perf::write_lat` between two ferroce ends, as `bench write --lat` runs it: one side writes
/// first (ib_write_lat's server), each polls the last byte of its receive half.
#[test]
fn write_latency_ping_pong() {
    use ferroce_verbs::perf::{self, PerfOp, PerfParams, RemoteBuf};
    let (ca, cb) = pair(EngineMode::Thread);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(256).unwrap(), cb.create_cq(256).unwrap());
    let qa = pa.create_qp().build(&cqa, &cqa).unwrap();
    let qb = pb.create_qp().build(&cqb, &cqb).unwrap();
    let half = 4096u64;
    let ma = pa.reg_mr(2 * half as usize, all_access()).unwrap();
    let mb = pb.reg_mr(2 * half as usize, all_access()).unwrap();
    let opts = ConnectOptions::default();
    qa.to_init(&opts).unwrap();
    qb.to_init(&opts).unwrap();
    let remote = |c: &Context, qpn| RemoteQp {
        qpn,
        psn: 0,
        gid: c.query_gid(0).unwrap(),
    };
    qa.connect(&ca, &remote(&cb, qb.qpn()), &opts).unwrap();
    qb.connect(&cb, &remote(&ca, qa.qpn()), &opts).unwrap();
    // 300 iterations: the iteration byte wraps past 255.
    let p = PerfParams::new(PerfOp::Write, 64, 300);
    let to = |m: &ferroce_verbs::MemoryRegion<'_>| RemoteBuf {
        addr: m.addr() + half,
        rkey: m.rkey(),
        len: half,
        ud: None,
    };
    let (ra, rb) = (to(&mb), to(&ma));
    std::thread::scope(|s| {
        let h = s.spawn(|| perf::write_lat(&qb, &cqb, &mb, &rb, &p, false, half));
        let a = perf::write_lat(&qa, &cqa, &ma, &ra, &p, true, half).unwrap();
        let b = h.join().unwrap().unwrap();
        assert_eq!(a.iters, 300);
        // perftest's n − 1 each: the starter's first write, and the other
        // side's wait for it, are not round trips.
        assert_eq!(b.lat_us.len(), 299);
        assert_eq!(
            a.lat_us.len(),
            299,
            "the starter's first write is not a sample"
        );
    });
}

/// A polling-mode application that stays out of the library (computing)
/// longer than its peer's whole retry budget still answers: its keeper
/// thread steps the device, so the peer's WRITE and READ complete instead of
/// failing with RETRY_EXC_ERR. (Without the keeper the ACK would wait for the
/// application's next poll, 300 ms away, against a budget of ~13 ms.)
#[test]
fn a_quiet_polling_peer_still_acks() {
    let (ca, cb) = pair_modes(EngineMode::Thread, EngineMode::Polling);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(16).unwrap(), cb.create_cq(16).unwrap());
    let qa = pa.create_qp().build(&cqa, &cqa).unwrap();
    let qb = pb.create_qp().build(&cqb, &cqb).unwrap();
    let ma = pa.reg_mr(1 << 16, all_access()).unwrap();
    let mb = pb.reg_mr(1 << 16, all_access()).unwrap();
    // 4.096 µs × 2^10 ≈ 4.2 ms per try, 3 tries.
    let opts = |psn| ConnectOptions {
        local_psn: psn,
        path_mtu: 1024,
        timeout: 10,
        retry_cnt: 2,
        ..Default::default()
    };
    connect_pair((&ca, &qa), (&cb, &qb), opts);

    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 13) as u8).collect();
    ma.write(0, &data).unwrap();
    let sge = [ma.sge(0, 20_000)];
    let mut wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &sge,
    );
    wr.flags.signaled = true;
    qa.post_send(&[wr]).unwrap();
    let rsge = [ma.sge(30_000, 20_000)];
    let mut rd = SendWr::new(
        2,
        SendOp::RdmaRead {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &rsge,
    );
    rd.flags.signaled = true;
    qa.post_send(&[rd]).unwrap();
    // b's application never calls into the library while a waits.
    let wcs = cqa.poll_n(2, T).unwrap();
    for (wc, id) in wcs.iter().zip([1, 2]) {
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    let mut got = vec![0u8; 20_000];
    ma.read(30_000, &mut got).unwrap();
    assert_eq!(got, data);
    drop(cqb);
}

/// Polling mode: the step that completes a receive leaves the ACK for it
/// unsent, so the application's answer and that ACK leave together at its
/// `post_send` (a ping-pong's critical path then has one send call per hop,
/// not two). Checked only where no keeper step can have run in between
/// (the keeper steps after 5 ms without one); the exchange itself must
/// complete either way.
#[test]
fn polling_mode_sends_the_ack_with_the_answer() {
    let (ca, cb) = pair_modes(EngineMode::Thread, EngineMode::Polling);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(16).unwrap(), cb.create_cq(16).unwrap());
    let qa = pa.create_qp().build(&cqa, &cqa).unwrap();
    let qb = pb.create_qp().build(&cqb, &cqb).unwrap();
    let ma = pa.reg_mr(4096, all_access()).unwrap();
    let mb = pb.reg_mr(4096, all_access()).unwrap();
    let opts = |psn| ConnectOptions {
        local_psn: psn,
        path_mtu: 1024,
        ..Default::default()
    };
    connect_pair((&ca, &qa), (&cb, &qb), opts);
    let (sa, sb) = ([ma.sge(0, 8)], [mb.sge(0, 8)]);
    let (ra, rb) = ([ma.sge(64, 8)], [mb.sge(64, 8)]);
    let mut conclusive = 0;
    for i in 0..20u64 {
        qa.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &ra,
        }])
        .unwrap();
        qb.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &rb,
        }])
        .unwrap();
        let before = cb.stats().io.tx_frames;
        let mut ping = SendWr::new(i, SendOp::Send, &sa);
        ping.flags.signaled = true;
        qa.post_send(&[ping]).unwrap();
        let wc = cqb.poll_n(1, T).unwrap()[0];
        let seen = std::time::Instant::now();
        assert_eq!((wc.opcode, wc.status), (WcOpcode::Recv, WcStatus::Success));
        let after_recv = cb.stats().io.tx_frames;
        if seen.elapsed() < Duration::from_millis(2) {
            conclusive += 1;
            assert_eq!(
                after_recv, before,
                "round {i}: the ACK left before the answer"
            );
        }
        let mut pong = SendWr::new(i, SendOp::Send, &sb);
        pong.flags.signaled = true;
        qb.post_send(&[pong]).unwrap();
        assert_eq!(
            cb.stats().io.tx_frames,
            before + 2,
            "round {i}: the answer and the ACK"
        );
        // a: its ping acknowledged, the pong received; b: the pong acknowledged.
        let wcs = cqa.poll_n(2, T).unwrap();
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        let wc = cqb.poll_n(1, T).unwrap()[0];
        assert_eq!((wc.opcode, wc.status), (WcOpcode::Send, WcStatus::Success));
    }
    assert!(conclusive > 0, "no round was free of keeper steps");
}

/// An engine that carries frames of at most 3840 bytes (AF_XDP on a kernel before 6.6: one
/// 4 KiB chunk less the XDP headroom) makes a port with active and max MTU 2048; a QP given
/// PATH_MTU 4096 is refused at once (as rxe refuses one above its max_mtu) instead of sending
/// frames the engine would drop, and one at 2048 moves a multi-packet WRITE.
#[test]
fn an_engine_that_carries_less_caps_the_port_mtu() {
    let cfg = ferroce_nic::mem::SwitchConfig {
        max_frame_len: 3840,
        ..Default::default()
    };
    let (a, b) = ferroce_nic::mem::pair_with(cfg).unwrap();
    let ga: Ipv6Addr = "::ffff:198.18.0.1".parse().unwrap();
    let gb: Ipv6Addr = "::ffff:198.18.0.2".parse().unwrap();
    let ca = Context::with_io(Box::new(a), "mem0", vec![ga], 1, OpenOptions::default()).unwrap();
    let cb = Context::with_io(Box::new(b), "mem1", vec![gb], 2, OpenOptions::default()).unwrap();
    let port = ca.query_port();
    assert_eq!((port.active_mtu, port.max_mtu), (2048, 2048));

    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(16).unwrap(), cb.create_cq(16).unwrap());
    let qa = pa.create_qp().build(&cqa, &cqa).unwrap();
    let qb = pb.create_qp().build(&cqb, &cqb).unwrap();
    let opts = |psn: u32, mtu: u32| ConnectOptions {
        local_psn: psn,
        path_mtu: mtu,
        ..ConnectOptions::default()
    };
    qa.to_init(&opts(1, 4096)).unwrap();
    let remote = RemoteQp {
        qpn: qb.qpn(),
        psn: 2,
        gid: gb,
    };
    let err = qa.connect(&ca, &remote, &opts(1, 4096)).unwrap_err();
    assert!(err.to_string().contains("PATH_MTU"), "{err}");
    qa.modify(
        &ferroce_verbs::QpAttr {
            qp_state: ferroce_verbs::QpState::Reset,
            ..Default::default()
        },
        ferroce_verbs::QpAttrMask::STATE,
    )
    .unwrap();
    connect_pair((&ca, &qa), (&cb, &qb), |psn| opts(psn, 2048));

    let ma = pa.reg_mr(20_000, all_access()).unwrap();
    let mb = pb.reg_mr(20_000, all_access()).unwrap();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
    ma.write(0, &data).unwrap();
    let sge = [ma.sge(0, 20_000)];
    let write = SendOp::RdmaWrite {
        remote_addr: mb.addr(),
        rkey: mb.rkey(),
    };
    let mut wr = SendWr::new(1, write, &sge);
    wr.flags.signaled = true;
    qa.post_send(&[wr]).unwrap();
    let wc = cqa.poll_n(1, T).unwrap()[0];
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = vec![0u8; 20_000];
    mb.read(0, &mut got).unwrap();
    assert_eq!(got, data);
}
