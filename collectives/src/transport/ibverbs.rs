//! The rdma-core backend (cargo feature `rdma-core`): the same transport as
//! [`super::rdma`] — one RC QP per peer pair, a ring of `slots` receive
//! buffers of `chunk` bytes, RDMA WRITE WITH IMMEDIATE carrying the chunk
//! length and piggybacked credits, lone credits in a zero-length SEND WITH
//! IMMEDIATE — over rdma-core's libibverbs, so a job runs on real RNICs and on
//! rxe. The rendezvous blob, PSNs and immediates are `transport::wire`'s, so ranks
//! on this backend and ranks on ferroce join one communicator (both speak
//! RoCE v2 on the wire).
//!
//! Binding: `sideway`, over `rdma-mummy-sys`, whose small static shim
//! `dlopen()`s the system's `libibverbs.so.1` when the process starts; the
//! host's (or a VM's) rdma-core then loads its own providers (mlx5, rxe, ...).
//! `LD_LIBRARY_PATH` can point it at another libibverbs (the tests use
//! ferroce's drop-in one on hosts without an RDMA device).
//!
//! Connection: port 1, RoCE v2 GID (the first RoCE v2 GID holding an
//! IPv4-mapped address, as `show_gids` users pick by hand; else the first
//! RoCE v2 one; override with `FERROCE_IBV_GID`), path MTU = the port's
//! active MTU, initial PSNs from `wire::psn_for`, local ACK time-out
//! `ack_timeout`, retry and RNR retry 7 (infinite RNR retry, as the ferroce
//! backend).
//!
//! Waiting: completions are polled; a rank with nothing to do yields the CPU
//! for `spin`, then arms the CQ (`ibv_req_notify_cq`), polls once more (a
//! completion may have come before the arming) and sleeps in `poll(2)` on the
//! CQ's completion channel, at most 20 ms at a time so the time-out is checked.
//!
//! Buffers are page-aligned allocations owned here and registered with the
//! device; the device writes into the receive ring behind the compiler's
//! back, so it is only ever read one slot at a time, for one copy or fold,
//! after a completion announced the slot's chunk and before its credit goes
//! back (the peer writes it again only after that).
//!
//! The exchange itself (slots, credits, time-outs) is `transport::exchange`'s,
//! shared with the ferroce backend; this file is its [`Link`] over libibverbs.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue as _, PollCompletionQueueError,
    WorkCompletionOperationType, WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

use super::exchange::{Completion, Exchange, Link};
use super::wire::{self, QpAddr};
use super::{RecvSpec, SendSpec, Transport};
use crate::bootstrap::Rendezvous;
use crate::error::{Error, Result};
use crate::transport::rdma::RdmaConfig;

/// `enum ibv_gid_type_sysfs` in rdma-core's verbs.h: 0 is IB/RoCE v1, 1 RoCE v2.
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
/// The port every job uses (single-port devices: rxe, most RoCE NICs' functions).
const PORT: u8 = 1;
/// Hop limit of the GRH (rdma-core's perftest uses 0xff for RoCE v2).
const HOP_LIMIT: u8 = 64;

fn ibv_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Error {
    Error::Ibverbs(format!("{what}: {e}"))
}

/// An opened rdma-core device, its port, GID and a protection domain.
pub struct IbvEndpoint {
    name: String,
    gid_index: u32,
    gid: Ipv6Addr,
    mtu: Mtu,
    pd: Arc<ProtectionDomain>,
    ctx: Arc<DeviceContext>,
}

impl std::fmt::Debug for IbvEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvEndpoint")
            .field("name", &self.name)
            .field("gid_index", &self.gid_index)
            .field("gid", &self.gid)
            .field("mtu", &self.mtu)
            .finish()
    }
}

impl IbvEndpoint {
    /// Opens `device` (by name; `None`: the first device) and picks the GID
    /// (`gid_index`, or the RoCE v2 IPv4-mapped one, see the module docs).
    pub fn open(device: Option<&str>, gid_index: Option<u32>) -> Result<IbvEndpoint> {
        let list = DeviceList::new().map_err(|e| {
            ibv_err(
                "listing RDMA devices (is libibverbs.so.1 installed, with a provider?)",
                e,
            )
        })?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        let dev = match device {
            Some(want) => list.iter().find(|d| d.name() == want).ok_or_else(|| {
                Error::Ibverbs(format!("no RDMA device {want:?} (devices: {names:?})"))
            })?,
            None => list.get(0).ok_or_else(|| {
                Error::Ibverbs(
                    "no RDMA device (ibv_get_device_list found none; is a provider loaded?)".into(),
                )
            })?,
        };
        let name = dev.name();
        let ctx = dev
            .open()
            .map_err(|e| ibv_err(format!("opening {name}"), e))?;
        let port = ctx
            .query_port(PORT)
            .map_err(|e| ibv_err(format!("querying {name} port {PORT}"), e))?;
        let gid_index = match gid_index {
            Some(i) => i,
            None => pick_gid(&ctx, port.gid_tbl_len().max(0) as u32)
                .ok_or_else(|| Error::Ibverbs(format!("{name} port {PORT} has no usable GID")))?,
        };
        let gid: Ipv6Addr = ctx
            .query_gid(PORT, gid_index)
            .map_err(|e| ibv_err(format!("querying {name} GID {gid_index}"), e))?
            .into();
        let pd = ctx
            .alloc_pd()
            .map_err(|e| ibv_err(format!("allocating a PD on {name}"), e))?;
        Ok(IbvEndpoint {
            name,
            gid_index,
            gid,
            mtu: port.active_mtu(),
            pd,
            ctx,
        })
    }

    /// [`IbvEndpoint::open`] with `FERROCE_IBV_DEVICE` (name) and
    /// `FERROCE_IBV_GID` (index) from the environment.
    pub fn from_env() -> Result<IbvEndpoint> {
        let dev = std::env::var("FERROCE_IBV_DEVICE")
            .ok()
            .filter(|d| !d.is_empty());
        let gid = match std::env::var("FERROCE_IBV_GID") {
            Ok(v) if !v.is_empty() => Some(
                v.trim()
                    .parse()
                    .map_err(|_| Error::Env(format!("FERROCE_IBV_GID={v:?} is not an index")))?,
            ),
            _ => None,
        };
        Self::open(dev.as_deref(), gid)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn gid_index(&self) -> u32 {
        self.gid_index
    }
    pub fn gid(&self) -> Ipv6Addr {
        self.gid
    }

    /// Create a QP and buffers for every peer, exchange their addresses
    /// through the rendezvous, connect, and meet once more so no rank writes
    /// before its peer is ready (the same steps, in the same rounds, as the
    /// ferroce backend: ranks of both meet in one rendezvous).
    pub fn connect(&self, rv: &mut Rendezvous, cfg: &RdmaConfig) -> Result<IbvTransport> {
        wire::check_config(cfg)?;
        let (rank, size) = (rv.rank(), rv.size());
        let sq = (2 * cfg.slots + 8) as u32;
        let rq = (2 * cfg.slots + 8) as u32;
        let channel = CompletionChannel::new(&self.ctx)
            .map_err(|e| ibv_err("creating a completion channel", e))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| ibv_err("completion channel non-blocking", e))?;
        let cq = self
            .ctx
            .create_cq_builder()
            .setup_cqe((sq + rq) * size.max(1) as u32 + 64)
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| ibv_err("creating the CQ", e))?;
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite;
        let ring = cfg.chunk * cfg.slots;
        let mut entries = vec![None; size];
        let mut made = Vec::with_capacity(size);
        for (j, entry) in entries.iter_mut().enumerate() {
            if j == rank {
                made.push(None);
                continue;
            }
            let mut qp = self
                .pd
                .create_qp_builder()
                .setup_max_send_wr(sq)
                .setup_max_recv_wr(rq)
                .setup_max_send_sge(1)
                .setup_max_recv_sge(1)
                .setup_send_cq(Arc::clone(&cq))
                .setup_recv_cq(Arc::clone(&cq))
                .build()
                .map_err(|e| ibv_err(format!("creating the QP to rank {j}"), e))?;
            let send = Ring::new(&self.pd, ring, access)?;
            let recv = Ring::new(&self.pd, ring, access)?;
            let mut attr = QueuePairAttribute::new();
            attr.setup_state(QueuePairState::Init)
                .setup_pkey_index(0)
                .setup_port(PORT)
                .setup_access_flags(access);
            qp.modify(&attr)
                .map_err(|e| ibv_err(format!("QP to rank {j} to INIT"), e))?;
            let psn = wire::psn_for(cfg.seed, rank, j);
            *entry = Some(QpAddr {
                qpn: qp.qp_number(),
                psn,
                addr: recv.addr(),
                rkey: recv.rkey(),
            });
            made.push(Some((qp, send, recv, psn)));
        }
        let all = rv.allgather(&wire::encode(self.gid.octets(), &entries))?;
        let mut conns = Vec::with_capacity(size);
        for (j, m) in made.into_iter().enumerate() {
            let Some((mut qp, send, recv, psn)) = m else {
                conns.push(None);
                continue;
            };
            let (gid, theirs) = wire::remote(&all, j, rank, size)?;
            let mut ah = AddressHandleAttribute::new();
            ah.setup_dest_lid(0)
                .setup_port(PORT)
                .setup_service_level(0)
                .setup_grh_src_gid_index(self.gid_index as u8)
                .setup_grh_dest_gid(&Gid::from(Ipv6Addr::from(gid)))
                .setup_grh_hop_limit(HOP_LIMIT);
            let mut attr = QueuePairAttribute::new();
            attr.setup_state(QueuePairState::ReadyToReceive)
                .setup_path_mtu(self.mtu)
                .setup_dest_qp_num(theirs.qpn)
                .setup_rq_psn(theirs.psn)
                .setup_max_dest_read_atomic(1)
                .setup_min_rnr_timer(12)
                .setup_address_vector(&ah);
            qp.modify(&attr)
                .map_err(|e| ibv_err(format!("QP to rank {j} to RTR"), e))?;
            let mut attr = QueuePairAttribute::new();
            attr.setup_state(QueuePairState::ReadyToSend)
                .setup_sq_psn(psn)
                .setup_timeout(cfg.ack_timeout)
                .setup_retry_cnt(7)
                .setup_rnr_retry(7)
                .setup_max_read_atomic(1);
            qp.modify(&attr)
                .map_err(|e| ibv_err(format!("QP to rank {j} to RTS"), e))?;
            post_recvs(&mut qp, j, rq as usize)?;
            conns.push(Some(Conn {
                qp,
                send,
                recv,
                remote_addr: theirs.addr,
                remote_rkey: theirs.rkey,
            }));
        }
        // Everyone is at RTS with receives posted before anyone writes.
        rv.allgather(&[])?;
        let link = Ibv {
            chunk: cfg.chunk,
            conns,
            cq,
            channel,
        };
        Ok(IbvTransport {
            cfg: *cfg,
            ex: Exchange::new(link, rank, size, cfg),
        })
    }
}

/// The first RoCE v2 GID with an IPv4-mapped address, else the first RoCE v2
/// GID, else the first non-zero one.
fn pick_gid(ctx: &DeviceContext, len: u32) -> Option<u32> {
    let mut v2 = None;
    let mut any = None;
    for i in 0..len.min(256) {
        let Ok(g) = ctx.query_gid(PORT, i) else {
            continue;
        };
        let addr = Ipv6Addr::from(g);
        if addr.is_unspecified() {
            continue;
        }
        any.get_or_insert(i);
        // A library without ibv_query_gid_type: judge by the address alone.
        let roce_v2 = ctx
            .query_gid_type(PORT, i)
            .map_or(true, |t| t == GID_TYPE_SYSFS_ROCE_V2);
        if roce_v2 {
            if addr.to_ipv4_mapped().is_some() {
                return Some(i);
            }
            v2.get_or_insert(i);
        }
    }
    v2.or(any)
}

fn post_recvs(qp: &mut BasicQueuePair, peer: usize, n: usize) -> Result<()> {
    let mut g = qp.start_post_recv();
    for _ in 0..n {
        // No scatter list: only immediates arrive through receives.
        g.construct_wr(peer as u64);
    }
    g.post()
        .map_err(|e| ibv_err(format!("posting receives for rank {peer}"), e))
}

/// A page-aligned buffer registered with the device.
struct Ring {
    /// `None` only while dropping (deregistered before the memory is freed).
    mr: Option<Arc<MemoryRegion>>,
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Ring {
    fn new(pd: &Arc<ProtectionDomain>, len: usize, access: AccessFlags) -> Result<Ring> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::Invalid(format!("ring of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| Error::Invalid(format!("cannot allocate a {len}-byte ring")))?;
        // SAFETY: `ptr` is valid for `len` bytes until `Ring::drop`, which
        // deregisters the MR (drops `mr`, the only reference) before freeing.
        let mr = unsafe { pd.reg_mr(ptr.as_ptr() as usize, len, access) };
        let mr = match mr {
            Ok(mr) => mr,
            Err(e) => {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { dealloc(ptr.as_ptr(), layout) };
                return Err(ibv_err(format!("registering a {len}-byte ring"), e));
            }
        };
        Ok(Ring {
            mr: Some(mr),
            ptr,
            layout,
        })
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, |m| m.lkey())
    }

    fn rkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, |m| m.rkey())
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    /// Copies `src` to offset `off` of the ring.
    ///
    /// The caller makes sure the device does not read that range now (no
    /// posted WRITE from it is incomplete).
    fn write(&self, off: usize, src: &[u8]) -> Result<()> {
        if off
            .checked_add(src.len())
            .is_none_or(|end| end > self.len())
        {
            return Err(Error::Invalid(format!(
                "{} bytes at {off} of a {}-byte ring",
                src.len(),
                self.len()
            )));
        }
        // SAFETY: the range lies inside the allocation (checked above) and
        // `src` is a distinct Rust slice; the device does not touch the range
        // (caller's contract), so nothing races this copy.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        };
        Ok(())
    }

    /// Runs `f` on `len` bytes at offset `off` of the ring.
    ///
    /// The caller makes sure the peer does not write that range now (its
    /// chunk there completed and the slot's credit was not returned).
    fn with<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        if off.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(Error::Invalid(format!(
                "{len} bytes at {off} of a {}-byte ring",
                self.len()
            )));
        }
        // SAFETY: the range lies inside the allocation (checked above); the
        // device finished writing it before the completion that announced it
        // and writes it again only after we return the slot's credit, which
        // cannot happen while `f` holds the slice.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) };
        Ok(f(bytes))
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Deregister first: the device must not access the memory once freed.
        drop(self.mr.take());
        // SAFETY: allocated in `Ring::new` with `self.layout`; the MR over it
        // is gone and the QP that used it was destroyed before (Peer field order).
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The connection to one peer.
struct Conn {
    // Destroyed before the rings its WRs point into.
    qp: BasicQueuePair,
    send: Ring,
    recv: Ring,
    remote_addr: u64,
    remote_rkey: u32,
}

/// A completion's opcode (`enum ibv_wc_opcode`), for the error on one the
/// protocol never causes.
#[derive(Clone, Copy)]
struct IbvOpcode(u32);

impl std::fmt::Debug for IbvOpcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "opcode {}", self.0)
    }
}

/// The exchange's [`Link`] over libibverbs.
struct Ibv {
    chunk: usize,
    // Dropped before the CQ they complete into, and the CQ before its channel.
    conns: Vec<Option<Conn>>,
    cq: Arc<BasicCompletionQueue>,
    channel: Arc<CompletionChannel>,
}

/// One rank's connections to every other rank over libibverbs.
pub struct IbvTransport {
    cfg: RdmaConfig,
    ex: Exchange<Ibv>,
}

impl std::fmt::Debug for IbvTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvTransport")
            .field("rank", &self.ex.rank())
            .field("size", &self.ex.size())
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// rdma-core's name of a completion status (as `ibv_wc_status_str`).
fn status_str(s: u32) -> &'static str {
    use WorkCompletionStatus as S;
    const NAMES: [(S, &str); 13] = [
        (S::Success, "success"),
        (S::LocalLengthError, "local length error"),
        (S::LocalQueuePairOperationError, "local QP operation error"),
        (S::LocalProtectionError, "local protection error"),
        (S::WorkRequestFlushedError, "Work Request Flushed Error"),
        (S::BadResponseError, "bad response error"),
        (S::LocalAccessError, "local access error"),
        (S::RemoteInvalidRequestError, "remote invalid request error"),
        (S::RemoteAccessError, "remote access error"),
        (S::RemoteOperationError, "remote operation error"),
        (
            S::RetryCounterExceededError,
            "transport retry counter exceeded",
        ),
        (
            S::ResponderNotReadyRetryCounterExceededError,
            "RNR retry counter exceeded",
        ),
        (S::FatalError, "fatal error"),
    ];
    NAMES
        .iter()
        .find(|(k, _)| *k as u32 == s)
        .map_or("unknown completion status", |(_, n)| n)
}

impl Ibv {
    /// Ask for an event on the channel at the next completion.
    fn req_notify(&self) -> Result<()> {
        // SAFETY: `self.cq` keeps the CQ (and its context) alive; the call
        // goes through the context's ops table, which the provider filled.
        let rc = unsafe { rdma_mummy_sys::ibv_req_notify_cq(self.cq.cq().as_ptr(), 0) };
        if rc != 0 {
            return Err(ibv_err(
                "arming the CQ",
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    /// Sleep until the armed CQ has an event or `d` passes; consume the event.
    fn sleep_on_channel(&self, d: Duration) -> Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.channel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = d.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: one valid pollfd, alive for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            // Time-out, or EINTR: the caller polls the CQ again either way.
            return Ok(());
        }
        let mut cq: *mut rdma_mummy_sys::ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel is alive (`self.channel`) and non-blocking, the
        // out-pointers are valid locals.
        let rc = unsafe {
            rdma_mummy_sys::ibv_get_cq_event(
                self.channel.comp_channel().as_ptr(),
                &mut cq,
                &mut ctx,
            )
        };
        if rc == 0 && !cq.is_null() {
            // SAFETY: `cq` is the CQ the event was for: ours, the only one on
            // this channel; acknowledged at once, so destroying it later does
            // not wait on unacknowledged events.
            unsafe { rdma_mummy_sys::ibv_ack_cq_events(cq, 1) };
        }
        Ok(())
    }

    fn conn(&mut self, j: usize) -> Result<&mut Conn> {
        self.conns
            .get_mut(j)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Invalid(format!("no connection to rank {j}")))
    }
}

impl Link for Ibv {
    type Opcode = IbvOpcode;

    fn post_data(&mut self, peer: usize, slot: usize, data: &[u8], imm: u32) -> Result<()> {
        let off = slot * self.chunk;
        let c = self.conn(peer)?;
        c.send.write(off, data)?;
        post_write_imm(c, peer, off, data.len(), imm)
    }

    fn post_credits(&mut self, peer: usize, n: u32) -> Result<()> {
        post_credits(self.conn(peer)?, peer, n)
    }

    fn post_recv(&mut self, peer: usize) -> Result<()> {
        post_recvs(&mut self.conn(peer)?.qp, peer, 1)
    }

    fn poll(&mut self, max: usize, out: &mut Vec<Completion<IbvOpcode>>) -> Result<()> {
        const WRITE: u32 = WorkCompletionOperationType::Write as u32;
        const SEND: u32 = WorkCompletionOperationType::Send as u32;
        const RECV_IMM: u32 = WorkCompletionOperationType::ReceiveWithImmediate as u32;
        const RECV: u32 = WorkCompletionOperationType::Receive as u32;
        let poller = match self.cq.start_poll() {
            Ok(poller) => poller,
            Err(PollCompletionQueueError::CompletionQueueEmpty) => return Ok(()),
            Err(e) => return Err(ibv_err("polling the CQ", e)),
        };
        for wc in poller.take(max) {
            let j = wc.wr_id() as usize;
            let status = wc.status();
            // Network order in the work completion (verbs.h: __be32).
            let imm = u32::from_be(wc.imm_data());
            out.push(if status != WorkCompletionStatus::Success as u32 {
                Completion::Failed(j, status_str(status))
            } else {
                match wc.opcode() {
                    WRITE => Completion::DataSent(j),
                    SEND => Completion::CreditsSent(j),
                    RECV_IMM => Completion::DataArrived(j, imm),
                    RECV => Completion::CreditsArrived(j, imm),
                    other => Completion::Unexpected(j, IbvOpcode(other)),
                }
            });
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
        self.conn(peer)?.recv.with(slot * chunk, len, f)
    }

    /// Armed after the last poll: a completion in between raises no event.
    fn arm(&mut self) -> Result<bool> {
        self.req_notify()?;
        Ok(true)
    }

    fn sleep(&mut self, d: Duration) -> Result<()> {
        self.sleep_on_channel(d)
    }
}

fn post_write_imm(p: &mut Conn, peer: usize, off: usize, len: usize, imm: u32) -> Result<()> {
    let (lkey, addr) = (p.send.lkey(), p.send.addr() + off as u64);
    let (raddr, rkey) = (p.remote_addr + off as u64, p.remote_rkey);
    let mut g = p.qp.start_post_send();
    let wr = g
        .construct_wr(peer as u64, WorkRequestFlags::Signaled)
        .setup_write_imm(rkey, raddr, imm.to_be());
    // SAFETY: `addr..addr+len` lies in the send ring (off + len ≤ ring
    // length: slot < slots, len ≤ chunk), registered under `lkey` and alive
    // while the QP is (the Peer owns both and drops the QP first).
    unsafe { wr.setup_sge(lkey, addr, len as u32) };
    g.post()
        .map_err(|e| ibv_err(format!("posting a WRITE to rank {peer}"), e))
}

fn post_credits(p: &mut Conn, peer: usize, n: u32) -> Result<()> {
    let mut g = p.qp.start_post_send();
    // Zero-length: no scatter list.
    g.construct_wr(peer as u64, WorkRequestFlags::Signaled)
        .setup_send_imm(n.to_be());
    g.post()
        .map_err(|e| ibv_err(format!("posting credits to rank {peer}"), e))
}

impl Transport for IbvTransport {
    fn rank(&self) -> usize {
        self.ex.rank()
    }
    fn size(&self) -> usize {
        self.ex.size()
    }

    fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()> {
        self.ex.run(sends, recvs, None)
    }
}

impl Drop for IbvTransport {
    /// Let the last WRITEs be acknowledged before the QPs go away (bounded).
    fn drop(&mut self) {
        self.ex
            .settle(|_| true, |_| std::thread::sleep(Duration::from_millis(1)));
    }
}
