//! Debian's perftest 4.5, unmodified, over the ferroce libibverbs.so.1
//! between two network-namespace hosts. Needs root; skips without it.

mod common;

use std::time::Duration;

use common::{can_run, pair, topology};

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
