//! `ferroce bench` options between two processes over the UDP backend on
//! loopback (no privileges needed): `-b` (bidirectional bandwidth) and
//! `-c UC`.

use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

fn bench(args: &[&str], port: u16, server: Option<&str>) -> std::process::Child {
    bench_env(args, port, server, &[])
}

fn bench_env(
    args: &[&str],
    port: u16,
    server: Option<&str>,
    env: &[(&str, &str)],
) -> std::process::Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    c.envs(env.iter().copied());
    c.arg("bench")
        .args(args.iter().filter(|a| **a != TABLE))
        .args(["-d", "lo", "--backend", "udp", "-p"])
        .arg(port.to_string());
    // JSON lines unless the run asks for perftest's bare figures or its table.
    if !args.contains(&"--output") && !args.contains(&TABLE) {
        c.arg("--json");
    }
    if let Some(s) = server {
        c.arg(s);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().expect("run ferroce")
}

/// Among a test's arguments: run without `--json` (perftest's table).
const TABLE: &str = "<table>";

/// One pair at a time: pairs of parallel tests would share 127.0.0.1:4791
/// with this one, and a device joining or leaving mid-run may steer a
/// datagram wrongly (RC resends it; UC, tested here, would lose it).
static ONE_PAIR: Mutex<()> = Mutex::new(());

/// Server and client of one run, however they ended.
fn run_pair(args: &[&str], port: u16) -> (Output, Output) {
    run_pair_env(args, port, &[])
}

fn run_pair_env(args: &[&str], port: u16, env: &[(&str, &str)]) -> (Output, Output) {
    let _one = ONE_PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let srv = bench_env(args, port, None, env);
    // The client retries its connection while the server starts listening.
    std::thread::sleep(Duration::from_millis(300));
    let cli = bench_env(args, port, Some("127.0.0.1"), env);
    let (c, s) = (cli.wait_with_output(), srv.wait_with_output());
    (c.expect("client"), s.expect("server"))
}

/// Server and client of one run; both must exit 0.
fn pair(args: &[&str], port: u16) -> (Output, Output) {
    pair_env(args, port, &[])
}

/// [`pair`] with settings for both processes' environment.
fn pair_env(args: &[&str], port: u16, env: &[(&str, &str)]) -> (Output, Output) {
    let (c, s) = run_pair_env(args, port, env);
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(
            o.status.success(),
            "{who} of `bench {}` failed: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    (c, s)
}

fn lines(o: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON result line"))
        .collect()
}

fn port(offset: u16) -> u16 {
    // Apart from other test binaries' exchanges running at the same time.
    20_000 + (std::process::id() % 20_000) as u16 + offset
}

/// Each side runs its own direction and prints the sum: one's local figure
/// is the other's remote one (the reports crossed as perftest's do), and
/// the data each side wrote or read checked out.
#[test]
fn bidirectional_runs_report_the_sum_of_both_directions() {
    for (i, args) in [
        &["write", "-b", "-s", "4096", "-n", "500"][..],
        &["read", "-b", "-s", "65536", "-n", "200"][..],
        // Every size: a barrier before each and a report after each.
        &["write", "-b", "-a", "-n", "20"][..],
        // Each side sends and receives at once (its own CQ for each).
        &["send", "-b", "-s", "8192", "-n", "300"][..],
        &["send", "-b", "-a", "-n", "20"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair(args, port(i as u16));
        let (cl, sl) = (lines(&c), lines(&s));
        let sizes = if args.contains(&"-a") { 23 } else { 1 };
        assert_eq!((cl.len(), sl.len()), (sizes, sizes), "{args:?}");
        for (x, y) in cl.iter().zip(&sl) {
            assert_eq!(x["test"], y["test"]);
            assert!(x["test"].as_str().unwrap().contains("Bidirectional BW"));
            assert_eq!(x["bytes"], y["bytes"]);
            assert_eq!(x["bidirectional"], true);
            // Each side read back what it wrote (WRITE) or checked what it read.
            assert_eq!(x["data_check"], "verified", "{x}");
            assert_eq!(y["data_check"], "verified", "{y}");
            // The reports cross in perftest's unit (MiB/s): equal up to rounding.
            let same = |u: &Value, v: &Value| {
                let (u, v) = (u.as_f64().unwrap(), v.as_f64().unwrap());
                (u - v).abs() <= 1e-9 * u.abs().max(v.abs())
            };
            assert!(
                same(&x["local_bw_mb_s"], &y["remote_bw_mb_s"]),
                "{args:?} {x} {y}"
            );
            assert!(
                same(&x["remote_bw_mb_s"], &y["local_bw_mb_s"]),
                "{args:?} {x} {y}"
            );
            // perftest's column is MiB/s: 10^6 / 2^20 of the SI figure.
            let perftest = x["bw_avg_perftest"].as_f64().unwrap();
            let si = x["bw_mb_s"].as_f64().unwrap();
            assert!((perftest * 1.048576 - si).abs() < 1e-6 * si, "{x}");
            let sum = x["local_bw_mb_s"].as_f64().unwrap() + x["remote_bw_mb_s"].as_f64().unwrap();
            assert!((x["bw_mb_s"].as_f64().unwrap() - sum).abs() < 1e-6 * sum);
            assert!(x["local_bw_mb_s"].as_f64().unwrap() > 0.0);
            assert!(x["remote_bw_mb_s"].as_f64().unwrap() > 0.0);
        }
    }
}

/// Unreliable connection: WRITE and SEND, bandwidth and latency, run to
/// the end with the sizes asked; the SEND receiver checks the data.
#[test]
fn uc_write_and_send_run() {
    for (i, args) in [
        &["write", "-c", "UC", "-s", "65536", "-n", "300"][..],
        &["send", "-c", "UC", "-s", "8192", "-n", "300"][..],
        &["write", "-c", "UC", "--lat", "-s", "8", "-n", "300"][..],
        &["send", "-c", "UC", "--lat", "-s", "8", "-n", "300"][..],
        &["write", "-c", "UC", "-b", "-s", "4096", "-n", "300"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair(args, port(10 + i as u16));
        let (cl, sl) = (lines(&c), lines(&s));
        let want = if args.contains(&"--lat") {
            // ib_*_lat: both sides measure.
            (1, 1)
        } else if args.contains(&"-b") || args[0] == "send" {
            (1, 1)
        } else {
            // A WRITE bandwidth server only serves.
            (1, 0)
        };
        assert_eq!((cl.len(), sl.len()), want, "{args:?}");
        assert_eq!(cl[0]["data_verified"], true, "{args:?}: {}", cl[0]);
        assert_eq!(cl[0]["iterations"], 300, "{args:?}");
        if args[0] == "send" && !args.contains(&"--lat") {
            // The receiver counted every message and found the sender's pattern: nothing
            // lost on loopback, not even at the start (the receives are posted before the
            // sender is let go, and a GSO send that reached the server while it was alone
            // on the port is split after the client joined).
            assert_eq!(
                sl[0]["iterations"],
                300,
                "{}",
                String::from_utf8_lossy(&s.stderr)
            );
            assert_eq!(sl[0]["data_check"], "verified", "{}", sl[0]);
            assert_eq!(sl[0]["data_verified"], true);
        }
    }
}

/// `-c UD`: SEND only, each message one packet (a larger `-s` is cut to the
/// MTU, `-a` stops there), received after its 40-byte GRH: every message
/// arrives and holds the sender's bytes, one way, both ways, and ping-pong.
#[test]
fn ud_send_runs() {
    for (i, (args, size, sizes)) in [
        (
            &["send", "-c", "UD", "-s", "2048", "-n", "300"][..],
            2048,
            1,
        ),
        (
            &["send", "-c", "UD", "-s", "65536", "-n", "300"][..],
            4096,
            1,
        ),
        (&["send", "-c", "UD", "-a", "-n", "50"][..], 4096, 12),
        (
            &["send", "-c", "UD", "-b", "-s", "1024", "-n", "300"][..],
            1024,
            1,
        ),
        (
            &["send", "-c", "UD", "--lat", "-s", "8", "-n", "300"][..],
            8,
            1,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair(args, port(70 + i as u16));
        let (cl, sl) = (lines(&c), lines(&s));
        assert_eq!((cl.len(), sl.len()), (sizes, sizes), "{args:?}");
        let (cl, sl) = (&cl[sizes - 1], &sl[sizes - 1]);
        assert_eq!(cl["bytes"], size, "{args:?}");
        for l in [cl, sl] {
            assert_eq!(l["data_verified"], true, "{args:?}: {l}");
            assert_eq!(
                l["iterations"],
                if sizes > 1 { 50 } else { 300 },
                "{args:?}"
            );
        }
        if !args.contains(&"--lat") {
            // What the receiving side got is the sender's data.
            assert_eq!(sl["data_check"], "verified", "{args:?}: {sl}");
        }
    }
}

/// `-a` for SEND: each size's receives are posted before a hand-shake lets
/// the sender start, and receives left from a smaller size take a larger
/// message (a ping-pong keeps two posted across sizes; they used to fail
/// the next size with a local length error).
#[test]
fn send_all_sizes_run_to_the_end() {
    for (i, args) in [
        &["send", "--lat", "-a", "-n", "5"][..],
        &["send", "-a", "-n", "5"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair(args, port(20 + i as u16));
        let (cl, sl) = (lines(&c), lines(&s));
        assert_eq!((cl.len(), sl.len()), (23, 23), "{args:?}");

        for (x, y) in cl.iter().zip(&sl) {
            assert_eq!(x["bytes"], y["bytes"]);
            assert_eq!(x["iterations"], 5);
            assert_eq!(y["iterations"], 5, "{args:?}: {y}");
            assert_eq!(y["data_verified"], true, "{args:?}: {y}");
            if !args.contains(&"--lat") {
                // The receiver found the sender's pattern at every size.
                assert_eq!(y["data_check"], "verified", "{args:?}: {y}");
            }
        }
    }
}

/// The UDP backend's io_uring multishot receive (`FERROCE_UDP_MULTISHOT=1`)
/// under every kind of run: all sizes to 8 MiB (GRO runs of 64 KiB, more
/// datagrams at once than the ring has buffers), READ, busy-polled SEND
/// latency (the polling thread arms the receive), an engine thread that
/// sleeps between messages. Data checked at every size.
#[test]
fn multishot_receive_carries_every_kind_of_run() {
    let env = [("FERROCE_UDP_MULTISHOT", "1")];
    for (i, args) in [
        &["write", "-a", "-n", "5"][..],
        &["read", "-s", "65536", "-n", "200"][..],
        &["send", "--lat", "--busy-poll", "-s", "8", "-n", "2000"][..],
        &["send", "-s", "100000", "-n", "100"][..],
        &["send", "--lat", "-s", "8", "-n", "200"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair_env(args, port(100 + i as u16), &env);
        for (who, o) in [("server", &s), ("client", &c)] {
            let ls = lines(o);
            // A passive WRITE/READ server reports nothing.
            assert!(who == "server" || !ls.is_empty(), "{args:?}");
            for l in ls {
                assert_eq!(l["data_verified"], true, "{who} {args:?}: {l}");
            }
        }
    }
}

/// perftest command lines carry `-i 1`, `-I`, `-e`: accepted.
#[test]
fn perftest_flags_are_accepted() {
    let args = [
        "write", "-s", "4096", "-n", "200", "-i", "1", "-I", "64", "-e",
    ];
    let (c, _) = pair(&args, port(30));
    assert_eq!(lines(&c)[0]["data_check"], "verified");
}

/// perftest's -Q (CQ moderation), -l (post list) and -r (receive depth):
/// every request still completes and the data checks out, with a
/// moderation that does not divide the count, and a duration run.
#[test]
fn window_flags_keep_every_request() {
    for (i, args) in [
        &[
            "write", "-s", "1024", "-n", "1001", "-Q", "16", "-l", "3", "-t", "64",
        ][..],
        &["read", "-s", "4096", "-n", "500", "-Q", "100", "-t", "128"][..],
        &["send", "-s", "512", "-n", "700", "-Q", "7", "-r", "32"][..],
        &["atomic", "-n", "333", "-Q", "10"][..],
        &["write", "-s", "1024", "-D", "1", "-Q", "50"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair(args, port(80 + i as u16));
        let cl = &lines(&c)[0];
        if let Some(n) = args.iter().position(|a| *a == "-n") {
            assert_eq!(cl["iterations"].to_string(), args[n + 1], "{args:?}");
        }
        assert_eq!(cl["data_verified"], true, "{args:?}: {cl}");
        if args[0] == "send" {
            let sl = &lines(&s)[0];
            assert_eq!(sl["iterations"], 700, "{sl}");
            assert_eq!(sl["data_check"], "verified", "{sl}");
        }
    }
}

/// (TOS, TTL, BTH opcode) of every IPv4 RoCE v2 frame in a pcap.
fn ip_fields(pcap: &std::path::Path) -> Vec<(u8, u8, u8)> {
    let file = std::fs::File::open(pcap).expect("open pcap");
    let mut r = pcap_file::pcap::PcapReader::new(file).expect("a pcap");
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        let d = p.expect("a packet").data;
        // Ethernet, IPv4 (TOS at 1, TTL at 8, protocol at 9), UDP to 4791, BTH.
        let ipv4 = d.get(12..14) == Some(&[0x08, 0x00][..]) && d.get(14) == Some(&0x45);
        if ipv4 && d.get(23) == Some(&17) && d.get(36..38) == Some(&[0x12, 0xb7][..]) {
            v.push((d[15], d[22], d[42]));
        }
    }
    v
}

/// `--tclass` and `-L` reach the wire both ways: what each side received
/// (its pcap holds the headers the kernel reported) carries them, in the
/// WRITEs the server took and in the ACKs the client took; without them,
/// TOS 0 and TTL 64.
#[test]
fn traffic_class_and_hop_limit_reach_the_wire() {
    let dir = std::env::temp_dir().join(format!("ferroce-tclass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (i, (flags, tos, ttl)) in [
        (&["--tclass", "106", "-L", "32"][..], 106u8, 32u8),
        (&[][..], 0, 64),
    ]
    .into_iter()
    .enumerate()
    {
        let (sp, cp) = (
            dir.join(format!("s{i}.pcap")),
            dir.join(format!("c{i}.pcap")),
        );
        let _one = ONE_PAIR.lock().unwrap_or_else(|p| p.into_inner());
        let args = |pcap: &std::path::Path| -> Vec<String> {
            ["write", "-s", "8192", "-n", "50", "--pcap"]
                .iter()
                .map(|s| s.to_string())
                .chain([pcap.display().to_string()])
                .chain(flags.iter().map(|s| s.to_string()))
                .collect()
        };
        let (sa, ca) = (args(&sp), args(&cp));
        let sa: Vec<&str> = sa.iter().map(String::as_str).collect();
        let ca: Vec<&str> = ca.iter().map(String::as_str).collect();
        let srv = bench(&sa, port(40 + i as u16), None);
        std::thread::sleep(Duration::from_millis(300));
        let cli = bench(&ca, port(40 + i as u16), Some("127.0.0.1"));
        let (c, s) = (cli.wait_with_output(), srv.wait_with_output());
        for o in [c.expect("client"), s.expect("server")] {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        let (server, client) = (ip_fields(&sp), ip_fields(&cp));
        // WRITE FIRST/LAST (RC opcodes 6 and 8) reach the server; ACKs (0x11) the client.
        let writes = server.iter().filter(|f| f.2 == 6 || f.2 == 8).count();
        let acks = client.iter().filter(|f| f.2 == 0x11).count();
        assert!(writes >= 100 && acks > 0, "{writes} WRITEs, {acks} ACKs");
        for (who, frames) in [("server", &server), ("client", &client)] {
            for f in frames {
                assert_eq!((f.0, f.1), (tos, ttl), "{who} {flags:?}: opcode {:#x}", f.2);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--output` prints the one figure per size and nothing else, on both
/// sides; `-w`/`-y` fail a run (exit 1, perftest's message) whose figures
/// stay below them and pass one that reaches them.
#[test]
fn output_prints_only_the_figure_and_limits_fail_the_run() {
    let figures = |o: &Output| -> Vec<f64> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| {
                l.parse::<f64>()
                    .unwrap_or_else(|_| panic!("a bare figure: {l:?}"))
            })
            .collect()
    };
    for (i, (args, lines)) in [
        (
            &["write", "-s", "4096", "-n", "200", "--output", "bandwidth"][..],
            1,
        ),
        (
            &["read", "-a", "-n", "20", "--output", "message_rate"][..],
            23,
        ),
        (
            &[
                "send", "--lat", "-s", "8", "-n", "100", "--output", "latency",
            ][..],
            1,
        ),
        (
            &[
                "write", "-s", "4096", "-n", "200", "-w", "0.01", "-y", "0.0001",
            ][..],
            0,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair(args, port(50 + i as u16));
        if lines > 0 {
            let fc = figures(&c);
            assert_eq!(fc.len(), lines, "{args:?}");
            assert!(fc.iter().all(|f| *f > 0.0), "{args:?}: {fc:?}");
            // The server prints the client's figure (ib_write_bw's server
            // does), or its own ping-pong half.
            assert!(!figures(&s).is_empty(), "{args:?}");
        }
    }
    for (i, (args, says)) in [
        (
            &["write", "-s", "4096", "-n", "200", "-w", "1e9"][..],
            "BW result is below bw limit",
        ),
        (
            &["write", "-s", "4096", "-n", "200", "-y", "1e6"][..],
            "Msg rate  is below msg_rate limit",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = run_pair(args, port(60 + i as u16));
        for o in [&c, &s] {
            assert_eq!(o.status.code(), Some(1), "{args:?}");
            assert!(
                String::from_utf8_lossy(&o.stderr).contains(says),
                "{args:?}"
            );
        }
    }
}

/// `-H`/`-U`: every latency sample, sorted (`-U`: first as measured), in
/// perftest's `#, usec` / `i, sample` lines before the result, and in JSON.
#[test]
fn latency_samples_are_listed() {
    let (c, s) = pair(&["send", "--lat", "-s", "8", "-n", "50", "-H"], port(90));
    for o in [&c, &s] {
        let l = &lines(o)[0];
        let v: Vec<f64> = l["samples_us"]
            .as_array()
            .expect("samples_us")
            .iter()
            .map(|x| x.as_f64().expect("a number"))
            .collect();
        // perftest's n − 1: the time from one send to the next.
        assert_eq!(v.len(), 49, "{l}");
        assert!(v.windows(2).all(|w| w[0] <= w[1]), "sorted: {v:?}");
        assert_eq!(v[24], l["t_typical_us"].as_f64().unwrap_or(-1.0), "{l}");
    }
    let (c, _) = pair(
        &[
            "write", "--lat", "-s", "8", "-n", "40", "-U", "--output", "latency",
        ],
        port(91),
    );
    let out = String::from_utf8_lossy(&c.stdout).into_owned();
    let rows: Vec<&str> = out.lines().collect();
    // Two lists of the 39 samples of 40 iterations (as measured, then
    // sorted), each under its header, then the figure.
    const N: usize = 39;
    assert_eq!(rows.len(), 2 * (N + 1) + 1, "{out}");
    assert_eq!((rows[0], rows[N + 1]), ("#, usec", "#, usec"), "{out}");
    let list = |from: usize| -> Vec<f64> {
        rows[from..from + N]
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (n, x) = r.split_once(", ").expect("i, sample");
                assert_eq!(n, (i + 1).to_string());
                x.parse().expect("a sample")
            })
            .collect()
    };
    let (mut measured, sorted) = (list(1), list(N + 2));
    assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "{out}");
    measured.sort_by(|x, y| x.total_cmp(y));
    assert_eq!(measured, sorted);
    assert!(rows[2 * (N + 1)].parse::<f64>().is_ok(), "{out}");
}

/// `--run_infinitely`: the client prints a checked result every -D
/// seconds until it is stopped; the server then ends by itself, exit 0.
#[test]
fn run_infinitely_reports_until_stopped() {
    use std::io::BufRead;
    let _one = ONE_PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let args = ["write", "-s", "65536", "--run_infinitely", "-D", "1"];
    let port = port(95);
    let mut srv = bench(&args, port, None);
    std::thread::sleep(Duration::from_millis(300));
    let mut cli = bench(&args, port, Some("127.0.0.1"));
    let out = cli.stdout.take().expect("client stdout");
    let mut lines_read = std::io::BufReader::new(out).lines();
    for _ in 0..3 {
        let l = lines_read.next().expect("a result line").expect("read");
        let v: Value = serde_json::from_str(&l).expect("JSON");
        assert_eq!(v["data_check"], "verified", "{v}");
        // A period of -D 1 (measured between two clock readings: 0.999999992
        // has been seen).
        assert!(v["seconds"].as_f64().unwrap_or(0.0) >= 0.99, "{v}");
        assert!(v["iterations"].as_u64().unwrap_or(0) > 0, "{v}");
    }
    cli.kill().expect("stop the client");
    let _ = cli.wait();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = srv.try_wait().expect("server") {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not end"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "server: {status}");
}

/// The banner and address lines in perftest 4.5's shape, with `-o` (the
/// outstanding READs each side offers) in both; past the device's limit it is
/// cut to it with perftest's words; `-o` outside READ/atomic is refused.
#[test]
fn outstanding_reads_and_the_perftest_banner() {
    let (c, s) = pair(
        &[TABLE, "read", "-s", "4096", "-n", "200", "-o", "4"],
        port(60),
    );
    for (who, o, depth) in [("client", &c, true), ("server", &s, false)] {
        let out = String::from_utf8_lossy(&o.stdout);
        let has = |l: &str| out.lines().any(|x| x == l);
        for l in [
            "                    RDMA_Read BW Test",
            " Connection type : RC\t\tUsing SRQ      : OFF",
            " CQ Moderation   : 100",
            " Link type       : Ethernet",
            " Outstand reads  : 4",
            " rdma_cm QPs\t : OFF",
            " Data ex. method : Ethernet",
        ] {
            assert!(has(l), "{who}: no line {l:?} in\n{out}");
        }
        assert_eq!(has(" TX depth        : 128"), depth, "{who}:\n{out}");
        // " local address: LID 0000 QPN 0x0011 PSN 0x1b2c3d OUT 0x04 RKey 0x000299 VAddr 0x0056952d600000"
        let addr: Vec<&str> = out.lines().filter(|l| l.contains(" address: ")).collect();
        assert_eq!(addr.len(), 2, "{who}:\n{out}");
        for l in addr {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w[2..5], ["LID", "0000", "QPN"], "{l}");
            assert_eq!(w[8..10], ["OUT", "0x04"], "{l}");
            assert_eq!((w[10], w[11].len(), w[13].len()), ("RKey", 8, 16), "{l}");
        }
        let gid = out.lines().find(|l| l.starts_with(" GID: ")).unwrap_or("");
        // perftest prints the GID's bytes in decimal: an IPv4-mapped one has 255:255.
        let bytes: Vec<&str> = gid.trim_start_matches(" GID: ").split(':').collect();
        assert!(
            bytes.len() == 16
                && bytes
                    .iter()
                    .all(|b| b.len() >= 2 && b.parse::<u8>().is_ok())
                && bytes[10..12] == ["255", "255"],
            "{who}: {gid:?}"
        );
        // The result row: perftest's columns, tabs before the message rate.
        let row = out.lines().find(|l| l.starts_with(" 4096 ")).unwrap_or("");
        assert!(row.starts_with(" 4096       200  "), "{row:?}");
        assert!(row.contains(" \t\t   0."), "{row:?}");
    }
    let (c, _) = pair(&["read", "-s", "8", "-n", "50", "-o", "99"], port(61));
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(
        err.contains("Number of outstanding reads is above max = 16")
            && err.contains("Changing to that max value"),
        "{err}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["bench", "write", "-o", "4", "127.0.0.1"])
        .output()
        .expect("run ferroce");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("Setting Outstanding reads only available on READ verb"));
}

/// perftest's BW peak: measured (at least the average, which is the run as a
/// whole) unless `-N` or a `-D` run; the average in MiB/s as perftest's "MB/sec".
#[test]
fn bandwidth_peak_follows_perftest() {
    for (i, (args, measured)) in [
        (&["write", "-s", "4096", "-n", "500"][..], true),
        (&["write", "-s", "4096", "-n", "500", "-N"][..], false),
        (&["read", "-s", "4096", "-D", "1"][..], false),
    ]
    .into_iter()
    .enumerate()
    {
        let (c, _) = pair(args, port(70 + i as u16));
        let r = &lines(&c)[0];
        let (peak, avg) = (
            r["bw_peak_perftest"].as_f64().unwrap(),
            r["bw_avg_perftest"].as_f64().unwrap(),
        );
        assert!(avg > 0.0, "{args:?}: {r}");
        if measured {
            assert!(peak >= avg * 0.999, "{args:?}: {r}");
        } else {
            assert_eq!(peak, 0.0, "{args:?}: {r}");
        }
        let si = r["bw_mb_s"].as_f64().unwrap();
        assert!((avg * 1.048576 - si).abs() < 1e-6 * si, "{args:?}: {r}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["bench", "send", "--lat", "-N", "127.0.0.1"])
        .output()
        .expect("run ferroce");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("NoPeak only valid for BW tests"));
}

#[test]
fn unsupported_combinations_are_refused() {
    for (args, says) in [
        (&["write", "-b", "--lat"][..], "-b (bidirectional)"),
        (&["write", "-i", "2"][..], "one port, port 1"),
        (&["read", "-c", "UC"][..], "UC has no RDMA READ"),
        (
            &["atomic", "-c", "UC"][..],
            "UC has no RDMA READ or atomics",
        ),
        (&["write", "-c", "UD"][..], "-c UD has only SEND"),
        (
            &["write", "--output", "latency"][..],
            "bandwidth tests can be: bandwidth, message_rate",
        ),
        (
            &["write", "--lat", "--output", "bandwidth"][..],
            "latency tests can be: latency",
        ),
        (&["send", "--lat", "-w", "1"][..], "-w and -y (limits)"),
        (&["write", "-H"][..], "-H and -U (latency samples)"),
        (
            &["send", "--run_infinitely"][..],
            "--run_infinitely runs WRITE",
        ),
        (
            &["write", "--lat", "--run_infinitely"][..],
            "is for bandwidth tests",
        ),
        (
            &["write", "-T", "32"][..],
            "TOS only valid for rdma_cm based QP",
        ),
        (
            &["write", "-R", "-c", "UC"][..],
            "UC is not supported in librdmacm",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
            .arg("bench")
            .args(args)
            .args(["-d", "lo", "--backend", "udp", "127.0.0.1"])
            .output()
            .expect("run ferroce");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// perftest's `-D`: every latency test runs for the duration and prints its
/// duration line (the average and the rate over the window); a bandwidth
/// run's figure covers only the window between the margins (`-f`), and a
/// margin that leaves no window is refused with perftest's words. (A
/// latency `-D` run used to abort: it sized its sample list for u64::MAX
/// iterations.)
#[test]
fn duration_runs_measure_between_the_margins() {
    for (i, args) in [
        &["write", "--lat", "-D", "2"][..],
        &["send", "--lat", "-D", "2"][..],
        &["read", "--lat", "-D", "2"][..],
        &["atomic", "--lat", "-D", "2"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let table = [args, &[TABLE]].concat();
        let (c, s) = pair(&table, port(90 + i as u16));
        let out = String::from_utf8_lossy(&c.stdout);
        assert!(
            out.contains(" #bytes        #iterations       t_avg[usec]    tps average"),
            "{args:?}: {out}"
        );
        let row: Vec<f64> = out
            .lines()
            .rev()
            .find_map(|l| {
                let v: Vec<f64> = l
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                (v.len() == 4).then_some(v)
            })
            .unwrap_or_else(|| panic!("{args:?}: no result row in {out}"));
        let (iters, t_avg, tps) = (row[1], row[2], row[3]);
        assert!(iters > 0.0 && t_avg > 0.0 && tps > 0.0, "{args:?}: {out}");
        // The rate is the iterations over the window: one round trip each,
        // two halves of it for the ping-pongs (send, write).
        let halves = if args[0] == "send" || args[0] == "write" {
            2.0
        } else {
            1.0
        };
        let rate = 1e6 / (t_avg * halves);
        assert!((rate - tps).abs() <= 0.02 * tps, "{args:?}: {out}");
        // Both sides of a ping-pong measure and print.
        if halves == 2.0 {
            assert!(String::from_utf8_lossy(&s.stdout).contains("tps average"));
        }
    }
    // A 3 s run with 1 s margins measures one second; without -f the margin
    // is a quarter of the duration (0 s of a 1 s run). A SEND run's
    // receiver measures its own window too, and keeps receiving after it
    // until the sender (on its own clock) is done.
    for (i, (args, window)) in [
        (&["write", "-s", "4096", "-D", "3", "-f", "1"][..], 1.0),
        (&["write", "-s", "4096", "-D", "1"][..], 1.0),
        (&["send", "-s", "4096", "-D", "3", "-f", "1"][..], 1.0),
        (&["send", "-b", "-s", "4096", "-D", "1"][..], 1.0),
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pair(args, port(95 + i as u16));
        for (who, o) in [("client", &c), ("server", &s)] {
            let Some(r) = lines(o).into_iter().next() else {
                // A passive WRITE server prints no JSON line of its own.
                assert_eq!(args[0], "write", "{who} {args:?}: no result");
                continue;
            };
            let secs = r["seconds"].as_f64().unwrap();
            assert!(
                (window * 0.9..window * 1.3).contains(&secs),
                "{who} {args:?}: {r}"
            );
            assert!(r["iterations"].as_u64().unwrap() > 0, "{who} {args:?}: {r}");
            assert_eq!(r["data_verified"], true, "{who} {args:?}: {r}");
        }
    }
    let o = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["bench", "write", "-D", "4", "-f", "2", "127.0.0.1"])
        .output()
        .expect("run ferroce");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("please check that DURATION > 2*MARGIN"));
}
