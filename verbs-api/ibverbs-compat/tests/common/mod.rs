//! Shared by the tests: build libibverbs.so.1 once, run Debian's unmodified
//! tools in two network-namespace hosts with it preloaded by LD_LIBRARY_PATH.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferroce_nic::netns::{Topology, TopologyConfig};

/// The backend the tests run the tools over (override: FERROCE_TEST_BACKEND).
pub fn backend() -> String {
    std::env::var("FERROCE_TEST_BACKEND").unwrap_or_else(|_| "afpacket".to_string())
}

/// Root, and every tool named installed; else print why and return false.
pub fn can_run(test: &str, tools: &[&str]) -> bool {
    if !ferroce_nic::is_root() {
        eprintln!("SKIP {test}: needs root (network namespaces, raw sockets)");
        return false;
    }
    for t in tools {
        if !Path::new("/usr/bin").join(t).exists() {
            eprintln!("SKIP {test}: /usr/bin/{t} is not installed (ibverbs-utils / perftest)");
            return false;
        }
    }
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("SKIP {test}: libibverbs-dev is not installed");
        return false;
    }
    true
}

/// The directory holding the freshly linked libibverbs.so.1.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tool = PathBuf::from(env!("CARGO_BIN_EXE_ferroce-libibverbs"));
        let dir = tool
            .parent()
            .unwrap_or(Path::new("."))
            // One directory for every test binary: the linker tool replaces
            // the file atomically, so a running tool keeps its mapping.
            .join("ibverbs-compat-test");
        let out = Command::new(&tool)
            .arg(&dir)
            .output()
            .expect("run ferroce-libibverbs");
        assert!(
            out.status.success(),
            "linking libibverbs.so.1 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// Two hosts on a veth pair (MTU 9000, static neighbours).
pub fn topology(tag: &str) -> Topology {
    Topology::up(&TopologyConfig {
        tag: Some(tag.to_string()),
        ..TopologyConfig::default()
    })
    .expect("netns topology")
}

/// A tool in host `i` over the ferroce libibverbs.
pub fn tool(topo: &Topology, i: usize, program: &str, args: &[&str]) -> Command {
    let mut c = topo.command(i, program);
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FERROCE_DEVICE", &topo.host(i).ifname)
        .env("FERROCE_BACKEND", backend())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The TCP port of the tools' out-of-band exchange (their default).
pub const PORT: u16 = 18515;

/// Wait (at most 30 s) until host `i` listens on TCP `port`: a server opens
/// its device before it listens, which takes a while on a loaded machine.
pub fn wait_listening(topo: &Topology, i: usize, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let want = format!(":{port} ");
    while Instant::now() < deadline {
        let out = topo.command(i, "ss").args(["-Hltn"]).output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&want)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("host {i} is not listening on {port} after 30 s; trying anyway");
}

/// Wait for a child at most `t`; kill it after that.
pub fn wait(mut child: Child, t: Duration) -> (Output, bool) {
    let deadline = Instant::now() + t;
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

/// Run a server/client pair of `program` (server on host 1, client on host
/// 0 connecting to host 1's IPv4 address); both must exit 0 within `t`.
/// Returns (server stdout+stderr, client stdout+stderr).
pub fn pair(topo: &Topology, program: &str, args: &[&str], t: Duration) -> (String, String) {
    pair_from(topo, 0, program, args, t)
}

/// [`pair`] with the client on host `client` (1: both on the server's host).
pub fn pair_from(
    topo: &Topology,
    client: usize,
    program: &str,
    args: &[&str],
    t: Duration,
) -> (String, String) {
    let server = tool(topo, 1, program, args);
    let ip = topo.host(1).ipv4.to_string();
    let mut cargs: Vec<&str> = args.to_vec();
    cargs.push(&ip);
    let client = tool(topo, client, program, &cargs);
    serve_and_run(
        topo,
        server,
        PORT,
        client,
        t,
        &format!("{program} {args:?}"),
    )
}

/// Start `server` (on host 1), wait until it listens on TCP `port`, run
/// `client`; the client must exit 0 within `t` and the server 20 s after.
/// Returns (server stdout+stderr, client stdout+stderr).
pub fn serve_and_run(
    topo: &Topology,
    mut server: Command,
    port: u16,
    mut client: Command,
    t: Duration,
    what: &str,
) -> (String, String) {
    let server = server.spawn().expect("spawn server");
    wait_listening(topo, 1, port);
    let client = client.spawn().expect("spawn client");
    let (c, ct) = wait(client, t);
    let (s, st) = wait(server, Duration::from_secs(20));
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let (stext, ctext) = (text(&s), text(&c));
    assert!(
        !ct && !st && c.status.success() && s.status.success(),
        "{what} failed (client {}{}, server {}{})\n--- client:\n{ctext}\n--- server:\n{stext}",
        c.status,
        if ct { " timed out" } else { "" },
        s.status,
        if st { " timed out" } else { "" },
    );
    (stext, ctext)
}

/// Whether `fd` polls readable within `ms` milliseconds.
pub fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLIN != 0 }
}
