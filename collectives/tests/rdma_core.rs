//! The rdma-core backend (feature `rdma-core`) on a host without an RDMA
//! device: every rank is a `ferroce-coll-bench --fabric rdma-core` process in
//! a network-namespace host, its libibverbs.so.1 replaced (LD_LIBRARY_PATH)
//! by ferroce's drop-in one (`ferroce-ibverbs-compat`), so the backend's
//! libibverbs calls — device list, GID type, QP state changes, post/poll
//! through the context's ops — are the ones it makes on a real RNIC or rxe.
//! Checks the bench's `#wrong` column (every result element compared with a
//! reference) on 2–4 ranks, and a job mixing ferroce-verbs ranks
//! (`--fabric env`) with rdma-core ranks in one communicator.
//!
//! Both tools are built (release) into this test's target folder by the
//! interop harness's one build of every release tool. Skips, with the reason, when not root or when cmake (for
//! sideway's rdma-mummy-sys) or rdma-core's headers are missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferroce_interop::host;
use ferroce_nic::netns::{Topology, TopologyConfig};

/// A rank's packet backend under both libraries (the compat tests' default).
const BACKEND: &str = "afpacket";
const MASTER_PORT: &str = "29517";
/// Per job; a healthy one takes a few seconds.
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

fn skip_reason() -> Option<String> {
    if !ferroce_nic::is_root() {
        return Some("needs root (network namespaces, raw sockets)".into());
    }
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        return Some("rdma-core's headers are missing (libibverbs-dev)".into());
    }
    let cmake = Command::new("cmake")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !cmake.is_ok_and(|s| s.success()) {
        return Some("cmake is missing (sideway's rdma-mummy-sys builds with it)".into());
    }
    None
}

struct Tools {
    bench: PathBuf,
    lib_dir: PathBuf,
}

/// Builds `ferroce-coll-bench` with the rdma-core feature and ferroce's
/// libibverbs.so.1, once per test process.
fn tools() -> &'static Tools {
    static T: OnceLock<Tools> = OnceLock::new();
    T.get_or_init(|| {
        let started = Instant::now();
        // The interop harness's builds: one cargo command for every release tool the tests
        // run, so this test and the interop tests share one build.
        let bench = host::coll_bench_bin().expect("build ferroce-coll-bench (rdma-core)");
        let linker = host::libibverbs_tool().expect("build ferroce-libibverbs");
        // Its own folder: another test binary may link its copy at the same time.
        let lib_dir = linker.with_file_name("coll-rdma-core-libibverbs");
        let out = Command::new(&linker)
            .arg(&lib_dir)
            .output()
            .expect("run ferroce-libibverbs");
        assert!(
            out.status.success(),
            "linking libibverbs.so.1 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "rdma-core bench and libibverbs ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Tools { bench, lib_dir }
    })
}

/// How a rank reaches the network.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stack {
    /// rdma-core's API (this crate's rdma-core backend) over ferroce's libibverbs.
    RdmaCore,
    /// ferroce-verbs directly (`--fabric env`).
    Ferroce,
}

/// Rank `i` of `n` in host `i` of `topo`, on `stack`, master at host 0.
fn rank_command(topo: &Topology, n: usize, i: usize, stack: Stack, bench_args: &[&str]) -> Command {
    let t = tools();
    let mut c = topo.command(i, t.bench.to_str().expect("utf-8 path"));
    c.args(bench_args)
        .env("RANK", i.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", topo.host(0).ipv4.to_string())
        .env("MASTER_PORT", MASTER_PORT)
        .env("FERROCE_BOOTSTRAP_TIMEOUT", "60")
        .stdin(Stdio::null());
    match stack {
        Stack::RdmaCore => c
            .args(["--fabric", "rdma-core"])
            .env("LD_LIBRARY_PATH", &t.lib_dir)
            .env("FERROCE_DEVICE", &topo.host(i).ifname)
            .env("FERROCE_BACKEND", BACKEND),
        Stack::Ferroce => c
            .args(["--fabric", "env", "--backend", BACKEND])
            .env("FERROCE_IFACE", &topo.host(i).ifname),
    };
    c
}

/// Runs one job, rank `i` in host `i` on `stacks[i]`; returns rank 0's stdout.
fn job(tag: &str, stacks: &[Stack], bench_args: &[&str]) -> String {
    let n = stacks.len();
    let topo = Topology::up(&TopologyConfig {
        hosts: n,
        bridge: n > 2,
        tag: Some(tag.into()),
        ..TopologyConfig::default()
    })
    .expect("netns topology");
    let children: Vec<Child> = stacks
        .iter()
        .enumerate()
        .rev() // workers first; rank 0 (the master) waits for them anyway
        .map(|(i, &s)| {
            rank_command(&topo, n, i, s, bench_args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let deadline = Instant::now() + JOB_TIMEOUT;
    let outs: Vec<(Output, bool)> = children
        .into_iter()
        .map(|c| wait(c, deadline))
        .rev()
        .collect();
    for (i, (o, timed_out)) in outs.iter().enumerate() {
        assert!(
            !timed_out && o.status.success(),
            "{tag}: rank {i} ({:?}) {}: {}\n{}",
            stacks[i],
            if *timed_out {
                "timed out".to_string()
            } else {
                o.status.to_string()
            },
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    String::from_utf8_lossy(&outs[0].0.stdout).into_owned()
}

fn wait(mut child: Child, deadline: Instant) -> (Output, bool) {
    let mut timed_out = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                timed_out = true;
                let _ = child.kill();
                break;
            }
        }
    }
    (child.wait_with_output().expect("wait"), timed_out)
}

/// The table rows of a bench output: (size, #wrong).
fn rows(out: &str) -> Vec<(u64, u64)> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() != 8 {
                return None;
            }
            Some((w[0].parse().ok()?, w[7].parse().ok()?))
        })
        .collect()
}

/// Every size from 8 B to 1 MiB (×8) ran, with no wrong element.
fn check_table(what: &str, out: &str) {
    let r = rows(out);
    let sizes: Vec<u64> = r.iter().map(|x| x.0).collect();
    assert_eq!(
        sizes,
        vec![8, 64, 512, 4096, 32768, 262_144],
        "{what}: sizes run\n{out}"
    );
    assert!(r.iter().all(|x| x.1 == 0), "{what}: wrong elements\n{out}");
    eprintln!("{what}: {} sizes, #wrong 0", r.len());
}

const SIZES: [&str; 8] = ["-b", "8", "-e", "1M", "-f", "8", "-w", "1"];

fn bench_args<'a>(op: &'a str, dtype: &'a str, redop: &'a str) -> Vec<&'a str> {
    let mut a = vec![op, "-d", dtype, "-o", redop, "-i", "3"];
    a.extend_from_slice(&SIZES);
    a
}

#[test]
fn allreduce_over_rdma_core_2_3_4_ranks() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIP allreduce_over_rdma_core_2_3_4_ranks: {why}");
        return;
    }
    // Recursive doubling (2, 4), the fold onto a power of two (3), Rabenseifner (4):
    // small sizes take the first, large ones the second.
    for (n, dtype, redop) in [
        (2, "float", "sum"),
        (3, "int32", "max"),
        (4, "bfloat16", "sum"),
    ] {
        let stacks = vec![Stack::RdmaCore; n];
        let out = job(
            &format!("crc{n}"),
            &stacks,
            &bench_args("allreduce", dtype, redop),
        );
        check_table(&format!("{n} rdma-core ranks, {dtype} {redop}"), &out);
    }
}

#[test]
fn ferroce_and_rdma_core_ranks_in_one_job() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIP ferroce_and_rdma_core_ranks_in_one_job: {why}");
        return;
    }
    // Alternating, so every ring and recursive-doubling step pairs the two stacks.
    let stacks = [
        Stack::Ferroce,
        Stack::RdmaCore,
        Stack::Ferroce,
        Stack::RdmaCore,
    ];
    let out = job("cmix", &stacks, &bench_args("allreduce", "float", "sum"));
    check_table("2 ferroce + 2 rdma-core ranks, allreduce", &out);
    let out = job("cmix", &stacks, &bench_args("allgather", "int32", "sum"));
    check_table("2 ferroce + 2 rdma-core ranks, allgather", &out);
}

#[test]
fn a_dead_rdma_core_rank_fails_the_others() {
    let test = "a_dead_rdma_core_rank_fails_the_others";
    if let Some(why) = skip_reason() {
        eprintln!("SKIP {test}: {why}");
        return;
    }
    let n = 3;
    let topo = Topology::up(&TopologyConfig {
        hosts: n,
        bridge: true,
        tag: Some("cdead".into()),
        ..TopologyConfig::default()
    })
    .expect("netns topology");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(test);
    std::fs::create_dir_all(&dir).expect("log folder");
    // Far more iterations than fit in the test: only the kill ends it.
    let args = [
        "allreduce",
        "-b",
        "1M",
        "-e",
        "1M",
        "-w",
        "0",
        "-i",
        "1000000",
        "--timeout",
        "5",
    ];
    let mut ranks: Vec<(Child, PathBuf)> = (0..n)
        .rev()
        .map(|i| {
            let err = dir.join(format!("rank{i}.err"));
            let f = std::fs::File::create(&err).expect("log file");
            let child = rank_command(&topo, n, i, Stack::RdmaCore, &args)
                .stdout(Stdio::null())
                .stderr(f)
                .spawn()
                .expect("start a rank");
            (child, err)
        })
        .collect();
    ranks.reverse();
    // Kill rank 2 once rank 0 is inside the timed loop (its progress line).
    let deadline = Instant::now() + JOB_TIMEOUT;
    while !std::fs::read_to_string(&ranks[0].1)
        .unwrap_or_default()
        .contains("# running")
    {
        assert!(Instant::now() < deadline, "rank 0 never started the loop");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (mut dead, _) = ranks.pop().expect("rank 2");
    dead.kill().expect("kill rank 2");
    let _ = dead.wait();
    let killed = Instant::now();
    // The transport's time-out (--timeout 5), or sooner through a
    // retry-exceeded completion; slack for a loaded machine.
    let bound = Duration::from_secs(5 + 15);
    for (i, (child, err)) in ranks.into_iter().enumerate() {
        let (out, timed_out) = wait(child, killed + bound);
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        assert!(
            !timed_out,
            "rank {i} still running {bound:?} after rank 2 died:\n{text}"
        );
        assert!(
            !out.status.success() && text.contains("ferroce-coll-bench:"),
            "rank {i} should fail with an error: {}\n{text}",
            out.status
        );
        let last = text
            .lines()
            .last()
            .unwrap_or_default()
            .trim_start_matches('\r');
        eprintln!(
            "rank {i} failed {:.1} s after the kill: {}",
            killed.elapsed().as_secs_f64(),
            last.rsplit('\r').next().unwrap_or(last)
        );
    }
}
