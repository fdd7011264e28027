//! A pair (or more) of cores on the simulated network, with one PD, one
//! big memory region, a send CQ and a receive CQ per node.
#![allow(dead_code)]

use ferroce_stack::sim::{connect, ConnectCfg, LinkConfig, Network};
use ferroce_stack::transport::*;

pub const IOVA: u64 = 0x1_0000_0000;

pub struct Node {
    pub pd: PdHandle,
    pub scq: CqHandle,
    pub rcq: CqHandle,
    pub lkey: u32,
    pub rkey: u32,
    pub qps: Vec<u32>,
}

pub struct Pair {
    pub net: Network,
    pub nodes: Vec<Node>,
}

pub fn init_attr(t: QpType, scq: CqHandle, rcq: CqHandle) -> QpInitAttr {
    QpInitAttr {
        qp_type: t,
        send_cq: scq,
        recv_cq: rcq,
        srq: None,
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 30,
            max_recv_sge: 30,
            max_inline_data: 128,
        },
        sq_sig_all: false,
    }
}

impl Pair {
    /// Two nodes, `npairs` QP pairs (QP i of node 0 <-> QP i of node 1).
    pub fn with(
        t: QpType,
        link: LinkConfig,
        seed: u64,
        cfg: ConnectCfg,
        mem: usize,
        npairs: usize,
        psn: (u32, u32),
    ) -> Pair {
        let window = std::env::var("FERROCE_WINDOW")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(Config::default().max_unacked_psns);
        let core = Config {
            max_unacked_psns: window,
            // Soak the responder's ACK coalescing too:
            // FERROCE_ACK_DELAY_US=<µs> (off by default).
            ack_delay: std::env::var("FERROCE_ACK_DELAY_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .map(std::time::Duration::from_micros),
            ..Config::default()
        };
        Pair::with_core(t, link, seed, cfg, mem, npairs, psn, core)
    }

    /// [`Pair::with`] with both cores built from `core`.
    #[allow(clippy::too_many_arguments)]
    pub fn with_core(
        t: QpType,
        link: LinkConfig,
        seed: u64,
        cfg: ConnectCfg,
        mem: usize,
        npairs: usize,
        psn: (u32, u32),
        core: Config,
    ) -> Pair {
        let mut net = Network::with_config(2, link, seed, core);
        let mut nodes = Vec::new();
        for i in 0..2 {
            let c = &mut net.cores[i];
            let pd = c.alloc_pd();
            let scq = c.create_cq(1 << 16).unwrap();
            let rcq = c.create_cq(1 << 16).unwrap();
            let (lkey, rkey) = c
                .reg_mr(pd, IOVA, AccessFlags::ALL, Box::new(VecRegion::zeroed(mem)))
                .unwrap();
            let qps = (0..npairs)
                .map(|_| c.create_qp(pd, &init_attr(t, scq, rcq)).unwrap())
                .collect();
            nodes.push(Node {
                pd,
                scq,
                rcq,
                lkey,
                rkey,
                qps,
            });
        }
        for k in 0..npairs {
            let (qa, qb) = (nodes[0].qps[k], nodes[1].qps[k]);
            connect(&mut net, 0, qa, 1, qb, t, &cfg, psn.0, psn.1).unwrap();
        }
        Pair { net, nodes }
    }

    pub fn new(t: QpType) -> Pair {
        Pair::with_connect(t, ConnectCfg::default())
    }

    /// [`Pair::new`] with other connection attributes.
    pub fn with_connect(t: QpType, cfg: ConnectCfg) -> Pair {
        Pair::with(t, LinkConfig::perfect(), 1, cfg, 1 << 20, 1, (100, 5000))
    }

    pub fn qp(&self, node: usize) -> u32 {
        self.nodes[node].qps[0]
    }
    pub fn sge(&self, node: usize, off: u64, len: u32) -> Sge {
        Sge {
            addr: IOVA + off,
            length: len,
            lkey: self.nodes[node].lkey,
        }
    }
    pub fn write_mem(&mut self, node: usize, off: u64, data: &[u8]) {
        let k = self.nodes[node].lkey;
        self.net.cores[node]
            .mr_region_mut(k)
            .unwrap()
            .write(off, data)
            .unwrap();
    }
    pub fn read_mem(&self, node: usize, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.net.cores[node]
            .mr_region(self.nodes[node].lkey)
            .unwrap()
            .read(off, &mut v)
            .unwrap();
        v
    }
    pub fn post_recv(&mut self, node: usize, wr_id: u64, off: u64, len: u32) {
        let s = [self.sge(node, off, len)];
        let q = self.qp(node);
        self.net.cores[node]
            .post_recv(q, &RecvWr { wr_id, sg_list: &s })
            .unwrap();
    }
    pub fn post(
        &mut self,
        node: usize,
        wr_id: u64,
        op: SendOp,
        sges: &[Sge],
    ) -> Result<(), VerbsError> {
        let q = self.qp(node);
        self.net.cores[node].post_send(q, &SendWr::new(wr_id, op, sges))
    }
    /// Posts a WRITE of `len` bytes at `off` of node 0's region to the same
    /// offset of node 1's, signaled or not.
    pub fn post_write(&mut self, wr_id: u64, off: u64, len: u32, signaled: bool) {
        let (remote_addr, rkey) = self.remote(1, off);
        let s = [self.sge(0, off, len)];
        let mut wr = SendWr::new(wr_id, SendOp::RdmaWrite { remote_addr, rkey }, &s);
        wr.flags.signaled = signaled;
        let q = self.qp(0);
        self.net.cores[0].post_send(q, &wr).unwrap();
    }
    pub fn run(&mut self) {
        self.net.run_idle(std::time::Duration::from_secs(30));
    }
    pub fn scq(&mut self, node: usize) -> Vec<WorkCompletion> {
        drain(&mut self.net.cores[node], self.nodes[node].scq)
    }
    pub fn rcq(&mut self, node: usize) -> Vec<WorkCompletion> {
        drain(&mut self.net.cores[node], self.nodes[node].rcq)
    }
    pub fn remote(&self, node: usize, off: u64) -> (u64, u32) {
        (IOVA + off, self.nodes[node].rkey)
    }
}

pub fn drain(core: &mut Core, cq: CqHandle) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    while let Some(wc) = core.poll_cq_one(cq) {
        v.push(wc);
    }
    v
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seed
                .wrapping_mul(31)
                .wrapping_add(i as u64 * 7 + (i as u64 >> 8))) as u8
        })
        .collect()
}
