//! The requester's window of unacknowledged PSNs (`Config::max_unacked_psns`,
//! rxe's RXE_MAX_UNACKED_PSNS): it holds before every packet, inside a long
//! message too, and the packet that fills it asks for an ACK.

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use ferroce_stack::sim::{ConnectCfg, LinkConfig};
use ferroce_stack::transport::*;
use ferroce_stack::wire::Opcode;

const MIB: usize = 1 << 20;

/// One RC pair on a link slow enough that ACKs lag the data: 20 µs each way.
fn pair(window: u32, mem: usize) -> Pair {
    let link = LinkConfig {
        latency: Duration::from_micros(20),
        ..LinkConfig::perfect()
    };
    let core = Config {
        max_unacked_psns: window,
        ..Config::default()
    };
    Pair::with_core(
        QpType::Rc,
        link,
        1,
        ConnectCfg::default(),
        mem,
        1,
        (100, 5000),
        core,
    )
}

/// Watches the wire: the most PSNs node 0 had sent past the last one node 1
/// acknowledged, at any moment.
fn watch_outstanding(p: &mut Pair, first_psn: u32) -> Rc<Cell<u32>> {
    let most = Rc::new(Cell::new(0u32));
    let seen = most.clone();
    let mut acked_to = first_psn;
    p.net.drop_if = Some(Box::new(move |src, _dst, repr| {
        let psn = repr.bth.psn;
        if src == 0 {
            let next_psn = psn.wrapping_add(1) & 0xff_ffff;
            let out = next_psn.wrapping_sub(acked_to) & 0xff_ffff;
            seen.set(seen.get().max(out));
        } else if repr.bth.opcode == Opcode(0x11) {
            acked_to = psn.wrapping_add(1) & 0xff_ffff;
        }
        false
    }));
    most
}

#[test]
fn a_message_longer_than_the_window_keeps_to_it() {
    // Path MTU 1024: a 2 MiB WRITE is 2048 packets, four windows of 512.
    // Sent whole, it overran a TCG VM's receive queue (go-back-N sent each
    // packet ~3 times); rxe checks its window before every packet.
    let window = 512;
    let mut p = pair(window, 2 * MIB);
    let most = watch_outstanding(&mut p, 100);
    let data = pattern(3, 2 * MIB);
    p.write_mem(0, 0, &data);
    p.post_write(1, 0, (2 * MIB) as u32, true);
    p.run();
    let wcs = p.scq(0);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    assert_eq!(p.read_mem(1, 0, data.len()), data);
    assert!(
        most.get() <= window,
        "{} PSNs were out unacknowledged, the window is {window}",
        most.get()
    );
    assert!(
        most.get() > window / 2,
        "the window was never used: {}",
        most.get()
    );
    assert_eq!(p.net.cores[0].stats().retransmits, 0);
}

#[test]
fn a_window_off_the_ack_stride_asks_for_its_ack() {
    // A window of 48 is shorter than the 64 packets between AckReqs: unless
    // the packet that fills it asks for an ACK, the requester waits out its
    // ACK time-out (4.2 ms here) at every window.
    let window = 48;
    let mut p = pair(window, MIB);
    let most = watch_outstanding(&mut p, 100);
    let data = pattern(4, MIB);
    p.write_mem(0, 0, &data);
    let t0 = p.net.now;
    p.post_write(1, 0, MIB as u32, true);
    while p.net.cores[0].cq_len(p.nodes[0].scq) < 1 {
        assert!(p.net.step(), "nothing left to do and no completion");
    }
    let took = p.net.now.saturating_duration_since(t0);
    let wcs = p.scq(0);
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    assert_eq!(p.read_mem(1, 0, data.len()), data);
    assert!(most.get() <= window, "{} PSNs out", most.get());
    // 22 windows of 48 packets, one 40 µs round trip each, plus the bytes.
    assert!(
        took < Duration::from_millis(2),
        "1 MiB in windows of {window} took {took:?}: it waited for ACK time-outs"
    );
    let s = p.net.cores[0].stats();
    assert_eq!((s.retransmits, s.timeouts), (0, 0));
}
