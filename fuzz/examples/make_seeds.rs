//! Regenerates the committed seed corpora under `fuzz/corpus/<target>/`:
//! `cargo run -p ferroce-fuzz --example make_seeds` (from the repo root).
//! Seeds have descriptive names; files libFuzzer adds are named by their
//! SHA-1 and are ignored by git.

use std::fs;
use std::path::{Path, PathBuf};

use ferroce_fuzz::stateful::{script_frames, tag};
use ferroce_stack::wire::sample::{sample_frame, SplitMix};
use ferroce_stack::wire::{ParsedPacket, OPCODES};

/// Frames of a classic little-endian pcap.
fn pcap_frames(b: &[u8]) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let mut at = 24;
    while at + 16 <= b.len() {
        let n = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16;
        if at + n > b.len() {
            break;
        }
        v.push(b[at..at + n].to_vec());
        at += n;
    }
    v
}

fn pcap_of(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut p = vec![
        0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0,
    ];
    for f in frames {
        let len = (f.len() as u32).to_le_bytes();
        p.extend_from_slice(&[0; 8]);
        p.extend_from_slice(&len);
        p.extend_from_slice(&len);
        p.extend_from_slice(f);
    }
    p
}

struct Out(PathBuf);

impl Out {
    fn dir(&self, target: &str) -> PathBuf {
        let d = self.0.join(target);
        if d.exists() {
            fs::remove_dir_all(&d).unwrap();
        }
        fs::create_dir_all(&d).unwrap();
        d
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Out(root.join("corpus"));
    let captures = root.join("../interop-tests/captures");
    let mut pcaps: Vec<(String, Vec<u8>)> = fs::read_dir(&captures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&p).unwrap())
        })
        .collect();
    pcaps.sort();

    // Whole frames: every opcode over IPv4; IPv6, VLAN and both for a rotating
    // third; plus the first distinct opcodes of every rxe capture.
    let mut frames: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, info) in OPCODES.iter().enumerate() {
        let name = info.opcode.name().to_lowercase();
        frames.push((
            format!("{name}-v4"),
            sample_frame(info.opcode, false, false, 1 + i * 29 % 300, i as u64).unwrap(),
        ));
        let (v6, vlan, tagname) = match i % 3 {
            0 => (true, false, "v6"),
            1 => (false, true, "v4-vlan"),
            _ => (true, true, "v6-vlan"),
        };
        frames.push((
            format!("{name}-{tagname}"),
            sample_frame(info.opcode, v6, vlan, i * 7 % 64, i as u64 + 99).unwrap(),
        ));
    }
    let mut rxe_frames = Vec::new();
    for (name, bytes) in &pcaps {
        let mut seen = Vec::new();
        for (k, f) in pcap_frames(bytes).into_iter().enumerate() {
            let Ok(p) = ParsedPacket::parse(&f) else {
                continue;
            };
            let op = p.repr.bth.opcode;
            if seen.contains(&op) || seen.len() >= 3 {
                continue;
            }
            seen.push(op);
            rxe_frames.push((format!("{name}-{k}-{}", op.name().to_lowercase()), f));
        }
    }
    frames.extend(rxe_frames);

    let d = out.dir("frame_parse");
    for (n, f) in &frames {
        fs::write(d.join(n), f).unwrap();
    }
    // Header parsers: the bytes from the BTH on, and from the first extension header on.
    let d = out.dir("header_parsers");
    for (n, f) in frames.iter().step_by(2) {
        let Ok(p) = ParsedPacket::parse(f) else {
            continue;
        };
        let bth_at = p.repr.eth.header_len() + p.repr.ip.header_len() + 8;
        fs::write(d.join(format!("{n}-bth")), &f[bth_at..]).unwrap();
        fs::write(d.join(format!("{n}-ext")), &f[bth_at + 12..]).unwrap();
    }
    // Round trip: the first byte picks the opcode, the rest fills the fields.
    let d = out.dir("frame_roundtrip");
    let mut rng = SplitMix::new(0x707);
    for (i, info) in OPCODES.iter().enumerate() {
        let mut b = vec![0u8; 200 + i * 11];
        rng.fill(&mut b);
        b[0] = i as u8;
        fs::write(d.join(info.opcode.name().to_lowercase()), &b).unwrap();
    }
    // Decode: every rxe capture, and small pcaps of sample frames.
    let d = out.dir("decode");
    for (name, bytes) in &pcaps {
        fs::write(d.join(name), bytes).unwrap();
    }
    for k in 0..6 {
        let fs_: Vec<Vec<u8>> = frames
            .iter()
            .skip(k * 8)
            .take(8)
            .map(|(_, f)| f.clone())
            .collect();
        fs::write(d.join(format!("sample-{k}")), pcap_of(&fs_)).unwrap();
    }
    // Stateful targets: replays of the script conversation and variations.
    let [to_requester, to_responder] = script_frames();
    for (target, pool) in [("responder", to_responder), ("requester", to_requester)] {
        let d = out.dir(target);
        let n = pool.len() as u8;
        let all: Vec<u8> = (0..n).flat_map(|i| [tag::REPLAY, i]).collect();
        fs::write(d.join("replay-all"), &all).unwrap();
        let mut twice = all.clone();
        twice.extend_from_slice(&all);
        fs::write(d.join("replay-all-twice"), &twice).unwrap();
        let rev: Vec<u8> = (0..n).rev().flat_map(|i| [tag::REPLAY, i]).collect();
        fs::write(d.join("replay-reversed"), &rev).unwrap();
        for i in 0..n.min(24) {
            fs::write(d.join(format!("replay-{i}")), [tag::REPLAY, i]).unwrap();
        }
        // Skip one frame, then tick past a timeout, then the rest.
        let mut gap: Vec<u8> = vec![tag::REPLAY, 0];
        gap.extend([tag::TICK, 0x40, 0x0d, 0x03, 0]);
        gap.extend((2..n).flat_map(|i| [tag::REPLAY, i]));
        fs::write(d.join("gap-tick"), &gap).unwrap();
        let ticks: Vec<u8> = (0..8)
            .flat_map(|k| [tag::TICK, 0, 0x10 << (k % 4), 0, 0])
            .collect();
        fs::write(d.join("ticks"), &ticks).unwrap();
        // Forges: a base frame and a tail of field bytes.
        for k in 0..6u8 {
            let mut b = vec![tag::FORGE, k * 3, k * 5];
            let mut tail = vec![0u8; 96];
            SplitMix::new(u64::from(k)).fill(&mut tail);
            b.extend(tail);
            b.extend([tag::REPLAY, k]);
            fs::write(d.join(format!("forge-{k}")), &b).unwrap();
        }
        let mut posts = vec![tag::POST_RECV, 0, 0, 4, tag::POST_SEND, 0, 5, 0, 2, 0, 1];
        posts.extend(all.iter().take(8));
        posts.extend([tag::TICK, 0, 0, 1, 0]);
        fs::write(d.join("posts"), &posts).unwrap();
    }
    eprintln!("seeds written under {}", out.0.display());
}
