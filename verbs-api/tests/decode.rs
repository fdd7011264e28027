//! `ferroce decode` on captures of frames from every opcode.

use std::borrow::Cow;
use std::process::Command;
use std::time::Duration;

use ferroce_stack::wire::sample::sample_frame;
use ferroce_stack::wire::OPCODES;
use ferroce_verbs::decode::{decode_capture, Format, Summary};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;

fn pcap_of(frames: &[Vec<u8>]) -> Vec<u8> {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(&PcapPacket {
            timestamp: Duration::from_micros(i as u64),
            orig_len: f.len() as u32,
            data: Cow::Borrowed(f),
        })
        .unwrap();
    }
    w.into_writer()
}

/// Every opcode over IPv4, IPv6 and with a VLAN tag, plus one ARP frame.
fn all_frames() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for (i, info) in OPCODES.iter().enumerate() {
        for (ipv6, vlan) in [(false, false), (true, false), (false, true)] {
            frames.push(sample_frame(info.opcode, ipv6, vlan, 1 + 97 * i, i as u64).unwrap());
        }
    }
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    frames.push(arp);
    frames
}

#[test]
fn every_opcode_decodes_with_good_icrc() {
    let frames = all_frames();
    let mut out = Vec::new();
    let s = decode_capture(&pcap_of(&frames)[..], &mut out, Format::Text).unwrap();
    let n = OPCODES.len() as u64 * 3;
    assert_eq!(
        s,
        Summary {
            packets: n + 1,
            roce: n,
            icrc_ok: n,
            icrc_bad: 0,
            malformed: 0
        }
    );
    assert_eq!(s.exit_code(), 0);
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len() as u64, n + 1);
    for (info, chunk) in OPCODES.iter().zip(lines.chunks(3)) {
        for l in chunk {
            assert!(l.contains(info.name), "{l} should name {}", info.name);
            assert!(l.ends_with("icrc=ok"), "{l}");
        }
    }
    assert!(lines[0].starts_with("1 198.18.0.1 -> 198.18.0.2 RC_SEND_FIRST qp="));
    assert!(lines[1].contains("fd00::1 -> fd00::2"));
    assert_eq!(
        *lines.last().unwrap(),
        format!(
            "{} packets, {n} roce, {n} icrc-ok, 0 icrc-bad, 0 malformed",
            n + 1
        )
    );
}

#[test]
fn a_corrupted_payload_byte_is_flagged_and_fails() {
    let mut frames = all_frames();
    // Frame 8 is RC_SEND_LAST over IPv6; flip a bit of its last payload byte.
    let f = &mut frames[7];
    let at = f.len() - 5;
    f[at] ^= 0x40;
    let mut out = Vec::new();
    let s = decode_capture(&pcap_of(&frames)[..], &mut out, Format::Text).unwrap();
    assert_eq!(s.icrc_bad, 1);
    assert_eq!(s.exit_code(), 1);
    let text = String::from_utf8(out).unwrap();
    let bad: Vec<_> = text.lines().filter(|l| l.ends_with("icrc=BAD")).collect();
    assert_eq!(bad.len(), 1);
    assert!(bad[0].starts_with("8 "), "{}", bad[0]);
}

#[test]
fn malformed_roce_is_counted_not_fatal() {
    let mut frames = all_frames();
    frames[0].truncate(50); // cut inside the BTH: IP length now disagrees
    let mut out = Vec::new();
    let s = decode_capture(&pcap_of(&frames)[..], &mut out, Format::Text).unwrap();
    assert_eq!(s.malformed, 1);
    assert_eq!(s.exit_code(), 1);
    assert!(String::from_utf8(out)
        .unwrap()
        .starts_with("1 malformed: IPv4: length field"));
}

#[test]
fn json_lines_parse() {
    let frames = all_frames();
    let mut out = Vec::new();
    decode_capture(&pcap_of(&frames)[..], &mut out, Format::Json).unwrap();
    let text = String::from_utf8(out).unwrap();
    let values: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let first = &values[0];
    assert_eq!(first["opcode"], "RC_SEND_FIRST");
    assert_eq!(first["icrc"], "ok");
    let write_first = values
        .iter()
        .find(|v| v["opcode"] == "RC_RDMA_WRITE_FIRST")
        .unwrap();
    assert!(write_first["reth"]["rkey"].is_u64());
    assert_eq!(values.last().unwrap()["summary"]["roce"], OPCODES.len() * 3);
}

#[test]
fn cli_exit_codes() {
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let dir = std::env::temp_dir().join(format!("ferroce-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.pcap");
    std::fs::write(&good, pcap_of(&all_frames())).unwrap();
    let st = Command::new(bin)
        .args(["decode"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(
        st.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );

    let mut frames = all_frames();
    let at = frames[3].len() - 6;
    frames[3][at] ^= 1;
    let bad = dir.join("bad.pcap");
    std::fs::write(&bad, pcap_of(&frames)).unwrap();
    let st = Command::new(bin)
        .args(["decode"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(1));

    let junk = dir.join("junk.pcap");
    std::fs::write(&junk, b"this is not a capture").unwrap();
    let st = Command::new(bin)
        .args(["decode"])
        .arg(&junk)
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(2));
    let st = Command::new(bin)
        .args(["decode", "/nonexistent/x.pcap"])
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The golden captures of real Linux rxe traffic (interop-tests/captures):
/// every frame is RoCE v2 with a correct ICRC, and one flipped payload byte
/// turns the exit status to 1 and flags exactly that frame.
#[test]
fn real_rxe_captures_decode_with_good_icrc() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../interop-tests/captures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "expected the rxe captures in {}",
        dir.display()
    );
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let mut opcodes = std::collections::BTreeSet::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let mut out = Vec::new();
        let s = decode_capture(&bytes[..], &mut out, Format::Json).unwrap();
        assert!(s.roce > 0 && s.roce == s.packets, "{}: {s}", f.display());
        assert_eq!(
            (s.icrc_ok, s.icrc_bad, s.malformed),
            (s.roce, 0, 0),
            "{}",
            f.display()
        );
        for line in String::from_utf8(out).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(op) = v["opcode"].as_str() {
                opcodes.insert(op.to_string());
            }
        }
        let st = Command::new(bin).arg("decode").arg(f).output().unwrap();
        assert_eq!(st.status.code(), Some(0), "{}", f.display());
    }
    // The captures cover every family of opcode rxe sends in them.
    for op in [
        "RC_SEND_FIRST",
        "RC_SEND_MIDDLE",
        "RC_SEND_LAST",
        "RC_SEND_ONLY",
        "RC_RDMA_WRITE_FIRST",
        "RC_RDMA_WRITE_MIDDLE",
        "RC_RDMA_WRITE_LAST",
        "RC_RDMA_WRITE_ONLY",
        "RC_RDMA_READ_REQUEST",
        "RC_RDMA_READ_RESPONSE_FIRST",
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        "RC_RDMA_READ_RESPONSE_LAST",
        "RC_RDMA_READ_RESPONSE_ONLY",
        "RC_ACKNOWLEDGE",
        "RC_ATOMIC_ACKNOWLEDGE",
        "RC_COMPARE_SWAP",
        "RC_FETCH_ADD",
        "UC_SEND_FIRST",
        "UC_SEND_LAST",
        "UD_SEND_ONLY",
    ] {
        assert!(
            opcodes.contains(op),
            "{op} not seen in the rxe captures: {opcodes:?}"
        );
    }

    // Corrupt one payload byte of the third frame of the WRITE capture.
    let write = dir.join("rxe-rc-write.pcap");
    let mut bytes = std::fs::read(&write).unwrap();
    // pcap: 24-byte file header, then 16-byte record headers.
    let mut at = 24;
    for _ in 0..2 {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16 + incl;
    }
    let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
    bytes[at + 16 + incl - 10] ^= 0x01;
    let mut out = Vec::new();
    let s = decode_capture(&bytes[..], &mut out, Format::Text).unwrap();
    assert_eq!((s.icrc_bad, s.exit_code()), (1, 1));
    let text = String::from_utf8(out).unwrap();
    let bad: Vec<_> = text.lines().filter(|l| l.ends_with("icrc=BAD")).collect();
    assert_eq!(bad.len(), 1);
    assert!(bad[0].starts_with("3 "), "{}", bad[0]);
}
