//! The RDMA transport over `ferroce-verbs`: one RC queue pair per peer pair,
//! and per direction a ring of `slots` pre-registered buffers of `chunk`
//! bytes at the receiver.
//!
//! Data path: a message is cut into chunks; chunk `s` (counted over the life
//! of the pair) is copied into send slot `s % slots` and written with RDMA
//! WRITE WITH IMMEDIATE into the peer's receive slot `s % slots`; the
//! immediate is the chunk's length in its low 24 bits and, in its top 8,
//! credits for the opposite direction (chunks of the peer's this side has
//! consumed since it last said so). The receiver learns of a chunk from a
//! receive completion (a receive with an empty scatter list is posted for
//! every expected immediate) and copies it out. Credits ride on the next
//! chunk to that peer; when none goes and half the ring is consumed, they
//! go alone in a zero-length SEND WITH IMMEDIATE (the immediate is the
//! count). Piggybacking matters for small exchanges between the same pair
//! (recursive doubling): a lone credit message is two more packets (it and
//! its ACK) through the kernel per few rounds. The sender never has more than `slots`
//! chunks the receiver has not handed back, and never reuses a send slot
//! before its WRITE completed. RC delivers and completes in order, so both
//! sides agree on slot numbers without further bookkeeping.
//!
//! Limits: reading and writing the registered buffers goes through the
//! device lock (`MemoryRegion::read`/`write`), one extra copy per chunk on
//! each side; every pair is connected eagerly at start-up (n−1 QPs and
//! 2·slots·chunk bytes per peer).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ferroce_stack::transport::{copy_bytes, VecRegion};
use ferroce_verbs::{
    AccessFlags, CompletionQueue, ConnectOptions, Context, MemoryRegion, ProtectionDomain, QpType,
    QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::region::{prefaulted, SharedRegion};
use super::slots;
use super::wire::{self, QpAddr, LEN_MASK};
use super::{exchange_fold_whole, Fold, RecvSpec, SendSpec, Transport};
use crate::bootstrap::Rendezvous;
use crate::error::{Error, Result};

/// Settings of the RDMA transport.
#[derive(Debug, Clone, Copy)]
pub struct RdmaConfig {
    /// Bytes per RDMA WRITE (one receive slot).
    pub chunk: usize,
    /// Receive slots per peer (the credit window).
    pub slots: usize,
    /// A collective fails when nothing moved for this long.
    pub timeout: Duration,
    /// Local ACK time-out exponent (4.096 µs × 2^t) for the QPs.
    pub ack_timeout: u8,
    /// Seed for initial PSNs.
    pub seed: u32,
    /// How long a rank waiting for data keeps polling (yielding the CPU
    /// between polls) before it sleeps on the device.
    pub spin: Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            chunk: 64 << 10,
            slots: 8,
            timeout: Duration::from_secs(30),
            ack_timeout: 12,
            seed: 0x5eed,
            spin: Duration::from_micros(200),
        }
    }
}

impl RdmaConfig {
    /// Defaults, overridden by `FERROCE_COLL_CHUNK` (bytes), `FERROCE_COLL_SLOTS`,
    /// `FERROCE_COLL_SPIN_US` and `FERROCE_COLL_ACK_TIMEOUT` (exponent).
    pub fn from_env() -> Result<RdmaConfig> {
        fn var<T: std::str::FromStr>(k: &str) -> Result<Option<T>> {
            match std::env::var(k) {
                Err(_) => Ok(None),
                Ok(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| Error::Env(format!("{k}={v:?} is not a number"))),
            }
        }
        let mut c = RdmaConfig::default();
        if let Some(v) = var("FERROCE_COLL_CHUNK")? {
            c.chunk = v;
        }
        if let Some(v) = var("FERROCE_COLL_SLOTS")? {
            c.slots = v;
        }
        if let Some(v) = var("FERROCE_COLL_SPIN_US")? {
            c.spin = Duration::from_micros(v);
        }
        if let Some(v) = var("FERROCE_COLL_ACK_TIMEOUT")? {
            c.ack_timeout = v;
        }
        Ok(c)
    }
}

/// A device and a protection domain; transports borrow it.
#[derive(Debug)]
pub struct RdmaEndpoint {
    ctx: Context,
    pd: ProtectionDomain,
}

#[derive(Debug)]
struct Peer<'pd> {
    qp: QueuePair<'pd>,
    send_mr: MemoryRegion<'pd>,
    /// Registered (the peer's WRITEs land here); `recv` reaches the same
    /// bytes without the device lock.
    _recv_mr: MemoryRegion<'pd>,
    recv: SharedRegion,
    remote_addr: u64,
    remote_rkey: u32,
    /// Receive slots free at the peer.
    credits: usize,
    data_posted: u64,
    data_done: u64,
    credit_posted: u64,
    credit_done: u64,
    /// Lengths of chunks arrived and not yet consumed, in order.
    arrived: VecDeque<u32>,
    consumed: u64,
    unreported: u32,
}

/// One rank's connections to every other rank.
#[derive(Debug)]
pub struct RdmaTransport<'pd> {
    rank: usize,
    size: usize,
    cfg: RdmaConfig,
    // Dropped before the CQ they complete into.
    peers: Vec<Option<Peer<'pd>>>,
    cq: CompletionQueue,
    wcs: Vec<WorkCompletion>,
    /// When the last message arrived: a responder coalescing ACKs may still
    /// hold its ACK back (see [`RdmaTransport::drop`]).
    last_rx: Instant,
}

impl RdmaEndpoint {
    pub fn new(ctx: Context) -> RdmaEndpoint {
        let pd = ctx.alloc_pd();
        RdmaEndpoint { ctx, pd }
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The GID index used: the first IPv4-mapped GID (RoCE v2 over IPv4), else 0.
    fn sgid_index(&self) -> usize {
        self.ctx
            .gids()
            .iter()
            .position(|g| g.to_ipv4_mapped().is_some())
            .unwrap_or(0)
    }

    /// Create a QP and buffers for every peer, exchange their addresses
    /// through the rendezvous, connect, and meet once more so no rank writes
    /// before its peer is ready.
    pub fn connect(&self, rv: &mut Rendezvous, cfg: &RdmaConfig) -> Result<RdmaTransport<'_>> {
        wire::check_config(cfg)?;
        let (rank, size) = (rv.rank(), rv.size());
        let sq = (2 * cfg.slots + 8) as u32;
        let rq = (2 * cfg.slots + 8) as u32;
        let cq = self
            .ctx
            .create_cq(((sq + rq) as usize * size.max(1) + 64) as u32)?;
        let sgid_index = self.sgid_index();
        let gid = self.ctx.query_gid(sgid_index)?;
        let access = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
        let base_opts = ConnectOptions {
            path_mtu: self.ctx.query_port().active_mtu,
            sgid_index,
            access,
            timeout: cfg.ack_timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            ..ConnectOptions::default()
        };
        let ring = cfg.chunk * cfg.slots;
        let mut entries = vec![None; size];
        let mut made = Vec::with_capacity(size);
        for (j, entry) in entries.iter_mut().enumerate() {
            if j == rank {
                made.push(None);
                continue;
            }
            let qp = self
                .pd
                .create_qp()
                .qp_type(QpType::Rc)
                .max_send_wr(sq)
                .max_recv_wr(rq)
                .build(&cq, &cq)?;
            let send_mr = self
                .pd
                .reg_mr_with(Box::new(VecRegion(prefaulted(ring))), access)?;
            let recv = SharedRegion::zeroed(ring);
            let recv_mr = self.pd.reg_mr_with(Box::new(recv.clone()), access)?;
            let opts = ConnectOptions {
                local_psn: wire::psn_for(cfg.seed, rank, j),
                ..base_opts
            };
            qp.to_init(&opts)?;
            *entry = Some(QpAddr {
                qpn: qp.qpn(),
                psn: opts.local_psn,
                addr: recv_mr.addr(),
                rkey: recv_mr.rkey(),
            });
            made.push(Some((qp, send_mr, recv_mr, recv, opts)));
        }
        let all = rv.allgather(&wire::encode(gid.octets(), &entries))?;
        let mut peers = Vec::with_capacity(size);
        for (j, m) in made.into_iter().enumerate() {
            let Some((qp, send_mr, recv_mr, recv, opts)) = m else {
                peers.push(None);
                continue;
            };
            let (
                gid_bytes,
                QpAddr {
                    qpn,
                    psn,
                    addr,
                    rkey,
                },
            ) = wire::remote(&all, j, rank, size)?;
            qp.connect(
                &self.ctx,
                &RemoteQp {
                    qpn,
                    psn,
                    gid: std::net::Ipv6Addr::from(gid_bytes),
                },
                &opts,
            )?;
            let recvs: Vec<RecvWr<'_>> = (0..rq)
                .map(|_| RecvWr {
                    wr_id: j as u64,
                    sg_list: &[],
                })
                .collect();
            qp.post_recv(&recvs)?;
            peers.push(Some(Peer {
                qp,
                send_mr,
                _recv_mr: recv_mr,
                recv,
                remote_addr: addr,
                remote_rkey: rkey,
                credits: cfg.slots,
                data_posted: 0,
                data_done: 0,
                credit_posted: 0,
                credit_done: 0,
                arrived: VecDeque::new(),
                consumed: 0,
                unreported: 0,
            }));
        }
        // Everyone is at RTS with receives posted before anyone writes.
        rv.allgather(&[])?;
        Ok(RdmaTransport {
            rank,
            size,
            cfg: *cfg,
            peers,
            cq,
            wcs: Vec::with_capacity(64),
            last_rx: Instant::now(),
        })
    }
}

impl<'pd> RdmaTransport<'pd> {
    fn peer(&mut self, j: usize) -> Result<&mut Peer<'pd>> {
        self.peers
            .get_mut(j)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Invalid(format!("rank {j} is not a peer of rank {}", self.rank)))
    }

    /// Handle the completions waiting; returns how many.
    fn drain_cq(&mut self) -> Result<usize> {
        self.wcs.clear();
        let n = self.cq.poll(64, &mut self.wcs)?;
        if n > 0 {
            self.last_rx = Instant::now();
        }
        let slots = self.cfg.slots;
        let chunk = self.cfg.chunk;
        for i in 0..n {
            let wc = self.wcs[i];
            let j = wc.wr_id as usize;
            if wc.status != WcStatus::Success {
                return Err(Error::Completion {
                    peer: j,
                    status: ferroce_verbs::wc::status_str(wc.status),
                });
            }
            let p = self.peer(j)?;
            match wc.opcode {
                WcOpcode::RdmaWrite => p.data_done += 1,
                WcOpcode::Send => p.credit_done += 1,
                WcOpcode::RecvRdmaWithImm => {
                    let (len, back) = wire::split_imm(wc.imm_data.unwrap_or(LEN_MASK));
                    if back > 0 {
                        if p.credits + back > slots {
                            return Err(Error::Protocol {
                                peer: j,
                                what: format!(
                                    "returned {back} credits with {} held of {slots}",
                                    p.credits
                                ),
                            });
                        }
                        p.credits += back;
                    }
                    if len as usize > chunk || len == 0 {
                        return Err(Error::Protocol {
                            peer: j,
                            what: format!("chunk of {len} bytes (chunk size {chunk})"),
                        });
                    }
                    if p.arrived.len() >= slots {
                        return Err(Error::Protocol {
                            peer: j,
                            what: format!("more than {slots} chunks outstanding"),
                        });
                    }
                    p.arrived.push_back(len);
                    p.qp.post_recv(&[RecvWr {
                        wr_id: j as u64,
                        sg_list: &[],
                    }])?;
                }
                WcOpcode::Recv => {
                    let n = wc.imm_data.unwrap_or(0) as usize;
                    if n == 0 || p.credits + n > slots {
                        return Err(Error::Protocol {
                            peer: j,
                            what: format!(
                                "returned {n} credits with {} held of {slots}",
                                p.credits
                            ),
                        });
                    }
                    p.credits += n;
                    p.qp.post_recv(&[RecvWr {
                        wr_id: j as u64,
                        sg_list: &[],
                    }])?;
                }
                other => {
                    return Err(Error::Protocol {
                        peer: j,
                        what: format!("unexpected completion {other:?}"),
                    })
                }
            }
        }
        Ok(n)
    }
}

impl Transport for RdmaTransport<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()> {
        self.run(sends, recvs, None)
    }

    /// Chunks are folded straight out of their receive slots as they
    /// arrive (no temporary, and the reduction overlaps the transfer) when
    /// the chunk size is a multiple of `align`; otherwise whole messages.
    fn exchange_fold(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        align: usize,
        fold: Fold<'_>,
    ) -> Result<()> {
        if align == 0 || !self.cfg.chunk.is_multiple_of(align) {
            return exchange_fold_whole(self, sends, recvs, fold);
        }
        self.run(sends, recvs, Some(fold))
    }
}

impl RdmaTransport<'_> {
    /// The exchange loop; with `fold`, receives are combined into their
    /// buffers chunk by chunk instead of copied.
    fn run(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        mut fold: Option<Fold<'_>>,
    ) -> Result<()> {
        let (chunk, slots) = (self.cfg.chunk, self.cfg.slots);
        for &(j, _) in sends.iter() {
            self.peer(j)?;
        }
        for (j, _) in recvs.iter() {
            self.peer(*j)?;
        }
        // Progress offsets; per peer only the first unfinished op is active.
        let mut send_off = vec![0usize; sends.len()];
        let mut recv_off = vec![0usize; recvs.len()];
        let mut last_progress = Instant::now();
        loop {
            let mut progressed = self.drain_cq()? > 0;
            let mut all_done = true;
            // Sends.
            let mut busy = vec![false; self.size];
            for (k, &(j, data)) in sends.iter().enumerate() {
                if send_off[k] >= data.len() {
                    continue;
                }
                all_done = false;
                if std::mem::replace(&mut busy[j], true) {
                    continue;
                }
                let p = self.peer(j)?;
                while send_off[k] < data.len()
                    && p.credits > 0
                    && p.data_posted - p.data_done < slots as u64
                {
                    let len = (data.len() - send_off[k]).min(chunk);
                    let slot = (p.data_posted % slots as u64) as usize;
                    let off = (slot * chunk) as u64;
                    p.send_mr
                        .write(off, &data[send_off[k]..send_off[k] + len])?;
                    let sge = [p.send_mr.sge(off, len as u32)];
                    let wr = SendWr::new(
                        j as u64,
                        SendOp::RdmaWriteWithImm {
                            remote_addr: p.remote_addr + off,
                            rkey: p.remote_rkey,
                            imm: wire::data_imm(len, p.unreported),
                        },
                        &sge,
                    );
                    p.qp.post_send(&[wr])?;
                    p.credits -= 1;
                    p.unreported = 0;
                    p.data_posted += 1;
                    send_off[k] += len;
                    progressed = true;
                }
                if send_off[k] < data.len() {
                    continue;
                }
                busy[j] = false;
            }
            // Receives.
            let mut busy = vec![false; self.size];
            for (k, (j, buf)) in recvs.iter_mut().enumerate() {
                let j = *j;
                if recv_off[k] >= buf.len() {
                    continue;
                }
                all_done = false;
                if std::mem::replace(&mut busy[j], true) {
                    continue;
                }
                let p = self.peer(j)?;
                while recv_off[k] < buf.len() {
                    let Some(&len) = p.arrived.front() else { break };
                    let want = (buf.len() - recv_off[k]).min(chunk);
                    if len as usize != want {
                        return Err(Error::Protocol {
                            peer: j,
                            what: format!(
                                "chunk of {len} bytes where {want} were expected \
                                 (mismatched message sizes?)"
                            ),
                        });
                    }
                    p.arrived.pop_front();
                    let slot = (p.consumed % slots as u64) as usize;
                    let dst = &mut buf[recv_off[k]..recv_off[k] + want];
                    match fold.as_mut() {
                        None => p.recv.with(slot * chunk, want, |src| copy_bytes(dst, src)),
                        Some(f) => p.recv.with(slot * chunk, want, |src| f(dst, src)),
                    }
                    .map_err(|e| Error::Invalid(format!("receive slot {slot}: {e}")))?;
                    p.consumed += 1;
                    p.unreported += 1;
                    recv_off[k] += want;
                    progressed = true;
                }
                if recv_off[k] >= buf.len() {
                    busy[j] = false;
                }
            }
            // Credits back.
            for (j, p) in self.peers.iter_mut().enumerate() {
                let Some(p) = p else { continue };
                if slots::credit_due(p.unreported, slots, p.credit_posted, p.credit_done) {
                    let mut wr =
                        SendWr::new(j as u64, SendOp::SendWithImm { imm: p.unreported }, &[]);
                    wr.flags.signaled = true;
                    p.qp.post_send(&[wr])?;
                    p.credit_posted += 1;
                    p.unreported = 0;
                    progressed = true;
                }
            }
            if all_done {
                return Ok(());
            }
            if progressed {
                last_progress = Instant::now();
                continue;
            }
            let idle = last_progress.elapsed();
            if idle < self.cfg.spin {
                // Stay runnable (as MPI's progress loop does): with more
                // ranks than cores, a sleeping rank costs a wake-up on every
                // message, while a yielding one lets the peer run now.
                std::thread::yield_now();
                continue;
            }
            if idle >= self.cfg.timeout {
                return Err(slots::timeout(
                    self.cfg.timeout,
                    sends,
                    &send_off,
                    recvs,
                    &recv_off,
                ));
            }
            match self
                .cq
                .wait((self.cfg.timeout - idle).min(Duration::from_millis(20)))
            {
                Ok(()) | Err(ferroce_verbs::Error::Timeout(..)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for RdmaTransport<'_> {
    /// Let the last WRITEs be acknowledged before the QPs go away (bounded),
    /// and keep the device going until any ACK this side holds back for
    /// coalescing is out: its delay is at most an eighth of the ACK
    /// time-out (`DeviceOptions::fit`), counted from the last arrival.
    fn drop(&mut self) {
        let deadline = Instant::now() + self.cfg.timeout.min(Duration::from_secs(2));
        let held = ferroce_stack::transport::timers::local_ack_timeout(self.cfg.ack_timeout)
            .map_or(Duration::ZERO, |t| t / 8);
        while Instant::now() < deadline {
            let pending = self
                .peers
                .iter()
                .flatten()
                .any(|p| p.data_posted != p.data_done || p.credit_posted != p.credit_done);
            if !pending && self.last_rx.elapsed() > held {
                break;
            }
            match self.drain_cq() {
                Ok(0) => {
                    let _ = self.cq.wait(Duration::from_millis(1));
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
}
