//! Responder ACK coalescing (`Config::ack_delay` / `ack_coalesce`): a
//! responder holds back the ACK of a SEND/WRITE so one ACK covers several,
//! and still acknowledges everything within the delay, before any NAK, and
//! under loss, duplication and reordering.

mod common;

use std::time::Duration;

use common::*;
use ferroce_stack::sim::{connect, ConnectCfg, LinkConfig, Network};
use ferroce_stack::transport::*;

const DELAY: Duration = Duration::from_micros(500);

/// Two nodes, one RC pair, responders coalescing `k` ACKs over `DELAY`.
fn pair(link: LinkConfig, seed: u64, k: u32) -> Pair {
    let mut net = Network::with_config(
        2,
        link,
        seed,
        Config {
            ack_delay: Some(DELAY),
            ack_coalesce: k,
            ..Config::default()
        },
    );
    let mut nodes = Vec::new();
    for c in &mut net.cores {
        let pd = c.alloc_pd();
        let scq = c.create_cq(1 << 12).unwrap();
        let rcq = c.create_cq(1 << 12).unwrap();
        let (lkey, rkey) = c
            .reg_mr(
                pd,
                IOVA,
                AccessFlags::ALL,
                Box::new(VecRegion::zeroed(1 << 20)),
            )
            .unwrap();
        let qps = vec![c.create_qp(pd, &init_attr(QpType::Rc, scq, rcq)).unwrap()];
        nodes.push(Node {
            pd,
            scq,
            rcq,
            lkey,
            rkey,
            qps,
        });
    }
    let (qa, qb) = (nodes[0].qps[0], nodes[1].qps[0]);
    // 4.096 µs × 2^10 ≈ 4.2 ms local ACK time-out: well above DELAY.
    connect(
        &mut net,
        0,
        qa,
        1,
        qb,
        QpType::Rc,
        &ConnectCfg::default(),
        100,
        5000,
    )
    .unwrap();
    Pair { net, nodes }
}

#[test]
fn one_ack_covers_k_writes() {
    let mut p = pair(LinkConfig::perfect(), 1, 4);
    let data = pattern(7, 8 * 64);
    p.write_mem(0, 0, &data);
    for i in 0..8u64 {
        p.post_write(i, i * 64, 64, true);
        // One at a time (one step: send and deliver it), so the responder
        // cannot fold them into one ACK without holding back.
        assert!(p.net.step());
    }
    p.run();
    let wcs = p.scq(0);
    assert_eq!(wcs.len(), 8, "{wcs:?}");
    assert!(wcs
        .iter()
        .enumerate()
        .all(|(i, w)| w.status == WcStatus::Success && w.wr_id == i as u64));
    assert_eq!(p.read_mem(1, 0, data.len()), data);
    let resp = p.net.cores[1].stats();
    // Eight ACK-requesting WRITEs, one ACK per four.
    assert_eq!(resp.tx_packets, 2, "{resp:?}");
    assert_eq!(resp.get("ack_deferred"), 6);
    assert_eq!(p.net.cores[0].stats().retransmits, 0);
}

#[test]
fn a_lone_held_back_ack_goes_out_after_the_delay() {
    let mut p = pair(LinkConfig::perfect(), 2, 4);
    p.write_mem(0, 0, b"hello");
    let t0 = p.net.now;
    p.post_write(9, 0, 5, true);
    while p.net.cores[0].cq_len(p.nodes[0].scq) == 0 {
        assert!(p.net.step(), "nothing left to do and no completion");
    }
    let took = p.net.now.saturating_duration_since(t0);
    assert!(took >= DELAY, "completed after {took:?}, before the delay");
    assert!(took < DELAY * 2, "completed after {took:?}");
    let wcs = p.scq(0);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(p.net.cores[1].stats().tx_packets, 1);
    assert_eq!(p.net.cores[0].stats().retransmits, 0);
    assert_eq!(p.read_mem(1, 0, 5), b"hello");
}

#[test]
fn a_nak_goes_out_after_the_held_back_ack() {
    // Drop the second WRITE's only packet: the third is out of sequence and
    // draws a PSN-sequence NAK, which must not overtake the ACK of the first.
    let mut p = pair(LinkConfig::perfect(), 3, 4);
    let mut seen = 0;
    p.net.drop_if = Some(Box::new(move |src, _dst, _pkt| {
        if src != 0 {
            return false;
        }
        seen += 1;
        seen == 2
    }));
    let data = pattern(3, 3 * 32);
    p.write_mem(0, 0, &data);
    for i in 0..3u64 {
        p.post_write(i, i * 32, 32, true);
    }
    p.run();
    let wcs = p.scq(0);
    assert_eq!(wcs.len(), 3, "{wcs:?}");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(p.read_mem(1, 0, data.len()), data);
    assert_eq!(p.net.cores[1].stats().naks_sent, 1);
    assert_eq!(p.net.cores[0].stats().naks_received, 1);
    // The NAK, not the local ACK time-out, brought the lost WRITE back.
    assert_eq!(p.net.cores[0].stats().timeouts, 0);
}

#[test]
fn sends_and_writes_all_arrive_over_a_lossy_link() {
    for seed in 0..8 {
        let mut p = pair(LinkConfig::lossy(), 100 + seed, 3);
        let n = 200u64;
        let data = pattern(seed, 4096);
        p.write_mem(0, 0, &data);
        for i in 0..n {
            p.post_recv(1, i, 0x8_0000 + (i % 64) * 4096, 4096);
        }
        let mut posted = 0;
        while posted < n || p.net.cores[0].cq_len(p.nodes[0].scq) < n as usize {
            // Keep up to 16 outstanding, mixing 1-packet and 4-packet
            // messages (path MTU 1024).
            while posted < n && posted < p.net.cores[0].cq_len(p.nodes[0].scq) as u64 + 16 {
                let len = if posted % 3 == 0 { 4000 } else { 100 };
                let s = [p.sge(0, 0, len)];
                let mut wr = if posted % 2 == 0 {
                    SendWr::new(posted, SendOp::Send, &s)
                } else {
                    let (remote_addr, rkey) = p.remote(1, 0x4_0000);
                    SendWr::new(posted, SendOp::RdmaWrite { remote_addr, rkey }, &s)
                };
                wr.flags.signaled = true;
                let q = p.qp(0);
                p.net.cores[0].post_send(q, &wr).unwrap();
                posted += 1;
            }
            assert!(p.net.step(), "seed {seed}: stalled after {posted} posted");
            assert!(
                p.net.now < ferroce_stack::transport::Instant::from_nanos(60_000_000_000),
                "seed {seed}: too slow"
            );
        }
        p.run();
        let wcs = p.scq(0);
        assert_eq!(wcs.len(), n as usize, "seed {seed}");
        for (i, w) in wcs.iter().enumerate() {
            assert_eq!(
                (w.wr_id, w.status),
                (i as u64, WcStatus::Success),
                "seed {seed}"
            );
        }
        let recvs = p.rcq(1);
        assert_eq!(recvs.len(), (n as usize).div_ceil(2), "seed {seed}");
        assert!(recvs.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(p.read_mem(1, 0x4_0000, 100), data[..100].to_vec());
        assert_eq!(p.net.cores[0].qp_state(p.qp(0)), Some(QpState::Rts));
    }
}

#[test]
fn off_by_default_every_write_is_acked_at_once() {
    let mut p = Pair::new(QpType::Rc);
    p.write_mem(0, 0, &pattern(1, 8 * 64));
    for i in 0..8u64 {
        p.post_write(i, i * 64, 64, true);
        assert!(p.net.step());
    }
    p.run();
    assert_eq!(p.scq(0).len(), 8);
    assert_eq!(p.net.cores[1].stats().tx_packets, 8);
    assert_eq!(p.net.cores[1].stats().get("ack_deferred"), 0);
}

#[test]
fn a_held_back_ack_never_lets_the_requester_window_fill() {
    // Path MTU 1024 (a 1500-byte Ethernet link): a 64 KiB WRITE is 64
    // packets and asks for one ACK, so four of them held back would cover
    // 256 PSNs, twice the 128 unacknowledged PSNs a requester (ours, rxe's)
    // sends before it waits. The responder must ACK before that window
    // fills instead of leaving the requester idle until the delay ends.
    let mut p = pair(LinkConfig::perfect(), 4, 4);
    let len = 64 << 10;
    let data = pattern(11, 4 * len);
    p.write_mem(0, 0, &data);
    let t0 = p.net.now;
    for i in 0..4u64 {
        p.post_write(i, i * len as u64, len as u32, true);
    }
    while p.net.cores[0].cq_len(p.nodes[0].scq) < 4 {
        assert!(p.net.step(), "nothing left to do and no completion");
    }
    let took = p.net.now.saturating_duration_since(t0);
    // 256 KiB at 0.125 ns/B is ~33 µs on the wire; one wait for the delay
    // would be 500 µs.
    assert!(
        took < DELAY,
        "4 × 64 KiB took {took:?}: the requester waited for a held-back ACK"
    );
    let wcs = p.scq(0);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(p.read_mem(1, 0, data.len()), data);
    assert_eq!(p.net.cores[0].stats().retransmits, 0);
}
