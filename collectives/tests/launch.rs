//! A job launched the way torchrun does it: one `ferroce-coll-bench`
//! process per rank, each in its own network namespace, told only RANK,
//! WORLD_SIZE, MASTER_ADDR and MASTER_PORT (no ferroce-specific glue).
//! Needs root for the namespaces; skips otherwise.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ferroce_nic::netns::{Topology, TopologyConfig};

#[test]
fn torchrun_style_processes_in_namespaces() {
    if !ferroce_nic::is_root() {
        eprintln!("skipped: needs root for namespaces");
        return;
    }
    let n = 3;
    let topo = Topology::up(&TopologyConfig {
        hosts: n,
        bridge: true,
        ..Default::default()
    })
    .unwrap();
    let master = topo.host(0).ipv4.to_string();
    let port = (29600 + std::process::id() % 1000).to_string();
    let mut kids: Vec<_> = (0..n)
        .map(|i| {
            topo.command(i, env!("CARGO_BIN_EXE_ferroce-coll-bench"))
                .args(["allreduce", "--fabric", "env", "-b", "8", "-e", "1M"])
                .args(["-f", "64", "-w", "1", "-i", "2"])
                .env("RANK", i.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", &master)
                .env("MASTER_PORT", &port)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut status = vec![None; n];
    while status.iter().any(Option::is_none) && Instant::now() < deadline {
        for (k, s) in kids.iter_mut().zip(status.iter_mut()) {
            if s.is_none() {
                *s = k.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut outs = Vec::new();
    for k in kids.iter_mut() {
        let _ = k.kill();
        let _ = k.wait();
        let (mut o, mut e) = (String::new(), String::new());
        k.stdout.take().unwrap().read_to_string(&mut o).unwrap();
        k.stderr.take().unwrap().read_to_string(&mut e).unwrap();
        outs.push((o, e));
    }
    for (r, s) in status.iter().enumerate() {
        let ok = s.is_some_and(|s| s.success());
        assert!(ok, "rank {r}: {s:?}\n{}\n{}", outs[r].0, outs[r].1);
    }
    // Rank 0 prints the table: sizes 8, 512 and 32768 bytes, none wrong.
    let rows: Vec<Vec<&str>> = outs[0]
        .0
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let sizes: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, ["8", "512", "32768"], "{}", outs[0].0);
    assert!(rows.iter().all(|r| r.last() == Some(&"0")), "{}", outs[0].0);
    assert!(
        outs[0].0.contains(&format!("{n} ranks on env")),
        "{}",
        outs[0].0
    );
    // The others print nothing.
    assert!(outs[1].0.trim().is_empty(), "{}", outs[1].0);
}
