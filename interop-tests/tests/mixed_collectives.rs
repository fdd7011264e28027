//! One communicator across two RoCE v2 stacks (issue 7): a 4-rank allreduce where ranks 0 and 2
//! are ferroce (ferroce-verbs, UDP backend, on the host side of the lab bridge: `veth-h`,
//! 10.77.0.1 and a second address 10.77.0.2) and ranks 1 and 3 are rdma-core ranks on Linux rxe
//! (`rxe0`) in two VMs. Every rank runs the same `ferroce-coll-bench` (built with the `rdma-core`
//! feature, shared into the VMs over 9p like the `speed` subcommand's ferroce): `--fabric env` on
//! the host, `--fabric rdma-core` in the VMs, where it `dlopen`s the VM's libibverbs and rxe
//! provider. The ranks meet at a TCP rendezvous at rank 0 (10.77.0.1); ranks alternate between
//! the stacks so every ring and recursive-doubling step crosses between ferroce and rxe.
//!
//! Checks: every rank exits 0 and rank 0's table shows every size with `#wrong` 0 (each result
//! element compared with a reference), for a float sum and an int32 max (the ring at 1 MiB+).
//!
//! Skips (passing, with a message) when not root, without QEMU, when the VM image cannot be
//! built or when the bench cannot be built (cmake missing). Slow under TCG: small sizes, few
//! iterations; this checks function, not speed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferroce_interop::host::{coll_bench_bin, HostJob};
use ferroce_interop::matrix::{write_section, Row, Verdict};
use ferroce_interop::vm::{self, Output, RxeLab};

const MASTER_PORT: u16 = 29531;
/// The host side's second address (rank 2), on `veth-h` next to the lab's 10.77.0.1.
const HOST2: &str = "10.77.0.2";
/// Per job: rxe under TCG moves a few MB/s.
const JOB_TIMEOUT: Duration = Duration::from_secs(100);

/// Rank `r`'s place: the host (ferroce, bound to this address) or a VM (rxe).
#[derive(Clone, Copy, Debug)]
enum Place {
    Host(&'static str),
    Vm(usize),
}

const PLACES: [Place; 4] = [
    Place::Host("10.77.0.1"),
    Place::Vm(0),
    Place::Host(HOST2),
    Place::Vm(1),
];

enum Job {
    Host(HostJob),
    Vm(ferroce_interop::vm::VmJob),
}

fn run_job(lab: &RxeLab, bench: &PathBuf, dir: &std::path::Path, args: &[&str]) -> Vec<Output> {
    let n = PLACES.len();
    let master = match PLACES[0] {
        Place::Host(a) => a,
        Place::Vm(_) => unreachable!("rank 0 is on the host"),
    };
    let env = |r: usize| {
        vec![
            ("RANK", r.to_string()),
            ("WORLD_SIZE", n.to_string()),
            ("MASTER_ADDR", master.to_string()),
            ("MASTER_PORT", MASTER_PORT.to_string()),
            ("FERROCE_BOOTSTRAP_TIMEOUT", "90".to_string()),
            ("FERROCE_COLL_STATS", "1".to_string()),
        ]
    };
    // Workers first (rank 0 listens, the others retry until it does).
    let mut jobs: Vec<(usize, Job)> = Vec::new();
    for r in (0..n).rev() {
        let job = match PLACES[r] {
            Place::Vm(v) => {
                let vars: String = env(r)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v} "))
                    .collect();
                let cmd = format!(
                    "{vars}FERROCE_IBV_DEVICE=rxe0 /mnt/host/ferroce-coll-bench {} --fabric rdma-core",
                    args.join(" ")
                );
                Job::Vm(lab.vm(v).spawn(&cmd).expect("start a VM rank"))
            }
            Place::Host(addr) => {
                let mut cmd = lab.command(bench);
                cmd.args(args)
                    .args(["--fabric", "env", "--backend", "udp"])
                    .env("FERROCE_IFACE", lab.host_iface())
                    .env("FERROCE_UDP_BIND", addr);
                for (k, v) in env(r) {
                    cmd.env(k, v);
                }
                Job::Host(HostJob::spawn(cmd, dir, &format!("rank{r}")).expect("start a host rank"))
            }
        };
        jobs.push((r, job));
    }
    let deadline = Instant::now() + JOB_TIMEOUT;
    let mut outs: Vec<(usize, Output)> = jobs
        .into_iter()
        .map(|(r, j)| {
            let left = deadline.saturating_duration_since(Instant::now());
            let out = match j {
                Job::Host(h) => h.wait_timeout(left.max(Duration::from_secs(1))),
                Job::Vm(v) => v
                    .wait_timeout(left.max(Duration::from_secs(1)))
                    .unwrap_or_else(|e| Output {
                        status: -1,
                        stdout: Vec::new(),
                        stderr: e.to_string().into_bytes(),
                    }),
            };
            (r, out)
        })
        .collect();
    outs.sort_by_key(|(r, _)| *r);
    outs.into_iter().map(|(_, o)| o).collect()
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

#[test]
fn mixed_ferroce_rxe_allreduce_4_ranks() {
    let test = "mixed_ferroce_rxe_allreduce_4_ranks";
    if let Some(why) = vm::skip_reason() {
        eprintln!("SKIP {test}: {why}");
        return;
    }
    let bench = match coll_bench_bin() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("SKIP {test}: no ferroce-coll-bench with the rdma-core feature: {e}");
            return;
        }
    };
    let started = Instant::now();
    let lab = RxeLab::new(2).expect("boot two rxe VMs");
    eprintln!(
        "{test}: VMs ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for v in lab.vms() {
        std::fs::copy(&bench, v.share_dir().join("ferroce-coll-bench"))
            .expect("copy the bench into the VM share");
    }
    let st = lab
        .command("ip")
        .args([
            "addr",
            "add",
            &format!("{HOST2}/24"),
            "dev",
            lab.host_iface(),
        ])
        .status()
        .expect("ip addr add");
    assert!(st.success(), "adding {HOST2} to {}", lab.host_iface());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mixed-collectives");
    let _ = std::fs::remove_dir_all(&dir);
    // Small sizes for recursive doubling, 64 KiB+ for Rabenseifner (4 ranks), 1 MiB+ the ring
    // (int32 max with the ring forced); -f 8 keeps the count low under TCG.
    let cases: [(&str, &[&str]); 2] = [
        (
            "allreduce float sum",
            &[
                "allreduce",
                "-d",
                "float",
                "-o",
                "sum",
                "-b",
                "8",
                "-e",
                "256K",
                "-f",
                "8",
                "-w",
                "1",
                "-i",
                "2",
            ],
        ),
        (
            "allreduce int32 max, ring",
            &[
                "allreduce",
                "-d",
                "int32",
                "-o",
                "max",
                "--algo",
                "ring",
                "-b",
                "4K",
                "-e",
                "1M",
                "-f",
                "16",
                "-w",
                "1",
                "-i",
                "2",
            ],
        ),
    ];
    let mut failures = Vec::new();
    let mut results = Vec::new();
    for (what, args) in cases {
        let t0 = Instant::now();
        let outs = run_job(&lab, &bench, &dir, args);
        let mut ok = true;
        for (r, o) in outs.iter().enumerate() {
            if o.status != 0 {
                ok = false;
                failures.push(format!(
                    "{what}: rank {r} ({:?}) exited {}:\n{}\n{}",
                    PLACES[r],
                    o.status,
                    o.stdout_str(),
                    o.stderr_str()
                ));
            }
        }
        let table = outs.first().map(Output::stdout_str).unwrap_or_default();
        let r = rows(&table);
        let right = !r.is_empty() && r.iter().all(|x| x.1 == 0);
        if ok && !right {
            failures.push(format!("{what}: wrong results or no rows:\n{table}"));
        }
        let sizes = match (r.first(), r.last()) {
            (Some(a), Some(b)) => format!("{} B – {} B", a.0, b.0),
            _ => "no sizes".into(),
        };
        results.push(Row {
            peer: "ferroce-coll-bench --fabric rdma-core (rxe0, 2 VMs)".into(),
            operation: format!("{what}, 4 ranks, {sizes}"),
            direction: "ferroce ⇄ rxe in one communicator (ranks 0, 2 host; 1, 3 VMs)".into(),
            params: "ferroce UDP backend on veth-h (10.77.0.1, .2); RoCE v2 IPv4-mapped GIDs; \
                     path MTU 4096"
                .into(),
            verdict: if ok && right {
                Verdict::Pass
            } else {
                Verdict::Fail
            },
            seconds: t0.elapsed().as_secs_f64(),
            note: if ok && right {
                format!("{} sizes, #wrong 0 at each", r.len())
            } else {
                "see the test output".into()
            },
        });
        eprintln!(
            "{test}: {what}: {} sizes in {:.1} s, #wrong {:?}\n{table}",
            r.len(),
            t0.elapsed().as_secs_f64(),
            r.iter().map(|x| x.1).collect::<Vec<_>>()
        );
        for (r, o) in outs.iter().enumerate() {
            for l in o.stderr_str().lines().filter(|l| l.starts_with("# rank")) {
                eprintln!("  rank {r} ({:?}): {l}", PLACES[r]);
            }
        }
    }
    let intro = "## Collectives: ferroce and rxe ranks in one job\n\n\
        `tests/mixed_collectives.rs`: a 4-rank `ferroce-coll-bench allreduce`, ranks 0 and 2 on \
        ferroce (host side, `--fabric env`), ranks 1 and 3 on rxe through rdma-core's libibverbs \
        (`--fabric rdma-core`, feature `rdma-core`) in two VMs; every result element checked.";
    write_section(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("RESULTS.md"),
        "collectives",
        intro,
        &results,
    )
    .expect("write RESULTS.md");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("{test}: done in {:.1} s", started.elapsed().as_secs_f64());
}
