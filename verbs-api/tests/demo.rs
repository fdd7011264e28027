//! `ferroce demo` runs to the end with every byte verified (exit 0). With
//! root it uses two network namespaces; without, UDP on loopback.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn demo_exits_zero_with_data_verified() {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("demo")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all data verified"), "{stdout}");
    assert!(!stdout.contains("MISMATCH"), "{stdout}");
    for test in [
        "RC ping-pong",
        "WRITE bandwidth",
        "READ bandwidth",
        "SEND bandwidth",
        "SEND latency",
    ] {
        assert!(stdout.contains(test), "{test} missing:\n{stdout}");
    }
    // The brief: under 30 seconds (debug builds included, with margin).
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "demo took {:?}",
        t.elapsed()
    );
}

#[test]
fn demo_without_root_path_uses_udp() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["demo", "--backend", "udp"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("UDP backend") || stdout.contains("in-memory"),
        "{stdout}"
    );
}
