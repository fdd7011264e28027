//! Jobs launched the way torchrun does it: one `ferroce-coll-bench`
//! process per rank, told only RANK, WORLD_SIZE, MASTER_ADDR and
//! MASTER_PORT (no ferroce-specific glue): one rank per network namespace
//! (needs root; skips otherwise), and several ranks on one host.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ferroce_nic::netns::{Topology, TopologyConfig};

/// `n` namespace hosts on a bridge and the master address (host 0's), or
/// `None` (skipped) without root.
fn namespaces(n: usize) -> Option<(Topology, String)> {
    if !ferroce_nic::is_root() {
        eprintln!("skipped: needs root for namespaces");
        return None;
    }
    let topo = Topology::up(&TopologyConfig {
        hosts: n,
        bridge: true,
        ..Default::default()
    })
    .unwrap();
    let master = topo.host(0).ipv4.to_string();
    Some((topo, master))
}

#[test]
fn torchrun_style_processes_in_namespaces() {
    let n = 3;
    let Some((topo, master)) = namespaces(n) else {
        return;
    };
    let kids = (0..n)
        .map(|i| {
            rank(
                topo.command(i, env!("CARGO_BIN_EXE_ferroce-coll-bench")),
                i,
                n,
                &master,
                "1M",
            )
        })
        .collect();
    check_job(kids, n, &["8", "512", "32768"]);
}

/// Several ranks on one host, as `torchrun --nproc_per_node 3` or
/// `mpirun -np 3` start them: every rank's UDP device binds the same
/// address and port 4791, which they share (ferroce_nic::port_share). Over
/// loopback, so it needs no root; `FERROCE_IFACE=lo` because a rank does not
/// pick loopback by itself.
#[test]
fn several_ranks_on_one_host_share_its_address() {
    let n = 3;
    let kids = (0..n)
        .map(|i| {
            let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ferroce-coll-bench"));
            c.env("FERROCE_IFACE", "lo")
                .env("FERROCE_BACKEND", "udp")
                .env_remove("FERROCE_UDP_BIND");
            rank(c, i, n, "127.0.0.1", "2M")
        })
        .collect();
    // 2 MiB: bulk GSO sends between the ranks, each to one of them.
    check_job(kids, n, &["8", "512", "32768", "2097152"]);
}

/// `FERROCE_COLL_BIND=core`: each rank process runs on the CPU of its local
/// rank (modulo the CPUs it may use), and the job's results are right.
#[test]
fn ranks_bind_to_the_cpu_of_their_local_rank() {
    let n = 3;
    let cpus = allowed_cpus(std::process::id(), None).expect("this process's CPUs");
    let mut kids: Vec<std::process::Child> = (0..n)
        .map(|i| {
            let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ferroce-coll-bench"));
            c.env("FERROCE_IFACE", "lo")
                .env("FERROCE_BACKEND", "udp")
                .env("FERROCE_COLL_BIND", "core")
                // Local ranks in the other order than the ranks.
                .env("LOCAL_RANK", (n - 1 - i).to_string())
                .env_remove("FERROCE_UDP_BIND");
            // Its own rendezvous: the other loopback test may run at once.
            rank(c, i, n, "127.0.0.2", "2M")
        })
        .collect();
    for (i, k) in kids.iter_mut().enumerate() {
        let want = vec![cpus[(n - 1 - i) % cpus.len()]];
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = None;
        while Instant::now() < deadline && k.try_wait().unwrap().is_none() {
            // The main thread binds itself right after reading the launcher's variables.
            seen = allowed_cpus(k.id(), Some(k.id()));
            if seen.as_ref() == Some(&want) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(seen, Some(want), "rank {i}");
    }
    let outs = check_job(kids, n, &["8", "512", "32768", "2097152"]);
    assert!(outs[0].0.contains("bound to a CPU"), "{}", outs[0].0);
}

/// The CPUs a process (or one of its threads) may run on, from /proc.
fn allowed_cpus(pid: u32, tid: Option<u32>) -> Option<Vec<usize>> {
    let path = match tid {
        Some(t) => format!("/proc/{pid}/task/{t}/status"),
        None => format!("/proc/{pid}/status"),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// `FERROCE_COLL_SMALL_BACKEND`: each rank holds a second device, AF_XDP,
/// for messages up to 16 KiB, beside its UDP one; sizes on both sides of
/// the threshold come out right.
#[test]
fn small_messages_on_a_second_device() {
    let n = 3;
    let Some((topo, master)) = namespaces(n) else {
        return;
    };
    let kids = (0..n)
        .map(|i| {
            let mut c = topo.command(i, env!("CARGO_BIN_EXE_ferroce-coll-bench"));
            c.env("FERROCE_BACKEND", "udp")
                .env("FERROCE_COLL_SMALL_BACKEND", "afxdp")
                .env("FERROCE_COLL_SMALL_MAX", "16384")
                .env("FERROCE_COLL_STATS", "1");
            rank(c, i, n, &master, "2M")
        })
        .collect();
    let outs = check_job(kids, n, &["8", "512", "32768", "2097152"]);
    assert!(
        outs[0]
            .0
            .contains("messages up to 16384 B on a second device, afxdp"),
        "{}",
        outs[0].0
    );
    // Every rank's stats: two devices, both moved frames.
    for (r, (_, err)) in outs.iter().enumerate() {
        // (The progress line, ended by a carriage return, may precede one.)
        let out: Vec<u64> = err
            .split(&format!("# rank {r}: "))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        assert!(
            out.len() == 2 && out.iter().all(|&f| f > 0),
            "rank {r}: {err}"
        );
    }
}

/// Starts rank `i` of `n` of a small allreduce run, told only what
/// torchrun tells it.
fn rank(
    mut c: std::process::Command,
    i: usize,
    n: usize,
    master: &str,
    max: &str,
) -> std::process::Child {
    // One port per test binary run and master (the two tests may run at once).
    let port = 29600
        + std::process::id() % 1000
        + match master {
            "127.0.0.1" => 1000,
            m if m.starts_with("127.") => 2000,
            _ => 0,
        };
    c.args(["allreduce", "--fabric", "env", "-b", "8", "-e", max])
        .args(["-f", "64", "-w", "1", "-i", "2"])
        .env("RANK", i.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", master)
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the ranks and checks rank 0's table.
fn check_job(
    mut kids: Vec<std::process::Child>,
    n: usize,
    want_sizes: &[&str],
) -> Vec<(String, String)> {
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
    // Rank 0 prints the table: the sizes asked for, none wrong.
    let rows: Vec<Vec<&str>> = outs[0]
        .0
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let sizes: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, want_sizes, "{}", outs[0].0);
    assert!(rows.iter().all(|r| r.last() == Some(&"0")), "{}", outs[0].0);
    assert!(
        outs[0].0.contains(&format!("{n} ranks on env")),
        "{}",
        outs[0].0
    );
    // The others print nothing.
    assert!(outs[1].0.trim().is_empty(), "{}", outs[1].0);
    outs
}
