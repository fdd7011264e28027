//! The RDMA transport over `ferroce-verbs`: one RC queue pair per peer pair,
//! and per direction a ring of `slots` pre-registered buffers of `chunk`
//! bytes at the receiver.
//!
//! Data path: the slot/credit exchange of the sibling module `exchange` (chunks by
//! RDMA WRITE WITH IMMEDIATE into the peer's receive slots, credits riding
//! back on data or alone in a zero-length SEND WITH IMMEDIATE). Piggybacking
//! matters for small exchanges between the same pair (recursive doubling): a
//! lone credit message is two more packets (it and its ACK) through the
//! kernel per few rounds.
//!
//! Limits: reading and writing the registered buffers goes through the
//! device lock (`MemoryRegion::read`/`write`), one extra copy per chunk on
//! each side; every pair is connected eagerly at start-up (n−1 QPs and
//! 2·slots·chunk bytes per peer).

use std::time::{Duration, Instant};

use ferroce_stack::transport::VecRegion;
use ferroce_verbs::{
    AccessFlags, CompletionQueue, ConnectOptions, Context, MemoryRegion, ProtectionDomain, QpType,
    QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcOpcode, WcStatus,
};

use super::exchange::{Completion, Exchange, Link};
use super::region::{prefaulted, SharedRegion};
use super::wire::{self, QpAddr, LEN_MASK};
use super::{exchange_fold_whole, Fold, RecvSpec, SendSpec, Transport};
use crate::bootstrap::Rendezvous;
use crate::error::{env_number, Error, Result};

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
        let mut c = RdmaConfig::default();
        if let Some(v) = env_number("FERROCE_COLL_CHUNK")? {
            c.chunk = v;
        }
        if let Some(v) = env_number("FERROCE_COLL_SLOTS")? {
            c.slots = v;
        }
        if let Some(v) = env_number("FERROCE_COLL_SPIN_US")? {
            c.spin = Duration::from_micros(v);
        }
        if let Some(v) = env_number("FERROCE_COLL_ACK_TIMEOUT")? {
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

/// The connection to one peer.
#[derive(Debug)]
struct Conn<'pd> {
    qp: QueuePair<'pd>,
    send_mr: MemoryRegion<'pd>,
    /// Registered (the peer's WRITEs land here); `recv` reaches the same
    /// bytes without the device lock.
    _recv_mr: MemoryRegion<'pd>,
    recv: SharedRegion,
    remote_addr: u64,
    remote_rkey: u32,
}

/// The exchange's [`Link`] over ferroce-verbs.
#[derive(Debug)]
struct Verbs<'pd> {
    chunk: usize,
    // Dropped before the CQ they complete into.
    conns: Vec<Option<Conn<'pd>>>,
    cq: CompletionQueue,
    /// When the last message arrived: a responder coalescing ACKs may still
    /// hold its ACK back (see [`RdmaTransport::drop`]).
    last_rx: Instant,
}

/// One rank's connections to every other rank.
#[derive(Debug)]
pub struct RdmaTransport<'pd> {
    cfg: RdmaConfig,
    ex: Exchange<Verbs<'pd>>,
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
        let mut conns = Vec::with_capacity(size);
        for (j, m) in made.into_iter().enumerate() {
            let Some((qp, send_mr, recv_mr, recv, opts)) = m else {
                conns.push(None);
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
            conns.push(Some(Conn {
                qp,
                send_mr,
                _recv_mr: recv_mr,
                recv,
                remote_addr: addr,
                remote_rkey: rkey,
            }));
        }
        // Everyone is at RTS with receives posted before anyone writes.
        rv.allgather(&[])?;
        let link = Verbs {
            chunk: cfg.chunk,
            conns,
            cq,
            last_rx: Instant::now(),
        };
        Ok(RdmaTransport {
            cfg: *cfg,
            ex: Exchange::new(link, rank, size, cfg),
        })
    }
}

impl<'pd> Verbs<'pd> {
    fn conn(&mut self, j: usize) -> Result<&mut Conn<'pd>> {
        self.conns
            .get_mut(j)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Invalid(format!("no connection to rank {j}")))
    }
}

impl Link for Verbs<'_> {
    type Opcode = WcOpcode;

    fn post_data(&mut self, peer: usize, slot: usize, data: &[u8], imm: u32) -> Result<()> {
        let off = (slot * self.chunk) as u64;
        let c = self.conn(peer)?;
        c.send_mr.write(off, data)?;
        let sge = [c.send_mr.sge(off, data.len() as u32)];
        let wr = SendWr::new(
            peer as u64,
            SendOp::RdmaWriteWithImm {
                remote_addr: c.remote_addr + off,
                rkey: c.remote_rkey,
                imm,
            },
            &sge,
        );
        c.qp.post_send(&[wr])?;
        Ok(())
    }

    fn post_credits(&mut self, peer: usize, n: u32) -> Result<()> {
        let mut wr = SendWr::new(peer as u64, SendOp::SendWithImm { imm: n }, &[]);
        wr.flags.signaled = true;
        self.conn(peer)?.qp.post_send(&[wr])?;
        Ok(())
    }

    fn post_recv(&mut self, peer: usize) -> Result<()> {
        self.conn(peer)?.qp.post_recv(&[RecvWr {
            wr_id: peer as u64,
            sg_list: &[],
        }])?;
        Ok(())
    }

    fn poll(&mut self, max: usize, out: &mut Vec<Completion<WcOpcode>>) -> Result<()> {
        let n = self.cq.poll_each(max, |_, wc| {
            let j = wc.wr_id as usize;
            out.push(if wc.status != WcStatus::Success {
                Completion::Failed(j, ferroce_verbs::wc::status_str(wc.status))
            } else {
                match wc.opcode {
                    WcOpcode::RdmaWrite => Completion::DataSent(j),
                    WcOpcode::Send => Completion::CreditsSent(j),
                    // No immediate: a length no chunk has, refused.
                    WcOpcode::RecvRdmaWithImm => {
                        Completion::DataArrived(j, wc.imm_data.unwrap_or(LEN_MASK))
                    }
                    WcOpcode::Recv => Completion::CreditsArrived(j, wc.imm_data.unwrap_or(0)),
                    other => Completion::Unexpected(j, other),
                }
            });
        })?;
        if n > 0 {
            self.last_rx = Instant::now();
        }
        Ok(())
    }

    fn with_slot<R>(
        &mut self,
        peer: usize,
        slot: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let chunk = self.chunk;
        self.conn(peer)?
            .recv
            .with(slot * chunk, len, f)
            .map_err(|e| Error::Invalid(format!("receive slot {slot}: {e}")))
    }

    /// `CompletionQueue::wait` needs no arming.
    fn arm(&mut self) -> Result<bool> {
        Ok(false)
    }

    fn sleep(&mut self, d: Duration) -> Result<()> {
        match self.cq.wait(d) {
            Ok(()) | Err(ferroce_verbs::Error::Timeout(..)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Transport for RdmaTransport<'_> {
    fn rank(&self) -> usize {
        self.ex.rank()
    }
    fn size(&self) -> usize {
        self.ex.size()
    }

    fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()> {
        self.ex.run(sends, recvs, None)
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
        self.ex.run(sends, recvs, Some(fold))
    }
}

impl Drop for RdmaTransport<'_> {
    /// Let the last WRITEs be acknowledged before the QPs go away (bounded),
    /// and keep the device going until any ACK this side holds back for
    /// coalescing is out: its delay is at most an eighth of the ACK
    /// time-out (`DeviceOptions::fit`), counted from the last arrival.
    fn drop(&mut self) {
        let held = ferroce_stack::transport::timers::local_ack_timeout(self.cfg.ack_timeout)
            .map_or(Duration::ZERO, |t| t / 8);
        self.ex.settle(
            |l| l.last_rx.elapsed() > held,
            |l| {
                let _ = l.cq.wait(Duration::from_millis(1));
            },
        );
    }
}
