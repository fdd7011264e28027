//! `ferroce demo`: two ferroce hosts, RC ping-pong, WRITE / READ / SEND /
//! atomic bandwidth and latency at a few sizes, every byte checked, one table.
//!
//! With root it builds two network namespaces joined by a veth pair (MTU
//! 9000) and runs over AF_XDP, falling back to AF_PACKET and then UDP;
//! without root it uses the UDP backend on loopback (127.0.0.1 ⇄ 127.0.0.2),
//! or the in-memory switch if that port is taken.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use ferroce_nic::netns::{Topology, TopologyConfig};
use ferroce_verbs::perf::{self, PerfOp, PerfParams, PerfResult, RemoteBuf};
use ferroce_verbs::{
    Backend, CompletionQueue, ConnectOptions, Context, DeviceConfig, MemoryRegion, OpenOptions,
    QueuePair, RemoteQp,
};

const BUF: usize = 8 << 20;
const SEED: u64 = 0xdead_beef;

/// Where the two hosts live.
enum Place {
    Namespaces(Topology),
    Loopback,
    Memory,
}

impl Place {
    fn describe(&self, a: &Context) -> String {
        match self {
            Place::Namespaces(t) => format!(
                "two network namespaces ({}) on a veth pair, MTU 9000, backend {}",
                t.name(),
                a.backend()
            ),
            Place::Loopback => "UDP backend on loopback, 127.0.0.1 <-> 127.0.0.2 (no root)".into(),
            Place::Memory => "in-memory switch (no root, UDP port 4791 taken)".into(),
        }
    }
}

fn open_pair(backend: Backend) -> Result<(Place, Context, Context), String> {
    let opts = OpenOptions::default();
    if ferroce_nic::is_root() && backend != Backend::Udp {
        let topo = Topology::up(&TopologyConfig::default()).map_err(|e| e.to_string())?;
        // The demo's own order (not `auto`'s, which puts a copy-mode AF_XDP
        // socket after AF_PACKET): it shows AF_XDP wherever it opens.
        let order: &[Backend] = match backend {
            Backend::Auto => &[Backend::AfXdp, Backend::AfPacket, Backend::Udp],
            _ => std::slice::from_ref(&backend),
        };
        let mut errors = Vec::new();
        for &b in order {
            let open = |i: usize| -> Result<Context, String> {
                let mut cfg = DeviceConfig::new(&topo.host(i).ifname, b);
                cfg.netns = Some(topo.host(i).ns.clone());
                cfg.seed = SEED + i as u64;
                topo.run_in(i, move || Context::open(&cfg, opts))
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())
            };
            match open(0).and_then(|a| Ok((a, open(1)?))) {
                Ok((a, b)) => return Ok((Place::Namespaces(topo), a, b)),
                Err(e) => errors.push(format!("{}: {e}", b.name())),
            }
        }
        return Err(errors.join("; "));
    }
    let udp = |last: u8| {
        let mut cfg = DeviceConfig::new("lo", Backend::Udp);
        cfg.udp_bind = Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
            4791,
        ));
        cfg.seed = SEED + u64::from(last);
        Context::open(&cfg, opts)
    };
    match (udp(1), udp(2)) {
        (Ok(a), Ok(b)) => Ok((Place::Loopback, a, b)),
        _ => {
            let (pa, pb) = ferroce_nic::mem::pair().map_err(|e| e.to_string())?;
            let ga = Ipv4Addr::new(198, 18, 0, 1).to_ipv6_mapped();
            let gb = Ipv4Addr::new(198, 18, 0, 2).to_ipv6_mapped();
            let a = Context::with_io(Box::new(pa), "mem0", vec![ga], SEED, opts)
                .map_err(|e| e.to_string())?;
            let b = Context::with_io(Box::new(pb), "mem1", vec![gb], SEED + 1, opts)
                .map_err(|e| e.to_string())?;
            Ok((Place::Memory, a, b))
        }
    }
}

/// One end of a connection made for one test: a fresh QP and CQ, so
/// receives left posted by one test never meet the next.
struct Side<'pd> {
    qp: QueuePair<'pd>,
    cq: CompletionQueue,
}

struct Row {
    test: String,
    size: u32,
    iters: u64,
    bw: Option<f64>,
    mpps: Option<f64>,
    lat: Option<(f64, f64, f64)>,
    ok: bool,
    note: String,
}

fn progress(step: usize, total: usize, what: &str) {
    eprint!("\r\x1b[2K[{step}/{total}] {what} ...");
    let _ = std::io::stderr().flush();
}

pub fn run(backend: Backend) -> i32 {
    let t0 = Instant::now();
    let (place, ca, cb) = match open_pair(backend) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("ferroce demo: cannot set up two hosts: {e}");
            return 1;
        }
    };
    println!("ferroce demo: {}", place.describe(&ca));
    let rows = match run_tests(&ca, &cb) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("\nferroce demo: {e}");
            for (name, c) in [("A", &ca), ("B", &cb)] {
                let s = c.stats();
                eprintln!("host {name}: {:?}\n        {:?}", s.io, s.core);
            }
            return 1;
        }
    };
    eprint!("\r\x1b[2K");
    print_table(&rows);
    let stats = (ca.stats(), cb.stats());
    println!(
        "frames: host A sent {} received {}, host B sent {} received {}; retransmissions {}; dropped {}",
        stats.0.io.tx_frames,
        stats.0.io.rx_frames,
        stats.1.io.tx_frames,
        stats.1.io.rx_frames,
        stats.0.core.retransmits + stats.1.core.retransmits,
        stats.0.io.rx_dropped + stats.1.io.rx_dropped
    );
    drop((ca, cb));
    drop(place);
    let all_ok = rows.iter().all(|r| r.ok);
    println!(
        "{} in {:.1} s",
        if all_ok {
            "all data verified"
        } else {
            "DATA MISMATCH"
        },
        t0.elapsed().as_secs_f64()
    );
    if all_ok {
        0
    } else {
        1
    }
}

fn side<'pd>(
    ctx: &Context,
    pd: &'pd ferroce_verbs::ProtectionDomain,
) -> Result<Side<'pd>, ferroce_verbs::Error> {
    let cq = ctx.create_cq(1024)?;
    let qp = pd
        .create_qp()
        .max_send_wr(256)
        .max_recv_wr(256)
        .build(&cq, &cq)?;
    Ok(Side { qp, cq })
}

/// Two fresh, connected RC QPs (A's is the requester in every test).
fn connect<'a, 'b>(
    ca: &Context,
    pa: &'a ferroce_verbs::ProtectionDomain,
    cb: &Context,
    pb: &'b ferroce_verbs::ProtectionDomain,
    step: u32,
    announce: bool,
) -> Result<(Side<'a>, Side<'b>), ferroce_verbs::Error> {
    let a = side(ca, pa)?;
    let b = side(cb, pb)?;
    let mtu = ca.query_port().active_mtu.min(cb.query_port().active_mtu);
    let gid_index = |c: &Context| if c.gids().len() > 1 { 1 } else { 0 };
    let oa = ConnectOptions {
        path_mtu: mtu,
        sgid_index: gid_index(ca),
        local_psn: 0x1234 + step * 0x1000,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..Default::default()
    };
    let ob = ConnectOptions {
        sgid_index: gid_index(cb),
        local_psn: 0x5678 + step * 0x1000,
        ..oa
    };
    a.qp.to_init(&oa)?;
    b.qp.to_init(&ob)?;
    let ga = ca.query_gid(oa.sgid_index)?;
    let gb = cb.query_gid(ob.sgid_index)?;
    a.qp.connect(
        ca,
        &RemoteQp {
            qpn: b.qp.qpn(),
            psn: ob.local_psn,
            gid: gb,
        },
        &oa,
    )?;
    b.qp.connect(
        cb,
        &RemoteQp {
            qpn: a.qp.qpn(),
            psn: oa.local_psn,
            gid: ga,
        },
        &ob,
    )?;
    if announce {
        println!(
            "host A {ga} qpn {:#x}  <->  host B {gb} qpn {:#x}, path MTU {mtu}",
            a.qp.qpn(),
            b.qp.qpn()
        );
    }
    Ok((a, b))
}

struct Buffers<'a, 'b> {
    a: MemoryRegion<'a>,
    b: MemoryRegion<'b>,
}

fn run_tests(ca: &Context, cb: &Context) -> Result<Vec<Row>, ferroce_verbs::Error> {
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let access = ConnectOptions::default().access;
    let m = Buffers {
        a: pa.reg_mr(BUF, access)?,
        b: pb.reg_mr(BUF, access)?,
    };
    let remote_b = RemoteBuf {
        addr: m.b.addr(),
        rkey: m.b.rkey(),
        len: m.b.len(),
        ud: None,
    };

    let plan: Vec<(&str, PerfOp, u32, u64, bool)> = vec![
        ("RC ping-pong", PerfOp::Send, 4096, 500, true),
        ("SEND latency", PerfOp::Send, 8, 1000, true),
        ("WRITE latency", PerfOp::Write, 8, 1000, true),
        ("READ latency", PerfOp::Read, 8, 1000, true),
        ("WRITE bandwidth", PerfOp::Write, 64, 20_000, false),
        ("WRITE bandwidth", PerfOp::Write, 4096, 10_000, false),
        ("WRITE bandwidth", PerfOp::Write, 65536, 1500, false),
        ("READ bandwidth", PerfOp::Read, 4096, 5000, false),
        ("READ bandwidth", PerfOp::Read, 65536, 1000, false),
        ("SEND bandwidth", PerfOp::Send, 4096, 5000, false),
        ("SEND bandwidth", PerfOp::Send, 65536, 1000, false),
        ("ATOMIC fetch-add", PerfOp::FetchAdd, 8, 5000, false),
    ];
    let total = plan.len();
    let mut rows = Vec::new();
    for (step, (name, op, size, iters, lat)) in plan.into_iter().enumerate() {
        progress(step + 1, total, &format!("{name} {size} B"));
        let p = PerfParams::new(op, size, iters);
        let (a, b) = connect(ca, &pa, cb, &pb, step as u32, step == 0)?;
        let row = match (op, lat) {
            (PerfOp::Send, true) => {
                // Both sides ping-pong; B answers from its own thread.
                let a_pat = SEED ^ u64::from(size);
                let (from_a, from_b) = (
                    perf::send_lat_source(&m.a, size),
                    perf::send_lat_source(&m.b, size),
                );
                perf::fill_pattern(&m.a, from_a, u64::from(size), a_pat)?;
                perf::fill_pattern(&m.b, from_b, u64::from(size), a_pat)?;
                let res = std::thread::scope(|s| {
                    let server = s.spawn(|| perf::send_lat(&b.qp, &b.cq, &m.b, &p, false));
                    let client = perf::send_lat(&a.qp, &a.cq, &m.a, &p, true);
                    let server = server.join().unwrap_or_else(|_| {
                        Err(ferroce_verbs::Error::EngineStopped(
                            "server thread panicked".into(),
                        ))
                    });
                    client.and_then(|c| server.map(|_| c))
                })?;
                // Each side's receive buffer holds the other's message.
                let ok = perf::check_pattern(&m.a, 0, u64::from(size), a_pat)?.is_none()
                    && perf::check_pattern(&m.b, 0, u64::from(size), a_pat)?.is_none();
                lat_row(name, &res, ok)
            }
            (_, true) => {
                perf::fill_pattern(&m.b, 0, 8, SEED)?;
                perf::fill_pattern(&m.a, 0, 8, SEED)?;
                let res = perf::op_lat(&a.qp, &a.cq, &m.a, &remote_b, &p)?;
                let ok = perf::check_pattern(&m.a, 0, 8, SEED)?.is_none()
                    && perf::check_pattern(&m.b, 0, 8, SEED)?.is_none();
                lat_row(name, &res, ok)
            }
            (PerfOp::Write, false) => {
                let span = (u64::from(size) * iters).min(BUF as u64);
                let pat = SEED ^ u64::from(size);
                perf::fill_pattern(&m.a, 0, span, pat)?;
                m.b.write(0, &vec![0u8; span as usize])?;
                let res = perf::bw_requester(&a.qp, &a.cq, &m.a, &remote_b, &p)?;
                let ok = perf::check_pattern(&m.b, 0, span, pat)?.is_none();
                bw_row(name, &res, ok)
            }
            (PerfOp::Read, false) => {
                let span = (u64::from(size) * iters).min(BUF as u64);
                let pat = SEED ^ 0x5eed ^ u64::from(size);
                perf::fill_pattern(&m.b, 0, span, pat)?;
                m.a.write(0, &vec![0u8; span as usize])?;
                let res = perf::bw_requester(&a.qp, &a.cq, &m.a, &remote_b, &p)?;
                let ok = perf::check_pattern(&m.a, 0, span, pat)?.is_none();
                bw_row(name, &res, ok)
            }
            (PerfOp::Send, false) => {
                let span = (u64::from(size) * iters).min(BUF as u64);
                let pat = SEED ^ 0x5e4d ^ u64::from(size);
                perf::fill_pattern(&m.a, 0, span, pat)?;
                m.b.write(0, &vec![0u8; span as usize])?;
                let res = std::thread::scope(|s| {
                    let server = s.spawn(|| perf::bw_receiver(&b.qp, &b.cq, &m.b, &p, 128));
                    let client = perf::bw_requester(&a.qp, &a.cq, &m.a, &remote_b, &p);
                    let got = server.join().unwrap_or_else(|_| {
                        Err(ferroce_verbs::Error::EngineStopped(
                            "server thread panicked".into(),
                        ))
                    });
                    client.and_then(|c| got.map(|g| (c, g)))
                })?;
                let ok =
                    res.1.messages == iters && perf::check_pattern(&m.b, 0, span, pat)?.is_none();
                bw_row(name, &res.0, ok)
            }
            (_, false) => {
                m.b.write(0, &0u64.to_ne_bytes())?;
                let res = perf::bw_requester(&a.qp, &a.cq, &m.a, &remote_b, &p)?;
                let mut w = [0u8; 8];
                m.b.read(0, &mut w)?;
                let ok = u64::from_ne_bytes(w) == iters;
                let mut r = bw_row(name, &res, ok);
                r.note = format!("counter = {}", u64::from_ne_bytes(w));
                r
            }
        };
        rows.push(row);
    }
    Ok(rows)
}

fn lat_row(name: &str, r: &PerfResult, ok: bool) -> Row {
    let s = r.lat_summary();
    Row {
        test: name.into(),
        size: r.size,
        iters: r.iters,
        bw: None,
        mpps: None,
        lat: s.map(|(min, typ, _avg, p99, _max)| (min, typ, p99)),
        ok,
        note: String::new(),
    }
}

fn bw_row(name: &str, r: &PerfResult, ok: bool) -> Row {
    Row {
        test: name.into(),
        size: r.size,
        iters: r.iters,
        bw: Some(r.gbits()),
        mpps: Some(r.mpps()),
        lat: None,
        ok,
        note: String::new(),
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<18} {:>8} {:>7} {:>10} {:>8} {:>27} {:>9}",
        "test", "bytes", "iters", "Gbit/s", "Mmsg/s", "latency us (min/typ/p99)", "data"
    );
    for r in rows {
        let bw = r.bw.map_or("-".to_string(), |v| format!("{v:.3}"));
        let mpps = r.mpps.map_or("-".to_string(), |v| format!("{v:.3}"));
        let lat = r.lat.map_or("-".to_string(), |(a, b, c)| {
            format!("{a:.1} / {b:.1} / {c:.1}")
        });
        println!(
            "{:<18} {:>8} {:>7} {:>10} {:>8} {:>27} {:>9} {}",
            r.test,
            r.size,
            r.iters,
            bw,
            mpps,
            lat,
            if r.ok { "verified" } else { "MISMATCH" },
            r.note
        );
    }
}
