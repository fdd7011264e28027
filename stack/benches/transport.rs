//! Two cores joined in memory, no faults, one thread: 64 B SEND message
//! rate and 1 MiB RDMA WRITE throughput, with a single-core memcpy of the
//! same bytes measured in the same run as the baseline.
//!
//! The `floor` group measures, in the same run, what one 1 MiB WRITE cannot
//! avoid with these primitives: per 4 KiB packet one CRC pass over the
//! packet (`icrc_4KiB`: IP header to pad, 4136 bytes) on each side and one
//! copy between a memory region and a frame (`copy_4KiB`) on each side;
//! `primitives_1MiB` does exactly that work for 256 packets between two
//! 1 MiB regions, with no transport at all. WRITE / memcpy cannot beat
//! primitives_1MiB / memcpy without fusing the copy and the CRC into one
//! pass (hand-written SIMD, which the project keeps out of the stack).
//!
//! After criterion, a best-of-many-short-rounds report prints the same
//! figures as ratios (a short round often runs unpreempted on a shared
//! machine, so the minimum is the undisturbed cost).
//!
//! Why WRITE >= 0.4x memcpy (issue 3) is out of reach here, from one report
//! (2-vCPU AMD EPYC VM, load 4-5, best of 200 rounds): memcpy of 1 MiB
//! 23-25 us, i.e. 90-97 ns per 4 KiB. One CRC pass over a 4 KiB packet
//! (crc32fast, 16 AVX-512 VPCLMULQDQ streams) 95-102 ns: as slow as copying
//! it, a quarter of that the per-call fold-down and reduction. The two
//! copies (region -> frame, frame -> region) together 105-125 ns: one
//! streaming read and one streaming write, a memcpy's traffic. So the floor
//! is 2 CRC passes + 2 copies = 310-320 ns per packet, 80 us per MiB =
//! 0.29-0.31x memcpy, while 0.4x needs at most 60 us, 235 ns per packet:
//! less than the two CRC passes and the copies take on their own. Only a
//! copy that computes the CRC as it goes (one pass per side) would get
//! there, and that is hand-written SIMD, which the stack does not contain.
//!
//! `cargo bench -p ferroce-stack --bench transport`

use std::hint::black_box;
use std::time::Instant as Clock;

use criterion::{BenchmarkId, Criterion, Throughput};
use ferroce_stack::sim::{connect, ConnectCfg, LinkConfig, Network};
use ferroce_stack::transport::*;
use ferroce_stack::wire::icrc;
use ferroce_stack::wire::sample::sample_frame;
use ferroce_stack::wire::Opcode;

const MIB: usize = 1 << 20;
const BATCH: usize = 512;

struct Duo {
    cores: Vec<Core>,
    qp: [u32; 2],
    cq: [CqHandle; 2],
    lkey: [u32; 2],
    rkey: [u32; 2],
    buf: Vec<u8>,
    wcs: Vec<WorkCompletion>,
    /// Where each core's region lies, for the alignment line of the report.
    mr_addr: [usize; 2],
}

impl Duo {
    fn new() -> Duo {
        let mut net = Network::new(2, LinkConfig::perfect(), 7);
        let mut qp = [0; 2];
        let mut cq = [CqHandle(0); 2];
        let mut lkey = [0; 2];
        let mut rkey = [0; 2];
        let mut mr_addr = [0; 2];
        for i in 0..2 {
            let c = &mut net.cores[i];
            let pd = c.alloc_pd();
            cq[i] = c.create_cq(4 * BATCH as u32).unwrap();
            let region = VecRegion::zeroed(2 * MIB);
            mr_addr[i] = region.0.as_ptr() as usize;
            let (l, r) = c
                .reg_mr(pd, 0x1000, AccessFlags::ALL, Box::new(region))
                .unwrap();
            lkey[i] = l;
            rkey[i] = r;
            let init = QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq[i],
                recv_cq: cq[i],
                srq: None,
                cap: QpCap {
                    max_send_wr: 2 * BATCH as u32,
                    max_recv_wr: 2 * BATCH as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            };
            qp[i] = c.create_qp(pd, &init).unwrap();
        }
        let cfg = ConnectCfg {
            path_mtu: 4096,
            ..ConnectCfg::default()
        };
        connect(&mut net, 0, qp[0], 1, qp[1], QpType::Rc, &cfg, 0, 0).unwrap();
        Duo {
            cores: std::mem::take(&mut net.cores),
            qp,
            cq,
            lkey,
            rkey,
            buf: vec![0; MAX_FRAME_LEN],
            wcs: vec![dummy_wc(); 4 * BATCH],
            mr_addr,
        }
    }

    /// Move frames both ways until both cores are quiet.
    fn pump(&mut self) {
        let now = Instant::ZERO;
        loop {
            let mut moved = false;
            for (from, to) in [(0, 1), (1, 0)] {
                while let Some(n) = self.cores[from].poll_transmit(now, &mut self.buf) {
                    self.cores[to].handle_frame(now, &self.buf[..n]);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
    }

    fn drain(&mut self, i: usize) -> usize {
        self.cores[i].poll_cq(self.cq[i], &mut self.wcs).unwrap()
    }
}

fn dummy_wc() -> WorkCompletion {
    WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: 0,
        src_qp: 0,
        grh: false,
        ipv4: false,
        solicited: false,
    }
}

/// 512 64-byte SENDs (the last one signaled), pumped to completion.
fn send_batch(d: &mut Duo) -> usize {
    let rs = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: d.lkey[1],
    }];
    let ss = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: d.lkey[0],
    }];
    for i in 0..BATCH {
        d.cores[1]
            .post_recv(
                d.qp[1],
                &RecvWr {
                    wr_id: i as u64,
                    sg_list: &rs,
                },
            )
            .unwrap();
        let mut wr = SendWr::new(i as u64, SendOp::Send, &ss);
        wr.flags.signaled = i == BATCH - 1;
        d.cores[0].post_send(d.qp[0], &wr).unwrap();
    }
    d.pump();
    let n = d.drain(1) + d.drain(0);
    assert_eq!(n, BATCH + 1);
    n
}

/// One 1 MiB RDMA WRITE from core 0's region into core 1's, pumped to its completion.
fn write_once(d: &mut Duo) {
    let s = [Sge {
        addr: 0x1000,
        length: MIB as u32,
        lkey: d.lkey[0],
    }];
    let op = SendOp::RdmaWrite {
        remote_addr: 0x1000 + MIB as u64,
        rkey: d.rkey[1],
    };
    d.cores[0]
        .post_send(d.qp[0], &SendWr::new(1, op, &s))
        .unwrap();
    d.pump();
    assert_eq!(d.drain(0), 1);
}

fn send_64b(c: &mut Criterion) {
    let mut d = Duo::new();
    let mut g = c.benchmark_group("transport");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function(BenchmarkId::new("send_64B_msgs", BATCH), |b| {
        b.iter(|| black_box(send_batch(&mut d)))
    });
    g.finish();
}

fn write_1mib(c: &mut Criterion) {
    let mut d = Duo::new();
    let mut g = c.benchmark_group("transport");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.bench_function("rdma_write_1MiB", |b| b.iter(|| write_once(&mut d)));
    let mut m = Memcpy::new();
    g.bench_function("memcpy_1MiB_baseline", |b| b.iter(|| m.run()));
    g.finish();
}

/// The baseline: one single-core memcpy of 1 MiB.
struct Memcpy {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl Memcpy {
    fn new() -> Memcpy {
        Memcpy {
            src: vec![0x5au8; MIB],
            dst: vec![0u8; MIB],
        }
    }
    fn run(&mut self) {
        self.dst.copy_from_slice(black_box(&self.src));
        black_box(&mut self.dst);
    }
}

/// Payload bytes of one full-MTU packet.
const PKT: usize = 4096;

/// The bare per-packet work of a WRITE, without the transport: see the module docs.
struct Floor {
    /// A real WRITE_MIDDLE frame: Ethernet + IPv4 + UDP + BTH, 4 KiB, ICRC.
    frame: Vec<u8>,
    payload_at: usize,
    /// Regions allocated as the WRITE bench's are (same size, same allocator path).
    src: VecRegion,
    dst: VecRegion,
}

impl Floor {
    fn new() -> Floor {
        let mut frame = sample_frame(Opcode::RC_RDMA_WRITE_MIDDLE, false, false, PKT, 1)
            .expect("WRITE_MIDDLE is a valid opcode");
        let payload_at = frame.len() - icrc::ICRC_LEN - PKT;
        // Variant fields at ones for good: each ICRC below is then the one
        // pass over the packet that both sides must make at the least.
        let end = frame.len() - icrc::ICRC_LEN;
        let _ = icrc::mask_in_place(&mut frame[14..end], false);
        Floor {
            frame,
            payload_at,
            src: VecRegion(vec![0x5au8; 2 * MIB]),
            dst: VecRegion::zeroed(2 * MIB),
        }
    }
    fn l3(&self) -> &[u8] {
        &self.frame[14..self.frame.len() - icrc::ICRC_LEN]
    }
    fn icrc(&self) -> u32 {
        icrc::compute_masked(black_box(self.l3()))
    }
    fn copy(&mut self) {
        let at = self.payload_at;
        copy_bytes(
            black_box(&mut self.frame[at..at + PKT]),
            black_box(&self.src.0[..PKT]),
        )
    }
    /// 256 packets: requester region -> frame, ICRC; responder ICRC, frame -> region.
    fn primitives_1mib(&mut self) -> u32 {
        let at = self.payload_at;
        let mut sum = 0u32;
        for off in (0..MIB).step_by(PKT) {
            let _ = self.src.read(off as u64, &mut self.frame[at..at + PKT]);
            sum ^= self.icrc();
            sum ^= self.icrc();
            let _ = self
                .dst
                .write((MIB + off) as u64, &self.frame[at..at + PKT]);
        }
        black_box(sum)
    }
}

fn floor(c: &mut Criterion) {
    let mut f = Floor::new();
    let mut g = c.benchmark_group("floor");
    g.throughput(Throughput::Bytes(PKT as u64));
    g.bench_function("icrc_4KiB", |b| b.iter(|| f.icrc()));
    g.bench_function("copy_4KiB", |b| b.iter(|| f.copy()));
    g.throughput(Throughput::Bytes(MIB as u64));
    g.bench_function("primitives_1MiB", |b| b.iter(|| f.primitives_1mib()));
    g.finish();
}

/// Best round of ns per call over many short rounds, the measured things
/// taking turns so a busy spell of the machine hits them all alike.
fn best_of(rounds: usize, fs: &mut [(usize, &mut dyn FnMut())]) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; fs.len()];
    for _ in 0..rounds {
        for (i, (iters, f)) in fs.iter_mut().enumerate() {
            let t = Clock::now();
            for _ in 0..*iters {
                f();
            }
            let ns = t.elapsed().as_nanos() as f64 / *iters as f64;
            best[i] = best[i].min(ns);
        }
    }
    best
}

/// How far past its source (modulo a page) each payload copy writes: the
/// memcpy cliff of `copy_bytes` is 1-127.
fn ahead(dst: usize, src: usize) -> usize {
    dst.wrapping_sub(src) % 4096
}

fn ratio_report() {
    let mut duo_w = Duo::new();
    let mut duo_s = Duo::new();
    let mut m = Memcpy::new();
    let mut f = Floor::new();
    let mut g = Floor::new();
    // A WRITE_MIDDLE's payload sits 54 bytes into the frame; region offsets are page multiples.
    let frame_payload = duo_w.buf.as_ptr() as usize + 54;
    let floor_payload = f.frame.as_ptr() as usize + f.payload_at;
    let align = format!(
        "  copy dst-src mod 4096: WRITE gather {} scatter {}, floor gather {} scatter {}",
        ahead(frame_payload, duo_w.mr_addr[0]),
        ahead(duo_w.mr_addr[1], frame_payload),
        ahead(floor_payload, f.src.0.as_ptr() as usize),
        ahead(f.dst.0.as_ptr() as usize, floor_payload),
    );
    let mut write = || write_once(&mut duo_w);
    let mut send = || {
        black_box(send_batch(&mut duo_s));
    };
    let mut memcpy = || m.run();
    let mut prims = || {
        f.primitives_1mib();
    };
    let mut icrc4k = || {
        black_box(g.icrc());
    };
    let mut ns = best_of(
        200,
        &mut [
            (4, &mut memcpy),
            (4, &mut write),
            (4, &mut prims),
            (4, &mut send),
            (100, &mut icrc4k),
        ],
    );
    let copy4k = best_of(200, &mut [(100, &mut || g.copy())]);
    ns.extend(copy4k);
    let [memcpy, write, prims, send, icrc4k, copy4k] = ns[..] else {
        return;
    };
    let us = |n: f64| n / 1e3;
    println!("ratio report (best of 200 short rounds):");
    println!("  memcpy 1 MiB            {:8.1} us  1.00x", us(memcpy));
    println!(
        "  RDMA WRITE 1 MiB        {:8.1} us  {:.3}x memcpy (target >= 0.4x)",
        us(write),
        memcpy / write
    );
    println!(
        "  primitives 1 MiB        {:8.1} us  {:.3}x memcpy (256 x [copy in, CRC pass, CRC pass, copy out]: the floor)",
        us(prims),
        memcpy / prims
    );
    println!(
        "  per packet: WRITE {:.0} ns = primitives {:.0} ns + transport {:.0} ns",
        write / 256.0,
        prims / 256.0,
        (write - prims) / 256.0
    );
    println!(
        "  one CRC pass over a 4 KiB packet {icrc4k:.1} ns, copy 4 KiB {copy4k:.1} ns (in cache), memcpy 4 KiB share {:.1} ns",
        memcpy / 256.0
    );
    println!("{align}");
    println!(
        "  64 B SEND               {:8.2} M msg/s (target >= 3)",
        BATCH as f64 / send * 1e3
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    send_64b(&mut c);
    write_1mib(&mut c);
    floor(&mut c);
    c.final_summary();
    // `cargo bench` passes --bench; `cargo test --benches` does not: skip the slow report there.
    if std::env::args().any(|a| a == "--bench") {
        ratio_report();
    }
}
