//! Two cores joined in memory, no faults, one thread: 64 B SEND message
//! rate and 1 MiB RDMA WRITE throughput, with a single-core memcpy of the
//! same bytes measured in the same run as the baseline.
//!
//! `cargo bench -p ferroce-stack --bench transport`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroce_stack::sim::{connect, ConnectCfg, LinkConfig, Network};
use ferroce_stack::transport::*;

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
}

impl Duo {
    fn new() -> Duo {
        let mut net = Network::new(2, LinkConfig::perfect(), 7);
        let mut qp = [0; 2];
        let mut cq = [CqHandle(0); 2];
        let mut lkey = [0; 2];
        let mut rkey = [0; 2];
        for i in 0..2 {
            let c = &mut net.cores[i];
            let pd = c.alloc_pd();
            cq[i] = c.create_cq(4 * BATCH as u32).unwrap();
            let (l, r) = c
                .reg_mr(
                    pd,
                    0x1000,
                    AccessFlags::ALL,
                    Box::new(VecRegion::zeroed(2 * MIB)),
                )
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
        solicited: false,
    }
}

fn send_64b(c: &mut Criterion) {
    let mut d = Duo::new();
    let mut g = c.benchmark_group("transport");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function(BenchmarkId::new("send_64B_msgs", BATCH), |b| {
        b.iter(|| {
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
            black_box(n)
        })
    });
    g.finish();
}

fn write_1mib(c: &mut Criterion) {
    let mut d = Duo::new();
    let mut g = c.benchmark_group("transport");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.bench_function("rdma_write_1MiB", |b| {
        b.iter(|| {
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
        })
    });
    let src = vec![0x5au8; MIB];
    let mut dst = vec![0u8; MIB];
    g.bench_function("memcpy_1MiB_baseline", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        })
    });
    g.finish();
}

criterion_group!(benches, send_64b, write_1mib);
criterion_main!(benches);
