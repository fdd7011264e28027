//! Transmit order between a QP's two directions: responses go first, except
//! that one request may go ahead of a plain ACK (an answer to what was just
//! received leaves one frame sooner); the ACK is never held back longer.

mod common;

use common::*;
use ferroce_stack::transport::*;
use ferroce_stack::wire::{Opcode, ParsedPacket};

/// Node 1 receives a SEND from node 0 (owing it an ACK), then posts
/// `answers` SENDs of its own; returns node 1's opcodes in send order.
fn node1_after_receiving(answers: u64) -> Vec<Opcode> {
    let mut p = Pair::new(QpType::Rc);
    p.post_recv(1, 9, 0, 64);
    let s = p.sge(0, 0, 8);
    p.post(0, 1, SendOp::Send, &[s]).unwrap();
    let now = Instant::from_nanos(1);
    let mut buf = vec![0u8; 10_000];
    let n = p.net.cores[0]
        .poll_transmit(now, &mut buf)
        .expect("the SEND");
    p.net.cores[1].handle_frame(now, &buf[..n]);
    for i in 0..answers {
        let s = p.sge(1, 128, 8);
        p.post(1, 100 + i, SendOp::Send, &[s]).unwrap();
    }
    let core = &mut p.net.cores[1];
    let mut out = Vec::new();
    while let Some(n) = core.poll_transmit(now, &mut buf) {
        let f = ParsedPacket::parse(&buf[..n]).expect("a valid frame");
        out.push(f.repr.bth.opcode);
    }
    out
}

#[test]
fn an_answer_goes_ahead_of_the_ack_once() {
    assert_eq!(node1_after_receiving(0), [Opcode::RC_ACKNOWLEDGE]);
    assert_eq!(
        node1_after_receiving(1),
        [Opcode::RC_SEND_ONLY, Opcode::RC_ACKNOWLEDGE]
    );
    // More requests waiting do not starve the ACK.
    assert_eq!(
        node1_after_receiving(3),
        [
            Opcode::RC_SEND_ONLY,
            Opcode::RC_ACKNOWLEDGE,
            Opcode::RC_SEND_ONLY,
            Opcode::RC_SEND_ONLY
        ]
    );
}
