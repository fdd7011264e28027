//! Frames written with their payload left in place (`poll_transmit_split`)
//! are, once joined, the bytes `poll_transmit` writes.

mod common;

use common::*;
use ferroce_stack::transport::*;

fn frames(split: bool) -> (Vec<Vec<u8>>, usize) {
    let mut p = Pair::new(QpType::Rc);
    let data = pattern(7, 3 * 4096 + 333);
    p.write_mem(0, 0, &data);
    let (va, rkey) = p.remote(1, 0);
    let one = p.sge(0, 0, data.len() as u32);
    p.post(
        0,
        1,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        &[one],
    )
    .unwrap();
    // Two SGEs: the packet across them is copied, the others may be split.
    let two = [p.sge(0, 10, 5000), p.sge(0, 40_000, 3000)];
    p.post(0, 2, SendOp::Send, &two).unwrap();
    // Inline data is always copied.
    let q = p.qp(0);
    let mut wr = SendWr::new(3, SendOp::Send, &[]);
    wr.flags.inline = true;
    wr.inline_data = b"inline bytes";
    p.net.cores[0].post_send(q, &wr).unwrap();

    let core = &mut p.net.cores[0];
    let now = Instant::from_nanos(1);
    let mut buf = vec![0u8; 10_000];
    let (mut out, mut in_place) = (Vec::new(), 0);
    loop {
        if split {
            let Some(s) = core.poll_transmit_split(now, &mut buf) else {
                break;
            };
            let mut f = buf[..s.head].to_vec();
            if let Some(pl) = s.payload {
                in_place += 1;
                f.extend_from_slice(core.tx_payload(&pl).unwrap());
                f.extend_from_slice(&buf[s.head..s.head + s.tail]);
            }
            out.push(f);
        } else {
            let Some(n) = core.poll_transmit(now, &mut buf) else {
                break;
            };
            out.push(buf[..n].to_vec());
        }
    }
    (out, in_place)
}

#[test]
fn split_frames_join_to_the_copied_ones() {
    let (copied, none) = frames(false);
    let (joined, in_place) = frames(true);
    assert_eq!(none, 0);
    // At the pair's path MTU of 1024: the WRITE's 13 packets in place; the
    // SEND over two SGEs: 7 in place, 1 across the boundary (copied); the
    // inline SEND copied.
    assert_eq!(copied.len(), 22);
    assert_eq!(in_place, 20);
    assert_eq!(joined, copied);
    for f in &joined {
        ferroce_stack::wire::ParsedPacket::parse(f).expect("a valid RoCE frame with its ICRC");
    }
}
