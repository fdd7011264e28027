//! AF_XDP specifics: generic (skb) mode, several queues, and the program
//! going away when the process dies without running any destructor.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ferroce_nic::afxdp::{AfXdpConfig, AfXdpIo, XdpMode};
use ferroce_nic::frame::ROCE_V2_PORT;
use ferroce_nic::netns::{self, Topology};
use ferroce_nic::PacketIo;

fn xdp_attached(t: &Topology, i: usize) -> bool {
    let out = t
        .command(i, "ip")
        .args(["-d", "link", "show", "veth0"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

#[test]
fn skb_mode_batches() {
    if !root_or_skip("afxdp skb mode") {
        return;
    }
    let t = topo();
    let (ea, eb) = ends(&t, false);
    let open = |i: usize| {
        t.run_in(i, || {
            let mut c = AfXdpConfig::new("veth0");
            c.mode = XdpMode::Skb;
            AfXdpIo::open(c).unwrap()
        })
        .unwrap()
    };
    let (a, b) = (open(0), open(1));
    assert_eq!((a.xdp_mode(), b.xdp_mode()), ("skb", "skb"));
    let mut p = Pair {
        topo: None,
        a: Box::new(a),
        b: Box::new(b),
        ea,
        eb,
    };
    batches(&mut p, &[60, 1500, 4200, 9014]);
    drop(p);
    // A test thread forking `ip` at that moment briefly shares our fds (until
    // its exec closes them): allow the detach a moment.
    let t0 = Instant::now();
    while (xdp_attached(&t, 0) || xdp_attached(&t, 1)) && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !xdp_attached(&t, 0) && !xdp_attached(&t, 1),
        "detached on drop"
    );
}

#[test]
fn two_queues_each_get_a_socket() {
    if !root_or_skip("afxdp multi-queue") {
        return;
    }
    let t = topo();
    for i in 0..2 {
        let ok = t
            .command(i, "ethtool")
            .args(["-L", "veth0", "rx", "2", "tx", "2"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("SKIP: cannot set 2 channels on veth (ethtool -L)");
            return;
        }
    }
    let mut b = t
        .run_in(1, || AfXdpIo::open(AfXdpConfig::new("veth0")).unwrap())
        .unwrap();
    assert_eq!(b.queues(), 2);
    // Kernel UDP from many source ports spreads over A's TX queues, which
    // veth maps onto B's RX queues; every datagram must reach a socket.
    let dst = SocketAddr::new(t.host(1).ipv4.into(), ROCE_V2_PORT);
    let a_ip = t.host(0).ipv4;
    let n = 400usize;
    t.run_in(0, move || {
        for i in 0..n {
            let s = UdpSocket::bind((a_ip, 0)).unwrap();
            s.send_to(&(i as u32).to_be_bytes(), dst).unwrap();
        }
    })
    .unwrap();
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while got < n && Instant::now() < deadline {
        got += b.recv(64, &mut |_f: &[u8]| {}).unwrap();
        if got < n {
            let _ = b.wait(Some(Duration::from_millis(20)));
        }
    }
    assert_eq!(got, n);
    let per = b.rx_frames_per_queue();
    eprintln!("frames per queue: {per:?}");
    assert!(
        per.iter().all(|&q| q > 0),
        "both queues carried traffic: {per:?}"
    );
}

#[test]
fn program_detached_when_process_is_killed() {
    if let Ok(ns) = std::env::var("FRC_XDP_CHILD_NS") {
        // Child: attach, say so, and wait to be killed.
        let io = netns::enter_and_run(&ns, || AfXdpIo::open(AfXdpConfig::new("veth0")).unwrap())
            .unwrap();
        println!("attached {}", io.xdp_mode());
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    if !root_or_skip("afxdp crash safety") {
        return;
    }
    let t = topo();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "program_detached_when_process_is_killed",
            "--exact",
            "--nocapture",
        ])
        .env("FRC_XDP_CHILD_NS", &t.host(1).ns)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    while !line.contains("attached") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
    }
    assert!(line.contains("attached"), "child attached: {line:?}");
    assert!(xdp_attached(&t, 1), "program present while the child lives");
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    let t0 = Instant::now();
    while xdp_attached(&t, 1) && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !xdp_attached(&t, 1),
        "the kernel detached the program with the process"
    );
    // And a new attach works at once (no stale program in the way).
    let io = t
        .run_in(1, || AfXdpIo::open(AfXdpConfig::new("veth0")))
        .unwrap();
    assert!(io.is_ok(), "{:?}", io.err());
}

#[test]
fn busy_poll_mode_still_moves_frames() {
    if !root_or_skip("afxdp busy poll") {
        return;
    }
    let t = topo();
    let (ea, eb) = ends(&t, false);
    let open = |i: usize| {
        t.run_in(i, || {
            let mut io = AfXdpIo::open(AfXdpConfig::new("veth0")).unwrap();
            io.set_busy_poll(true).unwrap();
            io
        })
        .unwrap()
    };
    let mut p = Pair {
        topo: None,
        a: Box::new(open(0)),
        b: Box::new(open(1)),
        ea,
        eb,
    };
    batches(&mut p, &[60, 1500]);
}

/// `zero_copy_only` refuses a copy-mode bind (veth has no zero-copy AF_XDP)
/// and leaves nothing behind: no program, and the queue free for a
/// copy-mode socket at once.
#[test]
fn zero_copy_only_refuses_copy_mode() {
    if !root_or_skip("afxdp zero_copy_only") {
        return;
    }
    let t = topo();
    let r = t
        .run_in(0, || {
            let mut c = AfXdpConfig::new("veth0");
            c.zero_copy_only = true;
            AfXdpIo::open(c).map(|io| io.zero_copy())
        })
        .unwrap();
    match r {
        Err(ferroce_nic::NicError::Unsupported(what)) => {
            assert!(what.contains("zero-copy"), "{what}")
        }
        other => panic!("veth bound zero-copy? {other:?}"),
    }
    assert!(!xdp_attached(&t, 0), "no program left attached");
    let io = t
        .run_in(0, || AfXdpIo::open(AfXdpConfig::new("veth0")).unwrap())
        .unwrap();
    assert!(!io.zero_copy());
}
