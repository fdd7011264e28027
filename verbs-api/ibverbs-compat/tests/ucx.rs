//! UCX (Debian's ucx-utils 1.13) and Open MPI over UCX, unmodified, over the
//! ferroce libibverbs.so.1 between two network-namespace hosts. Needs root,
//! ucx-utils (and openmpi-bin + libopenmpi-dev for the MPI test); skips
//! without them.
//!
//! UCX takes an RDMA device only if `/dev/infiniband/<dev_name>` is a
//! character device it may open (it only stats it): each tool runs in a
//! mount namespace of its own where a tmpfs on `/dev/infiniband` holds
//! `uverbs_ferroce0`, an alias of `/dev/null` (the README shows the same
//! for a host).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use common::{backend, can_run, lib_dir, serve_and_run, wait};
use ferroce_nic::netns::Topology;

const T: Duration = Duration::from_secs(90);
/// ucx_perftest's out-of-band TCP port (its default).
const UCX_PORT: u16 = 13337;
/// In a private mount namespace: the device node UCX looks for, then the tool.
const WITH_NODE: &str = "mount -t tmpfs none /dev/infiniband && \
     mknod -m 666 /dev/infiniband/uverbs_ferroce0 c 1 3 && exec \"$@\"";

/// One test at a time: they share `/dev/infiniband` (created if missing).
static SERIAL: Mutex<()> = Mutex::new(());

fn ucx_ready(test: &str, tools: &[&str]) -> bool {
    if !can_run(test, tools) {
        return false;
    }
    if let Err(e) = std::fs::create_dir_all("/dev/infiniband") {
        eprintln!("SKIP {test}: cannot create /dev/infiniband: {e}");
        return false;
    }
    true
}

fn topology(tag: &str) -> Topology {
    common::topology(tag)
}

/// The argv that runs `program args` in host `i`'s namespace, in a mount
/// namespace with the device node.
fn in_host(topo: &Topology, i: usize, program: &str, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "ip",
        "netns",
        "exec",
        &topo.host(i).ns,
        "unshare",
        "-m",
        "sh",
        "-c",
        WITH_NODE,
        "sh",
        program,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

fn ucx_command(topo: &Topology, i: usize, program: &str, args: &[&str]) -> Command {
    let argv = in_host(topo, i, program, args);
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..])
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FERROCE_DEVICE", &topo.host(i).ifname)
        .env("FERROCE_BACKEND", backend())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A ucx_perftest server on host 1 and client on host 0 with `args` (and
/// `env` on both); both must exit 0. Returns the client's output.
fn perftest(topo: &Topology, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut server = ucx_command(topo, 1, "ucx_perftest", &[]);
    server.envs(env.iter().copied());
    let ip = topo.host(1).ipv4.to_string();
    let mut cargs = vec![ip.as_str()];
    cargs.extend_from_slice(args);
    let mut client = ucx_command(topo, 0, "ucx_perftest", &cargs);
    client.envs(env.iter().copied());
    let what = format!("ucx_perftest {env:?} {args:?}");
    let (_, ctext) = serve_and_run(topo, server, UCX_PORT, client, T, &what);
    assert!(ctext.contains("Final:"), "{args:?}: {ctext}");
    ctext
}

#[test]
fn ucx_finds_the_ferroce_device_and_its_transports() {
    if !ucx_ready("ucx_info", &["ucx_info"]) {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = topology("cucx");
    let out = ucx_command(&topo, 0, "ucx_info", &["-d"])
        .output()
        .expect("ucx_info");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "Memory domain: ferroce_veth0",
        "Transport: rc_verbs",
        "Transport: ud_verbs",
        "Device: ferroce_veth0:1",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
}

#[test]
fn ucx_perftest_over_rc_and_ud_verbs() {
    if !ucx_ready("ucx_perftest", &["ucx_perftest"]) {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = topology("cucp");
    let dev = ["-d", "ferroce_veth0:1"];
    // Transport level: RDMA WRITE (put), READ (get), 64-bit atomics, SENDs, UD datagrams
    // (UCX checks each one's GRH area against the RoCE packet type in wc.sl).
    for (tl, test, extra) in [
        ("rc_verbs", "put_lat", &["-n", "2000"][..]),
        (
            "rc_verbs",
            "put_bw",
            &["-D", "zcopy", "-s", "65536", "-n", "500"][..],
        ),
        (
            "rc_verbs",
            "get",
            &["-D", "zcopy", "-s", "65536", "-n", "500"][..],
        ),
        ("rc_verbs", "fadd", &["-n", "1000"][..]),
        ("rc_verbs", "cswap", &["-n", "1000"][..]),
        ("rc_verbs", "am_lat", &["-n", "2000"][..]),
        ("ud_verbs", "am_lat", &["-n", "2000"][..]),
        (
            "ud_verbs",
            "am_bw",
            &["-D", "bcopy", "-s", "1024", "-n", "2000"][..],
        ),
    ] {
        let mut args = vec!["-x", tl, "-t", test];
        args.extend_from_slice(&dev);
        args.extend_from_slice(extra);
        perftest(&topo, &[], &args);
    }
    // Protocol level (what MPI uses): tag matching, eager and rendezvous
    // (1 MiB goes by RDMA READ), connections wired up over UD, events on
    // the completion channels.
    let tls = [
        ("UCX_TLS", "rc_verbs,ud_verbs"),
        ("UCX_NET_DEVICES", "ferroce_veth0:1"),
    ];
    perftest(&topo, &tls, &["-t", "tag_lat", "-n", "2000"]);
    perftest(&topo, &tls, &["-t", "tag_bw", "-s", "1048576", "-n", "200"]);
}

#[test]
fn open_mpi_allreduce_over_ucx() {
    if !ucx_ready("Open MPI over UCX", &["mpirun", "mpicc", "ucx_info"]) {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = topology("cmpi");
    let work = std::env::temp_dir().join(format!("ferroce-mpi-ucx-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("temp dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mpi-allreduce.c");
    let bin = work.join("mpi-allreduce");
    let cc = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("mpicc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    // mpirun forks both ranks in host 0's namespace; the wrapper moves rank
    // r into host r's, in a mount namespace with the device node. Each rank
    // reaches mpirun's PMIx server over the veth link.
    let wrapper = work.join("rank.sh");
    let mut script = String::from("#!/bin/sh\ncase $OMPI_COMM_WORLD_RANK in\n");
    for i in 0..2 {
        script += &format!("{i}) ns={} ;;\n", topo.host(i).ns);
    }
    script +=
        &format!("esac\nexec ip netns exec \"$ns\" unshare -m sh -c '{WITH_NODE}' sh \"$@\"\n");
    std::fs::write(&wrapper, script).expect("wrapper");
    let chmod = Command::new("chmod").arg("+x").arg(&wrapper).status();
    assert!(chmod.is_ok_and(|s| s.success()));
    let ifname = topo.host(0).ifname.clone();
    let lib = lib_dir().display().to_string();
    let mut mpirun = topo.command(0, "mpirun");
    mpirun
        .env("PMIX_MCA_ptl_tcp_remote_connections", "1")
        .env("PMIX_MCA_ptl_tcp_if_include", &ifname)
        .args(["--allow-run-as-root", "-np", "2", "--bind-to", "none"])
        .args(["--mca", "pml", "ucx", "--mca", "btl", "^openib,tcp"])
        .args(["--mca", "oob_tcp_if_include", &ifname])
        .args(["-x", &format!("LD_LIBRARY_PATH={lib}")])
        .args(["-x", &format!("FERROCE_DEVICE={ifname}")])
        .args(["-x", &format!("FERROCE_BACKEND={}", backend())])
        .args(["-x", "UCX_TLS=rc_verbs,ud_verbs,self"])
        .args(["-x", "UCX_NET_DEVICES=ferroce_veth0:1"])
        .arg(&wrapper)
        .arg(&bin)
        // 8 B to 4 MiB by 16, 2 warm-up and 10 timed iterations.
        .args(["8", "4194304", "16", "2", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (out, timed_out) = wait(
        mpirun.spawn().expect("spawn mpirun"),
        Duration::from_secs(180),
    );
    let _ = std::fs::remove_dir_all(&work);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !timed_out && out.status.success(),
        "mpirun {}{}:\n{text}\n{err}",
        out.status,
        if timed_out { " timed out" } else { "" }
    );
    // size count time algbw busbw #wrong: every size, every result right.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 6)
        .collect();
    let sizes: Vec<&str> = rows.iter().map(|f| f[0]).collect();
    assert_eq!(sizes, ["8", "128", "2048", "32768", "524288"], "{text}");
    assert!(rows.iter().all(|f| f[5] == "0"), "wrong results:\n{text}");
}
