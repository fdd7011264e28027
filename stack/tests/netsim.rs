//! Seeded random-fault soak of the transport on the simulated network:
//! random WRs of every kind and size over lossy, duplicating, reordering,
//! corrupting links. Every message must arrive exactly once, in order, byte
//! for byte; every READ and atomic must return the right value; every
//! completion must be reported once and in order. A failure prints its seed;
//! replay with `FERROCE_SOAK_SEED=<seed> cargo test -p ferroce-stack --test netsim`.

mod common;

use std::collections::VecDeque;
use std::time::Duration;

use common::*;
use ferroce_stack::sim::{ConnectCfg, LinkConfig};
use ferroce_stack::transport::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const MIB: u64 = 1 << 20;
/// Per QP pair, in each node's memory region.
const BLOCK: u64 = 10 * MIB;
const RING: u64 = 4 * MIB;
const RECV_AT: u64 = 4 * MIB;
const READ_SRC_AT: u64 = 8 * MIB;
const ATOMIC_AT: u64 = 9 * MIB + 4096;
const SLOTS: usize = 4;
const MAX_OUTSTANDING: usize = 32;

/// First-in first-out allocator over a ring of bytes (frees happen in order).
struct Ring {
    base: u64,
    size: u64,
    cursor: u64,
    live: VecDeque<(u64, u64)>,
}

impl Ring {
    fn new(base: u64, size: u64) -> Ring {
        Ring {
            base,
            size,
            cursor: 0,
            live: VecDeque::new(),
        }
    }
    fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.max(1);
        let start = if self.cursor + len <= self.size {
            self.cursor
        } else {
            0
        };
        if self
            .live
            .iter()
            .any(|&(s, l)| start < s + l && s < start + len)
        {
            return None;
        }
        self.live.push_back((start, len));
        self.cursor = start + len;
        Some(self.base + start)
    }
    fn free(&mut self) {
        self.live.pop_front();
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
}

struct Posted {
    wr_id: u64,
    kind: Kind,
    signaled: bool,
    local: u64,
    len: u64,
    remote: u64,
    seed: u64,
    orig: u64,
}

struct RecvExpect {
    wr_id: u64,
    at: u64,
    len: u64,
    seed: u64,
    imm: Option<u32>,
    write_imm: bool,
}

struct Flow {
    req: usize,
    resp: usize,
    k: usize,
    next_id: u64,
    local: Ring,
    target: Ring,
    recv: Ring,
    pending: VecDeque<Posted>,
    recvs: VecDeque<RecvExpect>,
    atomics: [u64; SLOTS],
    completed: u64,
    received: u64,
    /// WRs this flow posts in all; the last one is signaled so the tail completes.
    quota: u64,
    posted: u64,
}

fn size(rng: &mut Xoshiro256PlusPlus, max: u64) -> u64 {
    let r: f64 = rng.random();
    let n = if r < 0.705 {
        rng.random_range(1..=256)
    } else if r < 0.955 {
        rng.random_range(257..=16 * 1024)
    } else if r < 0.995 {
        rng.random_range(16 * 1024..=256 * 1024)
    } else {
        rng.random_range(256 * 1024..=MIB)
    };
    n.min(max)
}

#[derive(Debug)]
pub struct SoakCfg {
    pub seed: u64,
    pub pairs: usize,
    pub wrs: u64,
    pub link: LinkConfig,
    pub max_size: u64,
}

fn read_u64(p: &Pair, node: usize, off: u64) -> u64 {
    u64::from_ne_bytes(p.read_mem(node, off, 8).try_into().unwrap())
}

/// Run one soak; `Err` says what went wrong.
pub fn soak(c: &SoakCfg) -> Result<String, String> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(c.seed);
    let mtu = [1024, 4096][(c.seed % 2) as usize];
    let cfg = ConnectCfg {
        path_mtu: mtu,
        ..ConnectCfg::default()
    };
    let mem = (BLOCK * c.pairs as u64) as usize;
    let mut p = Pair::with(
        QpType::Rc,
        c.link,
        c.seed,
        cfg,
        mem,
        c.pairs,
        (rng.random_range(0..1 << 24), rng.random_range(0..1 << 24)),
    );
    let mut flows: Vec<Flow> = (0..c.pairs)
        .map(|k| {
            let (req, resp) = if k % 2 == 0 { (0, 1) } else { (1, 0) };
            let b = BLOCK * k as u64;
            Flow {
                req,
                resp,
                k,
                next_id: 1,
                local: Ring::new(b, RING),
                target: Ring::new(b, RING),
                recv: Ring::new(b + RECV_AT, RING),
                pending: VecDeque::new(),
                recvs: VecDeque::new(),
                atomics: [0; SLOTS],
                completed: 0,
                received: 0,
                quota: c.wrs / c.pairs as u64 + if k == 0 { c.wrs % c.pairs as u64 } else { 0 },
                posted: 0,
            }
        })
        .collect();
    for f in &flows {
        let src = pattern(1000 + f.k as u64, MIB as usize);
        p.write_mem(f.resp, BLOCK * f.k as u64 + READ_SRC_AT, &src);
    }
    let mut posted = 0u64;
    let deadline = ferroce_stack::transport::Instant::from_nanos(
        env_u64("DBG_DEADLINE_S", 600) * 1_000_000_000,
    );
    loop {
        // Post what fits.
        for f in flows.iter_mut() {
            while f.posted < f.quota && f.pending.len() < MAX_OUTSTANDING {
                if !post_one(&mut p, f, &mut rng, c.max_size) {
                    break;
                }
                f.posted += 1;
                posted += 1;
            }
        }
        let mut idle = false;
        for _ in 0..64 {
            if !p.net.step() {
                idle = true;
                break;
            }
        }
        check_completions(&mut p, &mut flows)?;
        let could_post = posted < c.wrs && flows.iter().any(|f| f.pending.len() < MAX_OUTSTANDING);
        if idle
            && !could_post
            && flows
                .iter()
                .any(|f| !f.pending.is_empty() || !f.recvs.is_empty())
        {
            let st: Vec<_> = flows
                .iter()
                .map(|f| {
                    (
                        f.k,
                        f.pending.len(),
                        f.pending.front().map(|w| (w.wr_id, w.kind, w.len)),
                        f.recvs.len(),
                    )
                })
                .collect();
            return Err(format!(
                "idle with work outstanding at {:?}: {st:?}; stats {:?} {:?}",
                p.net.now,
                p.net.cores[0].stats(),
                p.net.cores[1].stats()
            ));
        }
        let done = posted == c.wrs
            && flows
                .iter()
                .all(|f| f.pending.is_empty() && f.recvs.is_empty());
        if done {
            break;
        }
        if p.net.now > deadline {
            return Err(format!("stuck at {:?}: {} posted", p.net.now, posted));
        }
        for n in 0..2 {
            for &q in &p.nodes[n].qps {
                if p.net.cores[n].qp_state(q) != Some(QpState::Rts) {
                    return Err(format!("node {n} QP {q:#x} left RTS"));
                }
            }
        }
    }
    for f in &flows {
        for (i, v) in f.atomics.iter().enumerate() {
            let got = read_u64(&p, f.resp, BLOCK * f.k as u64 + ATOMIC_AT + 8 * i as u64);
            if got != *v {
                return Err(format!("atomic slot {i} of pair {}: {got} != {v}", f.k));
            }
        }
    }
    let s0 = p.net.cores[0].stats();
    Ok(format!(
        "seed {} pairs {} wrs {} mtu {mtu}: virtual {:?}, net {:?}, core0 tx {} retransmits {} timeouts {} naks {} dups {}",
        c.seed,
        c.pairs,
        c.wrs,
        Duration::from_nanos(p.net.now.as_nanos()),
        p.net.stats,
        s0.tx_packets,
        s0.retransmits,
        s0.timeouts,
        s0.naks_sent,
        s0.duplicates
    ))
}

fn post_one(p: &mut Pair, f: &mut Flow, rng: &mut Xoshiro256PlusPlus, max_size: u64) -> bool {
    let kind = match rng.random_range(0..100) {
        0..25 => Kind::Send,
        25..35 => Kind::SendImm,
        35..55 => Kind::Write,
        55..65 => Kind::WriteImm,
        65..85 => Kind::Read,
        85..93 => Kind::Cas,
        _ => Kind::Faa,
    };
    let atomic = matches!(kind, Kind::Cas | Kind::Faa);
    let len = if atomic { 8 } else { size(rng, max_size) };
    let Some(local) = f.local.alloc(len) else {
        return false;
    };
    let b = BLOCK * f.k as u64;
    let seed = f.next_id * 7919 + f.k as u64;
    let mut remote = 0;
    let mut orig = 0;
    let (va_base, rkey) = p.remote(f.resp, 0);
    let needs_recv = matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm);
    let recv_at = if needs_recv {
        let rl = if kind == Kind::WriteImm { 0 } else { len };
        match f.recv.alloc(rl) {
            Some(a) => Some(a),
            None => {
                f.local.live.pop_back();
                return false;
            }
        }
    } else {
        None
    };
    let op = match kind {
        Kind::Send => SendOp::Send,
        Kind::SendImm => SendOp::SendWithImm { imm: seed as u32 },
        Kind::Write | Kind::WriteImm => {
            let Some(t) = f.target.alloc(len) else {
                f.local.live.pop_back();
                if recv_at.is_some() {
                    f.recv.live.pop_back();
                }
                return false;
            };
            remote = t;
            if kind == Kind::Write {
                SendOp::RdmaWrite {
                    remote_addr: va_base + t,
                    rkey,
                }
            } else {
                SendOp::RdmaWriteWithImm {
                    remote_addr: va_base + t,
                    rkey,
                    imm: seed as u32,
                }
            }
        }
        Kind::Read => {
            remote = b + READ_SRC_AT + rng.random_range(0..=MIB - len);
            SendOp::RdmaRead {
                remote_addr: va_base + remote,
                rkey,
            }
        }
        Kind::Cas | Kind::Faa => {
            let slot = rng.random_range(0..SLOTS);
            remote = b + ATOMIC_AT + 8 * slot as u64;
            orig = f.atomics[slot];
            if kind == Kind::Faa {
                let add = rng.random_range(1..1000u64);
                f.atomics[slot] = orig.wrapping_add(add);
                SendOp::AtomicFetchAdd {
                    remote_addr: va_base + remote,
                    rkey,
                    add,
                }
            } else {
                let compare = if rng.random_bool(0.5) { orig } else { orig ^ 1 };
                let swap = rng.random();
                if compare == orig {
                    f.atomics[slot] = swap;
                }
                SendOp::AtomicCmpSwp {
                    remote_addr: va_base + remote,
                    rkey,
                    compare,
                    swap,
                }
            }
        }
    };
    if matches!(
        kind,
        Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm
    ) {
        p.write_mem(f.req, local, &pattern(seed, len as usize));
    }
    if let Some(at) = recv_at {
        let rlen = if kind == Kind::WriteImm {
            0
        } else {
            len as u32
        };
        let s = [p.sge(f.resp, at, rlen)];
        let q = p.nodes[f.resp].qps[f.k];
        p.net.cores[f.resp]
            .post_recv(
                q,
                &RecvWr {
                    wr_id: f.next_id,
                    sg_list: &s,
                },
            )
            .unwrap();
        let imm = match kind {
            Kind::SendImm | Kind::WriteImm => Some(seed as u32),
            _ => None,
        };
        f.recvs.push_back(RecvExpect {
            wr_id: f.next_id,
            at,
            len,
            seed,
            imm,
            write_imm: kind == Kind::WriteImm,
        });
    }
    let s = [p.sge(f.req, local, len as u32)];
    let q = p.nodes[f.req].qps[f.k];
    let mut wr = SendWr::new(f.next_id, op, &s);
    wr.flags.signaled = rng.random_bool(0.75) || f.posted + 1 == f.quota;
    p.net.cores[f.req].post_send(q, &wr).unwrap();
    f.pending.push_back(Posted {
        wr_id: f.next_id,
        kind,
        signaled: wr.flags.signaled,
        local,
        len,
        remote,
        seed,
        orig,
    });
    f.next_id += 1;
    true
}

fn check_completions(p: &mut Pair, flows: &mut [Flow]) -> Result<(), String> {
    for node in 0..2 {
        for wc in p.scq(node) {
            let f = flows
                .iter_mut()
                .find(|f| f.req == node && p.nodes[node].qps[f.k] == wc.qp_num)
                .ok_or("completion for unknown QP")?;
            if wc.status != WcStatus::Success {
                return Err(format!("pair {} wr {}: {:?}", f.k, wc.wr_id, wc.status));
            }
            loop {
                let Some(w) = f.pending.pop_front() else {
                    return Err(format!(
                        "pair {}: completion {} not pending (twice?)",
                        f.k, wc.wr_id
                    ));
                };
                if w.wr_id > wc.wr_id {
                    return Err(format!(
                        "pair {}: completion {} out of order",
                        f.k, wc.wr_id
                    ));
                }
                if w.wr_id < wc.wr_id && w.signaled {
                    return Err(format!(
                        "pair {}: signaled wr {} never completed",
                        f.k, w.wr_id
                    ));
                }
                verify_req(p, f, &w)?;
                f.local.free();
                f.completed += 1;
                if w.wr_id == wc.wr_id {
                    break;
                }
            }
        }
        for wc in p.rcq(node) {
            let f = flows
                .iter_mut()
                .find(|f| f.resp == node && p.nodes[node].qps[f.k] == wc.qp_num)
                .ok_or("recv for unknown QP")?;
            let e = f
                .recvs
                .pop_front()
                .ok_or_else(|| format!("pair {}: unexpected receive {:?}", f.k, wc))?;
            if wc.status != WcStatus::Success
                || wc.wr_id != e.wr_id
                || u64::from(wc.byte_len) != e.len
                || wc.imm_data != e.imm
            {
                return Err(format!(
                    "pair {}: receive {:?} expected wr {} len {} imm {:?}",
                    f.k, wc, e.wr_id, e.len, e.imm
                ));
            }
            if e.write_imm != (wc.opcode == WcOpcode::RecvRdmaWithImm) {
                return Err(format!("pair {}: receive opcode {:?}", f.k, wc.opcode));
            }
            if !e.write_imm
                && p.read_mem(node, e.at, e.len as usize) != pattern(e.seed, e.len as usize)
            {
                return Err(format!("pair {}: message {} corrupted", f.k, e.wr_id));
            }
            f.recv.free();
            f.received += 1;
        }
    }
    Ok(())
}

fn verify_req(p: &mut Pair, f: &mut Flow, w: &Posted) -> Result<(), String> {
    match w.kind {
        Kind::Write | Kind::WriteImm => {
            if p.read_mem(f.resp, w.remote, w.len as usize) != pattern(w.seed, w.len as usize) {
                return Err(format!("pair {}: WRITE {} landed wrong", f.k, w.wr_id));
            }
            f.target.free();
        }
        Kind::Read => {
            let src_off = w.remote - (BLOCK * f.k as u64 + READ_SRC_AT);
            let src = pattern(1000 + f.k as u64, MIB as usize);
            if p.read_mem(f.req, w.local, w.len as usize)
                != src[src_off as usize..(src_off + w.len) as usize]
            {
                return Err(format!(
                    "pair {}: READ {} returned wrong bytes",
                    f.k, w.wr_id
                ));
            }
        }
        Kind::Cas | Kind::Faa => {
            let got = read_u64(p, f.req, w.local);
            if got != w.orig {
                return Err(format!(
                    "pair {}: atomic {} returned {got}, expected {}",
                    f.k, w.wr_id, w.orig
                ));
            }
        }
        Kind::Send | Kind::SendImm => {}
    }
    Ok(())
}

fn run(c: SoakCfg) {
    let seed = c.seed;
    match soak(&c) {
        Ok(summary) => println!("{summary}"),
        Err(e) => panic!("soak failed with seed {seed}: {e}\nreplay: FERROCE_SOAK_SEED={seed} cargo test -p ferroce-stack --test netsim"),
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn soak_2_pairs_20000_wrs_lossy() {
    run(SoakCfg {
        seed: env_u64("FERROCE_SOAK_SEED", 0x5eed_0002),
        pairs: 2,
        wrs: env_u64("FERROCE_SOAK_WRS", 20_000),
        link: LinkConfig::lossy(),
        max_size: MIB,
    });
}

#[test]
fn soak_4_pairs_20000_wrs_lossy() {
    run(SoakCfg {
        seed: env_u64("FERROCE_SOAK_SEED", 0x5eed_0004) + 1,
        pairs: 4,
        wrs: env_u64("FERROCE_SOAK_WRS", 20_000),
        link: LinkConfig::lossy(),
        max_size: MIB,
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn soak_small_over_seeds_and_fault_rates(seed in any::<u64>(), loss in 0.0f64..0.2, dup in 0.0f64..0.1, reorder in 0.0f64..0.3, corrupt in 0.0f64..0.05, pairs in 1usize..4) {
        let link = LinkConfig { loss, duplicate: dup, reorder, reorder_depth: 8, corrupt, ..LinkConfig::perfect() };
        let r = soak(&SoakCfg { seed, pairs, wrs: 300, link, max_size: 64 * 1024 });
        prop_assert!(r.is_ok(), "seed {seed}: {:?}", r.err());
    }
}

#[test]
#[ignore]
fn dbg_soak() {
    let loss = env_u64("DBG_LOSS", 0) as f64 / 100.0;
    let link = LinkConfig {
        loss,
        reorder: env_u64("DBG_REORDER", 0) as f64 / 100.0,
        reorder_depth: 8,
        latency: Duration::from_micros(env_u64("DBG_LAT_US", 2)),
        ..LinkConfig::perfect()
    };
    run(SoakCfg {
        seed: env_u64("FERROCE_SOAK_SEED", 1),
        pairs: env_u64("DBG_PAIRS", 1) as usize,
        wrs: env_u64("FERROCE_SOAK_WRS", 50),
        link,
        max_size: env_u64("DBG_MAX", 4096),
    });
}
