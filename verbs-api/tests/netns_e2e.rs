//! End to end between two network-namespace hosts over a veth pair, for
//! every backend: every work-request kind, sizes 1 B to 8 MiB, path MTU 1024
//! and 4096, IPv4 and IPv6 GIDs, 1 and 16 QPs, and the same under `tc netem`
//! loss and reordering. Needs root; skips with a message without it.
//! Frames of one run are captured and checked by `ferroce decode`, tshark and
//! scapy.

use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::time::Duration;

use ferroce_nic::netns::{Topology, TopologyConfig};
use ferroce_verbs::perf::{check_pattern, fill_pattern};
use ferroce_verbs::{
    Backend, CompletionQueue, ConnectOptions, Context, DeviceConfig, MemoryRegion, OpenOptions,
    ProtectionDomain, QpType, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcStatus,
};

const T: Duration = Duration::from_secs(30);
const BUF: usize = 20 << 20;

fn root_or_skip(test: &str) -> bool {
    if ferroce_nic::is_root() {
        return true;
    }
    eprintln!("SKIP {test}: needs root (network namespaces, AF_XDP/AF_PACKET)");
    false
}

/// Opens host 0 and host 1 on `backends[0]` and `backends[1]`.
fn open_hosts(
    topo: &Topology,
    backends: [Backend; 2],
    pcap: Option<PathBuf>,
    faults: Option<ferroce_nic::FaultConfig>,
) -> (Context, Context) {
    let mut v = Vec::new();
    for (i, &backend) in backends.iter().enumerate() {
        let mut cfg = DeviceConfig::new(&topo.host(i).ifname, backend);
        cfg.netns = Some(topo.host(i).ns.clone());
        cfg.seed = 77 + i as u64;
        if i == 0 {
            cfg.pcap = pcap.clone();
        }
        cfg.faults = faults.map(|f| ferroce_nic::FaultConfig {
            seed: f.seed + i as u64,
            ..f
        });
        let ctx = topo
            .run_in(i, move || Context::open(&cfg, OpenOptions::default()))
            .unwrap()
            .unwrap_or_else(|e| panic!("open {backend:?} on host {i}: {e}"));
        v.push(ctx);
    }
    let b = v.pop().unwrap();
    (v.pop().unwrap(), b)
}

struct Conn<'a, 'b> {
    qa: QueuePair<'a>,
    qb: QueuePair<'b>,
    cqa: CompletionQueue,
    cqb: CompletionQueue,
}

#[allow(clippy::too_many_arguments)]
fn connect<'a, 'b>(
    ca: &Context,
    pa: &'a ProtectionDomain,
    cb: &Context,
    pb: &'b ProtectionDomain,
    mtu: u32,
    ipv6: bool,
    psn: u32,
) -> Conn<'a, 'b> {
    let cqa = ca.create_cq(4096).unwrap();
    let cqb = cb.create_cq(4096).unwrap();
    let qa = pa
        .create_qp()
        .max_send_wr(256)
        .max_recv_wr(256)
        .build(&cqa, &cqa)
        .unwrap();
    let qb = pb
        .create_qp()
        .max_send_wr(256)
        .max_recv_wr(256)
        .build(&cqb, &cqb)
        .unwrap();
    let gid_index = |c: &Context| {
        c.gids()
            .iter()
            .position(|g| (g.to_ipv4_mapped().is_some()) != ipv6 && !is_link_local(g))
            .unwrap()
    };
    let oa = ConnectOptions {
        path_mtu: mtu,
        sgid_index: gid_index(ca),
        local_psn: psn,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        timeout: 10,
        ..Default::default()
    };
    let ob = ConnectOptions {
        sgid_index: gid_index(cb),
        local_psn: psn ^ 0x00ab_cdef,
        ..oa
    };
    qa.to_init(&oa).unwrap();
    qb.to_init(&ob).unwrap();
    let (ga, gb) = (
        ca.query_gid(oa.sgid_index).unwrap(),
        cb.query_gid(ob.sgid_index).unwrap(),
    );
    assert_eq!(ga.to_ipv4_mapped().is_none(), ipv6);
    qa.connect(
        ca,
        &RemoteQp {
            qpn: qb.qpn(),
            psn: ob.local_psn,
            gid: gb,
        },
        &oa,
    )
    .unwrap();
    qb.connect(
        cb,
        &RemoteQp {
            qpn: qa.qpn(),
            psn: oa.local_psn,
            gid: ga,
        },
        &ob,
    )
    .unwrap();
    Conn { qa, qb, cqa, cqb }
}

fn is_link_local(g: &Ipv6Addr) -> bool {
    g.segments()[0] == 0xfe80
}

fn wait_ok(cq: &CompletionQueue, n: usize, what: &str) {
    for wc in cq.poll_n(n, T).unwrap_or_else(|e| panic!("{what}: {e}")) {
        assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
    }
}

/// Posts a signaled RDMA WRITE of `len` bytes at `off` in `ma` to the same
/// offset in `mb`.
fn post_write(
    c: &Conn<'_, '_>,
    ma: &MemoryRegion<'_>,
    mb: &MemoryRegion<'_>,
    off: u64,
    len: u32,
    wr_id: u64,
) {
    let ss = [ma.sge(off, len)];
    let mut wr = SendWr::new(
        wr_id,
        SendOp::RdmaWrite {
            remote_addr: mb.addr() + off,
            rkey: mb.rkey(),
        },
        &ss,
    );
    wr.flags.signaled = true;
    c.qa.post_send(&[wr]).unwrap();
}

/// Every operation once at `size`, data checked on arrival.
fn every_op(c: &Conn<'_, '_>, ma: &MemoryRegion<'_>, mb: &MemoryRegion<'_>, size: u32, seed: u64) {
    let len = u64::from(size);
    fill_pattern(ma, 0, len, seed).unwrap();
    // SEND and SEND_WITH_IMM into posted receives.
    for (i, op) in [SendOp::Send, SendOp::SendWithImm { imm: 0x1234_5678 }]
        .into_iter()
        .enumerate()
    {
        mb.write(0, &vec![0u8; size as usize]).unwrap();
        let rs = [mb.sge(0, size)];
        c.qb.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sg_list: &rs,
        }])
        .unwrap();
        let ss = [ma.sge(0, size)];
        let mut wr = SendWr::new(i as u64, op, &ss);
        wr.flags.signaled = true;
        c.qa.post_send(&[wr]).unwrap();
        wait_ok(&c.cqa, 1, "send completion");
        let wc = c.cqb.poll_n(1, T).unwrap()[0];
        assert_eq!(
            (wc.status, wc.byte_len),
            (WcStatus::Success, size),
            "recv {op:?}"
        );
        assert_eq!(
            check_pattern(mb, 0, len, seed).unwrap(),
            None,
            "SEND data, size {size}"
        );
    }
    // RDMA WRITE, then WRITE_WITH_IMM (which consumes a receive).
    mb.write(0, &vec![0u8; size as usize]).unwrap();
    post_write(c, ma, mb, 0, size, 3);
    wait_ok(&c.cqa, 1, "write");
    assert_eq!(
        check_pattern(mb, 0, len, seed).unwrap(),
        None,
        "WRITE data, size {size}"
    );
    let rs = [mb.sge(0, 0)];
    c.qb.post_recv(&[RecvWr {
        wr_id: 200,
        sg_list: &rs[..0],
    }])
    .unwrap();
    let ss = [ma.sge(0, size)];
    let mut wr = SendWr::new(
        4,
        SendOp::RdmaWriteWithImm {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
            imm: 42,
        },
        &ss,
    );
    wr.flags.signaled = true;
    c.qa.post_send(&[wr]).unwrap();
    wait_ok(&c.cqa, 1, "write with imm");
    let wc = c.cqb.poll_n(1, T).unwrap()[0];
    assert_eq!((wc.status, wc.imm_data), (WcStatus::Success, Some(42)));
    // RDMA READ it back into a's upper half.
    let up = BUF as u64 / 2;
    let ds = [ma.sge(up, size)];
    let mut wr = SendWr::new(
        5,
        SendOp::RdmaRead {
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
        },
        &ds,
    );
    wr.flags.signaled = true;
    c.qa.post_send(&[wr]).unwrap();
    wait_ok(&c.cqa, 1, "read");
    assert_eq!(
        check_pattern(ma, up, len, seed).unwrap(),
        None,
        "READ data, size {size}"
    );
    // Atomics on b's word at 8 MiB + 64.
    let w = 8u64 << 20 | 64;
    mb.write(w, &10u64.to_ne_bytes()).unwrap();
    let ds = [ma.sge(w, 8)];
    let mut wr = SendWr::new(
        6,
        SendOp::AtomicFetchAdd {
            remote_addr: mb.addr() + w,
            rkey: mb.rkey(),
            add: 5,
        },
        &ds,
    );
    wr.flags.signaled = true;
    c.qa.post_send(&[wr]).unwrap();
    wait_ok(&c.cqa, 1, "fetch-add");
    let mut wr = SendWr::new(
        7,
        SendOp::AtomicCmpSwp {
            remote_addr: mb.addr() + w,
            rkey: mb.rkey(),
            compare: 15,
            swap: 1000,
        },
        &ds,
    );
    wr.flags.signaled = true;
    c.qa.post_send(&[wr]).unwrap();
    wait_ok(&c.cqa, 1, "cmp-swap");
    let mut word = [0u8; 8];
    mb.read(w, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 1000);
    ma.read(w, &mut word).unwrap();
    assert_eq!(
        u64::from_ne_bytes(word),
        15,
        "cmp-swap returns the original value"
    );
}

/// The tests share two cores; running the matrices one at a time keeps
/// their time-outs meaningful.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn matrix(backend: Backend, faults: Option<ferroce_nic::FaultConfig>) {
    matrix_between([backend; 2], faults)
}

/// The matrix with host 0 on `backends[0]` and host 1 on `backends[1]`.
fn matrix_between(backends: [Backend; 2], faults: Option<ferroce_nic::FaultConfig>) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = Topology::up(&TopologyConfig::default()).unwrap();
    let (ca, cb) = open_hosts(&topo, backends, None, faults);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let access = ConnectOptions::default().access;
    let ma = pa.reg_mr(BUF, access).unwrap();
    let mb = pb.reg_mr(BUF, access).unwrap();
    let lossy = faults.is_some();
    let sizes: &[u32] = if lossy {
        &[1, 4095, 65536, 1 << 20]
    } else {
        &[1, 4095, 65536, 8 << 20]
    };
    let mut psn = 0x00ff_fff0; // near the 24-bit wrap
                               // The UDP backend's socket is bound to one IPv4 address: no IPv6 GID.
    let paths: &[(u32, bool)] = if backends.contains(&Backend::Udp) {
        &[(1024, false), (4096, false)]
    } else {
        &[(1024, false), (4096, true), (4096, false)]
    };
    for &(mtu, ipv6) in paths {
        let c = connect(&ca, &pa, &cb, &pb, mtu, ipv6, psn);
        psn = (psn + 0x10_0000) & 0x00ff_ffff;
        for &size in sizes {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                every_op(&c, &ma, &mb, size, u64::from(size) ^ u64::from(mtu))
            }));
            if let Err(p) = run {
                // Say what the engines saw before failing.
                for (name, ctx) in [("A", &ca), ("B", &cb)] {
                    let s = ctx.stats();
                    eprintln!("{backends:?} mtu {mtu} ipv6 {ipv6} size {size}: host {name}: {:?}\n    {:?}", s.io, s.core);
                }
                std::panic::resume_unwind(p);
            }
        }
    }
    // 16 QPs at once, each writing its own slice, data checked.
    let conns: Vec<_> = (0..16)
        .map(|i| connect(&ca, &pa, &cb, &pb, 4096, false, i * 4099))
        .collect();
    let slice = 64 * 1024u64;
    fill_pattern(&ma, 0, slice * 16, 5).unwrap();
    mb.write(0, &vec![0u8; (slice * 16) as usize]).unwrap();
    for (i, c) in conns.iter().enumerate() {
        post_write(c, &ma, &mb, i as u64 * slice, slice as u32, i as u64);
    }
    for c in &conns {
        wait_ok(&c.cqa, 1, "16-QP write");
    }
    assert_eq!(
        check_pattern(&mb, 0, slice * 16, 5).unwrap(),
        None,
        "16-QP data"
    );
    assert!(conns.iter().all(|c| c.qa.qp_type() == QpType::Rc));
    let s = ca.stats();
    eprintln!(
        "{backends:?} faults={lossy}: A sent {} frames ({} GSO super-frames), retransmits {}, drops {:?}",
        s.io.tx_frames, s.io.tx_gso, s.core.retransmits, s.core.drops
    );
    // Multi-packet WRITEs leave as GSO super-frames where the backend can
    // (AF_PACKET from Linux 6.2; a UDP socket always), and arrived intact above.
    let gso = match backends[0] {
        Backend::Udp => true,
        Backend::AfPacket => ferroce_verbs::device::afpacket_sends_gso(),
        _ => false,
    };
    if gso && !lossy {
        assert!(s.io.tx_gso > 0, "{backends:?}: no GSO super-frame sent");
    }
}

#[test]
fn afxdp_every_operation() {
    if root_or_skip("afxdp_every_operation") {
        matrix(Backend::AfXdp, None);
    }
}

#[test]
fn afpacket_every_operation() {
    if root_or_skip("afpacket_every_operation") {
        matrix(Backend::AfPacket, None);
    }
}

#[test]
fn udp_every_operation() {
    if root_or_skip("udp_every_operation") {
        matrix(Backend::Udp, None);
    }
}

/// A UDP-socket host and a raw-frame host on one veth link: the raw side sees
/// the kernel's offload forms (partial checksums, uncut GSO frames) and must
/// finish them as a NIC would (nic-drivers' offload module).
#[test]
fn udp_and_afpacket_hosts_together() {
    if root_or_skip("udp_and_afpacket_hosts_together") {
        matrix_between([Backend::Udp, Backend::AfPacket], None);
    }
}

#[test]
fn afxdp_and_udp_hosts_together() {
    if root_or_skip("afxdp_and_udp_hosts_together") {
        matrix_between([Backend::AfXdp, Backend::Udp], None);
    }
}

/// 1% loss, 1% duplication and 2% reordering on every frame each host
/// receives. `tc netem` would be the natural tool, but this kernel has no
/// sch_netem ("Specified qdisc kind is unknown"), so the faults are injected
/// by the backend wrapper instead, on the same veth link.
#[test]
fn lossy_reordering_link_still_delivers() {
    if root_or_skip("lossy_reordering_link_still_delivers") {
        matrix(
            Backend::AfXdp,
            Some(ferroce_nic::FaultConfig {
                seed: 11,
                loss: 0.01,
                dup: 0.01,
                reorder: 0.02,
                ..Default::default()
            }),
        );
    }
}

/// Frames captured with `--pcap`-style recording decode in `ferroce decode`
/// (ICRC checked), tshark (InfiniBand fields present) and scapy (same ICRC).
#[test]
fn captured_frames_pass_decode_tshark_and_scapy() {
    if !root_or_skip("captured_frames_pass_decode_tshark_and_scapy") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("e2e.pcap");
    {
        let _one_at_a_time = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let topo = Topology::up(&TopologyConfig::default()).unwrap();
        let (ca, cb) = open_hosts(&topo, [Backend::AfXdp; 2], Some(pcap.clone()), None);
        let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
        let access = ConnectOptions::default().access;
        let ma = pa.reg_mr(BUF, access).unwrap();
        let mb = pb.reg_mr(BUF, access).unwrap();
        let c = connect(&ca, &pa, &cb, &pb, 1024, false, 100);
        every_op(&c, &ma, &mb, 3000, 9);
        let c6 = connect(&ca, &pa, &cb, &pb, 4096, true, 200);
        every_op(&c6, &ma, &mb, 5000, 10);
    }
    // decode: every frame RoCE with a good ICRC.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("decode")
        .arg(&pcap)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let summary = text.lines().last().unwrap();
    assert!(summary.contains(" 0 icrc-bad, 0 malformed"), "{summary}");
    let roce: u64 = summary
        .split(" roce")
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(roce > 40, "{summary}");
    // tshark sees every frame as InfiniBand with an opcode.
    if let Ok(t) = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args([
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
        ])
        .output()
    {
        let rows = String::from_utf8_lossy(&t.stdout);
        let n = rows.lines().filter(|l| !l.trim().is_empty()).count() as u64;
        assert!(
            rows.lines()
                .all(|l| !l.split('\t').next().unwrap_or("").is_empty()),
            "{rows}"
        );
        assert!(n >= roce, "tshark saw {n} frames, decode {roce}");
    } else {
        eprintln!("SKIP tshark part: tshark not installed");
    }
    // scapy recomputes the same ICRC for every RoCE frame.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../interop-tests/scripts/scapy_icrc.py"
    );
    let has_scapy = std::process::Command::new("python3")
        .args(["-c", "import scapy.contrib.roce"])
        .status()
        .is_ok_and(|s| s.success());
    if has_scapy {
        let bytes = std::fs::read(&pcap).unwrap();
        let mut reader = pcap_file::pcap::PcapReader::new(&bytes[..]).unwrap();
        let mut hex = String::new();
        let mut ours = Vec::new();
        while let Some(p) = reader.next_packet() {
            let p = p.unwrap();
            if ferroce_stack::wire::ParsedPacket::parse(&p.data).is_ok() {
                hex.extend(p.data.iter().map(|b| format!("{b:02x}")));
                hex.push('\n');
                ours.push(
                    p.data[p.data.len() - 4..]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>(),
                );
            }
        }
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), hex.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let theirs: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(theirs, ours, "scapy's ICRCs differ");
    } else {
        eprintln!("SKIP scapy part: python3 with scapy not available");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `auto` on a veth, where AF_XDP binds only in copy mode: AF_PACKET when
/// it sends GSO super-frames (Linux >= 6.2; about twice AF_XDP's bandwidth
/// there), else AF_XDP as before; and the pair works.
#[test]
fn auto_prefers_afpacket_over_copy_mode_afxdp() {
    if !root_or_skip("auto_prefers_afpacket_over_copy_mode_afxdp") {
        return;
    }
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = Topology::up(&TopologyConfig::default()).unwrap();
    let (a, b) = open_hosts(&topo, [Backend::Auto; 2], None, None);
    let want = if ferroce_verbs::device::afpacket_sends_gso() {
        "afpacket"
    } else {
        "afxdp"
    };
    assert_eq!([a.backend(), b.backend()], [want; 2]);
    let access = ConnectOptions::default().access;
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ma, mb) = (
        pa.reg_mr(BUF, access).unwrap(),
        pb.reg_mr(BUF, access).unwrap(),
    );
    let c = connect(&a, &pa, &b, &pb, 4096, false, 0x3000);
    every_op(&c, &ma, &mb, 65536, 40);
}

/// Two devices on each host, an AF_XDP one and then one with `auto`, as two
/// processes on each would open them: the second gets AF_PACKET (a queue
/// takes one AF_XDP socket; on veth, where AF_XDP binds in copy mode, `auto`
/// takes AF_PACKET anyway), each with its own QPN prefix, and each pair's
/// traffic reaches only its own devices, one pair at a time and both at once.
#[test]
fn two_devices_per_host_keep_their_traffic_apart() {
    if !root_or_skip("two_devices_per_host_keep_their_traffic_apart") {
        return;
    }
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = Topology::up(&TopologyConfig::default()).unwrap();
    let (a0, b0) = open_hosts(&topo, [Backend::AfXdp; 2], None, None);
    let (a1, b1) = open_hosts(&topo, [Backend::Auto; 2], None, None);
    eprintln!(
        "backends: host 0 {} + {}, host 1 {} + {}",
        a0.backend(),
        a1.backend(),
        b0.backend(),
        b1.backend()
    );
    assert_eq!([a1.backend(), b1.backend()], ["afpacket"; 2], "auto");
    let access = ConnectOptions::default().access;
    let pds = [&a0, &b0, &a1, &b1].map(|c| c.alloc_pd());
    let mrs: Vec<MemoryRegion<'_>> = pds
        .iter()
        .map(|pd| pd.reg_mr(BUF, access).unwrap())
        .collect();
    let c0 = connect(&a0, &pds[0], &b0, &pds[1], 4096, false, 0x1000);
    let c1 = connect(&a1, &pds[2], &b1, &pds[3], 4096, false, 0x2000);
    assert_ne!(c0.qa.qpn() >> 16, c1.qa.qpn() >> 16, "host 0's prefixes");
    assert_ne!(c0.qb.qpn() >> 16, c1.qb.qpn() >> 16, "host 1's prefixes");
    for size in [1, 4095, 65536, 1 << 20] {
        every_op(&c0, &mrs[0], &mrs[1], size, 10 + u64::from(size));
        every_op(&c1, &mrs[2], &mrs[3], size, 20 + u64::from(size));
    }
    // Both pairs at once: a WRITE of 2 MiB each, data checked.
    let len = 2u64 << 20;
    for (i, (c, ma, mb)) in [(&c0, &mrs[0], &mrs[1]), (&c1, &mrs[2], &mrs[3])]
        .into_iter()
        .enumerate()
    {
        fill_pattern(ma, 0, len, 30 + i as u64).unwrap();
        mb.write(0, &vec![0u8; len as usize]).unwrap();
        post_write(c, ma, mb, 0, len as u32, i as u64);
    }
    for (i, (c, mb)) in [(&c0, &mrs[1]), (&c1, &mrs[3])].into_iter().enumerate() {
        wait_ok(&c.cqa, 1, "concurrent write");
        assert_eq!(
            check_pattern(mb, 0, len, 30 + i as u64).unwrap(),
            None,
            "pair {i}'s data"
        );
    }
}

/// Devices of one host reach each other whatever their backends, as rxe's
/// QPs do through the kernel's loopback: a raw device sends to an address
/// of its own host through its UDP socket (`ferroce_nic::local_peers`), and
/// the kernel hands it what such peers send. Pairs: AF_XDP ⇄ AF_PACKET (IPv4
/// and IPv6 GIDs), AF_PACKET ⇄ UDP, UDP ⇄ AF_XDP and two QPs of the AF_XDP
/// device; each runs every operation at 1 B, 4095 B, 64 KiB and 1 MiB, data
/// checked. Before, a raw device refused such a path ("an address of this
/// host").
#[test]
fn raw_devices_reach_peers_on_their_own_host() {
    if !root_or_skip("raw_devices_reach_peers_on_their_own_host") {
        return;
    }
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = Topology::up(&TopologyConfig::default()).unwrap();
    let open = |backend: Backend, seed: u64| {
        let mut cfg = DeviceConfig::new(&topo.host(0).ifname, backend);
        cfg.netns = Some(topo.host(0).ns.clone());
        cfg.seed = seed;
        topo.run_in(0, move || Context::open(&cfg, OpenOptions::default()))
            .unwrap()
            .unwrap_or_else(|e| panic!("open {backend:?}: {e}"))
    };
    // `auto` beside an AF_XDP device takes AF_PACKET (a queue takes one
    // AF_XDP socket).
    let ctxs = [
        open(Backend::AfXdp, 91),
        open(Backend::Auto, 92),
        open(Backend::Udp, 93),
    ];
    let kinds = ctxs.each_ref().map(|c| c.backend());
    assert_eq!(kinds, ["afxdp", "afpacket", "udp"], "backends");
    let access = ConnectOptions::default().access;
    let pds = ctxs.each_ref().map(|c| c.alloc_pd());
    // Two regions per device: the (0, 0) pair needs one for each side.
    let mrs = pds.each_ref().map(|pd| {
        [
            pd.reg_mr(BUF, access).unwrap(),
            pd.reg_mr(BUF, access).unwrap(),
        ]
    });
    // The UDP device has no IPv6 GID: IPv6 only between the raw ones.
    let pairs = [
        (0, 1, false),
        (1, 2, false),
        (2, 0, false),
        (0, 0, false),
        (0, 1, true),
    ];
    for (n, (i, j, ipv6)) in pairs.into_iter().enumerate() {
        let c = connect(
            &ctxs[i],
            &pds[i],
            &ctxs[j],
            &pds[j],
            4096,
            ipv6,
            0x3000 * (n as u32 + 1),
        );
        for size in [1, 4095, 65536, 1 << 20] {
            let family = if ipv6 { "IPv6" } else { "IPv4" };
            eprintln!("{} ⇄ {} ({family}): {size} B", kinds[i], kinds[j]);
            every_op(&c, &mrs[i][0], &mrs[j][1], size, 40 + u64::from(size));
        }
    }
}
