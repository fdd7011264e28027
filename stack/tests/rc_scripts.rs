//! Hand-scripted scenarios, one per rule of the transport (issue 3).

mod common;

use common::*;
use ferroce_stack::sim::{ConnectCfg, LinkConfig};
use ferroce_stack::transport::*;
use ferroce_stack::wire::aeth::Syndrome;
use ferroce_stack::wire::{OpKind, Opcode, PacketRepr};
use std::cell::RefCell;
use std::rc::Rc;

fn ok(wcs: &[WorkCompletion]) {
    for w in wcs {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
}

#[test]
fn rc_send_multi_packet_with_sges_and_imm() {
    let mut p = Pair::new(QpType::Rc);
    let data = pattern(1, 5000);
    p.write_mem(0, 0, &data);
    // Receive into three SGEs; send from two.
    let q = p.qp(1);
    let rs = [
        p.sge(1, 100, 1000),
        p.sge(1, 10_000, 3000),
        p.sge(1, 50_000, 2000),
    ];
    p.net.cores[1]
        .post_recv(
            q,
            &RecvWr {
                wr_id: 7,
                sg_list: &rs,
            },
        )
        .unwrap();
    p.post(
        0,
        1,
        SendOp::SendWithImm { imm: 0xdead_beef },
        &[p.sge(0, 0, 2500), p.sge(0, 2500, 2500)],
    )
    .unwrap();
    p.run();
    let s = p.scq(0);
    assert_eq!(s.len(), 1);
    ok(&s);
    assert_eq!(s[0].opcode, WcOpcode::Send);
    let r = p.rcq(1);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].wr_id, 7);
    assert_eq!(r[0].byte_len, 5000);
    assert_eq!(r[0].imm_data, Some(0xdead_beef));
    let mut got = p.read_mem(1, 100, 1000);
    got.extend(p.read_mem(1, 10_000, 3000));
    got.extend(p.read_mem(1, 50_000, 1000));
    assert_eq!(got, data);
}

#[test]
fn rc_write_write_imm_read_atomics() {
    let mut p = Pair::new(QpType::Rc);
    let data = pattern(2, 10_000);
    p.write_mem(0, 0, &data);
    let (va, rkey) = p.remote(1, 20_000);
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 10_000)],
    )
    .unwrap();
    p.post_recv(1, 9, 0, 0);
    p.post(
        0,
        2,
        SendOp::RdmaWriteWithImm {
            remote_addr: va + 10_000,
            rkey,
            imm: 5,
        },
        &[p.sge(0, 0, 3000)],
    )
    .unwrap();
    let (rva, _) = p.remote(1, 20_000);
    p.post(
        0,
        3,
        SendOp::RdmaRead {
            remote_addr: rva,
            rkey,
        },
        &[p.sge(0, 100_000, 10_000)],
    )
    .unwrap();
    p.write_mem(1, 512, &40u64.to_ne_bytes());
    let (ava, _) = p.remote(1, 512);
    p.post(
        0,
        4,
        SendOp::AtomicFetchAdd {
            remote_addr: ava,
            rkey,
            add: 2,
        },
        &[p.sge(0, 200_000, 8)],
    )
    .unwrap();
    p.post(
        0,
        5,
        SendOp::AtomicCmpSwp {
            remote_addr: ava,
            rkey,
            compare: 42,
            swap: 7,
        },
        &[p.sge(0, 200_008, 8)],
    )
    .unwrap();
    p.post(
        0,
        6,
        SendOp::AtomicCmpSwp {
            remote_addr: ava,
            rkey,
            compare: 42,
            swap: 9,
        },
        &[p.sge(0, 200_016, 8)],
    )
    .unwrap();
    p.run();
    let s = p.scq(0);
    ok(&s);
    assert_eq!(
        s.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert_eq!(s[2].opcode, WcOpcode::RdmaRead);
    assert_eq!(p.read_mem(1, 20_000, 10_000), data);
    assert_eq!(p.read_mem(1, 30_000, 3000), data[..3000]);
    assert_eq!(p.read_mem(0, 100_000, 10_000), data);
    let r = p.rcq(1);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].opcode, r[0].imm_data, r[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(5), 3000)
    );
    let orig = |p: &Pair, off| u64::from_ne_bytes(p.read_mem(0, off, 8).try_into().unwrap());
    assert_eq!(orig(&p, 200_000), 40);
    assert_eq!(orig(&p, 200_008), 42);
    assert_eq!(
        orig(&p, 200_016),
        7,
        "second CAS fails and returns the current value"
    );
    assert_eq!(
        u64::from_ne_bytes(p.read_mem(1, 512, 8).try_into().unwrap()),
        7
    );
}

#[test]
fn psn_wraps_around_2_pow_24() {
    let start = 0xff_fff0;
    let mut p = Pair::with(
        QpType::Rc,
        LinkConfig::perfect(),
        3,
        ConnectCfg::default(),
        1 << 20,
        1,
        (start, start + 3),
    );
    let data = pattern(3, 64 * 1024);
    p.write_mem(0, 0, &data);
    p.post_recv(1, 1, 0, 64 * 1024);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 64 * 1024)])
        .unwrap();
    let (va, rkey) = p.remote(0, 0);
    // Node 1 reads back across the wrap too.
    p.post(
        1,
        2,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &[p.sge(1, 200_000, 64 * 1024)],
    )
    .unwrap();
    p.run();
    ok(&p.scq(0));
    ok(&p.scq(1));
    assert_eq!(p.read_mem(1, 0, 64 * 1024), data);
    assert_eq!(p.read_mem(1, 200_000, 64 * 1024), data);
    let a = p.net.cores[0].query_qp(p.qp(0)).unwrap();
    assert!(a.sq_psn < start, "PSN wrapped: {:#x}", a.sq_psn);
}

/// Drop the frames `pick` selects, `times` times in all.
fn drop_matching(
    p: &mut Pair,
    times: usize,
    pick: impl Fn(usize, &PacketRepr) -> bool + 'static,
) -> Rc<RefCell<usize>> {
    let n = Rc::new(RefCell::new(0));
    let n2 = n.clone();
    p.net.drop_if = Some(Box::new(move |src, _dst, r| {
        if *n2.borrow() < times && pick(src, r) {
            *n2.borrow_mut() += 1;
            return true;
        }
        false
    }));
    n
}

#[test]
fn psn_sequence_nak_then_go_back_n() {
    let mut p = Pair::new(QpType::Rc);
    let data = pattern(4, 20 * 1024);
    p.write_mem(0, 0, &data);
    p.post_recv(1, 1, 0, 20 * 1024);
    // Lose the 3rd packet of the message: the 4th arrives out of sequence.
    let dropped = drop_matching(&mut p, 1, |src, r| src == 0 && r.bth.psn == 102);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 20 * 1024)])
        .unwrap();
    p.run();
    assert_eq!(*dropped.borrow(), 1);
    ok(&p.scq(0));
    assert_eq!(p.rcq(1).len(), 1);
    assert_eq!(p.read_mem(1, 0, 20 * 1024), data);
    assert_eq!(p.net.cores[1].stats().naks_sent, 1, "one NAK per gap");
    assert_eq!(p.net.cores[0].stats().naks_received, 1);
    assert!(p.net.cores[0].stats().retransmits >= 1);
    assert_eq!(
        p.net.cores[0].stats().timeouts,
        0,
        "NAK, not timeout, drove the retry"
    );
}

#[test]
fn local_ack_timeout_retransmits_lost_last_packet() {
    let mut p = Pair::new(QpType::Rc);
    p.post_recv(1, 1, 0, 100);
    drop_matching(&mut p, 1, |src, r| {
        src == 0 && r.bth.opcode == Opcode::RC_SEND_ONLY
    });
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 100)]).unwrap();
    p.run();
    ok(&p.scq(0));
    assert_eq!(p.rcq(1).len(), 1);
    assert_eq!(p.net.cores[0].stats().timeouts, 1);
    // 4.096 µs × 2^10 elapsed before the retry.
    assert!(p.net.now.as_nanos() >= 4096 << 10);
}

#[test]
fn duplicate_send_is_reacked_not_reexecuted() {
    let mut p = Pair::new(QpType::Rc);
    p.post_recv(1, 1, 0, 100);
    p.post_recv(1, 2, 100, 100);
    // Lose the ACK: the requester resends, the responder sees a duplicate.
    drop_matching(&mut p, 1, |src, r| {
        src == 1 && r.bth.opcode == Opcode::RC_ACKNOWLEDGE
    });
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 100)]).unwrap();
    p.run();
    ok(&p.scq(0));
    assert_eq!(p.rcq(1).len(), 1, "executed once");
    assert_eq!(p.net.cores[1].stats().duplicates, 1);
}

#[test]
fn retry_exhaustion_gives_retry_exc_err_and_flushes() {
    let cfg = ConnectCfg {
        retry_cnt: 2,
        ..ConnectCfg::default()
    };
    let mut p = Pair::with(
        QpType::Rc,
        LinkConfig::perfect(),
        5,
        cfg,
        1 << 20,
        1,
        (0, 0),
    );
    drop_matching(&mut p, usize::MAX, |src, _| src == 0);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 10)]).unwrap();
    p.post(0, 2, SendOp::Send, &[p.sge(0, 0, 10)]).unwrap();
    p.run();
    let s = p.scq(0);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        p.net.cores[0].stats().timeouts,
        3,
        "first try + 2 retries timed out"
    );
    assert_eq!(p.net.cores[0].qp_state(p.qp(0)), Some(QpState::Err));
    // Posting to a QP in ERR completes at once with a flush.
    p.post(0, 3, SendOp::Send, &[p.sge(0, 0, 10)]).unwrap();
    assert_eq!(p.scq(0)[0].status, WcStatus::WrFlushErr);
}

#[test]
fn rnr_nak_wait_then_success() {
    let mut p = Pair::new(QpType::Rc);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 10)]).unwrap();
    p.net.run_idle(std::time::Duration::from_micros(30));
    assert!(p.net.cores[1].stats().rnr_naks_sent >= 1);
    assert!(p.scq(0).is_empty());
    p.post_recv(1, 1, 0, 10);
    p.run();
    ok(&p.scq(0));
    assert_eq!(p.rcq(1).len(), 1);
    assert!(p.net.cores[0].stats().rnr_naks_received >= 1);
}

#[test]
fn rnr_retry_exhaustion() {
    let cfg = ConnectCfg {
        rnr_retry: 2,
        ..ConnectCfg::default()
    };
    let mut p = Pair::with(
        QpType::Rc,
        LinkConfig::perfect(),
        6,
        cfg,
        1 << 20,
        1,
        (0, 0),
    );
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 10)]).unwrap();
    p.run();
    let s = p.scq(0);
    assert_eq!(s[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(p.net.cores[1].stats().rnr_naks_sent, 3);
}

#[test]
fn remote_access_error_nak() {
    let mut p = Pair::new(QpType::Rc);
    let (va, rkey) = p.remote(1, 0);
    // Bad rkey, then a second WR that must be flushed.
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey: rkey ^ 0x55,
        },
        &[p.sge(0, 0, 10)],
    )
    .unwrap();
    p.post(
        0,
        2,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 10)],
    )
    .unwrap();
    p.run();
    let s = p.scq(0);
    assert_eq!(
        s.iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::RemAccessErr, WcStatus::WrFlushErr]
    );
    assert_eq!(
        p.net.cores[1].qp_state(p.qp(1)),
        Some(QpState::Err),
        "responder QP to ERR"
    );
    assert_eq!(p.net.cores[0].qp_state(p.qp(0)), Some(QpState::Err));
}

/// C9-88 (as rxe's check_rkey): a zero-length WRITE or READ touches no
/// memory, so its rkey and address are not checked; one byte is.
#[test]
fn zero_length_write_and_read_skip_the_rkey_check() {
    let mut p = Pair::new(QpType::Rc);
    let (va, rkey) = p.remote(1, 0);
    let bad = rkey ^ 0x55;
    let write = SendOp::RdmaWrite {
        remote_addr: 0,
        rkey: bad,
    };
    let read = SendOp::RdmaRead {
        remote_addr: 0,
        rkey: bad,
    };
    let write_imm = SendOp::RdmaWriteWithImm {
        remote_addr: 0,
        rkey: bad,
        imm: 7,
    };
    p.post(0, 1, write, &[]).unwrap();
    p.post(0, 2, read, &[]).unwrap();
    p.post_recv(1, 9, 0, 0);
    p.post(0, 3, write_imm, &[]).unwrap();
    p.run();
    assert_eq!(
        p.scq(0).iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::Success; 3]
    );
    let r = p.rcq(1);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].status, r[0].imm_data, r[0].byte_len),
        (WcStatus::Success, Some(7), 0)
    );
    assert_eq!(p.net.cores[1].qp_state(p.qp(1)), Some(QpState::Rts));
    for op in [
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey: bad,
        },
        SendOp::RdmaRead {
            remote_addr: va,
            rkey: bad,
        },
    ] {
        let mut p = Pair::new(QpType::Rc);
        p.post(0, 3, op, &[p.sge(0, 0, 1)]).unwrap();
        p.run();
        assert_eq!(p.scq(0)[0].status, WcStatus::RemAccessErr);
    }
}

#[test]
fn remote_access_bounds_overflow_and_read_permission() {
    for (i, op) in [
        // Past the end of the region.
        SendOp::RdmaRead {
            remote_addr: IOVA + (1 << 20) - 4,
            rkey: 0,
        },
        // va + len wraps around.
        SendOp::RdmaRead {
            remote_addr: u64::MAX - 2,
            rkey: 0,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = Pair::new(QpType::Rc);
        let rkey = p.nodes[1].rkey;
        let op = match op {
            SendOp::RdmaRead { remote_addr, .. } => SendOp::RdmaRead { remote_addr, rkey },
            o => o,
        };
        p.post(0, i as u64, op, &[p.sge(0, 0, 10)]).unwrap();
        p.run();
        assert_eq!(p.scq(0)[0].status, WcStatus::RemAccessErr);
    }
    // A region without REMOTE_READ.
    let mut p = Pair::new(QpType::Rc);
    let c = &mut p.net.cores[1];
    let (_, rk) = c
        .reg_mr(
            p.nodes[1].pd,
            0x5000,
            AccessFlags::LOCAL_WRITE,
            Box::new(VecRegion::zeroed(64)),
        )
        .unwrap();
    p.post(
        0,
        1,
        SendOp::RdmaRead {
            remote_addr: 0x5000,
            rkey: rk,
        },
        &[p.sge(0, 0, 8)],
    )
    .unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn dereg_invalidates_rkey_at_once() {
    let mut p = Pair::new(QpType::Rc);
    let (va, rkey) = p.remote(1, 0);
    p.net.cores[1].dereg_mr(p.nodes[1].lkey).unwrap();
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 10)],
    )
    .unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn misaligned_atomic_is_invalid_request() {
    let mut p = Pair::new(QpType::Rc);
    let (va, rkey) = p.remote(1, 4);
    p.post(
        0,
        1,
        SendOp::AtomicFetchAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
        &[p.sge(0, 0, 8)],
    )
    .unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn invalid_request_when_qp_lacks_remote_write() {
    let cfg = ConnectCfg {
        access: AccessFlags::LOCAL_WRITE,
        ..ConnectCfg::default()
    };
    let mut p = Pair::with(
        QpType::Rc,
        LinkConfig::perfect(),
        7,
        cfg,
        1 << 20,
        1,
        (0, 0),
    );
    let (va, rkey) = p.remote(1, 0);
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 10)],
    )
    .unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn send_longer_than_receive_is_loc_len_err_and_invalid_request() {
    let mut p = Pair::new(QpType::Rc);
    p.post_recv(1, 1, 0, 10);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 11)]).unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::RemInvReqErr);
    let r = p.rcq(1);
    assert_eq!(r[0].status, WcStatus::LocLenErr);
}

#[test]
fn bad_receive_lkey_is_remote_operational_error() {
    let mut p = Pair::new(QpType::Rc);
    let q = p.qp(1);
    let s = [Sge {
        addr: IOVA,
        length: 100,
        lkey: 0xdead_0000,
    }];
    p.net.cores[1]
        .post_recv(
            q,
            &RecvWr {
                wr_id: 1,
                sg_list: &s,
            },
        )
        .unwrap();
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 10)]).unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::RemOpErr);
    assert_eq!(p.rcq(1)[0].status, WcStatus::LocProtErr);
}

#[test]
fn bad_local_lkey_is_loc_prot_err() {
    let mut p = Pair::new(QpType::Rc);
    p.post(
        0,
        1,
        SendOp::Send,
        &[Sge {
            addr: IOVA,
            length: 10,
            lkey: 0x1234,
        }],
    )
    .unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::LocProtErr);
    assert_eq!(p.net.cores[0].qp_state(p.qp(0)), Some(QpState::Err));
}

#[test]
fn duplicate_read_is_replayed_partially() {
    let mut p = Pair::new(QpType::Rc);
    let data = pattern(8, 8 * 1024);
    p.write_mem(1, 0, &data);
    let (va, rkey) = p.remote(1, 0);
    // Lose the 4th response packet: the requester re-reads from there.
    drop_matching(&mut p, 1, |src, r| {
        src == 1 && r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE && r.bth.psn == 103
    });
    p.post(
        0,
        1,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 8 * 1024)],
    )
    .unwrap();
    p.run();
    ok(&p.scq(0));
    assert_eq!(p.read_mem(0, 0, 8 * 1024), data);
    assert_eq!(
        p.net.cores[1].stats().duplicates,
        1,
        "re-read served from the responder resource"
    );
}

#[test]
fn duplicate_atomic_returns_saved_result_and_runs_once() {
    let mut p = Pair::new(QpType::Rc);
    p.write_mem(1, 64, &10u64.to_ne_bytes());
    let (va, rkey) = p.remote(1, 64);
    drop_matching(&mut p, 1, |src, r| {
        src == 1 && r.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE
    });
    p.post(
        0,
        1,
        SendOp::AtomicFetchAdd {
            remote_addr: va,
            rkey,
            add: 5,
        },
        &[p.sge(0, 0, 8)],
    )
    .unwrap();
    p.run();
    ok(&p.scq(0));
    assert_eq!(
        u64::from_ne_bytes(p.read_mem(0, 0, 8).try_into().unwrap()),
        10
    );
    assert_eq!(
        u64::from_ne_bytes(p.read_mem(1, 64, 8).try_into().unwrap()),
        15,
        "added once"
    );
    assert_eq!(p.net.cores[1].stats().duplicates, 1);
}

/// Records which opcodes each node sent, in order.
/// What [`trace`] records: (sending node, opcode, PSN) per frame.
type Trace = Rc<RefCell<Vec<(usize, Opcode, u32)>>>;

fn trace(p: &mut Pair) -> Trace {
    let log = Rc::new(RefCell::new(Vec::new()));
    let l2 = log.clone();
    p.net.drop_if = Some(Box::new(move |src, _, r| {
        l2.borrow_mut().push((src, r.bth.opcode, r.bth.psn));
        false
    }));
    log
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let cfg = ConnectCfg {
        max_rd_atomic: 1,
        ..ConnectCfg::default()
    };
    let mut p = Pair::with(
        QpType::Rc,
        LinkConfig::perfect(),
        9,
        cfg,
        1 << 20,
        1,
        (0, 0),
    );
    let log = trace(&mut p);
    let (va, rkey) = p.remote(1, 0);
    for i in 0..4 {
        p.post(
            0,
            i,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[p.sge(0, i * 4096, 4096)],
        )
        .unwrap();
    }
    p.run();
    assert_eq!(p.scq(0).len(), 4);
    let mut outstanding = 0i32;
    for (src, op, _) in log.borrow().iter() {
        if *src == 0 && *op == Opcode::RC_RDMA_READ_REQUEST {
            outstanding += 1;
            assert!(outstanding <= 1, "more than max_rd_atomic READs in flight");
        }
        if *src == 1
            && matches!(
                *op,
                Opcode::RC_RDMA_READ_RESPONSE_LAST | Opcode::RC_RDMA_READ_RESPONSE_ONLY
            )
        {
            outstanding -= 1;
        }
    }
}

#[test]
fn fence_waits_for_earlier_read() {
    let mut p = Pair::new(QpType::Rc);
    let log = trace(&mut p);
    let (va, rkey) = p.remote(1, 0);
    p.post_recv(1, 1, 0, 64);
    p.post(
        0,
        1,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 8192)],
    )
    .unwrap();
    let s = [p.sge(0, 0, 8)];
    let mut wr = SendWr::new(2, SendOp::Send, &s);
    wr.flags.fence = true;
    let q = p.qp(0);
    p.net.cores[0].post_send(q, &wr).unwrap();
    p.run();
    let l = log.borrow();
    let send_at = l
        .iter()
        .position(|(s, op, _)| *s == 0 && *op == Opcode::RC_SEND_ONLY)
        .unwrap();
    let last_resp = l
        .iter()
        .position(|(s, op, _)| *s == 1 && *op == Opcode::RC_RDMA_READ_RESPONSE_LAST)
        .unwrap();
    assert!(send_at > last_resp);
}

#[test]
fn unsignaled_wrs_complete_silently() {
    let mut p = Pair::new(QpType::Rc);
    for i in 0..5 {
        p.post_write(i, 0, 8, i == 4);
    }
    p.run();
    let c = p.scq(0);
    assert_eq!(c.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![4]);
}

#[test]
fn cq_overflow_raises_event() {
    let mut p = Pair::new(QpType::Rc);
    let c = &mut p.net.cores[1];
    let small = c.create_cq(2).unwrap();
    let pd = p.nodes[1].pd;
    let q = c
        .create_qp(pd, &init_attr(QpType::Rc, small, small))
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    c.modify_qp(
        q,
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    for i in 0..4 {
        let s = [Sge {
            addr: IOVA,
            length: 8,
            lkey: p.nodes[1].lkey,
        }];
        c.post_recv(
            q,
            &RecvWr {
                wr_id: i,
                sg_list: &s,
            },
        )
        .unwrap();
    }
    // Move to ERR: four flush completions into a CQ of two.
    let a = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    c.modify_qp(q, &a, QpAttrMask::STATE).unwrap();
    assert_eq!(c.poll_event(), Some(AsyncEvent::CqError { cq: small }));
    assert_eq!(c.cq_len(small), 2);
}

#[test]
fn srq_shared_by_two_qps_with_limit_event() {
    let mut p = Pair::with(
        QpType::Rc,
        LinkConfig::perfect(),
        10,
        ConnectCfg::default(),
        1 << 20,
        0,
        (0, 0),
    );
    let c = &mut p.net.cores[1];
    let pd = p.nodes[1].pd;
    let srq = c.create_srq(pd, 16, 2).unwrap();
    let mut qb = Vec::new();
    for _ in 0..2 {
        let mut ia = init_attr(QpType::Rc, p.nodes[1].scq, p.nodes[1].rcq);
        ia.srq = Some(srq);
        qb.push(c.create_qp(pd, &ia).unwrap());
    }
    for i in 0..4u64 {
        let s = [Sge {
            addr: IOVA + i * 100,
            length: 100,
            lkey: p.nodes[1].lkey,
        }];
        c.post_srq_recv(
            srq,
            &RecvWr {
                wr_id: i,
                sg_list: &s,
            },
        )
        .unwrap();
    }
    c.modify_srq(srq, 3).unwrap();
    let mut qa = Vec::new();
    for &b in &qb {
        let a = p.net.cores[0]
            .create_qp(
                p.nodes[0].pd,
                &init_attr(QpType::Rc, p.nodes[0].scq, p.nodes[0].rcq),
            )
            .unwrap();
        ferroce_stack::sim::connect(
            &mut p.net,
            0,
            a,
            1,
            b,
            QpType::Rc,
            &ConnectCfg::default(),
            0,
            0,
        )
        .unwrap();
        qa.push(a);
    }
    let s = [Sge {
        addr: IOVA,
        length: 50,
        lkey: p.nodes[0].lkey,
    }];
    p.net.cores[0]
        .post_send(qa[0], &SendWr::new(1, SendOp::Send, &s))
        .unwrap();
    p.net.cores[0]
        .post_send(qa[1], &SendWr::new(2, SendOp::Send, &s))
        .unwrap();
    p.run();
    let r = p.rcq(1);
    assert_eq!(r.len(), 2);
    let mut qpns: Vec<u32> = r.iter().map(|w| w.qp_num).collect();
    qpns.sort();
    assert_eq!(qpns, qb);
    assert_eq!(
        p.net.cores[1].poll_event(),
        Some(AsyncEvent::SrqLimitReached { srq })
    );
}

#[test]
fn send_with_invalidate_kills_the_rkey() {
    let mut p = Pair::new(QpType::Rc);
    let rkey = p.nodes[1].rkey;
    p.post_recv(1, 1, 0, 16);
    p.post(
        0,
        1,
        SendOp::SendWithInv {
            invalidate_rkey: rkey,
        },
        &[p.sge(0, 0, 16)],
    )
    .unwrap();
    p.run();
    ok(&p.scq(0));
    let r = p.rcq(1);
    assert_eq!(r[0].invalidated_rkey, Some(rkey));
    let (va, _) = p.remote(1, 0);
    p.post(
        0,
        2,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 8)],
    )
    .unwrap();
    p.run();
    assert_eq!(p.scq(0)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn corrupted_frame_is_caught_by_icrc_and_recovered() {
    let mut link = LinkConfig::perfect();
    link.corrupt = 0.3;
    let mut p = Pair::with(
        QpType::Rc,
        link,
        11,
        ConnectCfg::default(),
        1 << 20,
        1,
        (0, 0),
    );
    let data = pattern(11, 30_000);
    p.write_mem(0, 0, &data);
    p.post_recv(1, 1, 0, 30_000);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 30_000)]).unwrap();
    p.run();
    ok(&p.scq(0));
    assert_eq!(p.read_mem(1, 0, 30_000), data);
    let bad: u64 = (0..2)
        .map(|i| {
            let s = p.net.cores[i].stats();
            s.get("rx_icrc_err")
                + s.get("rx_ipv4_checksum")
                + s.get("rx_length_mismatch")
                + s.get("rx_not_udp")
                + s.get("rx_not_roce_port")
                + s.get("rx_ip_version")
                + s.get("rx_truncated")
                + s.get("rx_ipv4_fragment")
                + s.get("rx_not_ip")
                + s.get("rx_ipv4_options")
                + s.get("rx_udp_checksum")
                + s.get("rx_wrong_source")
                + s.get("rx_unknown_qp")
        })
        .sum();
    assert!(p.net.stats.corrupted > 0);
    assert!(bad > 0 && bad <= p.net.stats.corrupted);
}

#[test]
fn ipv6_path() {
    let mut net = ferroce_stack::sim::Network::new(2, LinkConfig::perfect(), 12);
    net.ipv6 = true;
    let mut p = Pair::new(QpType::Rc);
    // Rebuild on an IPv6 network.
    let mut nodes = Vec::new();
    for i in 0..2 {
        let c = &mut net.cores[i];
        let pd = c.alloc_pd();
        let cq = c.create_cq(64).unwrap();
        let (lkey, rkey) = c
            .reg_mr(
                pd,
                IOVA,
                AccessFlags::ALL,
                Box::new(VecRegion::zeroed(4096)),
            )
            .unwrap();
        let q = c.create_qp(pd, &init_attr(QpType::Rc, cq, cq)).unwrap();
        nodes.push(Node {
            pd,
            scq: cq,
            rcq: cq,
            lkey,
            rkey,
            qps: vec![q],
        });
    }
    ferroce_stack::sim::connect(
        &mut net,
        0,
        nodes[0].qps[0],
        1,
        nodes[1].qps[0],
        QpType::Rc,
        &ConnectCfg::default(),
        0,
        0,
    )
    .unwrap();
    p.net = net;
    p.nodes = nodes;
    p.post_recv(1, 1, 0, 100);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 100)]).unwrap();
    p.run();
    ok(&p.scq(0));
    assert_eq!(p.rcq(1).len(), 1);
}

#[test]
fn uc_gap_drops_rest_of_message_only() {
    let mut p = Pair::new(QpType::Uc);
    let d1 = pattern(13, 4096);
    let d2 = pattern(14, 4096);
    p.write_mem(0, 0, &d1);
    p.write_mem(0, 8192, &d2);
    p.post_recv(1, 1, 0, 4096);
    p.post_recv(1, 2, 8192, 4096);
    // Lose the 2nd packet of message 1 (PSN 101).
    drop_matching(&mut p, 1, |src, r| src == 0 && r.bth.psn == 101);
    p.post(0, 1, SendOp::Send, &[p.sge(0, 0, 4096)]).unwrap();
    p.post(0, 2, SendOp::Send, &[p.sge(0, 8192, 4096)]).unwrap();
    p.run();
    let s = p.scq(0);
    assert_eq!(s.len(), 2, "UC completes on send");
    let r = p.rcq(1);
    assert_eq!(r.len(), 1, "only the second message arrives");
    assert_eq!(
        r[0].wr_id, 1,
        "into the receive the broken message had taken"
    );
    assert_eq!(p.read_mem(1, 0, 4096), d2);
    assert!(p.net.cores[1].stats().get("rx_uc_dropped_rest_of_message") >= 2);
}

#[test]
fn uc_write() {
    let mut p = Pair::new(QpType::Uc);
    let d = pattern(15, 3000);
    p.write_mem(0, 0, &d);
    let (va, rkey) = p.remote(1, 100);
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 3000)],
    )
    .unwrap();
    p.run();
    assert_eq!(p.read_mem(1, 100, 3000), d);
    assert!(p
        .post(
            0,
            2,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey
            },
            &[p.sge(0, 0, 8)]
        )
        .is_err());
}

#[test]
fn ud_send_with_grh_qkey_and_mtu_limit() {
    let mut p = Pair::new(QpType::Ud);
    let d = pattern(16, 500);
    p.write_mem(0, 0, &d);
    p.post_recv(1, 1, 0, 1000);
    p.post_recv(1, 2, 1000, 1000);
    let dest = UdDest {
        path: p.net.path(0, 1),
        remote_qpn: p.qp(1),
        remote_qkey: 0x1111_1111,
    };
    let s = [p.sge(0, 0, 500)];
    let q = p.qp(0);
    let mut wr = SendWr::new(1, SendOp::SendWithImm { imm: 3 }, &s);
    wr.ud = Some(dest);
    p.net.cores[0].post_send(q, &wr).unwrap();
    // Wrong Q_Key: dropped.
    let mut bad = wr;
    bad.wr_id = 2;
    bad.ud = Some(UdDest {
        remote_qkey: 0x2222,
        ..dest
    });
    p.net.cores[0].post_send(q, &bad).unwrap();
    // Larger than the MTU: local length error.
    let big = [p.sge(0, 0, 2000)];
    let mut wr3 = SendWr::new(3, SendOp::Send, &big);
    wr3.ud = Some(dest);
    p.net.cores[0].post_send(q, &wr3).unwrap();
    p.run();
    let r = p.rcq(1);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].byte_len, r[0].src_qp, r[0].grh, r[0].imm_data),
        (540, p.qp(0), true, Some(3))
    );
    assert_eq!(p.read_mem(1, 40, 500), d);
    // IPv4: the header sits in the last 20 bytes of the GRH area.
    assert_eq!(p.read_mem(1, 20, 1)[0], 0x45);
    assert_eq!(p.net.cores[1].stats().get("rx_qkey_mismatch"), 1);
    let s = p.scq(0);
    assert_eq!(
        s.iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::Success, WcStatus::Success, WcStatus::LocLenErr]
    );
}

#[test]
fn sqd_drains_and_resumes() {
    let mut p = Pair::new(QpType::Rc);
    let q = p.qp(0);
    let a = QpAttr {
        qp_state: QpState::Sqd,
        ..QpAttr::default()
    };
    p.net.cores[0].modify_qp(q, &a, QpAttrMask::STATE).unwrap();
    let (va, rkey) = p.remote(1, 0);
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 8)],
    )
    .unwrap();
    p.run();
    assert!(p.scq(0).is_empty(), "SQD starts nothing new");
    let a = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    p.net.cores[0].modify_qp(q, &a, QpAttrMask::STATE).unwrap();
    p.run();
    ok(&p.scq(0));
}

#[test]
fn ack_coalescing_and_periodic_ack_req() {
    let mut p = Pair::new(QpType::Rc);
    let log = trace(&mut p);
    let (va, rkey) = p.remote(1, 0);
    // 200 packets in one WRITE: AckReq on every 64th and the last.
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[p.sge(0, 0, 200 * 1024)],
    )
    .unwrap();
    p.run();
    ok(&p.scq(0));
    let acks = log
        .borrow()
        .iter()
        .filter(|(s, op, _)| *s == 1 && *op == Opcode::RC_ACKNOWLEDGE)
        .count();
    assert!(acks <= 4, "{acks} ACKs for 200 packets");
    let _ = (Syndrome::Ack { credits: 0 }, OpKind::Send);
}

fn acks_from_responder(log: &Trace) -> usize {
    log.borrow()
        .iter()
        .filter(|(s, op, _)| *s == 1 && *op == Opcode::RC_ACKNOWLEDGE)
        .count()
}

#[test]
fn unsignaled_messages_ride_on_a_later_ack() {
    let mut p = Pair::new(QpType::Rc);
    let log = trace(&mut p);
    for i in 0..5 {
        p.post_write(i, 0, 8, false);
    }
    p.post_write(5, 0, 8, true);
    p.run();
    let c = p.scq(0);
    assert_eq!(c.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![5]);
    ok(&c);
    // One ACK for six messages: only the signaled one asked.
    assert_eq!(acks_from_responder(&log), 1);
    assert_eq!(p.net.cores[0].stats().timeouts, 0);

    // A QP allowed no retry cannot leave an ACK to the time-out: every message asks.
    let cfg = ConnectCfg {
        retry_cnt: 0,
        ..ConnectCfg::default()
    };
    let mut p = Pair::with_connect(QpType::Rc, cfg);
    let log = trace(&mut p);
    for i in 0..3 {
        p.post_write(i, 0, 8, false);
    }
    p.run();
    assert_eq!(acks_from_responder(&log), 3);
    assert_eq!(p.net.cores[0].qp_state(p.qp(0)), Some(QpState::Rts));
}

#[test]
fn an_unsignaled_message_asks_for_its_ack_before_the_timeout_would_resend_it() {
    // Pair's QPs: local ACK time-out 10 (4.096 µs × 2^10, ~4.2 ms).
    let quarter = timers::local_ack_timeout(10).unwrap() / 4;
    for (gap, asks) in [(quarter / 4, false), (quarter + quarter / 4, true)] {
        let mut p = Pair::new(QpType::Rc);
        let log = trace(&mut p);
        p.post_write(0, 0, 8, false);
        p.net.transmit();
        // Delivered; no ACK asked for, so none comes.
        while p.net.next_event().is_some_and(|t| t < p.net.now + gap) && p.net.step() {}
        assert_eq!(acks_from_responder(&log), 0);
        p.net.now = p.net.now.max(p.net.now + gap);
        p.post_write(1, 0, 8, false);
        // Out, delivered, and whatever the responder answers out too.
        p.net.transmit();
        p.net.step();
        p.net.transmit();
        let asked = acks_from_responder(&log) == 1;
        assert_eq!(asked, asks, "gap {gap:?}");
        // Either way both complete: the ACK asked for, or (asked too soon to
        // need it, then nothing more to send) the time-out's resend, which
        // the responder answers as a duplicate.
        p.run();
        assert!(p.scq(0).is_empty());
        let s = p.net.cores[0].stats();
        assert_eq!(s.timeouts, u64::from(!asks), "gap {gap:?}");
        assert_eq!(p.net.cores[0].qp_state(p.qp(0)), Some(QpState::Rts));
    }
}
