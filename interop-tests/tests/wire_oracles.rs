//! Independent oracles for the wire format: tshark's InfiniBand dissector
//! must read back every header field we emit, and scapy's
//! `scapy.contrib.roce` must compute the same ICRC. Both skip with a message
//! when the tool is missing; CI installs both.

use std::borrow::Cow;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use ferroce_stack::wire::sample::sample_frame;
use ferroce_stack::wire::{ParsedPacket, OPCODES};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;

fn have(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Frames for every opcode, IPv4 and IPv6, with and without a VLAN tag, with
/// payload sizes that need every pad count.
fn frames() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, info) in OPCODES.iter().enumerate() {
        for (k, (ipv6, vlan)) in [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
        {
            let len = [0, 1, 2, 3, 5, 256, 1021, 4096][(i + k) % 8];
            out.push(sample_frame(info.opcode, ipv6, vlan, len, (i * 4 + k) as u64).unwrap());
        }
    }
    out
}

fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(std::fs::File::create(path).unwrap(), header).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(&PcapPacket {
            timestamp: Duration::from_millis(i as u64),
            orig_len: f.len() as u32,
            data: Cow::Borrowed(f),
        })
        .unwrap();
    }
}

/// tshark prints numbers in decimal or 0x-hex and booleans as True/False or 1/0.
fn num(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    match s {
        "True" => return Some(1),
        "False" => return Some(0),
        _ => {}
    }
    if let Some(h) = s.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    s.parse().ok()
}

const FIELDS: &[&str] = &[
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.a",
    "infiniband.bth.se",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.invariant.crc",
];

#[test]
fn tshark_decodes_every_header_we_emit() {
    if !have("tshark", &["--version"]) {
        eprintln!("SKIP tshark_decodes_every_header_we_emit: tshark not installed (apt-get install tshark)");
        return;
    }
    let frames = frames();
    let dir = std::env::temp_dir().join(format!("ferroce-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("all-opcodes.pcap");
    write_pcap(&pcap, &frames);
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&pcap)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), frames.len());

    for (i, (frame, row)) in frames.iter().zip(&rows).enumerate() {
        let p = ParsedPacket::parse(frame).unwrap();
        let r = &p.repr;
        let b = &r.bth;
        let name = b.opcode.name();
        let col = |f: &str| num(row[FIELDS.iter().position(|x| *x == f).unwrap()]);
        let ctx = format!("frame {} ({name}): {row:?}", i + 1);
        assert_eq!(
            col("infiniband.bth.opcode"),
            Some(u64::from(b.opcode.0)),
            "{ctx}"
        );
        assert_eq!(
            col("infiniband.bth.destqp"),
            Some(u64::from(b.dest_qp)),
            "{ctx}"
        );
        assert_eq!(col("infiniband.bth.psn"), Some(u64::from(b.psn)), "{ctx}");
        assert_eq!(col("infiniband.bth.a"), Some(u64::from(b.ack_req)), "{ctx}");
        assert_eq!(
            col("infiniband.bth.se"),
            Some(u64::from(b.solicited)),
            "{ctx}"
        );
        assert_eq!(
            col("infiniband.bth.padcnt"),
            Some(u64::from(b.pad_count)),
            "{ctx}"
        );
        assert_eq!(
            col("infiniband.bth.p_key"),
            Some(u64::from(b.pkey)),
            "{ctx}"
        );
        let e = &r.ext;
        if let Some(h) = e.reth {
            assert_eq!(col("infiniband.reth.va"), Some(h.va), "{ctx}");
            assert_eq!(
                col("infiniband.reth.r_key"),
                Some(u64::from(h.rkey)),
                "{ctx}"
            );
            assert_eq!(
                col("infiniband.reth.dmalen"),
                Some(u64::from(h.dma_len)),
                "{ctx}"
            );
        }
        if let Some(a) = e.atomic_eth {
            // Wireshark shows the AtomicETH VA and R_Key under the RETH field names.
            assert_eq!(col("infiniband.reth.va"), Some(a.va), "{ctx}");
            assert_eq!(
                col("infiniband.reth.r_key"),
                Some(u64::from(a.rkey)),
                "{ctx}"
            );
            assert_eq!(
                col("infiniband.atomiceth.swapdt"),
                Some(a.swap_add),
                "{ctx}"
            );
            assert_eq!(col("infiniband.atomiceth.cmpdt"), Some(a.compare), "{ctx}");
        }
        if e.reth.is_none() && e.atomic_eth.is_none() {
            assert_eq!(col("infiniband.reth.va"), None, "{ctx}");
        }
        match e.aeth {
            Some(a) => {
                assert_eq!(
                    col("infiniband.aeth.syndrome"),
                    Some(u64::from(a.syndrome)),
                    "{ctx}"
                );
                assert_eq!(col("infiniband.aeth.msn"), Some(u64::from(a.msn)), "{ctx}");
            }
            None => assert_eq!(col("infiniband.aeth.syndrome"), None, "{ctx}"),
        }
        if let Some(d) = e.deth {
            assert_eq!(
                col("infiniband.deth.q_key"),
                Some(u64::from(d.qkey)),
                "{ctx}"
            );
            assert_eq!(
                col("infiniband.deth.srcqp"),
                Some(u64::from(d.src_qp)),
                "{ctx}"
            );
        }
        if let Some(a) = e.atomic_ack_eth {
            assert_eq!(
                col("infiniband.atomicacketh.origremdt"),
                Some(a.orig_data),
                "{ctx}"
            );
        }
        // FT_BYTES fields come as bare hex digits.
        let bytes_col = |f: &str| {
            let v = row[FIELDS.iter().position(|x| *x == f).unwrap()].replace(':', "");
            (!v.is_empty()).then(|| u64::from_str_radix(&v, 16).unwrap())
        };
        match e.immdt {
            Some(imm) => assert_eq!(
                bytes_col("infiniband.immdt"),
                Some(u64::from(imm.imm)),
                "{ctx}"
            ),
            None => assert_eq!(bytes_col("infiniband.immdt"), None, "{ctx}"),
        }
        match e.ieth {
            Some(inv) => assert_eq!(
                bytes_col("infiniband.ieth"),
                Some(u64::from(inv.rkey)),
                "{ctx}"
            ),
            None => assert_eq!(bytes_col("infiniband.ieth"), None, "{ctx}"),
        }
        // tshark shows (without checking) the ICRC; it must be the bytes we sent.
        if let Some(crc) = col("infiniband.invariant.crc") {
            let wire = u32::from_be_bytes(frame[frame.len() - 4..].try_into().unwrap());
            assert_eq!(crc, u64::from(wire), "{ctx}");
        }
    }
}

#[test]
fn scapy_computes_the_same_icrc() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/scapy_icrc.py");
    if !have("python3", &["-c", "import scapy.contrib.roce"]) {
        eprintln!("SKIP scapy_computes_the_same_icrc: python3 with scapy not available (pip install scapy)");
        return;
    }
    // Random payloads on top of the fixed shapes.
    let mut frames = frames();
    for seed in 0..64u64 {
        let info = &OPCODES[(seed as usize * 7) % OPCODES.len()];
        let len = (seed as usize * 389) % 4097;
        frames.push(sample_frame(info.opcode, seed % 2 == 1, seed % 3 == 0, len, seed).unwrap());
    }
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for f in &frames {
            let hex: String = f.iter().map(|b| format!("{b:02x}")).collect();
            writeln!(stdin, "{hex}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "scapy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), frames.len());
    for (i, (f, line)) in frames.iter().zip(lines).enumerate() {
        let ours: String = f[f.len() - 4..]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let op = ParsedPacket::parse(f).unwrap().repr.bth.opcode;
        assert_eq!(
            line, ours,
            "frame {i} ({op}): scapy's ICRC differs from ours"
        );
    }
}
