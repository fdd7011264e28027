//! The pcap middleware's output, read back by an independent reader: tshark.

use std::io::BufWriter;

use ferroce_nic::frame::{build_udp_frame, HeaderSpec};
use ferroce_nic::middleware::pcap::{PcapIo, PcapMode};
use ferroce_nic::{mem, PacketIo};

#[test]
fn tshark_reads_what_pcap_io_wrote() {
    if std::process::Command::new("tshark")
        .arg("-v")
        .output()
        .is_err()
    {
        eprintln!("SKIP: tshark not installed");
        return;
    }
    let path = std::env::temp_dir().join(format!("frc-pcap-{}.pcap", std::process::id()));
    let (a, mut b) = mem::pair().unwrap();
    let file = std::fs::File::create(&path).unwrap();
    let mut a = PcapIo::new(a, BufWriter::new(file), PcapMode::Both).unwrap();
    let spec = HeaderSpec {
        dst_mac: b.mac(),
        src_mac: a.mac(),
        src: "198.18.0.1:49152".parse().unwrap(),
        dst: "198.18.0.2:4791".parse().unwrap(),
        tos: 0,
        ttl: 64,
    };
    let frames: Vec<Vec<u8>> = (0..10u8)
        .map(|i| build_udp_frame(&spec, &[i; 40]).unwrap())
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    assert_eq!(a.send_frames(&refs).unwrap(), 10);
    let mut got = Vec::new();
    b.recv_owned(64, &mut got).unwrap();
    assert_eq!(got.len(), 10);
    drop(a.into_writer()); // flushes the BufWriter
    let out = std::process::Command::new("tshark")
        .args([
            "-r",
            path.to_str().unwrap(),
            "-T",
            "fields",
            "-e",
            "ip.src",
            "-e",
            "udp.dstport",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        10,
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lines.iter().all(|l| *l == "198.18.0.1\t4791"), "{text}");
}
