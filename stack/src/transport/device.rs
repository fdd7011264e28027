//! The core: every object of one device and the sans-IO entry points.
//!
//! Order of calls for an engine (quinn-proto style):
//! 1. verbs calls (`post_send`, `post_recv`, ...) whenever the user makes them;
//! 2. `handle_frame(now, frame)` for every frame the driver received;
//! 3. `handle_timeout(now)` when `now` has reached `poll_timeout()`;
//! 4. `poll_transmit(now, buf)` until it returns `None`, sending each frame;
//! 5. sleep until the next frame or `poll_timeout()`.
//!
//! `now` must not go backwards. Nothing here allocates per packet once the
//! queues have reached their size.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::net::Ipv6Addr;

use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::wire::{bth, icrc, ParsedPacket, Transport};

use super::counters::{HwCounter, HwCounters};
use super::cq::{Cq, CqHandle};
use super::error::{ModifyError, VerbsError};
use super::mcast::{McastTable, MULTICAST_QPN};
use super::mr::{AccessFlags, MemoryRegion, MrTable, PdHandle};
use super::psn;
use super::qp::{check_modify, Qp, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType};
use super::split::{SplitState, TxPayload, TxSplit};
use super::srq::{Srq, SrqHandle};
use super::timers::Instant;
use super::wqe::{RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion, MAX_SGE};

/// Limits of a core (what ibv_query_device would report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub max_qp: u32,
    pub max_cq: u32,
    pub max_srq: u32,
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    pub max_sge: u32,
    pub max_inline_data: u32,
    /// Most unacknowledged PSNs a requester has out ([`DEFAULT_MAX_UNACKED_PSNS`];
    /// rxe's is [`RXE_MAX_UNACKED_PSNS`]).
    pub max_unacked_psns: u32,
    /// Largest message (IBTA: 2^31 bytes).
    pub max_msg_size: u64,
    /// The port's active path MTU in bytes. UD QPs have no path MTU
    /// attribute; like rxe they use the port's (rxe_av / port attr).
    pub port_mtu: u32,
    /// The largest path MTU a QP may be given (ibv_port_attr.max_mtu; rxe
    /// rejects a larger PATH_MTU with EINVAL in rxe_qp_chk_attr). 4096
    /// unless the packet engine carries less.
    pub max_mtu: u32,
    /// Responder ACK coalescing: an RC responder may hold back the ACK of a
    /// SEND/WRITE that asked for one this long, so that one ACK covers the
    /// packets that follow (IBTA ACK coalescing: an ACK acknowledges every
    /// earlier PSN too). `None` (the default, as rxe) ACKs at once. It must
    /// stay well below the peers' local ACK time-out, or they retransmit.
    pub ack_delay: Option<core::time::Duration>,
    /// With `ack_delay`: a held-back ACK goes out once it covers this many
    /// ACK-requesting packets, or once it leaves half of `max_unacked_psns`
    /// (at most 64, half of rxe's window) PSNs unacknowledged, so a
    /// requester never stops at its window to wait for the delay.
    pub ack_coalesce: u32,
    /// The top byte every QPN of this core carries, or `None` for QPNs from
    /// 0x11 up to the whole 24-bit space. Devices of several processes
    /// sharing one UDP port (`ferroce_nic::port_share`) are told apart by it:
    /// each then has the 65519 QPNs `prefix << 16 | 0x11` to `prefix << 16 | 0xFFFF`.
    pub qpn_prefix: Option<u8>,
    /// A UD packet this core sends to a multicast group also reaches the
    /// QPs of this core attached to it, the sender's own included, as rxe
    /// does through the kernel's IP loopback. Off where the packet engine
    /// loops the group's packets back itself (the UDP socket backend).
    pub mcast_loopback: bool,
}

impl Config {
    /// Gives this core's QPNs the top byte `prefix` ([`Config::qpn_prefix`]),
    /// with `max_qp` no larger than the QPNs under it.
    pub fn set_qpn_prefix(&mut self, prefix: u8) {
        self.qpn_prefix = Some(prefix);
        self.max_qp = self.max_qp.min(0x1_0000 - QPN_BASE);
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_qp: 1 << 16,
            max_cq: 1 << 16,
            max_srq: 1 << 12,
            max_qp_wr: 1 << 14,
            max_cqe: 1 << 20,
            max_sge: MAX_SGE as u32,
            max_inline_data: 256,
            max_unacked_psns: DEFAULT_MAX_UNACKED_PSNS,
            max_msg_size: 1 << 31,
            // rxe's active MTU on a 1500-byte Ethernet link; the verbs
            // layer sets the interface's own.
            port_mtu: 1024,
            max_mtu: 4096,
            ack_delay: None,
            ack_coalesce: 4,
            qpn_prefix: None,
            mcast_loopback: true,
        }
    }
}

/// Asynchronous events (ibv_get_async_event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A completion was lost because the CQ was full (IBV_EVENT_CQ_ERR).
    CqError { cq: CqHandle },
    /// An SRQ fell below its armed limit (IBV_EVENT_SRQ_LIMIT_REACHED).
    SrqLimitReached { srq: SrqHandle },
    /// A QP attached to an SRQ entered ERR (IBV_EVENT_QP_LAST_WQE_REACHED).
    QpLastWqeReached { qpn: u32, srq: SrqHandle },
    /// The send queue of a QP in SQD has drained (IBV_EVENT_SQ_DRAINED).
    SqDrained { qpn: u32 },
}

/// Counters: frames, retransmissions, NAKs, and every reason a frame was dropped.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub rx_frames: u64,
    pub tx_packets: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    pub duplicates: u64,
    pub out_of_sequence: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    /// Drops and oddities by name (wire errors use `wire::Error::counter_name`).
    pub drops: BTreeMap<&'static str, u64>,
    /// rxe's hw_counters, same names and events.
    pub hw: HwCounters,
}

impl Stats {
    pub fn count(&mut self, what: &'static str) {
        *self.drops.entry(what).or_default() += 1;
    }
    pub fn get(&self, what: &str) -> u64 {
        self.drops.get(what).copied().unwrap_or(0)
    }
    pub fn inc(&mut self, c: HwCounter) {
        self.hw.inc(c);
    }
    pub fn hw(&self, c: HwCounter) -> u64 {
        self.hw.get(c)
    }
    /// Every counter by name: rxe's hw_counters in rxe's order, then
    /// ferroce's own totals, then each drop reason (sorted by name).
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = self.hw.iter().collect();
        v.extend([
            ("rx_frames", self.rx_frames),
            ("tx_packets", self.tx_packets),
            ("retransmits", self.retransmits),
            ("timeouts", self.timeouts),
            ("duplicates", self.duplicates),
            ("out_of_sequence", self.out_of_sequence),
            ("naks_sent", self.naks_sent),
            ("naks_received", self.naks_received),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rnr_naks_received", self.rnr_naks_received),
        ]);
        v.extend(self.drops.iter().map(|(k, n)| (*k, *n)));
        v
    }
}

/// What a QP needs from the rest of the core while it works.
pub(crate) struct Ctx<'a> {
    pub mrs: &'a mut MrTable,
    pub cqs: &'a mut [Option<Cq>],
    pub srqs: &'a mut [Option<Srq>],
    pub events: &'a mut VecDeque<AsyncEvent>,
    pub stats: &'a mut Stats,
    pub cfg: &'a Config,
    pub now: Instant,
    /// Whether the frame being written may leave its payload in place.
    pub split: SplitState,
}

impl Ctx<'_> {
    pub fn complete(&mut self, cq: CqHandle, wc: WorkCompletion) {
        if wc.status == WcStatus::Success
            && matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
        {
            self.stats.inc(HwCounter::RdmaRecvs);
        }
        if let Some(Some(c)) = self.cqs.get_mut(cq.0 as usize) {
            let was = c.overflowed;
            if c.push(wc).is_err() && !was {
                self.events.push_back(AsyncEvent::CqError { cq });
            }
        }
    }
}

/// The QPN of slot 0 (rxe starts at RXE_MIN_QP_INDEX 16 + 1; 0 and 1 are special).
const QPN_BASE: u32 = 0x11;
/// QP1, the general service QP (IBTA §10.2.5).
const GSI_QPN: u32 = crate::wire::mad::GSI_QPN;

/// Unacknowledged PSNs an rxe requester sends before it waits (rxe_param.h:
/// RXE_MAX_UNACKED_PSNS).
pub const RXE_MAX_UNACKED_PSNS: u32 = 128;

/// Our requester's default window: 4× rxe's, 2 MiB at a 4096-byte MTU. A
/// stream moves at most one window per round trip, and where round trips
/// are long (VMs under emulation: a 64 KiB WRITE stream between two TCG
/// VMs ran at 50–75 MB/s with 128, 78–86 MB/s with 512) rxe's 128 stalls
/// it; real RNICs keep far more out. The IBTA allows up to 2^23 (half the
/// 24-bit PSN space, so a responder can tell duplicates from new packets).
pub const DEFAULT_MAX_UNACKED_PSNS: u32 = 512;

/// One RoCE v2 device's worth of transport state. See the module docs for the call order.
#[derive(Debug)]
pub struct Core {
    cfg: Config,
    rng: Xoshiro256PlusPlus,
    pds: Vec<bool>,
    mrs: MrTable,
    cqs: Vec<Option<Cq>>,
    /// Polls of any CQ so far ([`Core::note_cq_poll`]).
    cq_polls: u64,
    srqs: Vec<Option<Srq>>,
    qps: Vec<Option<Box<Qp>>>,
    free_qps: Vec<u32>,
    /// The slot of QP1 (the general service QP, [`Core::create_gsi_qp`]):
    /// frames to QPN 1 go there, none to the QPN its slot would have.
    gsi_slot: Option<u32>,
    ready: VecDeque<u32>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    events: VecDeque<AsyncEvent>,
    stats: Stats,
    /// The receive ICRC's header state for the last flow (see [`icrc::PrefixCache`]).
    icrc_prefix: icrc::PrefixCache,
    mcast: McastTable,
    /// Multicast frames this core sent, to hand to its own attached QPs
    /// ([`Config::mcast_loopback`]) on the next transmit call.
    mcast_looped: VecDeque<Vec<u8>>,
}

macro_rules! split {
    ($self:ident, $now:expr) => {
        Ctx {
            mrs: &mut $self.mrs,
            cqs: &mut $self.cqs,
            srqs: &mut $self.srqs,
            events: &mut $self.events,
            stats: &mut $self.stats,
            cfg: &$self.cfg,
            now: $now,
            split: SplitState::default(),
        }
    };
}

impl Core {
    /// A core whose keys come from `seed` (never from the OS).
    pub fn new(cfg: Config, seed: u64) -> Core {
        Core {
            cfg,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            pds: Vec::new(),
            mrs: MrTable::default(),
            cqs: Vec::new(),
            cq_polls: 0,
            srqs: Vec::new(),
            qps: Vec::new(),
            free_qps: Vec::new(),
            gsi_slot: None,
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            icrc_prefix: icrc::PrefixCache::default(),
            mcast: McastTable::default(),
            mcast_looped: VecDeque::new(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    // ---- protection domains and memory regions ----

    pub fn alloc_pd(&mut self) -> PdHandle {
        if let Some(i) = self.pds.iter().position(|used| !used) {
            self.pds[i] = true;
            return PdHandle(i as u32);
        }
        self.pds.push(true);
        PdHandle(self.pds.len() as u32 - 1)
    }

    fn pd_ok(&self, pd: PdHandle) -> Result<(), VerbsError> {
        match self.pds.get(pd.0 as usize) {
            Some(true) => Ok(()),
            _ => Err(VerbsError::NotFound("protection domain")),
        }
    }

    /// Fails with `Busy` while MRs, QPs or SRQs use it (ibv_dealloc_pd: EBUSY).
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), VerbsError> {
        self.pd_ok(pd)?;
        let used = self.mrs.any_in_pd(pd)
            || self.qps.iter().flatten().any(|q| q.pd == pd)
            || self.srqs.iter().flatten().any(|s| s.pd == pd);
        if used {
            return Err(VerbsError::Busy("protection domain"));
        }
        self.pds[pd.0 as usize] = false;
        Ok(())
    }

    /// Register `region`, known to local SGEs and remote peers by `iova`.
    /// Returns `(lkey, rkey)`.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        iova: u64,
        access: AccessFlags,
        region: Box<dyn MemoryRegion>,
    ) -> Result<(u32, u32), VerbsError> {
        self.pd_ok(pd)?;
        self.mrs.register(&mut self.rng, pd, iova, access, region)
    }

    /// Deregister; the keys stop working at once. Returns the memory.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        Ok(self.mrs.deregister(lkey)?.region)
    }

    /// The memory behind a key.
    pub fn mr_region(&self, key: u32) -> Option<&dyn MemoryRegion> {
        self.mrs.get(key).map(|m| &*m.region)
    }
    pub fn mr_region_mut(&mut self, key: u32) -> Option<&mut (dyn MemoryRegion + 'static)> {
        self.mrs.get_mut(key).map(|m| &mut *m.region)
    }

    // ---- completion queues ----

    pub fn create_cq(&mut self, depth: u32) -> Result<CqHandle, VerbsError> {
        if depth == 0 || depth > self.cfg.max_cqe {
            return Err(VerbsError::OutOfRange {
                what: "cqe",
                value: depth.into(),
                max: self.cfg.max_cqe.into(),
            });
        }
        let cq = Cq::new(depth as usize);
        if let Some(i) = self.cqs.iter().position(Option::is_none) {
            self.cqs[i] = Some(cq);
            return Ok(CqHandle(i as u32));
        }
        if self.cqs.len() >= self.cfg.max_cq as usize {
            return Err(VerbsError::Exhausted("completion queues"));
        }
        self.cqs.push(Some(cq));
        Ok(CqHandle(self.cqs.len() as u32 - 1))
    }

    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), VerbsError> {
        self.cq_ok(cq)?;
        if self
            .qps
            .iter()
            .flatten()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(VerbsError::Busy("completion queue"));
        }
        self.cqs[cq.0 as usize] = None;
        Ok(())
    }

    fn cq_ok(&self, cq: CqHandle) -> Result<(), VerbsError> {
        match self.cqs.get(cq.0 as usize) {
            Some(Some(_)) => Ok(()),
            _ => Err(VerbsError::NotFound("completion queue")),
        }
    }

    /// Move up to `out.len()` completions, oldest first, into `out`.
    pub fn poll_cq(
        &mut self,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize, VerbsError> {
        match self.cqs.get_mut(cq.0 as usize) {
            Some(Some(c)) => Ok(c.poll(out)),
            _ => Err(VerbsError::NotFound("completion queue")),
        }
    }

    /// One completion, if any.
    pub fn poll_cq_one(&mut self, cq: CqHandle) -> Option<WorkCompletion> {
        self.cqs.get_mut(cq.0 as usize)?.as_mut()?.pop()
    }

    /// Records a poll of `cq` by the application (whether or not it found
    /// anything), for [`Core::completions_waiting_in_polled`].
    pub fn note_cq_poll(&mut self, cq: CqHandle) {
        self.cq_polls += 1;
        let n = self.cq_polls;
        if let Some(Some(c)) = self.cqs.get_mut(cq.0 as usize) {
            c.polled_at = n;
        }
    }

    /// Whether a CQ the application polls (one of its last `window` polls
    /// was of it) holds a completion: a program polling several CQs in turn
    /// has work there, while one it looks at now and then (perftest's send
    /// CQ, polled every hundredth message) says nothing about now.
    pub fn completions_waiting_in_polled(&self, window: u64) -> bool {
        let now = self.cq_polls;
        self.cqs
            .iter()
            .flatten()
            .any(|c| c.len() > 0 && now - c.polled_at <= window)
    }

    /// Completions ever queued on `cq` (0 for no such CQ).
    pub fn cq_added(&self, cq: CqHandle) -> u64 {
        match self.cqs.get(cq.0 as usize) {
            Some(Some(c)) => c.added(),
            _ => 0,
        }
    }

    pub fn cq_len(&self, cq: CqHandle) -> usize {
        match self.cqs.get(cq.0 as usize) {
            Some(Some(c)) => c.len(),
            _ => 0,
        }
    }

    // ---- shared receive queues ----

    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SrqHandle, VerbsError> {
        self.pd_ok(pd)?;
        self.check_caps("max_wr", max_wr, self.cfg.max_qp_wr)?;
        self.check_caps("max_sge", max_sge, self.cfg.max_sge)?;
        let srq = Srq::new(pd, max_wr as usize, max_sge as usize);
        if let Some(i) = self.srqs.iter().position(Option::is_none) {
            self.srqs[i] = Some(srq);
            return Ok(SrqHandle(i as u32));
        }
        if self.srqs.len() >= self.cfg.max_srq as usize {
            return Err(VerbsError::Exhausted("shared receive queues"));
        }
        self.srqs.push(Some(srq));
        Ok(SrqHandle(self.srqs.len() as u32 - 1))
    }

    /// Arm the limit event: it fires once when fewer than `limit` WRs remain (0 disarms).
    pub fn modify_srq(&mut self, srq: SrqHandle, limit: u32) -> Result<(), VerbsError> {
        let s = self.srq_mut(srq)?;
        if u64::from(limit) > s.queue.cap() {
            return Err(VerbsError::OutOfRange {
                what: "srq_limit",
                value: limit.into(),
                max: s.queue.cap(),
            });
        }
        s.limit = limit;
        Ok(())
    }

    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbsError> {
        self.srq_mut(srq)?;
        if self.qps.iter().flatten().any(|q| q.srq == Some(srq)) {
            return Err(VerbsError::Busy("shared receive queue"));
        }
        self.srqs[srq.0 as usize] = None;
        Ok(())
    }

    fn srq_mut(&mut self, srq: SrqHandle) -> Result<&mut Srq, VerbsError> {
        match self.srqs.get_mut(srq.0 as usize) {
            Some(Some(s)) => Ok(s),
            _ => Err(VerbsError::NotFound("shared receive queue")),
        }
    }

    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        let s = self.srq_mut(srq)?;
        if wr.sg_list.len() > s.max_sge {
            return Err(VerbsError::OutOfRange {
                what: "num_sge",
                value: wr.sg_list.len() as u64,
                max: s.max_sge as u64,
            });
        }
        let slot = s.queue.next_slot().ok_or(VerbsError::QueueFull)?;
        slot.fill(wr);
        s.queue.commit_push();
        Ok(())
    }

    fn check_caps(&self, what: &'static str, v: u32, max: u32) -> Result<(), VerbsError> {
        if v > max {
            return Err(VerbsError::OutOfRange {
                what,
                value: v.into(),
                max: max.into(),
            });
        }
        Ok(())
    }

    // ---- queue pairs ----

    /// Create a QP in RESET; returns its QPN.
    pub fn create_qp(&mut self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, VerbsError> {
        self.create_qp_numbered(pd, init, None)
    }

    /// Create QP1, the general service QP (a UD QP that connection
    /// managers' MADs are addressed to, IBTA §13.5): one per device, for the
    /// device's own connection manager. Its Q_Key is set at INIT as any UD
    /// QP's (0x80010000 for QP1).
    pub fn create_gsi_qp(&mut self, pd: PdHandle, init: &QpInitAttr) -> Result<u32, VerbsError> {
        if init.qp_type != QpType::Ud {
            return Err(VerbsError::Invalid("QP1 is a UD QP"));
        }
        if self.gsi_slot.is_some() {
            return Err(VerbsError::Invalid("QP1 exists"));
        }
        self.create_qp_numbered(pd, init, Some(GSI_QPN))
    }

    fn create_qp_numbered(
        &mut self,
        pd: PdHandle,
        init: &QpInitAttr,
        fixed_qpn: Option<u32>,
    ) -> Result<u32, VerbsError> {
        self.pd_ok(pd)?;
        self.cq_ok(init.send_cq)?;
        self.cq_ok(init.recv_cq)?;
        if let Some(s) = init.srq {
            self.srq_mut(s)?;
        }
        let c = &init.cap;
        self.check_caps("max_send_wr", c.max_send_wr, self.cfg.max_qp_wr)?;
        self.check_caps("max_recv_wr", c.max_recv_wr, self.cfg.max_qp_wr)?;
        self.check_caps("max_send_sge", c.max_send_sge, self.cfg.max_sge)?;
        self.check_caps("max_recv_sge", c.max_recv_sge, self.cfg.max_sge)?;
        self.check_caps(
            "max_inline_data",
            c.max_inline_data,
            self.cfg.max_inline_data,
        )?;
        if c.max_send_wr == 0
            || (init.srq.is_none() && c.max_recv_wr == 0 && init.qp_type != QpType::Ud)
        {
            // A QP may have an empty RQ in ibverbs, but an empty SQ ring cannot exist here.
            if c.max_send_wr == 0 {
                return Err(VerbsError::Invalid("max_send_wr must be at least 1"));
            }
        }
        let slot = match self.free_qps.pop() {
            Some(s) => s,
            None => {
                let (base, end) = self.qpn_range();
                if self.qps.len() >= self.cfg.max_qp as usize || self.qps.len() as u32 + base >= end
                {
                    return Err(VerbsError::Exhausted("queue pairs"));
                }
                self.qps.push(None);
                self.qps.len() as u32 - 1
            }
        };
        let qpn = match fixed_qpn {
            Some(n) => {
                self.gsi_slot = Some(slot);
                n
            }
            None => slot + self.qpn_range().0,
        };
        let mut qp = Box::new(Qp::new(qpn, pd, init));
        if init.qp_type == QpType::Ud {
            qp.attr.path_mtu = self.cfg.port_mtu;
        }
        self.qps[slot as usize] = Some(qp);
        Ok(qpn)
    }

    /// The first QPN and the end (exclusive) of this core's QPN space.
    fn qpn_range(&self) -> (u32, u32) {
        match self.cfg.qpn_prefix {
            None => (QPN_BASE, bth::MASK_24 + 1),
            Some(p) => {
                let hi = u32::from(p) << 16;
                (hi | QPN_BASE, hi + 0x1_0000)
            }
        }
    }

    fn slot_of(&self, qpn: u32) -> Option<usize> {
        if qpn == GSI_QPN {
            return self.gsi_slot.map(|s| s as usize);
        }
        let (base, end) = self.qpn_range();
        (base..end)
            .contains(&qpn)
            .then(|| qpn - base)
            .filter(|s| Some(*s) != self.gsi_slot)
            .map(|s| s as usize)
    }

    fn qp_mut(&mut self, qpn: u32) -> Result<&mut Qp, VerbsError> {
        self.slot_of(qpn)
            .and_then(|s| self.qps.get_mut(s))
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbsError::NotFound("queue pair"))
    }

    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        self.qp_mut(qpn)?;
        if self.mcast.has_qp(qpn) {
            // rxe_qp_chk_destroy / uverbs: detach first (EBUSY).
            return Err(VerbsError::Busy("queue pair attached to a multicast group"));
        }
        if let Some(s) = self.slot_of(qpn) {
            self.qps[s] = None;
            self.free_qps.push(s as u32);
            if qpn == GSI_QPN {
                self.gsi_slot = None;
            }
        }
        Ok(())
    }

    /// Attaches UD QP `qpn` to the multicast group `mgid` (ibv_attach_mcast):
    /// packets to the multicast QPN whose IP destination is `mgid` reach it.
    /// Joining the group on the link (IGMP/MLD, the NIC's filter) is the
    /// engine's business.
    pub fn attach_mcast(&mut self, qpn: u32, mgid: Ipv6Addr) -> Result<(), VerbsError> {
        if self.qp_mut(qpn)?.qp_type != QpType::Ud {
            // ib_attach_mcast: EINVAL for any other QP type.
            return Err(VerbsError::Invalid("multicast needs a UD queue pair"));
        }
        self.mcast.attach(qpn, mgid)
    }

    /// Detaches `qpn` from `mgid` (ibv_detach_mcast).
    pub fn detach_mcast(&mut self, qpn: u32, mgid: Ipv6Addr) -> Result<(), VerbsError> {
        self.qp_mut(qpn)?;
        self.mcast.detach(qpn, mgid)
    }

    /// The multicast groups `qpn` is attached to.
    pub fn mcast_groups_of(&self, qpn: u32) -> Vec<Ipv6Addr> {
        self.mcast.groups_of(qpn)
    }

    /// The QP's current attributes (ibv_query_qp); `qp_state` is the live state.
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, VerbsError> {
        let q = self
            .slot_of(qpn)
            .and_then(|s| self.qps.get(s))
            .and_then(|q| q.as_deref())
            .ok_or(VerbsError::NotFound("queue pair"))?;
        let mut a = q.attr;
        a.qp_state = q.state;
        a.cur_qp_state = q.state;
        a.sq_psn = q.req.psn;
        a.rq_psn = q.resp.psn;
        a.sq_draining = q.state == QpState::Sqd && q.req.next < q.sq.tail;
        Ok(a)
    }

    /// ibv_modify_qp: check the transition and attributes, then apply them.
    pub fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let slot = self
            .slot_of(qpn)
            .ok_or(VerbsError::NotFound("queue pair"))?;
        let Some(Some(qp)) = self.qps.get_mut(slot) else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        let to = check_modify(qp.qp_type, qp.state, attr, mask)?;
        if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > self.cfg.max_mtu {
            return Err(ModifyError::InvalidValue {
                attr: "PATH_MTU",
                value: u64::from(attr.path_mtu),
            }
            .into());
        }
        let from = qp.state;
        let mut ctx = split!(self, Instant::ZERO);
        if to == QpState::Reset {
            qp.reset();
            qp.state = QpState::Reset;
            return Ok(());
        }
        qp.apply_attrs(attr, mask);
        if to == QpState::Err && from != QpState::Err {
            qp.enter_error(&mut ctx);
        }
        qp.state = to;
        qp.attr.qp_state = to;
        if from == QpState::Init && to == QpState::Rtr {
            // Fresh responder state at the agreed PSN; nothing before it is owed an ACK.
            qp.resp.psn = qp.attr.rq_psn;
            qp.resp.acked = psn::add(qp.attr.rq_psn, psn::PSN_MASK);
            qp.resp.nak_sent = false;
        }
        if from == QpState::Rtr && to == QpState::Rts {
            qp.req.retry_cnt = qp.attr.retry_cnt;
            qp.req.rnr_retry = qp.attr.rnr_retry;
        }
        if to == QpState::Sqd && qp.req.next >= qp.sq.tail {
            ctx.events.push_back(AsyncEvent::SqDrained { qpn });
        }
        self.schedule(slot);
        Ok(())
    }

    /// ibv_post_send for one work request.
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        let slot = self
            .slot_of(qpn)
            .ok_or(VerbsError::NotFound("queue pair"))?;
        let max_msg = self.cfg.max_msg_size;
        let Some(Some(qp)) = self.qps.get_mut(slot) else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(VerbsError::InvalidState(qp.state));
        }
        let t = qp.qp_type;
        let op_ok = match wr.op {
            SendOp::Send | SendOp::SendWithImm { .. } => true,
            SendOp::SendWithInv { .. } => t == QpType::Rc,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => t != QpType::Ud,
            SendOp::RdmaRead { .. }
            | SendOp::AtomicCmpSwp { .. }
            | SendOp::AtomicFetchAdd { .. } => t == QpType::Rc,
        };
        if !op_ok {
            return Err(VerbsError::Invalid("opcode not supported on this QP type"));
        }
        if t == QpType::Ud && wr.ud.is_none() {
            return Err(VerbsError::Invalid("UD send needs a destination"));
        }
        let cap = qp.attr.cap;
        let len: u64 = if wr.flags.inline {
            if wr.op.is_read_or_atomic() {
                return Err(VerbsError::Invalid("inline READ/atomic"));
            }
            if wr.inline_data.len() > cap.max_inline_data as usize {
                return Err(VerbsError::OutOfRange {
                    what: "inline data",
                    value: wr.inline_data.len() as u64,
                    max: cap.max_inline_data.into(),
                });
            }
            wr.inline_data.len() as u64
        } else {
            if wr.sg_list.len() > cap.max_send_sge as usize {
                return Err(VerbsError::OutOfRange {
                    what: "num_sge",
                    value: wr.sg_list.len() as u64,
                    max: cap.max_send_sge.into(),
                });
            }
            wr.sg_list.iter().map(|s| u64::from(s.length)).sum()
        };
        if wr.op.is_atomic() && len < 8 {
            return Err(VerbsError::Invalid("atomic needs an 8-byte local buffer"));
        }
        let len = if wr.op.is_atomic() { 8 } else { len };
        if len > max_msg {
            return Err(VerbsError::OutOfRange {
                what: "message length",
                value: len,
                max: max_msg,
            });
        }
        let w = qp.sq.next_slot().ok_or(VerbsError::QueueFull)?;
        w.wr_id = wr.wr_id;
        w.op = wr.op;
        w.flags = wr.flags;
        w.sges.clear();
        w.inline.clear();
        if wr.flags.inline {
            w.inline.extend_from_slice(wr.inline_data);
        } else {
            w.sges.extend_from_slice(wr.sg_list);
        }
        w.ud = wr.ud;
        w.len = len;
        w.state = super::wqe::WqeState::Posted;
        w.sent = 0;
        w.rd_counted = false;
        qp.sq.commit_push();
        if qp.state == QpState::Err {
            // rxe: WRs posted to a QP in ERR complete at once, flushed.
            let mut ctx = split!(self, Instant::ZERO);
            qp.flush(&mut ctx);
            return Ok(());
        }
        self.schedule(slot);
        Ok(())
    }

    /// ibv_post_recv for one work request.
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        let qp = self.qp_mut(qpn)?;
        if qp.srq.is_some() {
            return Err(VerbsError::Invalid("QP uses an SRQ"));
        }
        if qp.state == QpState::Reset {
            return Err(VerbsError::InvalidState(qp.state));
        }
        if wr.sg_list.len() > qp.attr.cap.max_recv_sge as usize {
            return Err(VerbsError::OutOfRange {
                what: "num_sge",
                value: wr.sg_list.len() as u64,
                max: qp.attr.cap.max_recv_sge.into(),
            });
        }
        let slot = qp.rq.next_slot().ok_or(VerbsError::QueueFull)?;
        slot.fill(wr);
        qp.rq.commit_push();
        if qp.state == QpState::Err {
            let slot = self.slot_of(qpn).unwrap_or(0);
            let mut ctx = split!(self, Instant::ZERO);
            if let Some(Some(q)) = self.qps.get_mut(slot) {
                q.flush(&mut ctx);
            }
        }
        Ok(())
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Whether an asynchronous event waits for [`Core::poll_event`].
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    // ---- sans-IO entry points ----

    fn schedule(&mut self, slot: usize) {
        if let Some(Some(q)) = self.qps.get_mut(slot) {
            if !q.scheduled {
                q.scheduled = true;
                self.ready.push_back(slot as u32);
            }
        }
    }

    fn sync_timer(&mut self, slot: usize) {
        if let Some(Some(q)) = self.qps.get_mut(slot) {
            if let Some(t) = q.timers.next() {
                if q.timer_entry.is_none_or(|e| t < e) {
                    q.timer_entry = Some(t);
                    self.timers.push(Reverse((t, slot as u32)));
                }
            }
        }
    }

    /// A frame from the network. Malformed frames are counted and dropped.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.handle_frame_checked(now, frame, false);
    }

    /// [`Core::handle_frame`] for a frame whose ICRC the backend may have
    /// verified already (`icrc_verified`): then it is not hashed again.
    pub fn handle_frame_checked(&mut self, now: Instant, frame: &[u8], icrc_verified: bool) {
        self.stats.rx_frames += 1;
        // Borrowed out of the result, not moved: the parsed packet is a few
        // hundred bytes and the move showed in profiles.
        let parsed = if icrc_verified {
            ParsedPacket::parse_icrc_verified(frame)
        } else {
            ParsedPacket::parse_cached(frame, &mut self.icrc_prefix)
        };
        let pkt = match &parsed {
            Ok(p) => p,
            Err(e) => {
                self.stats.count(e.counter_name());
                return;
            }
        };
        let info = pkt.opcode_info();
        if info.transport == Transport::Cnp {
            // Congestion control (DCQCN) is not implemented; CNPs are counted.
            self.stats.count("rx_cnp");
            return;
        }
        if pkt.repr.bth.dest_qp == MULTICAST_QPN {
            self.handle_multicast(now, pkt);
            return;
        }
        let Some(slot) = self
            .slot_of(pkt.repr.bth.dest_qp)
            .filter(|s| *s < self.qps.len())
        else {
            self.stats.count("rx_unknown_qp");
            return;
        };
        self.deliver(now, slot, pkt);
    }

    /// A packet to the multicast QPN: a copy to every QP attached to the
    /// group its IP destination names (rxe_rcv_mcast_pkt); each QP checks
    /// it as it would a packet of its own (state, transport, P_Key, Q_Key).
    fn handle_multicast(&mut self, now: Instant, pkt: &ParsedPacket<'_>) {
        let mgid = pkt.repr.ip.dst_gid();
        let n = self.mcast.members(&mgid).len();
        if n == 0 {
            self.stats.count("rx_mcast_unknown_group");
            return;
        }
        self.stats.count("rx_mcast_packets");
        // By index: a delivery cannot change the group (no verbs call runs in it).
        for i in 0..n {
            let Some(&qpn) = self.mcast.members(&mgid).get(i) else {
                break;
            };
            match self.slot_of(qpn).filter(|s| *s < self.qps.len()) {
                Some(slot) => self.deliver(now, slot, pkt),
                None => self.stats.count("rx_unknown_qp"),
            }
        }
    }

    /// Hands a parsed packet to the QP in `slot` after the checks every QP
    /// makes (rxe_recv.c check_type_state, check_keys, check_addr).
    fn deliver(&mut self, now: Instant, slot: usize, pkt: &ParsedPacket<'_>) {
        let info = pkt.opcode_info();
        let mut ctx = split!(self, now);
        let Some(Some(qp)) = self.qps.get_mut(slot) else {
            ctx.stats.count("rx_unknown_qp");
            return;
        };
        // rxe: rxe_recv.c check_type_state — requests need RTR or later,
        // responses RTS or later; a QP in RESET/INIT hears nothing.
        if matches!(qp.state, QpState::Reset | QpState::Init) {
            ctx.stats.count(if info.is_request() {
                "rx_request_bad_state"
            } else {
                "rx_response_bad_state"
            });
            return;
        }
        let want = match qp.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        };
        if info.transport != want {
            ctx.stats.count("rx_wrong_transport");
            return;
        }
        if pkt.repr.bth.pkey != bth::DEFAULT_PKEY {
            ctx.stats.count("rx_bad_pkey");
            return;
        }
        if qp.qp_type != QpType::Ud && pkt.repr.ip.src_gid() != qp.attr.ah_attr.dgid {
            // rxe: rxe_recv.c check_addr — a connected QP hears only its peer.
            ctx.stats.count("rx_wrong_source");
            return;
        }
        if qp.qp_type != QpType::Ud && pkt.repr.ip.dst_gid() != qp.attr.ah_attr.sgid {
            // rxe: check_addr checks the destination too. Without it a frame
            // flooded to every port (a switch that has not learned, the mem
            // backend) reaches the QP with the same number on another host,
            // which would then acknowledge data it was never meant to get.
            ctx.stats.count("rx_wrong_destination");
            return;
        }
        // rxe: rxe_rcv counts what passed its header checks and reached a QP.
        ctx.stats.inc(HwCounter::RcvdPkts);
        if info.is_request() {
            qp.handle_request(pkt, &mut ctx);
        } else {
            qp.handle_response(pkt, &mut ctx);
        }
        self.schedule(slot);
        self.sync_timer(slot);
    }

    /// Write the next frame to send into `buf` (which must hold
    /// [`MAX_FRAME_LEN`](super::MAX_FRAME_LEN) bytes) and return its length.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.transmit_next(now, buf, false).map(|s| s.head)
    }

    /// [`Core::poll_transmit`], except that a request's payload may be left
    /// in its memory region (when it lies in one piece of a region that
    /// offers [`MemoryRegion::as_slice`]):
    /// the frame is then `buf[..head]`, the bytes [`Core::tx_payload`] gives
    /// for the returned payload, and `buf[head..head + tail]`. They stay
    /// valid, and unchanged, until the core is next borrowed mutably.
    pub fn poll_transmit_split(&mut self, now: Instant, buf: &mut [u8]) -> Option<TxSplit> {
        self.transmit_next(now, buf, true)
    }

    /// The payload bytes of a frame from [`Core::poll_transmit_split`]
    /// (`None` if its region has gone, which needs a mutable borrow in between).
    pub fn tx_payload(&self, p: &TxPayload) -> Option<&[u8]> {
        self.mrs.get(p.lkey)?.region.as_slice(p.offset, p.len)
    }

    fn transmit_next(&mut self, now: Instant, buf: &mut [u8], split: bool) -> Option<TxSplit> {
        while let Some(f) = self.mcast_looped.pop_front() {
            self.handle_frame(now, &f);
        }
        while let Some(slot) = self.ready.pop_front() {
            let slot = slot as usize;
            let mut ctx = split!(self, now);
            ctx.split.allowed = split;
            let Some(Some(qp)) = self.qps.get_mut(slot) else {
                continue;
            };
            qp.scheduled = false;
            // Responses first, except that a request may go ahead of a plain
            // ACK once: an application answering what it just received then
            // has its answer on the wire one frame sooner (the ACK follows
            // at once, so the peer's window waits one frame at most).
            let mut out = None;
            if !qp.ack_overtaken && qp.plain_ack_next() {
                out = qp.poll_request(buf, &mut ctx);
                qp.ack_overtaken = out.is_some();
            } else {
                qp.ack_overtaken = false;
            }
            if out.is_none() {
                out = qp.poll_response(buf, &mut ctx);
            }
            if out.is_none() {
                out = qp.poll_request(buf, &mut ctx);
            }
            let out = out.map(|n| {
                ctx.split.out.take().unwrap_or(TxSplit {
                    head: n,
                    tail: 0,
                    payload: None,
                })
            });
            if qp.state == QpState::Sqd
                && qp.req.next >= qp.sq.tail
                && out.is_some()
                && qp.sq.is_empty()
            {
                ctx.events.push_back(AsyncEvent::SqDrained { qpn: qp.qpn });
            }
            if out.is_some() {
                qp.scheduled = true;
                self.ready.push_back(slot as u32);
            }
            let ud = qp.qp_type == QpType::Ud;
            self.sync_timer(slot);
            if let Some(s) = out {
                if ud && self.cfg.mcast_loopback && self.mcast.group_count() > 0 {
                    self.loop_back_multicast(buf, &s);
                }
                return out;
            }
        }
        None
    }

    /// Keeps a copy of a UD frame just written if it goes to a group this
    /// core has QPs in (rxe: the kernel loops it back to the host's members).
    fn loop_back_multicast(&mut self, buf: &[u8], s: &TxSplit) {
        let (Some(head), Some(tail)) = (buf.get(..s.head), buf.get(s.head..s.head + s.tail)) else {
            return;
        };
        let payload = match &s.payload {
            Some(p) => match self.tx_payload(p) {
                Some(b) => b,
                None => return,
            },
            None => &[],
        };
        let frame = [head, payload, tail].concat();
        let ours = match ParsedPacket::parse(&frame) {
            Ok(p) => {
                p.repr.bth.dest_qp == MULTICAST_QPN
                    && !self.mcast.members(&p.repr.ip.dst_gid()).is_empty()
            }
            Err(_) => false,
        };
        if ours {
            self.mcast_looped.push_back(frame);
        }
    }

    /// When `handle_timeout` next needs to be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(Reverse((t, slot))) = self.timers.peek().copied() {
            let live = match self.qps.get(slot as usize) {
                Some(Some(q)) => q.timers.next() == Some(t),
                _ => false,
            };
            if live {
                return Some(t);
            }
            // Stale: the deadline moved or the QP is gone.
            self.timers.pop();
            if let Some(Some(q)) = self.qps.get_mut(slot as usize) {
                if q.timer_entry == Some(t) {
                    q.timer_entry = None;
                }
            }
            self.sync_timer(slot as usize);
        }
        None
    }

    /// Run the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse((t, slot))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let s = slot as usize;
            let mut ctx = split!(self, now);
            if let Some(Some(q)) = self.qps.get_mut(s) {
                if q.timer_entry == Some(t) {
                    q.timer_entry = None;
                }
                let fired = q.timers.expire(now);
                if fired.iter().any(|f| *f) {
                    q.on_timers(fired, &mut ctx);
                }
            }
            self.schedule(s);
            self.sync_timer(s);
        }
    }

    /// Draw from the core's seeded RNG (for the layer above, e.g. initial PSNs).
    pub fn random_u32(&mut self) -> u32 {
        use rand::RngCore;
        self.rng.next_u32()
    }

    /// Entries the QP's responder still has to send (at most
    /// [`OUT_CAP`](super::responder::OUT_CAP), whatever the peer sends).
    pub fn responder_backlog(&self, qpn: u32) -> Option<usize> {
        self.slot_of(qpn)
            .and_then(|s| self.qps.get(s))
            .and_then(|q| q.as_deref())
            .map(|q| q.resp.out.len())
    }

    /// Completion status helper for tests and tools: whether a QP is in ERR.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.slot_of(qpn)
            .and_then(|s| self.qps.get(s))
            .and_then(|q| q.as_deref())
            .map(|q| q.state)
    }
}

/// Whether a completion reports success.
pub fn wc_ok(wc: &WorkCompletion) -> bool {
    wc.status == WcStatus::Success
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::qp::QpCap;

    /// Create attributes of an RC QP with one-entry queues on a new CQ.
    fn small_rc_qp(c: &mut Core) -> QpInitAttr {
        let cq = c.create_cq(16).unwrap();
        QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        }
    }

    #[test]
    // A scale check, not a memory-safety one: under Miri's interpreter 10 000
    // QPs take many minutes of CI for nothing the other tests do not cover.
    #[cfg_attr(miri, ignore = "scale test; too slow under Miri")]
    fn ten_thousand_qps_and_small_idle_qp() {
        // The budget: ≤ 2 KiB per idle QP beyond its queues.
        assert!(
            core::mem::size_of::<Qp>() <= 2048,
            "{}",
            core::mem::size_of::<Qp>()
        );
        let mut c = Core::new(Config::default(), 1);
        let pd = c.alloc_pd();
        let init = small_rc_qp(&mut c);
        let qpns: Vec<u32> = (0..10_000)
            .map(|_| c.create_qp(pd, &init).unwrap())
            .collect();
        assert_eq!(qpns.len(), 10_000);
        assert_eq!(c.qp_state(qpns[9_999]), Some(QpState::Reset));
    }

    #[test]
    fn a_qpn_prefix_keeps_every_qpn_in_its_64k_block() {
        let cfg = Config {
            qpn_prefix: Some(3),
            ..Config::default()
        };
        let mut c = Core::new(cfg, 1);
        let pd = c.alloc_pd();
        let init = small_rc_qp(&mut c);
        let first = c.create_qp(pd, &init).unwrap();
        assert_eq!(first, 0x03_0011);
        // The same low bits under another prefix are not ours.
        assert_eq!(c.qp_state(0x00_0011), None);
        assert_eq!(c.qp_state(0x04_0011), None);
        assert_eq!(c.qp_state(first), Some(QpState::Reset));
        let mut last = first;
        let mut made = 1;
        while let Ok(q) = c.create_qp(pd, &init) {
            last = q;
            made += 1;
        }
        assert_eq!((last, made), (0x03_FFFF, 0xFFEF));
    }
}
