//! Debian's rdmacm-utils and perftest's `-R`, unmodified, over ferroce's
//! librdmacm.so.1 and libibverbs.so.1 between two processes on loopback
//! (the UDP backend on `lo`, which needs no root): each tool's server and
//! client, checked by what the tools print and their exit status. The same
//! tools meet rxe's kernel CM in the interop tests.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Every tool installed and the headers to build the library; else say why.
fn can_run(test: &str, tools: &[&str]) -> bool {
    for t in tools {
        if !Path::new("/usr/bin").join(t).exists() {
            eprintln!("SKIP {test}: /usr/bin/{t} is not installed (rdmacm-utils / perftest)");
            return false;
        }
    }
    for h in ["infiniband/verbs.h", "rdma/rdma_cma.h"] {
        if !Path::new("/usr/include").join(h).exists() {
            eprintln!("SKIP {test}: /usr/include/{h} is missing (libibverbs-dev / librdmacm-dev)");
            return false;
        }
    }
    true
}

/// `line` run over the drop-in libraries on loopback.
fn tool(line: &str) -> Command {
    let mut words = line.split_whitespace();
    let mut c = Command::new(words.next().unwrap_or_default());
    c.args(words)
        .env("LD_LIBRARY_PATH", common::lib_dir())
        .env("FERROCE_DEVICE", "lo")
        .env("FERROCE_BACKEND", "udp")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Starts `server`, then `client` once the server has had time to listen
/// (rdma_cm listens on no TCP port); both must exit 0. Returns their output.
fn pair(server: &str, client: &str) -> (String, String) {
    let s = tool(server).spawn().expect("spawn server");
    std::thread::sleep(Duration::from_millis(1500));
    let c = tool(client).spawn().expect("spawn client");
    let (c, ct) = common::wait(c, Duration::from_secs(60));
    let (s, st) = common::wait(s, Duration::from_secs(20));
    let (stext, ctext) = (text(&s), text(&c));
    assert!(
        !ct && !st && c.status.success() && s.status.success(),
        "{server} / {client}: client {}{}, server {}{}\n--- client:\n{ctext}\n--- server:\n{stext}",
        c.status,
        if ct { " (timed out)" } else { "" },
        s.status,
        if st { " (timed out)" } else { "" },
    );
    (stext, ctext)
}

/// What a tool printed, stdout then stderr.
fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `line` alone (at most `timeout`): its output, whether it timed
/// out, and what it printed.
fn run_alone(line: &str, timeout: Duration) -> (std::process::Output, bool, String) {
    let (out, timed_out) = common::wait(tool(line).spawn().expect("spawn"), timeout);
    let t = text(&out);
    (out, timed_out, t)
}

/// One test: the cases share UDP port 4791 on `lo`, whose first device
/// takes connection requests, so they run one after another.
#[test]
fn rdmacm_tools_on_loopback() {
    let tools = [
        "rping",
        "ucmatose",
        "udaddy",
        "mckey",
        "rdma_server",
        "rdma_client",
        "ib_send_bw",
        "ib_write_bw",
        "cmtime",
    ];
    if !can_run("rdmacm_tools_on_loopback", &tools) {
        return;
    }
    // rping: per ping an RDMA READ of the client's buffer and a WRITE back,
    // checked by the client (-V).
    let (s, c) = pair(
        "rping -s -a 127.0.0.1 -p 7180 -v -C 5",
        "rping -c -a 127.0.0.1 -p 7180 -v -V -C 5",
    );
    assert_eq!(
        s.lines()
            .filter(|l| l.starts_with("server ping data: rdma-ping-"))
            .count(),
        5,
        "{s}"
    );
    assert_eq!(
        c.lines()
            .filter(|l| l.starts_with("ping data: rdma-ping-"))
            .count(),
        5,
        "{c}"
    );
    // The same with QPs each program makes and moves itself
    // (rdma_init_qp_attr, rdma_accept naming the QP, rdma_establish).
    let (s, c) = pair(
        "rping -s -q -a 127.0.0.1 -p 7185 -v -C 3",
        "rping -c -q -a 127.0.0.1 -p 7185 -v -V -C 3",
    );
    assert!(s.contains("server ping data: rdma-ping-2"), "{s}");
    assert!(c.contains("ping data: rdma-ping-2"), "{c}");
    // Two RC connections, 5 SENDs each way on each; the server disconnects.
    let (s, c) = pair(
        "ucmatose -p 7181 -c 2 -C 5 -S 2000",
        "ucmatose -s 127.0.0.1 -p 7181 -c 2 -C 5 -S 2000 -t 106",
    );
    for t in [&s, &c] {
        assert!(
            t.contains("data transfers complete") && t.contains("return status 0"),
            "{t}"
        );
    }
    assert!(s.contains("disconnected"), "{s}");
    // UD: SIDR names the server's QP; the server answers each message at
    // the QPN its immediate carries, with the Q_Key its QP reports (udaddy's
    // -p is its port space: it serves port 7174).
    let (s, c) = pair("udaddy -C 5 -S 1000", "udaddy -s 127.0.0.1 -C 5 -S 1000");
    for t in [&s, &c] {
        assert!(
            t.contains("data transfers complete") && t.contains("return status 0"),
            "{t}"
        );
    }
    // librdmacm's synchronous API: rdma_create_ep, rdma_get_request.
    let (s, c) = pair(
        "rdma_server -s 127.0.0.1 -p 7183",
        "rdma_client -s 127.0.0.1 -p 7183",
    );
    assert!(s.contains("rdma_server: end 0"), "{s}");
    assert!(c.contains("rdma_client: end 0"), "{c}");
    // Multicast: two receiving QPs joined, 5 messages to the group.
    let (s, c) = pair(
        "mckey -m 239.8.1.1 -b 127.0.0.1 -c 2 -C 5 -S 1000",
        "mckey -s -m 239.8.1.1 -b 127.0.0.1 -C 5 -S 1000",
    );
    for t in [&s, &c] {
        assert!(
            t.contains("mckey: joined dgid: ::ffff:239.8.1.1 mlid 0x0 sl 0")
                && t.contains("return status 0"),
            "{t}"
        );
    }
    // perftest over rdma_cm: the program opens the device itself too (one
    // ferroce device in the process), RC and UD.
    for (t, args) in [
        ("ib_write_bw", "-R -s 65536 -n 200 -F"),
        ("ib_send_bw", "-R -c UD -s 1024 -n 200 -F"),
    ] {
        let (s, c) = pair(
            &format!("{t} -d ferroce_lo -p 7184 {args}"),
            &format!("{t} -d ferroce_lo -p 7184 {args} 127.0.0.1"),
        );
        let size = if t == "ib_write_bw" { "65536" } else { "1024" };
        let row = |x: &str| {
            x.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() >= 4 && w[0] == size && w[1] == "200"
            })
        };
        assert!(row(&c), "{t}: no result row\n{c}\n{s}");
    }
    // cmtime: 20 connections set up at once (their MADs interleave on QP1),
    // then torn down; the server runs until it is stopped.
    let mut server = tool("cmtime -b 127.0.0.1 -p 7198 -c 20")
        .spawn()
        .expect("spawn cmtime server");
    std::thread::sleep(Duration::from_millis(1500));
    let (out, timed_out, text) =
        run_alone("cmtime -s 127.0.0.1 -p 7198 -c 20", Duration::from_secs(60));
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        !timed_out
            && out.status.success()
            && text.lines().any(|l| l.starts_with("connect "))
            && text.lines().any(|l| l.starts_with("disconnect ")),
        "cmtime: {}\n{text}",
        out.status
    );
    // A connect to a port no one listens on is refused as the kernel CM
    // refuses it (REJ "invalid service ID"), once the grace in which the
    // request goes again (a listener may be on its way) is over.
    let started = std::time::Instant::now();
    let (out, timed_out, text) = run_alone(
        "rping -c -a 127.0.0.1 -p 7199 -C 1",
        Duration::from_secs(20),
    );
    let took = started.elapsed();
    assert!(
        !timed_out && !out.status.success() && text.contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "{text}"
    );
    let grace = ferroce_ibverbs_compat::rdmacm::device::NO_LISTENER_GRACE;
    assert!(took >= grace, "refused after {took:?}");
    // Every tool left the UDP port's shared table at exit (librdmacm's
    // devices are never closed): no line names a process that is gone.
    let gone: Vec<String> = std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|f| {
            let n = f.file_name().to_string_lossy().into_owned();
            n.starts_with("ferroce-udp-") && n.ends_with("-127.0.0.1-4791.members")
        })
        .filter_map(|f| std::fs::read_to_string(f.path()).ok())
        .flat_map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    assert!(gone.is_empty(), "table lines of exited tools: {gone:?}");
}
