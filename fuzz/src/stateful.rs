//! Stateful targets: a transport [`Core`](ferroce_stack::transport::Core) with RC, UC and UD QPs in RTS (and
//! one RC QP left in INIT), guarded memory regions, and a script of frames,
//! timer ticks and verbs calls chosen by the fuzzer. After every step the
//! harness checks what must hold whatever the peer sends:
//!
//! - no panic;
//! - no memory access outside a registered region, into a region the peer has
//!   no right to (no remote access, or another PD), or outside the buffers the
//!   harness posted (receive SGEs, READ/atomic result SGEs) — see [`guard`](crate::guard);
//! - no completion without a matching posted work request, none twice, each
//!   on the QP and CQ it was posted to, with a plausible opcode and length;
//! - no more successful send completions on a QP than messages it started;
//! - counters consistent: `rx_frames` counts every frame handed in,
//!   `tx_packets` every frame taken out, no counter goes down;
//! - every frame the core emits parses (ICRC included) and comes from the
//!   victim's own address;
//! - a frame for one QP changes no other QP's state.
//!
//! Two nodes are set up identically on every run (same seeds, so the same
//! keys, QPNs and PSNs). Node 0 posts SEND/WRITE/READ/atomic work requests
//! toward node 1, which posts receives. A script run between the two, done
//! once, records every frame each side sent: the requests node 0 sent are the
//! seed material for the responder target (victim node 1), the ACKs and read
//! responses node 1 sent are the seed material for the requester target
//! (victim node 0). The fuzzer replays, mutates (with the ICRC fixed up so the
//! frame gets past the parser) or forges frames from them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use ferroce_stack::sim::{connect, ConnectCfg, LinkConfig, Network};
use ferroce_stack::transport::{
    AccessFlags, Config, CqHandle, Instant, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion, MAX_FRAME_LEN,
};
use ferroce_stack::wire::{icrc, sample, ParsedPacket, MAX_PAYLOAD, OPCODES};

use crate::guard::{lock, GuardHandle, GuardRegion, Policy};

const SEED: u64 = 0xf022_5eed;
const QKEY: u32 = 0x1111_1111;
/// Region base addresses (iova) on both nodes. The foreign-PD region shares
/// the open region's iova, so a lookup by address instead of key shows up.
pub const OPEN_IOVA: u64 = 0x1_0000_0000;
pub const OPEN_LEN: usize = 8192;
pub const SINK_IOVA: u64 = OPEN_IOVA + OPEN_LEN as u64;
pub const SINK_LEN: usize = 32768;
pub const INERT_IOVA: u64 = SINK_IOVA + SINK_LEN as u64;
pub const SMALL_LEN: usize = 1024;
const MTU: u32 = 256;
/// Frames taken out of the victim per step at most (keeps a run bounded).
const DRAIN_LIMIT: usize = 512;

/// Keys and handles of one node.
#[derive(Debug, Clone)]
pub struct Node {
    pub scq: CqHandle,
    pub rcq: CqHandle,
    /// (lkey, rkey) of the open, sink, inert and foreign-PD regions.
    pub open: (u32, u32),
    pub sink: (u32, u32),
    pub inert: (u32, u32),
    pub foreign: (u32, u32),
    /// RC, UC, UD (all RTS) and an RC QP left in INIT.
    pub qps: [u32; 4],
    pub guards: Vec<GuardHandle>,
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

fn connect_cfg() -> ConnectCfg {
    ConnectCfg {
        path_mtu: MTU,
        // 4.096 µs × 2^3 ≈ 33 µs, so ticks reach retries quickly.
        timeout: 3,
        retry_cnt: 2,
        rnr_retry: 2,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        access: AccessFlags::ALL,
    }
}

fn build() -> (Network, [Node; 2]) {
    let cfg = Config {
        max_qp: 64,
        max_cq: 16,
        max_qp_wr: 64,
        max_cqe: 1024,
        ..Config::default()
    };
    let mut net = Network::with_config(2, LinkConfig::perfect(), SEED, cfg);
    let mut nodes = Vec::new();
    for c in net.cores.iter_mut() {
        let pd = c.alloc_pd();
        let pd2 = c.alloc_pd();
        let scq = c.create_cq(256).expect("cq");
        let rcq = c.create_cq(256).expect("cq");
        let mut guards = Vec::new();
        let mut reg = |c: &mut ferroce_stack::transport::Core,
                       name: &'static str,
                       pd,
                       iova,
                       len,
                       access,
                       policy| {
            let (r, h) = GuardRegion::new(name, len, policy);
            guards.push(h);
            c.reg_mr(pd, iova, access, Box::new(r)).expect("reg_mr")
        };
        let open = reg(
            c,
            "open",
            pd,
            OPEN_IOVA,
            OPEN_LEN,
            AccessFlags::ALL,
            Policy::Open,
        );
        let sink = reg(
            c,
            "sink",
            pd,
            SINK_IOVA,
            SINK_LEN,
            AccessFlags::LOCAL_WRITE,
            Policy::LocalSink,
        );
        let inert = reg(
            c,
            "inert",
            pd,
            INERT_IOVA,
            SMALL_LEN,
            AccessFlags::NONE,
            Policy::Forbidden,
        );
        let foreign = reg(
            c,
            "foreign-pd",
            pd2,
            OPEN_IOVA,
            SMALL_LEN,
            AccessFlags::ALL,
            Policy::Forbidden,
        );
        let mut qps = [0u32; 4];
        for (i, t) in [QpType::Rc, QpType::Uc, QpType::Ud, QpType::Rc]
            .into_iter()
            .enumerate()
        {
            let init = QpInitAttr {
                qp_type: t,
                send_cq: scq,
                recv_cq: rcq,
                srq: None,
                cap: cap(),
                sq_sig_all: false,
            };
            qps[i] = c.create_qp(pd, &init).expect("create_qp");
        }
        nodes.push(Node {
            scq,
            rcq,
            open,
            sink,
            inert,
            foreign,
            qps,
            guards,
        });
    }
    let cc = connect_cfg();
    for (i, t) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
        let (a, b) = (nodes[0].qps[i], nodes[1].qps[i]);
        connect(
            &mut net,
            0,
            a,
            1,
            b,
            t,
            &cc,
            100 + i as u32,
            5000 + i as u32,
        )
        .expect("connect");
    }
    // Each UD QP hears a multicast group too, so frames to the multicast
    // QPN and that group reach the fan-out (rxe_rcv_mcast_pkt's path).
    for (n, node) in nodes.iter().enumerate() {
        net.cores[n]
            .attach_mcast(node.qps[2], FUZZ_MGID)
            .expect("attach_mcast");
    }
    for (n, node) in nodes.iter().enumerate() {
        let attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: AccessFlags::ALL,
            ..QpAttr::default()
        };
        net.cores[n]
            .modify_qp(
                node.qps[3],
                &attr,
                QpAttrMask::STATE
                    | QpAttrMask::PKEY_INDEX
                    | QpAttrMask::PORT
                    | QpAttrMask::ACCESS_FLAGS,
            )
            .expect("INIT");
    }
    let [a, b]: [Node; 2] = nodes.try_into().expect("two nodes");
    (net, [a, b])
}

/// The multicast group both nodes' UD QPs are attached to (239.0.0.1).
const FUZZ_MGID: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0xef00, 0x0001);

/// A posted work request the harness expects to complete at most once.
#[derive(Debug, Clone, Copy)]
struct Posted {
    qpn: u32,
    recv: bool,
    op: Option<WcOpcode>,
    /// Bytes the receive buffers hold, or the message length of a send.
    len: u64,
}

/// The verbs side of the script and of fuzzer-chosen posts.
pub struct Session {
    net: Network,
    nodes: [Node; 2],
    victim: usize,
    now: Instant,
    posted: HashMap<u64, Posted>,
    next_wr_id: u64,
    fed: u64,
    emitted: u64,
    /// Per QP: PSNs of first/only request packets the victim sent.
    started: HashMap<u32, HashSet<u32>>,
    succeeded: HashMap<u32, u64>,
    last: Vec<(String, u64)>,
    buf: Vec<u8>,
    sink_next: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("victim", &self.victim)
            .field("now", &self.now)
            .finish()
    }
}

/// Which node a target attacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Node 1: receives requests.
    Responder,
    /// Node 0: has SEND/WRITE/READ/atomic WRs outstanding, receives responses.
    Requester,
}

impl Session {
    /// Set both nodes up and post the script's work requests.
    pub fn new(role: Role) -> Session {
        let (net, nodes) = build();
        let mut s = Session {
            net,
            nodes,
            victim: match role {
                Role::Responder => 1,
                Role::Requester => 0,
            },
            now: Instant::ZERO,
            posted: HashMap::new(),
            next_wr_id: 1,
            fed: 0,
            emitted: 0,
            started: HashMap::new(),
            succeeded: HashMap::new(),
            last: Vec::new(),
            buf: vec![0; MAX_FRAME_LEN],
            sink_next: 0,
        };
        s.script();
        s
    }

    /// A node's core, for tests and debugging.
    pub fn core(&self, node: usize) -> &ferroce_stack::transport::Core {
        &self.net.cores[node]
    }

    pub fn peer_node(&self) -> &Node {
        &self.nodes[1 - self.victim]
    }

    pub fn victim_node(&self) -> &Node {
        &self.nodes[self.victim]
    }

    /// Take a sink buffer of `len` bytes on `node` (wrapping), marked writable.
    fn sink_sge(&mut self, node: usize, len: u32) -> Sge {
        let len = len.min(SINK_LEN as u32 / 4);
        if self.sink_next + u64::from(len) > SINK_LEN as u64 {
            self.sink_next = 0;
        }
        let off = self.sink_next;
        self.sink_next += u64::from(len).max(8).next_multiple_of(8);
        // The sink is the second guard of each node.
        lock(&self.nodes[node].guards[1])
            .writable
            .push(off..off + u64::from(len));
        Sge {
            addr: SINK_IOVA + off,
            length: len,
            lkey: self.nodes[node].sink.0,
        }
    }

    fn post_recv(&mut self, node: usize, qp: usize, len: u32) {
        let sge = self.sink_sge(node, len);
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        let qpn = self.nodes[node].qps[qp];
        let r = self.net.cores[node].post_recv(
            qpn,
            &RecvWr {
                wr_id,
                sg_list: &[sge],
            },
        );
        if r.is_ok() && node == self.victim {
            self.posted.insert(
                wr_id,
                Posted {
                    qpn,
                    recv: true,
                    op: None,
                    len: u64::from(sge.length),
                },
            );
        }
    }

    /// Post a send WR of kind `op` (0..=8) on `qp` of `node`.
    fn post_send(&mut self, node: usize, qp: usize, op: u8, len: u32, remote_off: u64) {
        let peer = &self.nodes[1 - node];
        let rkey = peer.open.1;
        let remote_addr = OPEN_IOVA + remote_off % OPEN_LEN as u64;
        let (sop, wc) = match op % 9 {
            0 => (SendOp::Send, WcOpcode::Send),
            1 => (
                SendOp::SendWithImm {
                    imm: 0xabcd_0000 | len,
                },
                WcOpcode::Send,
            ),
            2 => (
                SendOp::SendWithInv {
                    invalidate_rkey: 0xdead_0000,
                },
                WcOpcode::Send,
            ),
            3 => (SendOp::RdmaWrite { remote_addr, rkey }, WcOpcode::RdmaWrite),
            4 => (
                SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm: 7,
                },
                WcOpcode::RdmaWrite,
            ),
            5 => (SendOp::RdmaRead { remote_addr, rkey }, WcOpcode::RdmaRead),
            6 => (
                SendOp::AtomicCmpSwp {
                    remote_addr: remote_addr & !7,
                    rkey,
                    compare: 0,
                    swap: 0x5555,
                },
                WcOpcode::CompSwap,
            ),
            7 => (
                SendOp::AtomicFetchAdd {
                    remote_addr: remote_addr & !7,
                    rkey,
                    add: 3,
                },
                WcOpcode::FetchAdd,
            ),
            _ => (SendOp::Send, WcOpcode::Send),
        };
        // READ and atomics land in the sink; everything else is read from it.
        let sge = if sop.is_read_or_atomic() {
            let l = if sop.is_atomic() { 8 } else { len };
            self.sink_sge(node, l)
        } else {
            Sge {
                addr: SINK_IOVA + u64::from(len) % 512,
                length: len.min(SINK_LEN as u32 - 512),
                lkey: self.nodes[node].sink.0,
            }
        };
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        let qpn = self.nodes[node].qps[qp];
        let mut wr = SendWr::new(wr_id, sop, std::slice::from_ref(&sge));
        if qp == 2 {
            wr.ud = Some(UdDest {
                path: self.net.path(node, 1 - node),
                remote_qpn: self.nodes[1 - node].qps[2],
                remote_qkey: QKEY,
            });
        }
        let r = self.net.cores[node].post_send(qpn, &wr);
        if r.is_ok() && node == self.victim {
            let len = if sop.is_atomic() {
                8
            } else {
                u64::from(sge.length)
            };
            self.posted.insert(
                wr_id,
                Posted {
                    qpn,
                    recv: false,
                    op: Some(wc),
                    len,
                },
            );
        }
    }

    /// The work requests of the script: node 1 posts receives, node 0 posts
    /// one of each operation each QP type allows.
    fn script(&mut self) {
        for qp in 0..4 {
            for k in 0..4 {
                let len = if qp == 2 { 40 + 256 } else { 700 + 100 * k };
                self.post_recv(1, qp, len);
            }
        }
        // A few receives on node 0 too, for SENDs the fuzzer forges there.
        for qp in 0..3 {
            self.post_recv(0, qp, 40 + 300);
        }
        for (op, len) in [
            (0, 600),
            (1, 100),
            (3, 700),
            (4, 10),
            (5, 600),
            (6, 8),
            (7, 8),
        ] {
            self.post_send(0, 0, op, len, 64 * u64::from(op));
        }
        for (op, len) in [(0, 300), (1, 20), (3, 300), (4, 20)] {
            self.post_send(0, 1, op, len, 1024);
        }
        for (op, len) in [(0, 100), (1, 50)] {
            self.post_send(0, 2, op, len, 0);
        }
        self.snapshot_stats();
        // The victim sends what it has (a requester's requests).
        self.drain();
        self.check("setup");
    }

    fn stats_vec(&self) -> Vec<(String, u64)> {
        let s = self.net.cores[self.victim].stats();
        let mut v = vec![
            ("rx_frames".to_string(), s.rx_frames),
            ("tx_packets".to_string(), s.tx_packets),
            ("retransmits".to_string(), s.retransmits),
            ("timeouts".to_string(), s.timeouts),
            ("duplicates".to_string(), s.duplicates),
            ("out_of_sequence".to_string(), s.out_of_sequence),
            ("naks_sent".to_string(), s.naks_sent),
            ("naks_received".to_string(), s.naks_received),
            ("rnr_naks_sent".to_string(), s.rnr_naks_sent),
            ("rnr_naks_received".to_string(), s.rnr_naks_received),
        ];
        v.extend(s.drops.iter().map(|(k, n)| (k.to_string(), *n)));
        v
    }

    fn snapshot_stats(&mut self) {
        self.last = self.stats_vec();
    }

    /// Hand the victim one frame.
    pub fn feed(&mut self, frame: &[u8]) {
        let v = self.victim;
        let states: Vec<(u32, Option<QpState>)> = self.nodes[v]
            .qps
            .iter()
            .map(|q| (*q, self.net.cores[v].qp_state(*q)))
            .collect();
        let target = ParsedPacket::parse(frame).ok().map(|p| p.repr.bth.dest_qp);
        self.fed += 1;
        self.net.cores[v].handle_frame(self.now, frame);
        for (q, before) in states {
            let after = self.net.cores[v].qp_state(q);
            assert!(
                Some(q) == target || after == before,
                "a frame for QP {target:?} moved QP {q:#x} from {before:?} to {after:?}"
            );
        }
        self.drain();
        self.check("frame");
    }

    /// Move the clock forward and run what is due.
    pub fn tick(&mut self, micros: u32) {
        let v = self.victim;
        self.now = self.now + Duration::from_micros(u64::from(micros));
        if self.net.cores[v]
            .poll_timeout()
            .is_some_and(|t| t <= self.now)
        {
            self.net.cores[v].handle_timeout(self.now);
        }
        self.drain();
        self.check("tick");
    }

    pub fn post_recv_step(&mut self, qp: u8, len: u16) {
        let qp = usize::from(qp % 4);
        let len = u32::from(len % 1200).max(if qp == 2 { 40 } else { 0 });
        self.post_recv(self.victim, qp, len);
        self.drain();
        self.check("post_recv");
    }

    pub fn post_send_step(&mut self, qp: u8, op: u8, len: u16, remote_off: u16) {
        let qp = usize::from(qp % 3);
        self.post_send(
            self.victim,
            qp,
            op,
            u32::from(len % 1200),
            u64::from(remote_off),
        );
        self.drain();
        self.check("post_send");
    }

    fn drain(&mut self) {
        let v = self.victim;
        let me = self.net.gid(v);
        let peers: Vec<u32> = self.nodes[1 - v].qps.to_vec();
        for _ in 0..DRAIN_LIMIT {
            let Some(n) = self.net.cores[v].poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            self.emitted += 1;
            let p = ParsedPacket::parse(&self.buf[..n])
                .unwrap_or_else(|e| panic!("the victim emitted a frame that does not parse: {e}"));
            assert_eq!(
                p.repr.ip.src_gid(),
                me,
                "the victim sent from another address"
            );
            assert!(
                peers.contains(&p.repr.bth.dest_qp),
                "the victim sent to QP {:#x}, not one of its peers {peers:x?}",
                p.repr.bth.dest_qp
            );
            let info = p.opcode_info();
            if info.is_request() && info.is_first_or_only() {
                // Which of the victim's QPs sent it: the one connected to dest_qp.
                if let Some(i) = peers.iter().position(|q| *q == p.repr.bth.dest_qp) {
                    let q = self.nodes[v].qps[i];
                    self.started.entry(q).or_default().insert(p.repr.bth.psn);
                }
            }
        }
    }

    fn check_wc(&mut self, wc: &WorkCompletion, cq_is_recv: bool) {
        let Some(p) = self.posted.remove(&wc.wr_id) else {
            panic!("completion without a posted work request (or twice): {wc:?}");
        };
        assert_eq!(
            p.qpn, wc.qp_num,
            "completion on the wrong QP: {wc:?} for {p:?}"
        );
        assert_eq!(
            p.recv, cq_is_recv,
            "completion on the wrong CQ: {wc:?} for {p:?}"
        );
        if wc.status != WcStatus::Success {
            return;
        }
        if p.recv {
            assert!(
                matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                "receive completed as {wc:?}"
            );
            assert!(
                u64::from(wc.byte_len) <= p.len,
                "receive of {} bytes into {} bytes of buffers: {wc:?}",
                wc.byte_len,
                p.len
            );
        } else {
            assert_eq!(
                Some(wc.opcode),
                p.op,
                "send completed as another op: {wc:?}"
            );
            let ok = self.succeeded.entry(p.qpn).or_default();
            *ok += 1;
            let started = self.started.get(&p.qpn).map_or(0, HashSet::len) as u64;
            assert!(
                *ok <= started,
                "QP {:#x}: {ok} sends completed successfully but only {started} were ever sent: {wc:?}",
                p.qpn
            );
        }
    }

    fn check(&mut self, step: &str) {
        let v = self.victim;
        for g in &self.nodes[v].guards {
            let st = lock(g);
            assert!(
                st.violations.is_empty(),
                "after {step}: memory guard: {:?}",
                st.violations
            );
        }
        for recv in [false, true] {
            let cq = if recv {
                self.nodes[v].rcq
            } else {
                self.nodes[v].scq
            };
            while let Some(wc) = self.net.cores[v].poll_cq_one(cq) {
                self.check_wc(&wc, recv);
            }
        }
        while self.net.cores[v].poll_event().is_some() {}
        let s = self.net.cores[v].stats();
        assert_eq!(s.rx_frames, self.fed, "rx_frames vs frames handed in");
        assert_eq!(s.tx_packets, self.emitted, "tx_packets vs frames taken out");
        let now: BTreeMap<String, u64> = self.stats_vec().into_iter().collect();
        for (k, before) in &self.last {
            let after = now.get(k).copied().unwrap_or(0);
            assert!(
                after >= *before,
                "counter {k} went down: {before} -> {after}"
            );
        }
        self.last = now.into_iter().collect();
    }
}

// ---------------------------------------------------------------------------
// Frames: the script's capture, ICRC fix-up, structured forging.

/// Frames each node received in the script run, indexed by receiving node:
/// `[to node 0 (responses: the requester's), to node 1 (requests: the responder's)]`.
pub fn script_frames() -> &'static [Vec<Vec<u8>>; 2] {
    static FRAMES: OnceLock<[Vec<Vec<u8>>; 2]> = OnceLock::new();
    FRAMES.get_or_init(|| {
        let mut s = Session::new(Role::Responder);
        let mut out: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        loop {
            let mut moved = false;
            for src in 0..2 {
                while let Some(n) = s.net.cores[src].poll_transmit(s.now, &mut buf) {
                    out[1 - src].push(buf[..n].to_vec());
                    s.net.cores[1 - src].handle_frame(s.now, &buf[..n]);
                    moved = true;
                }
            }
            if !moved || out[0].len() + out[1].len() > 10_000 {
                break;
            }
        }
        out
    })
}

/// Where the ICRC of `frame` lies and whether it is IPv6: `(l3, end, ipv6)`.
fn icrc_span(frame: &[u8]) -> Option<(usize, usize, bool)> {
    let et = |at: usize| Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]));
    let (l3, ty) = match et(12)? {
        0x8100 => (18, et(16)?),
        t => (14, t),
    };
    let (ipv6, ip_len) = match ty {
        0x0800 => (false, 20),
        0x86dd => (true, 40),
        _ => return None,
    };
    let udp = l3 + ip_len;
    let udp_len = usize::from(et(udp + 4)?);
    let end = udp.checked_add(udp_len)?;
    (end <= frame.len() && end >= udp + 8 + 12 + icrc::ICRC_LEN).then_some((l3, end, ipv6))
}

/// Recompute the ICRC so an edited frame gets past the ICRC check.
pub fn fix_icrc(frame: &mut [u8]) {
    if let Some((l3, end, ipv6)) = icrc_span(frame) {
        if let Some(c) = icrc::compute(&frame[l3..end - icrc::ICRC_LEN], ipv6) {
            frame[end - icrc::ICRC_LEN..end].copy_from_slice(&c.to_le_bytes());
        }
    }
}

/// Which memory a forged RETH or AtomicETH points at.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Target {
    Keep,
    Open(u16),
    Sink(u16),
    Inert(u16),
    /// Just below or past the end of the open region.
    Edge(i16),
    Any(u64),
}

/// Which key a forged RETH, AtomicETH or IETH carries.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Key {
    Keep,
    Open,
    OpenLkey,
    Sink,
    Inert,
    Foreign,
    Any(u32),
}

/// Which QP a forged frame goes to.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Dest {
    Keep,
    Victim(u8),
    Any(u32),
}

/// A frame built from a script frame with header fields the fuzzer chose,
/// emitted with a correct ICRC.
#[derive(Debug, Clone, Arbitrary)]
pub struct Forge {
    pub base: u8,
    /// Index into the opcode table, or keep the base's opcode if out of range.
    pub opcode: u8,
    pub psn_delta: i16,
    pub dest: Dest,
    /// Payload length (taken modulo a little more than the MTU), if the opcode carries one.
    pub payload_len: Option<u16>,
    pub solicited: bool,
    pub ack_req: bool,
    pub va: Target,
    pub key: Key,
    pub dma_len: Option<u32>,
    pub syndrome: Option<u8>,
    pub msn_delta: i16,
    pub imm: u32,
    pub qkey: Option<u32>,
    pub src_qp: Option<u32>,
    pub swap_add: u64,
    pub compare: u64,
    pub orig: u64,
}

impl Forge {
    /// The frame, if the base parses and the result can be emitted.
    pub fn build(&self, pool: &[Vec<u8>], victim: &Node, peer: &Node) -> Option<Vec<u8>> {
        let base = pool.get(usize::from(self.base) % pool.len().max(1))?;
        let p = ParsedPacket::parse(base).ok()?;
        let mut repr = p.repr;
        let mut payload = p.payload.to_vec();
        if let Some(info) = OPCODES.get(usize::from(self.opcode)) {
            if info.opcode != repr.bth.opcode {
                let fresh = sample::sample_repr(
                    info.opcode,
                    repr.ip.is_ipv6(),
                    repr.eth.vlan.is_some(),
                    u64::from(self.imm),
                )
                .ok()?;
                repr.bth.opcode = info.opcode;
                repr.ext = fresh.ext;
                // Keep what the base had where the new opcode has the same header.
                let b = p.repr.ext;
                repr.ext.reth = repr.ext.reth.and(b.reth).or(repr.ext.reth);
                repr.ext.aeth = repr.ext.aeth.and(b.aeth).or(repr.ext.aeth);
                repr.ext.deth = repr.ext.deth.and(b.deth).or(repr.ext.deth);
                repr.ext.atomic_eth = repr
                    .ext
                    .atomic_eth
                    .and(b.atomic_eth)
                    .or(repr.ext.atomic_eth);
            }
        }
        let info = repr.bth.opcode.info().ok()?;
        repr.bth.psn =
            (i64::from(repr.bth.psn) + i64::from(self.psn_delta)).rem_euclid(1 << 24) as u32;
        repr.bth.solicited = self.solicited;
        repr.bth.ack_req = self.ack_req;
        repr.bth.dest_qp = match self.dest {
            Dest::Keep => repr.bth.dest_qp,
            Dest::Victim(i) => victim.qps[usize::from(i) % 4],
            Dest::Any(q) => q & 0x00ff_ffff,
        };
        let va = |keep: u64| match self.va {
            Target::Keep => keep,
            Target::Open(o) => OPEN_IOVA + u64::from(o) % OPEN_LEN as u64,
            Target::Sink(o) => SINK_IOVA + u64::from(o) % SINK_LEN as u64,
            Target::Inert(o) => INERT_IOVA + u64::from(o) % SMALL_LEN as u64,
            Target::Edge(d) => (OPEN_IOVA + OPEN_LEN as u64).wrapping_add_signed(i64::from(d)),
            Target::Any(v) => v,
        };
        let key = |keep: u32| match self.key {
            Key::Keep => keep,
            Key::Open => victim.open.1,
            Key::OpenLkey => victim.open.0,
            Key::Sink => victim.sink.1,
            Key::Inert => victim.inert.1,
            Key::Foreign => victim.foreign.1,
            Key::Any(k) => k,
        };
        if let Some(r) = repr.ext.reth.as_mut() {
            r.va = va(r.va);
            r.rkey = key(r.rkey);
            r.dma_len = self.dma_len.unwrap_or(r.dma_len);
        }
        if let Some(a) = repr.ext.atomic_eth.as_mut() {
            a.va = va(a.va);
            a.rkey = key(a.rkey);
            a.swap_add = self.swap_add;
            a.compare = self.compare;
        }
        if let Some(i) = repr.ext.ieth.as_mut() {
            i.rkey = key(i.rkey);
        }
        if let Some(a) = repr.ext.aeth.as_mut() {
            a.syndrome = self.syndrome.unwrap_or(a.syndrome);
            a.msn = (i64::from(a.msn) + i64::from(self.msn_delta)).rem_euclid(1 << 24) as u32;
        }
        if let Some(a) = repr.ext.atomic_ack_eth.as_mut() {
            a.orig_data = self.orig;
        }
        if let Some(i) = repr.ext.immdt.as_mut() {
            i.imm = self.imm;
        }
        if let Some(d) = repr.ext.deth.as_mut() {
            d.qkey = self.qkey.unwrap_or(QKEY);
            d.src_qp = self.src_qp.map_or(peer.qps[2], |q| q & 0x00ff_ffff);
        }
        if !info.has_payload {
            payload.clear();
        } else if let Some(n) = self.payload_len {
            let n = usize::from(n) % (MTU as usize + 64).min(MAX_PAYLOAD);
            payload = (0..n)
                .map(|i| payload.get(i).copied().unwrap_or(i as u8))
                .collect();
        }
        let mut buf = vec![0u8; repr.buffer_len(payload.len()).ok()?];
        let n = repr.emit(&mut buf, &payload).ok()?;
        buf.truncate(n);
        Some(buf)
    }
}

/// One step of a stateful script.
#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    /// A script frame as it was.
    Replay(u8),
    /// A script frame with bytes overwritten, ICRC fixed up (or not).
    Mutate {
        base: u8,
        edits: Vec<(u16, u8)>,
        keep_icrc: bool,
    },
    Forge(Forge),
    /// Arbitrary bytes as a frame.
    Raw(Vec<u8>),
    /// Advance the clock (µs, up to about 1 s) and run due timers.
    Tick(u32),
    PostRecv {
        qp: u8,
        len: u16,
    },
    PostSend {
        qp: u8,
        op: u8,
        len: u16,
        remote_off: u16,
    },
}

/// Run a script of steps against a fresh victim, checking invariants after each.
pub fn run(role: Role, steps: &[Step]) {
    let pool = &script_frames()[match role {
        Role::Responder => 1,
        Role::Requester => 0,
    }];
    let mut s = Session::new(role);
    for step in steps {
        match step {
            Step::Replay(i) => {
                if let Some(f) = pool.get(usize::from(*i) % pool.len().max(1)) {
                    s.feed(f);
                }
            }
            Step::Mutate {
                base,
                edits,
                keep_icrc,
            } => {
                let Some(f) = pool.get(usize::from(*base) % pool.len().max(1)) else {
                    continue;
                };
                let mut f = f.clone();
                for (at, b) in edits {
                    let n = f.len();
                    if n > 0 {
                        f[usize::from(*at) % n] = *b;
                    }
                }
                if !keep_icrc {
                    fix_icrc(&mut f);
                }
                s.feed(&f);
            }
            Step::Forge(g) => {
                let (victim, peer) = (&s.nodes[s.victim], &s.nodes[1 - s.victim]);
                if let Some(f) = g.build(pool, victim, peer) {
                    s.feed(&f);
                }
            }
            Step::Raw(b) => s.feed(b),
            Step::Tick(us) => s.tick(us % 1_000_000),
            Step::PostRecv { qp, len } => s.post_recv_step(*qp, *len),
            Step::PostSend {
                qp,
                op,
                len,
                remote_off,
            } => s.post_send_step(*qp, *op, *len, *remote_off),
        }
    }
    // Let every timer run out: retries end, QPs settle; the checks still hold.
    for _ in 0..8 {
        s.tick(1_000_000);
    }
}

/// Step tags of the byte format [`decode_steps`] reads.
pub mod tag {
    pub const REPLAY: u8 = 0;
    pub const MUTATE: u8 = 1;
    pub const FORGE: u8 = 2;
    pub const RAW: u8 = 3;
    pub const TICK: u8 = 4;
    pub const POST_RECV: u8 = 5;
    pub const POST_SEND: u8 = 6;
    pub const COUNT: u8 = 7;
}

/// Fuzzer bytes to steps (at most 64): each step is one tag byte (taken
/// modulo [`tag::COUNT`]) followed by that step's fields as `arbitrary`
/// reads them, so seeds are easy to write by hand (`[0, i]` replays script
/// frame `i`; `[4, us as 4 LE bytes]` ticks).
pub fn decode_steps(data: &[u8]) -> Vec<Step> {
    let mut u = Unstructured::new(data);
    let mut steps = Vec::new();
    while !u.is_empty() && steps.len() < 64 {
        let Ok(t) = u8::arbitrary(&mut u) else { break };
        let step =
            match t % tag::COUNT {
                tag::REPLAY => u8::arbitrary(&mut u).map(Step::Replay),
                tag::MUTATE => <(u8, Vec<(u16, u8)>, bool)>::arbitrary(&mut u).map(
                    |(base, edits, keep_icrc)| Step::Mutate {
                        base,
                        edits,
                        keep_icrc,
                    },
                ),
                tag::FORGE => Forge::arbitrary(&mut u).map(Step::Forge),
                tag::RAW => Vec::<u8>::arbitrary(&mut u).map(Step::Raw),
                tag::TICK => u32::arbitrary(&mut u).map(Step::Tick),
                tag::POST_RECV => {
                    <(u8, u16)>::arbitrary(&mut u).map(|(qp, len)| Step::PostRecv { qp, len })
                }
                _ => <(u8, u8, u16, u16)>::arbitrary(&mut u).map(|(qp, op, len, remote_off)| {
                    Step::PostSend {
                        qp,
                        op,
                        len,
                        remote_off,
                    }
                }),
            };
        match step {
            Ok(s) => steps.push(s),
            Err(_) => break,
        }
    }
    steps
}

/// Decode fuzzer bytes into steps and run them.
pub fn run_bytes(role: Role, data: &[u8]) {
    run(role, &decode_steps(data));
}

/// The stateful responder target (victim: node 1, receiving requests).
pub fn responder(data: &[u8]) {
    run_bytes(Role::Responder, data);
}

/// The requester target (victim: node 0 with WRs outstanding, receiving responses).
pub fn requester(data: &[u8]) {
    run_bytes(Role::Requester, data);
}
