//! `ferroce rdma-server` / `rdma-client`, `ferroce rping`, `ferroce ucmatose`, `ferroce
//! udaddy` and `ferroce mckey` between namespace hosts (connections set up, UD QPs resolved, by
//! the CM over QP1; multicast groups joined), on each packet engine. Needs root; skips with a
//! message without it, but for mckey over UDP on loopback. (Against the stock librdmacm tools on
//! rxe: interop-tests' rdma_cm_interop.)

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ferroce_nic::netns::{Topology, TopologyConfig};

fn ferroce(topo: &Topology, host: usize, args: &[&str]) -> Command {
    let mut c = topo.command(host, env!("CARGO_BIN_EXE_ferroce"));
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Server on host 0, client on host 1 (started once the server is up).
fn pair(topo: &Topology, server: &[&str], client: &[&str]) -> (Output, Output) {
    let srv = ferroce(topo, 0, server).spawn().expect("spawn server");
    std::thread::sleep(Duration::from_millis(700));
    let cli = ferroce(topo, 1, client).output().expect("run client");
    (srv.wait_with_output().expect("server"), cli)
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn rdma_cm_tools_between_namespaces() {
    if !ferroce_nic::is_root() {
        eprintln!("rdma_cm_tools_between_namespaces: skipped (needs root for network namespaces)");
        return;
    }
    let topo = Topology::up(&TopologyConfig::default()).unwrap();
    let server_ip = topo.host(0).ipv4.to_string();
    for backend in ["udp", "afpacket", "afxdp"] {
        let dev = ["--backend", backend, "--timeout", "20"];
        let with = |args: &[&'static str], dev_flag: &'static str| -> Vec<String> {
            let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            v.extend([dev_flag.to_string(), "veth0".to_string()]);
            v.extend(dev.iter().map(|s| s.to_string()));
            v
        };
        let srv = with(&["rdma-server"], "-d");
        let mut cli = with(&["rdma-client"], "-d");
        cli.extend(["-s".to_string(), server_ip.clone()]);
        let (s, c) = pair(&topo, &refs(&srv), &refs(&cli));
        assert!(
            s.status.success() && text(&s).contains("rdma_server: end 0"),
            "{backend}: {}",
            text(&s)
        );
        assert!(
            c.status.success() && text(&c).contains("rdma_client: end 0"),
            "{backend}: {}",
            text(&c)
        );

        let srv = with(&["rping", "-s", "-v"], "--ib-dev");
        let mut cli = with(&["rping", "-c", "-v", "-V", "-C", "5"], "--ib-dev");
        cli.extend(["-a".to_string(), server_ip.clone()]);
        let (s, c) = pair(&topo, &refs(&srv), &refs(&cli));
        let pings = |o: &Output, prefix: &str| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with(prefix))
                .count()
        };
        assert!(s.status.success(), "{backend}: {}", text(&s));
        assert!(c.status.success(), "{backend}: {}", text(&c));
        assert_eq!(
            pings(&s, "server ping data: rdma-ping-"),
            5,
            "{backend}: {}",
            text(&s)
        );
        assert_eq!(
            pings(&c, "ping data: rdma-ping-"),
            5,
            "{backend}: {}",
            text(&c)
        );

        // Two RC connections; 4 messages of 3000 B each way, then the
        // server's DREQ.
        let srv = with(&["ucmatose", "-c", "2", "-C", "4", "-S", "3000"], "-d");
        let mut cli = with(
            &["ucmatose", "-c", "2", "-C", "4", "-S", "3000", "-t", "96"],
            "-d",
        );
        cli.extend(["-s".to_string(), server_ip.clone()]);
        let (s, c) = pair(&topo, &refs(&srv), &refs(&cli));
        for (side, o) in [("server", &s), ("client", &c)] {
            let t = text(o);
            assert!(
                o.status.success()
                    && t.contains("data transfers complete")
                    && t.contains("return status 0"),
                "{backend} ucmatose {side}: {t}"
            );
        }
        assert!(text(&s).contains("disconnected"), "{}", text(&s));

        // Two UD QPs, each resolved by SIDR; 4 messages of 2000 B each way.
        let srv = with(&["udaddy", "-c", "2", "-C", "4", "-S", "2000"], "-d");
        let mut cli = with(&["udaddy", "-c", "2", "-C", "4", "-S", "2000"], "-d");
        cli.extend(["-s".to_string(), server_ip.clone()]);
        let (s, c) = pair(&topo, &refs(&srv), &refs(&cli));
        for (side, o) in [("server", &s), ("client", &c)] {
            let t = text(o);
            assert!(
                o.status.success()
                    && t.contains("data transfers complete")
                    && t.contains("return status 0"),
                "{backend} udaddy {side}: {t}"
            );
        }
    }
    // rping over IPv6: the CMs take the IPv6 GIDs (the device's default is the IPv4-mapped one).
    let server_ip6 = topo.host(0).ipv6.to_string();
    let dev = [
        "--ib-dev",
        "veth0",
        "--backend",
        "afpacket",
        "--timeout",
        "20",
    ];
    let mut srv = vec!["rping", "-s"];
    srv.extend(dev);
    let mut cli = vec!["rping", "-c", "-V", "-C", "3", "-a", &server_ip6];
    cli.extend(dev);
    let (s, c) = pair(&topo, &srv, &cli);
    assert!(
        s.status.success() && c.status.success(),
        "rping over IPv6: {}\n{}",
        text(&s),
        text(&c)
    );
}

/// `ferroce bench -R` (perftest's rdma_cm mode) between namespace hosts:
/// the exchange over its own rdma_cm connection, the test QPs connected by
/// the CM; every run checks its data. (Against perftest -R on rxe:
/// interop-tests' perftest_rdma_cm_interop.)
#[test]
fn bench_rdma_cm_between_namespaces() {
    if !ferroce_nic::is_root() {
        eprintln!("bench_rdma_cm_between_namespaces: skipped (needs root for network namespaces)");
        return;
    }
    let topo = Topology::up(&TopologyConfig::default()).unwrap();
    let server_ip = topo.host(0).ipv4.to_string();
    let runs: [&[&str]; 9] = [
        &["write", "-s", "65536", "-n", "300"],
        // A duration run of ib_write_lat has no closing hand-shake.
        &["write", "--lat", "-s", "64", "-D", "2"],
        &["write", "-s", "4096", "-n", "300", "-q", "3"],
        &["read", "-s", "65536", "-n", "200"],
        &["send", "-s", "8192", "-n", "300"],
        &["send", "--lat", "-s", "8", "-n", "300"],
        // UD: SIDR names the server's QP; a client that will be answered
        // announces its QPN in a SEND WITH IMMEDIATE.
        &["send", "-c", "UD", "-s", "1024", "-n", "300", "-q", "2"],
        &["send", "--lat", "-c", "UD", "-s", "8", "-n", "300"],
        &["send", "-c", "UD", "-b", "-s", "2048", "-n", "300"],
    ];
    // Over IPv6 too: the CM takes the IPv6 GIDs for the control and the test connections.
    let server_ip6 = topo.host(0).ipv6.to_string();
    let v6_runs = [runs[0], runs[7]];
    for (backend, server, runs) in [
        ("udp", &server_ip, &runs[..]),
        ("afpacket", &server_ip, &runs[..]),
        ("afpacket", &server_ip6, &v6_runs[..]),
    ] {
        for &run in runs {
            let mut srv: Vec<&str> = vec!["bench"];
            srv.extend(run);
            srv.extend(["-R", "-d", "veth0", "--backend", backend]);
            let mut cli = srv.clone();
            cli.push(server);
            let (s, c) = pair(&topo, &srv, &cli);
            let what = format!("{backend} {server} {}", run.join(" "));
            for (side, o) in [("server", &s), ("client", &c)] {
                let t = text(o);
                assert!(o.status.success(), "{what}: {side}: {t}");
                assert!(
                    t.contains("rdma_cm QPs\t : ON") && t.contains("Data ex. method : rdma_cm"),
                    "{what}: {side}: {t}"
                );
            }
            let out = String::from_utf8_lossy(&c.stdout);
            let size = run
                .iter()
                .position(|&w| w == "-s")
                .and_then(|i| run.get(i + 1))
                .copied()
                .unwrap_or_default();
            assert!(
                out.lines()
                    .any(|l| l.split_whitespace().next() == Some(size)),
                "{what}: no result row for {size}: {}",
                text(&c)
            );
        }
    }
}

/// `ferroce mckey`: two receiving hosts of three on a bridge, each with two
/// UD QPs joined to one group; the third sends to it, and every receiving QP
/// gets every message. The bridge's IGMP snooping forwards the group only
/// to ports whose host joined it.
#[test]
fn mckey_between_namespaces() {
    if !ferroce_nic::is_root() {
        eprintln!("mckey_between_namespaces: skipped (needs root for network namespaces)");
        return;
    }
    let topo = Topology::up(&TopologyConfig {
        hosts: 3,
        bridge: true,
        ..TopologyConfig::default()
    })
    .unwrap();
    for (backend, group, send_only) in [
        ("udp", "239.7.0.1", false),
        ("afpacket", "239.7.0.2", true),
        ("afxdp", "239.7.0.3", false),
    ] {
        let dev = ["-d", "veth0", "--backend", backend, "--timeout", "20"];
        let mut receiver = vec!["mckey", "-m", group, "-c", "2", "-C", "6", "-S", "4000"];
        receiver.extend(dev);
        let receivers: Vec<_> = (0..2)
            .map(|h| {
                ferroce(&topo, h, &receiver)
                    .spawn()
                    .expect("spawn receiver")
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        let mut sender = vec!["mckey", "-s", "-m", group, "-C", "6", "-S", "4000"];
        if send_only {
            sender.push("-o");
        }
        sender.extend(dev);
        let s = ferroce(&topo, 2, &sender).output().expect("run sender");
        let t = text(&s);
        assert!(
            s.status.success() && t.contains("initiating data transfers"),
            "{backend} sender: {t}"
        );
        assert!(
            t.contains(&format!("mckey: joined dgid: ::ffff:{group} mlid 0x0 sl 0")),
            "{t}"
        );
        for (h, r) in receivers.into_iter().enumerate() {
            let r = r.wait_with_output().expect("receiver");
            let t = text(&r);
            assert!(
                r.status.success()
                    && t.contains("receiving data transfers")
                    && t.contains("data transfers complete")
                    && t.contains("return status 0"),
                "{backend} receiver on host {h}: {t}"
            );
            assert_eq!(t.matches("mckey: joined dgid").count(), 2, "{t}");
        }
    }
}

/// `ferroce mckey` between two processes on loopback over the UDP backend
/// (no root needed): the receiver's device hears the group through a socket
/// bound to it, and its engine sleeps on that socket too.
/// The tests on loopback share 127.0.0.1:4791, whose first device alone hears
/// QP1: they take turns.
static LOOPBACK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn mckey_over_udp_on_loopback() {
    let _turn = LOOPBACK.lock().unwrap_or_else(|p| p.into_inner());
    let dev = [
        "-d",
        "lo",
        "--backend",
        "udp",
        "-b",
        "127.0.0.1",
        "--timeout",
        "20",
    ];
    let run = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ferroce"));
        c.arg("mckey")
            .args(extra)
            .args(["-m", "239.7.1.1", "-C", "8", "-S", "1200"])
            .args(dev)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let receiver = run(&["-c", "2"]).spawn().expect("spawn receiver");
    std::thread::sleep(Duration::from_millis(700));
    let s = run(&["-s"]).output().expect("run sender");
    let r = receiver.wait_with_output().expect("receiver");
    for (side, o) in [("sender", &s), ("receiver", &r)] {
        let t = text(o);
        assert!(
            o.status.success() && t.contains("data transfers complete"),
            "{side}: {t}"
        );
    }
}

/// rdma_cm tools on one host sharing UDP port 4791 (no namespaces, no root):
/// the port's steering program hands each MAD to the device whose comm ID it
/// names, and requests to the first device; a listener that is not first
/// says at once that requests will not reach it.
#[test]
fn rdma_cm_tools_share_a_port_on_loopback() {
    let _turn = LOOPBACK.lock().unwrap_or_else(|p| p.into_inner());
    let dev = ["--backend", "udp", "--timeout", "10"];
    let tool = |args: &[&str], dev_flag: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ferroce"));
        c.args(args)
            .args([dev_flag, "lo"])
            .args(dev)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    // rping: connection, READs and WRITEs, disconnection.
    let server = tool(&["rping", "-s", "-v"], "--ib-dev")
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(700));
    // A second listener on the port: not the first device, so refused at once.
    let started = std::time::Instant::now();
    let second = tool(&["rping", "-s", "-p", "7175"], "--ib-dev")
        .output()
        .expect("run second server");
    let quick = started.elapsed() < Duration::from_secs(3);
    let t = text(&second);
    assert!(
        !second.status.success() && quick && t.contains("start the listening side first"),
        "{t}"
    );
    let c = tool(
        &["rping", "-c", "-a", "127.0.0.1", "-v", "-V", "-C", "3"],
        "--ib-dev",
    )
    .output()
    .expect("run client");
    let s = server.wait_with_output().expect("server");
    for (side, o, prefix) in [
        ("server", &s, "server ping data: rdma-ping-"),
        ("client", &c, "ping data: rdma-ping-"),
    ] {
        let pings = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with(prefix))
            .count();
        assert!(
            o.status.success() && pings == 3,
            "rping {side}: {}",
            text(o)
        );
    }
    // udaddy: SIDR_REQ to the first device, its SIDR_REP back to the second.
    let server = tool(&["udaddy", "-C", "4"], "-d").spawn().expect("spawn");
    std::thread::sleep(Duration::from_millis(700));
    let c = tool(&["udaddy", "-s", "127.0.0.1", "-C", "4"], "-d")
        .output()
        .expect("run client");
    let s = server.wait_with_output().expect("server");
    for (side, o) in [("server", &s), ("client", &c)] {
        assert!(
            o.status.success() && text(o).contains("return status 0"),
            "udaddy {side}: {}",
            text(o)
        );
    }
}
