//! Replays the fuzz target bodies on seeds: every opcode's frame, each cut
//! at every length and with seeded byte mutations, plus captures.

use ferroce_fuzz::{decode, frame_parse, header_parsers, raw_offload};
use ferroce_stack::wire::sample::{sample_frame, SplitMix};
use ferroce_stack::wire::OPCODES;

fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for (i, info) in OPCODES.iter().enumerate() {
        for (ipv6, vlan) in [(false, false), (true, false), (false, true), (true, true)] {
            v.push(sample_frame(info.opcode, ipv6, vlan, i * 13 % 97, i as u64).unwrap());
        }
    }
    v
}

/// `f` with one to four bytes set at random.
fn mutated(rng: &mut SplitMix, f: &[u8]) -> Vec<u8> {
    let mut m = f.to_vec();
    if m.is_empty() {
        return m;
    }
    for _ in 0..1 + rng.next_u32() % 4 {
        let at = rng.next_u32() as usize % m.len();
        m[at] = rng.next_u32() as u8;
    }
    m
}

#[test]
fn frames_truncated_and_mutated() {
    let mut rng = SplitMix::new(0xf022);
    for f in seeds() {
        frame_parse(&f);
        for n in 0..f.len() {
            frame_parse(&f[..n]);
            header_parsers(&f[n..]);
        }
        for _ in 0..200 {
            frame_parse(&mutated(&mut rng, &f));
        }
    }
}

#[test]
fn decode_on_truncated_captures() {
    // A pcap of a few frames, cut at every length.
    let mut pcap = vec![
        0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0,
    ];
    for f in seeds().iter().take(6) {
        let len = (f.len() as u32).to_le_bytes();
        pcap.extend_from_slice(&[0; 8]);
        pcap.extend_from_slice(&len);
        pcap.extend_from_slice(&len);
        pcap.extend_from_slice(f);
    }
    for n in 0..pcap.len() {
        decode(&pcap[..n]);
    }
    let mut rng = SplitMix::new(7);
    for _ in 0..300 {
        let mut m = pcap.clone();
        let at = rng.next_u32() as usize % m.len();
        m[at] = rng.next_u32() as u8;
        decode(&m);
    }
}

#[test]
fn frame_roundtrip_on_seeded_bytes() {
    let mut rng = SplitMix::new(0x5eed);
    for len in 0..2000 {
        let mut b = vec![0u8; len % 400 + 100];
        rng.fill(&mut b);
        ferroce_fuzz::frame_roundtrip(&b);
    }
}

#[test]
fn script_capture_has_every_kind() {
    let [to_requester, to_responder] = ferroce_fuzz::stateful::script_frames();
    assert!(to_responder.len() >= 13, "{}", to_responder.len());
    assert!(!to_requester.is_empty());
    for f in to_responder.iter().chain(to_requester) {
        ferroce_stack::wire::ParsedPacket::parse(f).unwrap();
    }
}

#[test]
fn responder_replays_the_script() {
    use ferroce_fuzz::stateful::{run, Role, Step};
    let n = ferroce_fuzz::stateful::script_frames()[1].len();
    let steps: Vec<Step> = (0..n).map(|i| Step::Replay(i as u8)).collect();
    run(Role::Responder, &steps);
    // Twice: every one a duplicate the second time.
    let twice: Vec<Step> = steps.iter().chain(&steps).cloned().collect();
    run(Role::Responder, &twice);
}

#[test]
fn requester_replays_the_script() {
    use ferroce_fuzz::stateful::{run, Role, Step};
    let n = ferroce_fuzz::stateful::script_frames()[0].len();
    let steps: Vec<Step> = (0..n).map(|i| Step::Replay(i as u8)).collect();
    run(Role::Requester, &steps);
    run(Role::Requester, &[Step::Tick(1000), Step::Tick(100_000)]);
}

#[test]
fn stateful_on_seeded_bytes() {
    let mut rng = SplitMix::new(0x57a7e);
    for i in 0..300 {
        let mut b = vec![0u8; 64 + (i * 37) % 900];
        rng.fill(&mut b);
        ferroce_fuzz::responder(&b);
        ferroce_fuzz::requester(&b);
    }
}

/// The forge reaches the responder's checks: hostile READs (foreign-PD key,
/// inert region, past the end) are refused with NAKs and touch nothing.
#[test]
fn forged_hostile_reads_are_refused() {
    use ferroce_fuzz::stateful::{script_frames, Dest, Forge, Key, Role, Session, Target};
    let pool = &script_frames()[1];
    let read_at = pool
        .iter()
        .position(|f| {
            ferroce_stack::wire::ParsedPacket::parse(f)
                .unwrap()
                .repr
                .bth
                .opcode
                .0
                == 0x0c
        })
        .unwrap();
    for (va, key) in [
        (Target::Open(0), Key::Foreign),
        (Target::Inert(0), Key::Inert),
        (Target::Edge(-8), Key::Open),
    ] {
        let mut s = Session::new(Role::Responder);
        // Deliver the script up to the READ, so the forged one is in sequence.
        for f in &pool[..read_at] {
            s.feed(f);
        }
        let g = Forge {
            base: read_at as u8,
            opcode: 0xff,
            psn_delta: 0,
            dest: Dest::Keep,
            payload_len: None,
            solicited: false,
            ack_req: true,
            va,
            key,
            dma_len: Some(64),
            syndrome: None,
            msn_delta: 0,
            imm: 0,
            qkey: None,
            src_qp: None,
            swap_add: 0,
            compare: 0,
            orig: 0,
        };
        let f = g.build(pool, s.victim_node(), s.peer_node()).unwrap();
        let before = s.core(1).stats().naks_sent;
        s.feed(&f);
        assert_eq!(s.core(1).stats().naks_sent, before + 1, "{va:?} {key:?}");
    }
}

#[test]
fn raw_offload_on_frames_cut_and_mutated() {
    let mut rng = SplitMix::new(0x0ff1);
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for f in seeds().iter().step_by(3) {
        // Segment sizes around the frame's payload, checksum partial or not.
        for (gso, partial) in [
            (0u16, 0u16),
            (1, 1),
            (40, 0),
            (40, 1),
            (4112, 0),
            (0x7FFF, 1),
        ] {
            let mut d = ((gso << 1) | partial).to_le_bytes().to_vec();
            d.extend_from_slice(f);
            inputs.push(d);
        }
    }
    for dir in ["raw_offload"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(dir);
        for e in std::fs::read_dir(path).unwrap() {
            inputs.push(std::fs::read(e.unwrap().path()).unwrap());
        }
    }
    for d in &inputs {
        for n in 0..d.len() {
            raw_offload(&d[..n]);
        }
        for _ in 0..50 {
            raw_offload(&mutated(&mut rng, d));
        }
    }
}
