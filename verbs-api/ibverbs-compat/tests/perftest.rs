//! Debian's perftest 4.5, unmodified, over the ferroce libibverbs.so.1
//! between two network-namespace hosts. Needs root; skips without it.

mod common;

use std::time::Duration;

use common::{backend, can_run, pair, pair_from, topology};

const T: Duration = Duration::from_secs(90);

/// The result row of a perftest report: "<bytes> <iterations> ..." with a
/// non-zero figure at the end.
fn has_result(out: &str, bytes: &str) -> bool {
    out.lines().any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.len() >= 4
            && w[0] == bytes
            && w[1].parse::<u64>().is_ok()
            && w.last()
                .and_then(|x| x.parse::<f64>().ok())
                .is_some_and(|x| x > 0.0)
    })
}

fn run(tag: &str, tool: &str, cases: &[(&[&str], &str)]) {
    if !can_run(tool, &[tool]) {
        return;
    }
    let topo = topology(tag);
    for (args, bytes) in cases {
        // A UDP-backend device sends from the one IPv4 address its socket is
        // bound to: its IPv6 GID (index 2) is refused at set-up (udp_gids.rs).
        if backend() == "udp" && args.windows(2).any(|w| w == ["-x", "2"]) {
            eprintln!("SKIP {tool} {args:?}: the UDP backend has no IPv6 source GID");
            continue;
        }
        let (s, c) = pair(&topo, tool, args, T);
        assert!(
            has_result(&c, bytes) || has_result(&s, bytes),
            "{tool} {args:?}: no result row for {bytes} bytes\n--- client:\n{c}\n--- server:\n{s}"
        );
    }
}

#[test]
fn ib_write_bw() {
    run(
        "cwbw",
        "ib_write_bw",
        &[
            (&["-F", "-x", "1", "-s", "65536", "-n", "2000"], "65536"),
            // GID chosen by perftest itself, the old post-send API, 1 MiB.
            (
                &["-F", "--use_old_post_send", "-s", "1048576", "-n", "200"],
                "1048576",
            ),
            // Several QPs and a post list.
            (
                &[
                    "-F", "-x", "1", "-q", "4", "-l", "4", "-s", "4096", "-n", "2000",
                ],
                "4096",
            ),
        ],
    );
}

/// Server and client on one host, as perftest users often run them: the
/// client reaches the server's address through the kernel's loopback, which
/// a raw backend's device serves through its UDP socket for local peers
/// (`ferroce_nic::local_peers`). Before, the client refused the path.
#[test]
fn ib_write_bw_and_ib_read_bw_on_one_host() {
    if !can_run("one host", &["ib_write_bw", "ib_read_bw"]) {
        return;
    }
    // One interface queue takes one AF_XDP socket in copy mode (veth): the
    // second device on the host gets EBUSY, where `auto` would give it AF_PACKET.
    if backend() == "afxdp" {
        eprintln!("SKIP one host: two AF_XDP devices cannot share veth0's queue");
        return;
    }
    let topo = topology("c1h");
    for tool in ["ib_write_bw", "ib_read_bw"] {
        let args = ["-F", "-x", "1", "-s", "65536", "-n", "1000"];
        let (s, c) = pair_from(&topo, 1, tool, &args, T);
        assert!(
            has_result(&c, "65536") || has_result(&s, "65536"),
            "{tool} on one host: no result row\n--- client:\n{c}\n--- server:\n{s}"
        );
    }
}

#[test]
fn ib_read_bw() {
    run(
        "crbw",
        "ib_read_bw",
        &[
            (&["-F", "-x", "1", "-s", "65536", "-n", "1000"], "65536"),
            (
                &["-F", "-x", "1", "-o", "4", "-s", "1024", "-n", "2000"],
                "1024",
            ),
        ],
    );
}

#[test]
fn ib_send_bw() {
    run(
        "csbw",
        "ib_send_bw",
        &[
            (&["-F", "-x", "1", "-s", "65536", "-n", "1000"], "65536"),
            (
                &["-F", "-x", "1", "-c", "UD", "-s", "1024", "-n", "2000"],
                "1024",
            ),
            // Multicast (-g): to an IPv4 group (as an IPv4-mapped MGID) from
            // the IPv4 GID, and to perftest's default, interface-local MGID
            // (ff01:0:2:c985::) from the IPv6 one.
            (
                &[
                    "-F",
                    "-x",
                    "1",
                    "-c",
                    "UD",
                    "-g",
                    "-M",
                    "0:0:0:0:0:0:0:0:0:0:255:255:239:1:2:3",
                    "-s",
                    "512",
                    "-n",
                    "500",
                ],
                "512",
            ),
            (
                &["-F", "-x", "2", "-c", "UD", "-g", "-s", "512", "-n", "500"],
                "512",
            ),
        ],
    );
}

#[test]
fn ib_atomic_bw() {
    run(
        "cabw",
        "ib_atomic_bw",
        &[
            (&["-F", "-x", "1", "-n", "2000"], "8"),
            (&["-F", "-x", "1", "-A", "CMP_AND_SWAP", "-n", "2000"], "8"),
        ],
    );
}

#[test]
fn ib_send_lat() {
    run(
        "cslat",
        "ib_send_lat",
        &[
            (&["-F", "-x", "1", "-s", "64", "-n", "1000"], "64"),
            // Completion events (ibv_get_cq_event on a channel with two CQs).
            (&["-F", "-x", "1", "-e", "-s", "64", "-n", "500"], "64"),
        ],
    );
}

/// The library against ferroce's own `ferroce bench` (the native API) in
/// both roles: a stock ib_write_bw server with a bench client, a bench
/// READ server with a stock ib_read_bw client.
#[test]
fn against_ferroce_bench() {
    if !can_run("against_ferroce_bench", &["ib_write_bw", "ib_read_bw"]) {
        return;
    }
    let ferroce = match ferroce_interop::host::ferroce_bin() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("SKIP against_ferroce_bench: no ferroce binary: {e}");
            return;
        }
    };
    let topo = topology("cbench");
    let be = common::backend();
    let ferroce = ferroce.to_string_lossy().into_owned();
    let peer = topo.host(1).ipv4.to_string();
    let bench = |host: usize, op: &str, server: Option<&str>| {
        let mut c = topo.command(host, &ferroce);
        c.args([
            "bench",
            op,
            "-d",
            "veth0",
            "--backend",
            &be,
            "-x",
            "1",
            "-s",
            "65536",
            "-n",
            "500",
        ]);
        c.args(server);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let stock = |host: usize, tool: &str, server: Option<&str>| {
        let mut args = vec!["-F", "-x", "1", "-s", "65536", "-n", "500"];
        args.extend(server);
        common::tool(&topo, host, tool, &args)
    };
    for (srv, cli) in [
        (
            stock(1, "ib_write_bw", None),
            bench(0, "write", Some(&peer)),
        ),
        (bench(1, "read", None), stock(0, "ib_read_bw", Some(&peer))),
    ] {
        let (mut srv, mut cli) = (srv, cli);
        let s = srv.spawn().unwrap();
        common::wait_listening(&topo, 1, common::PORT);
        let (c, ct) = common::wait(cli.spawn().unwrap(), T);
        let (s, st) = common::wait(s, Duration::from_secs(15));
        let text = |o: &std::process::Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        let (stext, ctext) = (text(&s), text(&c));
        assert!(
            !ct && !st && s.status.success() && c.status.success(),
            "{srv:?} / {cli:?}\n--- client:\n{ctext}\n--- server:\n{stext}"
        );
        assert!(has_result(&ctext, "65536"), "no result row\n{ctext}");
    }
}
