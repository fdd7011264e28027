//! The connection manager's event core: QP1, the MADs in and out, and the
//! messages waiting for an answer (resent on a timer). Nothing here blocks
//! for the peer: an answer arrives as a [`CmEvent`] when
//! [`CmAgent::progress`] runs, so one agent serves every connection of a
//! device at once (librdmacm's event model). The blocking calls the tools
//! use (`connect`, `accept`, ...) are built on it in the sibling `blocking`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce_stack::transport::{
    AccessFlags, QpCap, QpState, QpType, RecvWr, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
    WorkCompletion,
};
use ferroce_stack::wire::mad::{
    self, answers, sidr_status, CmMessage, Dreq, Ids, Path as CmPath, Rep, Req, SidrRep, SidrReq,
    GSI_QKEY, GSI_QPN, MAD_LEN,
};

use super::{
    cma_header, cma_source, mtu_bytes, private_of, rej, source_gid_index, CmEvent, ConnParam,
    Connection, PeerOffer, Request, UdPeer, UdRequest, CMA_HDR_LEN, CM_RESPONSE_TIMEOUT,
    MAX_CM_RETRIES, PENDING_MAX, PS_TCP, PS_UDP, RECV_LEN, RECV_SLOTS, REJ_INVALID_SERVICE_ID,
    REQ_USER_PRIVATE_LEN, RESEND_AFTER, SEND_WR_ID, SIDR_ANSWERS_KEPT, SIDR_USER_PRIVATE_LEN,
};
use crate::context::{gid_of, Context};
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{ConnectOptions, QueuePair, RemoteQp};
use crate::wc::{GrhInfo, GRH_LEN};

/// DREQs sent before a disconnection counts as done without an answer
/// (the peer's time-wait covers it).
const DREQ_SENDS: u8 = 3;

/// Where a connection stands, for answering its peer's repeats.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) peer_gid: Ipv6Addr,
    pub(super) remote_comm_id: u32,
    /// The peer's QP, named in our DREQ (0 until its REP names it).
    remote_qpn: u32,
    tid: u64,
    /// Every MAD of the connection goes with its path's traffic class, as
    /// the kernel's CM sends them.
    traffic_class: u8,
    /// What we sent last (resent when the peer repeats itself).
    last_sent: Option<CmMessage>,
    /// A DREQ came, or ours was answered.
    pub(super) disconnected: bool,
    /// The active side's offer and first PSN, for [`CmAgent::finish_connect`].
    offer: Option<(ConnParam, u32)>,
}

/// What a message waiting for its answer waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaits {
    Rep,
    Rtu,
    Drep,
    SidrRep,
}

/// A message sent again every [`RESEND_AFTER`] until answered.
#[derive(Debug)]
struct Outstanding {
    peer: Ipv6Addr,
    tid: u64,
    msg: CmMessage,
    traffic_class: u8,
    awaits: Awaits,
    sends: u8,
    next_send: Instant,
}

/// QP1 of a device and the connections it manages.
pub struct CmAgent<'a> {
    pub(super) ctx: &'a Context,
    qp: QueuePair<'a>,
    /// QP1's receives; its sends complete on `send_cq`, so waiting for a
    /// send never takes a peer's MAD off this queue, where the thread that
    /// sleeps on it would not see it.
    cq: Arc<CompletionQueue>,
    send_cq: CompletionQueue,
    mr: MemoryRegion<'a>,
    sgid_index: usize,
    guid: u64,
    next_tid: u64,
    pub(super) conns: HashMap<u32, Conn>,
    /// Messages waiting for their answer, by our comm ID (request ID).
    outstanding: HashMap<u32, Outstanding>,
    /// Ports rdma_listen was called for: a REQ for another is rejected.
    listening: HashSet<u16>,
    /// Ports of rdma_cm's UDP space listened on.
    listening_ud: HashSet<u16>,
    /// Requests handed out and not answered yet (peer GID, its comm ID or
    /// request ID): a repeat of one is dropped, the answer will serve it.
    unanswered: VecDeque<(Ipv6Addr, u32)>,
    /// The last SIDR answers sent: (requester's GID, request ID, answer).
    sidr_answers: VecDeque<(Ipv6Addr, u32, CmMessage)>,
    /// MADs received and not looked at yet (transaction ID, message, the
    /// traffic class to answer it with).
    inbox: VecDeque<(u64, CmMessage, u8)>,
    /// What happened, oldest first, until someone takes it.
    pub(super) events: VecDeque<CmEvent>,
    /// MADs dropped (not CM, malformed, unknown connection).
    pub dropped: u64,
    /// The device's QPN prefix on a shared port (see `new_comm_id`).
    prefix: Option<u8>,
}

impl std::fmt::Debug for CmAgent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmAgent")
            .field("connections", &self.conns.len())
            .field("events", &self.events.len())
            .field("dropped", &self.dropped)
            .finish()
    }
}

impl<'a> CmAgent<'a> {
    /// Takes QP1 of `ctx` (one agent per device) in `pd`, using the GID at
    /// `sgid_index` (as `-x` / `-g` pick one for the other tools).
    pub fn new(ctx: &'a Context, pd: &'a ProtectionDomain, sgid_index: usize) -> Result<Self> {
        ctx.query_gid(sgid_index)?;
        let prefix = ctx.qpn_prefix();
        if let (Some(p @ 1..), false) = (prefix, ctx.backend() == "udp") {
            // A raw device shares its interface's frames by the destination
            // QPN's top byte: every MAD (to QP1) goes to the one with prefix 0.
            return Err(Error::Cm(format!(
                "this device shares its interface with another ferroce device of this host \
                 (its QPNs carry prefix {p}); connection-manager MADs go to QP1, which only \
                 the first raw device on the interface hears. Run rdma_cm peers in separate \
                 network namespaces (`sudo ferroce netns up 2`) or use the UDP backend"
            )));
        }
        let cq = Arc::new(ctx.create_cq((2 * RECV_SLOTS) as u32)?);
        let send_cq = ctx.create_cq(16)?;
        let qp = pd
            .create_qp()
            .qp_type(QpType::Ud)
            .cap(QpCap {
                max_send_wr: 16,
                max_recv_wr: RECV_SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            })
            .build_gsi(&send_cq, &cq)?;
        let mr = pd.reg_mr((RECV_SLOTS + 1) * RECV_LEN, AccessFlags::LOCAL_WRITE)?;
        let opts = ConnectOptions {
            qkey: GSI_QKEY,
            sgid_index,
            ..ConnectOptions::default()
        };
        qp.to_init(&opts)?;
        let me = RemoteQp {
            qpn: GSI_QPN,
            psn: 0,
            gid: ctx.query_gid(sgid_index)?,
        };
        qp.connect(ctx, &me, &opts)?;
        let guid = crate::device::node_guid(ctx.mac());
        let agent = CmAgent {
            ctx,
            qp,
            cq,
            send_cq,
            mr,
            sgid_index,
            guid,
            next_tid: u64::from(crate::device::seed_from_os() as u32) << 32,
            conns: HashMap::new(),
            outstanding: HashMap::new(),
            listening: HashSet::new(),
            listening_ud: HashSet::new(),
            unanswered: VecDeque::new(),
            sidr_answers: VecDeque::new(),
            inbox: VecDeque::new(),
            events: VecDeque::new(),
            dropped: 0,
            prefix,
        };
        for slot in 0..RECV_SLOTS {
            agent.post_recv(slot)?;
        }
        Ok(agent)
    }

    fn post_recv(&self, slot: usize) -> Result<()> {
        let sge = [self.mr.sge((slot * RECV_LEN) as u64, RECV_LEN as u32)];
        self.qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sg_list: &sge,
        }])
    }

    /// The completion queue of QP1: it completes when a MAD arrives, so a
    /// thread serving the agent sleeps on it ([`CompletionQueue::wait`])
    /// without holding the agent.
    pub fn completion_queue(&self) -> Arc<CompletionQueue> {
        Arc::clone(&self.cq)
    }

    /// A local comm ID (or SIDR request ID). On a shared UDP port its top
    /// byte is the device's QPN prefix: the port's steering program sends
    /// MADs that name it (REP, RTU, DREQ, ..., SIDR_REP) to this device.
    fn new_comm_id(&self) -> u32 {
        loop {
            let mut id = crate::device::seed_from_os() as u32;
            if let Some(p) = self.prefix {
                id = u32::from(p) << 24 | id & 0x00ff_ffff;
            }
            if id != 0 && !self.conns.contains_key(&id) && !self.outstanding.contains_key(&id) {
                return id;
            }
        }
    }

    /// Connection requests (REQ, SIDR_REQ) name no receiver: on a shared
    /// port they reach the first device, with QPN prefix 0, alone; this
    /// says why another device cannot listen.
    pub fn can_listen(&self) -> Result<()> {
        match self.prefix {
            Some(p @ 1..) => Err(Error::Cm(format!(
                "this device shares its UDP port with another ferroce device of this host \
                 (its QPNs carry prefix {p}); connection requests reach only the first device \
                 on the port: start the listening side first, or run the peers in separate \
                 network namespaces (`sudo ferroce netns up 2`)"
            ))),
            _ => Ok(()),
        }
    }

    fn send(&mut self, to: Ipv6Addr, tid: u64, msg: &CmMessage, traffic_class: u8) -> Result<()> {
        let bytes = mad::emit(tid, msg);
        let at = (RECV_SLOTS * RECV_LEN) as u64;
        self.mr.write(at, &bytes)?;
        let path = ConnectOptions {
            sgid_index: source_gid_index(self.ctx, self.sgid_index, to),
            traffic_class,
            ..ConnectOptions::default()
        }
        .path_to(self.ctx, to)?;
        let sge = [self.mr.sge(at, MAD_LEN as u32)];
        let mut wr = SendWr::new(SEND_WR_ID, SendOp::Send, &sge);
        wr.flags.signaled = true;
        wr.ud = Some(UdDest {
            path,
            remote_qpn: GSI_QPN,
            remote_qkey: GSI_QKEY,
        });
        self.qp.post_send(&[wr])?;
        // The send buffer is reused by the next send: wait for this one.
        let wc = self
            .send_cq
            .poll_n(1, Duration::from_secs(5))
            .map_err(|e| match e {
                Error::Timeout(after, _) => Error::Timeout(after, "a MAD send"),
                e => e,
            })?;
        match wc.first().map(|wc| wc.status) {
            Some(WcStatus::Success) => Ok(()),
            status => Err(Error::Cm(format!("MAD send failed: {status:?}"))),
        }
    }

    /// Sends `msg` and keeps it to send again until [`CmAgent::progress`]
    /// sees its answer (or gives up: [`CmEvent::TimedOut`]).
    fn send_awaiting(
        &mut self,
        id: u32,
        peer: Ipv6Addr,
        tid: u64,
        msg: CmMessage,
        traffic_class: u8,
        awaits: Awaits,
    ) -> Result<()> {
        self.send(peer, tid, &msg, traffic_class)?;
        self.outstanding.insert(
            id,
            Outstanding {
                peer,
                tid,
                msg,
                traffic_class,
                awaits,
                sends: 1,
                next_send: Instant::now() + RESEND_AFTER,
            },
        );
        Ok(())
    }

    /// Takes the MADs QP1 has received into the inbox
    /// ([`CmAgent::take_recv`]).
    fn drain_cq(&mut self) -> Result<()> {
        let mut wcs = Vec::new();
        self.cq.poll(16, &mut wcs)?;
        for wc in &wcs {
            self.take_recv(wc)?;
        }
        Ok(())
    }

    /// A receive completion: the MAD parsed and queued for [`CmAgent::progress`].
    fn take_recv(&mut self, wc: &WorkCompletion) -> Result<()> {
        let slot = wc.wr_id as usize;
        if wc.opcode != WcOpcode::Recv || slot >= RECV_SLOTS {
            return Ok(());
        }
        let mut buf = vec![0u8; RECV_LEN];
        let got = (wc.byte_len as usize).min(RECV_LEN);
        if wc.status == WcStatus::Success {
            self.mr.read((slot * RECV_LEN) as u64, &mut buf[..got])?;
        }
        self.post_recv(slot)?;
        let parsed = (wc.status == WcStatus::Success && got == RECV_LEN)
            .then(|| mad::parse(&buf[GRH_LEN..]).ok())
            .flatten();
        let mut grh = [0u8; GRH_LEN];
        grh.copy_from_slice(&buf[..GRH_LEN]);
        let from = GrhInfo::parse(&grh);
        // The kernel's CM answers a request from its WC's GRH read as an
        // IPv6 one (ib_init_ah_attr_from_wc): over IPv4 that is the zero
        // bytes before the IPv4 header, so rxe's SIDR_REP to a SIDR_REQ of
        // TOS 0x60 goes with 0 (seen on the wire).
        let tclass = if from.src.to_ipv4_mapped().is_some() {
            0
        } else {
            from.traffic_class
        };
        match parsed {
            Some((h, msg)) => self.inbox.push_back((h.transaction_id, msg, tclass)),
            None => self.dropped += 1,
        }
        Ok(())
    }

    fn next_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        self.next_tid
    }

    /// Handles every MAD that has arrived and every resend that is due;
    /// what happened is queued as [`CmEvent`]s (see [`CmAgent::take_events`]).
    /// Never waits for the network.
    pub fn progress(&mut self) -> Result<()> {
        self.drain_cq()?;
        while let Some((tid, msg, tclass)) = self.inbox.pop_front() {
            self.handle(tid, msg, tclass)?;
        }
        self.resend_due(Instant::now())
    }

    /// The events queued so far, oldest first.
    pub fn take_events(&mut self) -> Vec<CmEvent> {
        self.events.drain(..).collect()
    }

    /// When [`CmAgent::progress`] next has a resend to make, if any.
    pub fn next_timer(&self) -> Option<Instant> {
        self.outstanding.values().map(|o| o.next_send).min()
    }

    /// Waits up to `timeout` (less when a resend falls due first) for a MAD,
    /// then [`CmAgent::progress`].
    pub fn wait_and_progress(&mut self, timeout: Duration) -> Result<()> {
        if self.inbox.is_empty() {
            let now = Instant::now();
            let until = self
                .next_timer()
                .map_or(timeout, |t| t.saturating_duration_since(now).min(timeout));
            if !until.is_zero() {
                let _ = self.cq.wait(until);
            }
        }
        self.progress()
    }

    fn resend_due(&mut self, now: Instant) -> Result<()> {
        let due: Vec<u32> = self
            .outstanding
            .iter()
            .filter(|(_, o)| o.next_send <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(o) = self.outstanding.get_mut(&id) else {
                continue;
            };
            let limit = if o.awaits == Awaits::Drep {
                DREQ_SENDS
            } else {
                MAX_CM_RETRIES
            };
            if o.sends >= limit {
                let awaits = o.awaits;
                self.outstanding.remove(&id);
                self.give_up(id, awaits);
                continue;
            }
            o.sends += 1;
            o.next_send = now + RESEND_AFTER;
            let (peer, tid, msg, tclass) = (o.peer, o.tid, o.msg.clone(), o.traffic_class);
            self.send(peer, tid, &msg, tclass)?;
        }
        Ok(())
    }

    /// No answer after every send.
    fn give_up(&mut self, id: u32, awaits: Awaits) {
        match awaits {
            Awaits::Drep => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.disconnected = true;
                }
                self.events.push_back(CmEvent::Disconnected { id });
            }
            Awaits::Rep | Awaits::Rtu => {
                self.conns.remove(&id);
                self.events.push_back(CmEvent::TimedOut { id });
            }
            Awaits::SidrRep => self.events.push_back(CmEvent::TimedOut { id }),
        }
    }

    /// The answer `awaits` to our message `id` came: it is no longer resent.
    /// Returns the message it answers (None: nothing of ours waited for it).
    fn answered(&mut self, id: u32, awaits: &[Awaits]) -> Option<Outstanding> {
        match self.outstanding.get(&id) {
            Some(o) if awaits.contains(&o.awaits) => self.outstanding.remove(&id),
            _ => None,
        }
    }

    /// One MAD: answered here when it needs no one (a DREQ's DREP, a
    /// repeat's earlier answer, a REJ for a port nobody listens on), or
    /// queued as an event.
    fn handle(&mut self, tid: u64, msg: CmMessage, tclass: u8) -> Result<()> {
        match msg {
            CmMessage::Dreq(d) => {
                let Some(c) = self.conns.get_mut(&d.remote_comm_id) else {
                    self.dropped += 1;
                    return Ok(());
                };
                let first = !c.disconnected;
                c.disconnected = true;
                let (peer, tclass) = (c.peer_gid, c.traffic_class);
                let drep = CmMessage::Drep(Ids {
                    local_comm_id: d.remote_comm_id,
                    remote_comm_id: d.local_comm_id,
                });
                self.send(peer, tid, &drep, tclass)?;
                // A DREQ crossing ours ends it as its DREP would; one
                // during set-up ends that.
                let was_waiting = self.outstanding.remove(&d.remote_comm_id).is_some();
                if first || was_waiting {
                    self.events.push_back(CmEvent::Disconnected {
                        id: d.remote_comm_id,
                    });
                }
            }
            CmMessage::Drep(d) => {
                if self.answered(d.remote_comm_id, &[Awaits::Drep]).is_some() {
                    if let Some(c) = self.conns.get_mut(&d.remote_comm_id) {
                        c.disconnected = true;
                    }
                    self.events.push_back(CmEvent::Disconnected {
                        id: d.remote_comm_id,
                    });
                } else {
                    self.dropped += 1;
                }
            }
            CmMessage::Req(r) => self.handle_req(tid, *r, tclass)?,
            CmMessage::SidrReq(r) => self.handle_sidr_req(tid, *r, tclass)?,
            CmMessage::Rep(r) => {
                let id = r.remote_comm_id;
                let repeat = self
                    .conns
                    .get(&id)
                    .filter(|c| c.remote_comm_id == r.local_comm_id && c.last_sent.is_some())
                    .map(|c| (c.peer_gid, c.tid, c.last_sent.clone(), c.traffic_class));
                if let Some((peer, tid, Some(last), tclass)) = repeat {
                    // Our RTU was lost: the peer sent its REP again.
                    self.send(peer, tid, &last, tclass)?;
                } else if self.answered(id, &[Awaits::Rep]).is_some() {
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.remote_comm_id = r.local_comm_id;
                        c.remote_qpn = r.local_qpn;
                    }
                    self.events.push_back(CmEvent::Reply { id, rep: r });
                } else {
                    self.dropped += 1;
                }
            }
            CmMessage::Rtu(ids) => {
                if self.answered(ids.remote_comm_id, &[Awaits::Rtu]).is_some() {
                    self.events.push_back(CmEvent::Established {
                        id: ids.remote_comm_id,
                    });
                } else {
                    self.dropped += 1;
                }
            }
            CmMessage::Rej(r) => {
                let id = r.remote_comm_id;
                if self.answered(id, &[Awaits::Rep, Awaits::Rtu]).is_some() {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::Rejected {
                        id,
                        reason: r.reason,
                        private_data: r.private_data.to_vec(),
                    });
                } else {
                    self.dropped += 1;
                }
            }
            CmMessage::Mra(m) => match self.outstanding.get_mut(&m.remote_comm_id) {
                // The peer needs longer: it says how long.
                Some(o) => {
                    let wait = Duration::from_nanos(4096u64 << m.service_timeout.min(31));
                    o.next_send = Instant::now() + wait.max(RESEND_AFTER);
                }
                None => self.dropped += 1,
            },
            CmMessage::SidrRep(r) => {
                let id = r.request_id;
                if let Some(asked) = self.answered(id, &[Awaits::SidrRep]) {
                    self.events.push_back(if r.status == sidr_status::SUCCESS {
                        CmEvent::UdResolved {
                            id,
                            peer: UdPeer {
                                peer_gid: asked.peer,
                                qpn: r.qpn,
                                qkey: r.qkey,
                                private_data: r.private_data.to_vec(),
                            },
                        }
                    } else {
                        CmEvent::UdRefused {
                            id,
                            status: r.status,
                        }
                    });
                } else {
                    self.dropped += 1;
                }
            }
        }
        Ok(())
    }

    /// Remembers a request handed out until it is answered.
    fn hand_out(&mut self, from: Ipv6Addr, id: u32) -> bool {
        if self.unanswered.contains(&(from, id)) {
            return false;
        }
        if self.unanswered.len() >= PENDING_MAX {
            self.unanswered.pop_front();
        }
        self.unanswered.push_back((from, id));
        true
    }

    fn forget_request(&mut self, from: Ipv6Addr, id: u32) {
        self.unanswered.retain(|u| *u != (from, id));
    }

    fn handle_req(&mut self, tid: u64, r: Req, tclass: u8) -> Result<()> {
        let from = Ipv6Addr::from(r.primary.local_gid);
        let repeat = self
            .conns
            .values()
            .find(|c| c.remote_comm_id == r.local_comm_id && c.peer_gid == from)
            .map(|c| (c.peer_gid, c.tid, c.last_sent.clone(), c.traffic_class));
        if let Some((peer, tid, last, tclass)) = repeat {
            if let Some(last) = last {
                self.send(peer, tid, &last, tclass)?;
            }
            return Ok(());
        }
        let Some(req) = request_of(tid, r, tclass) else {
            self.dropped += 1;
            return Ok(());
        };
        if !self.listening.contains(&req.port) {
            return self.reject(&req, REJ_INVALID_SERVICE_ID);
        }
        let queued = self
            .events
            .iter()
            .filter(|e| matches!(e, CmEvent::Request(_)))
            .count();
        if queued >= PENDING_MAX || !self.hand_out(from, req.req.local_comm_id) {
            // A full backlog, or a repeat of a request not answered yet.
            self.dropped += 1;
        } else {
            self.events.push_back(CmEvent::Request(req));
        }
        Ok(())
    }

    fn handle_sidr_req(&mut self, tid: u64, r: SidrReq, tclass: u8) -> Result<()> {
        let from = cma_source(&r.private_data).map(|a| gid_of(a.ip()));
        let repeat = self
            .sidr_answers
            .iter()
            .find(|(g, id, _)| Some(*g) == from && *id == r.request_id)
            .map(|(g, _, m)| (*g, m.clone()));
        if let Some((peer, answer)) = repeat {
            return self.send(peer, tid, &answer, tclass);
        }
        let Some(req) = ud_request_of(tid, r, tclass) else {
            self.dropped += 1;
            return Ok(());
        };
        if !self.listening_ud.contains(&req.port) {
            return self.reject_ud(&req, sidr_status::UNSUPPORTED);
        }
        let queued = self
            .events
            .iter()
            .filter(|e| matches!(e, CmEvent::UdRequest(_)))
            .count();
        let from = gid_of(req.peer.ip());
        if queued >= PENDING_MAX || !self.hand_out(from, req.req.request_id) {
            self.dropped += 1;
        } else {
            self.events.push_back(CmEvent::UdRequest(req));
        }
        Ok(())
    }

    /// rdma_listen: connection requests for `port` become
    /// [`CmEvent::Request`]s (others are rejected).
    pub fn listen(&mut self, port: u16) {
        self.listening.insert(port);
    }

    /// rdma_listen in rdma_cm's UDP port space: SIDR requests for `port`
    /// become [`CmEvent::UdRequest`]s (others are refused).
    pub fn listen_ud(&mut self, port: u16) {
        self.listening_ud.insert(port);
    }

    /// rdma_destroy_id of a listening ID: requests for `port` are refused again.
    pub fn unlisten(&mut self, port: u16, ud: bool) {
        if ud {
            self.listening_ud.remove(&port);
        } else {
            self.listening.remove(&port);
        }
    }

    /// A connected QP's options towards `peer`.
    pub(super) fn options(
        &self,
        peer: Ipv6Addr,
        path_mtu: u32,
        traffic_class: u8,
    ) -> ConnectOptions {
        ConnectOptions {
            path_mtu,
            sgid_index: source_gid_index(self.ctx, self.sgid_index, peer),
            traffic_class,
            ..ConnectOptions::default()
        }
    }

    /// This device's address towards `peer` (of its kind: IPv4 or IPv6).
    pub fn local_ip_towards(&self, peer: Ipv6Addr) -> Result<IpAddr> {
        let gid = self
            .ctx
            .query_gid(source_gid_index(self.ctx, self.sgid_index, peer))?;
        Ok(gid.to_ipv4_mapped().map_or(IpAddr::V6(gid), IpAddr::V4))
    }

    /// rdma_connect's first half: a REQ for the connection manager at `dst`
    /// (its port in rdma_cm's TCP port space) to connect QP `qpn` (RC),
    /// resent until answered. Returns the connection's local comm ID; the
    /// answer comes as [`CmEvent::Reply`] (then [`CmAgent::finish_connect`]),
    /// [`CmEvent::Rejected`] or [`CmEvent::TimedOut`].
    pub fn start_connect(&mut self, qpn: u32, dst: SocketAddr, param: &ConnParam) -> Result<u32> {
        let peer_gid = gid_of(dst.ip());
        let my_gid = self
            .ctx
            .query_gid(source_gid_index(self.ctx, self.sgid_index, peer_gid))?;
        let my_ip = my_gid
            .to_ipv4_mapped()
            .map_or(IpAddr::V6(my_gid), IpAddr::V4);
        let local_comm_id = self.new_comm_id();
        // rdma_cm binds the active side to an ephemeral port; it only
        // travels in the header.
        let src = SocketAddr::new(my_ip, 0x8000 | (local_comm_id as u16 & 0x7fff));
        let mut private: [u8; mad::REQ_PRIVATE_LEN] =
            private_of(&param.private_data, REQ_USER_PRIVATE_LEN)?;
        private[..CMA_HDR_LEN].copy_from_slice(&cma_header(src, dst.ip()));
        let mtu = self.ctx.query_port().active_mtu;
        let psn = crate::device::seed_from_os() as u32 & 0x00ff_ffff;
        let req = CmMessage::Req(Box::new(Req {
            local_comm_id,
            service_id: PS_TCP << 16 | u64::from(dst.port()),
            local_ca_guid: self.guid,
            local_qkey: 0,
            local_qpn: qpn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            remote_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            transport_service_type: 0,
            end_to_end_flow_control: true,
            starting_psn: psn,
            local_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            retry_count: param.retry_count,
            partition_key: 0xffff,
            path_mtu: crate::device::ib_mtu_enum(mtu),
            rdc_exists: false,
            rnr_retry_count: param.rnr_retry_count,
            max_cm_retries: MAX_CM_RETRIES,
            srq: false,
            // Routed (hop limit above 1): permissive LIDs, not subnet-local,
            // as the kernel's CM fills a RoCE path.
            primary: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: my_gid.octets(),
                remote_gid: peer_gid.octets(),
                flow_label: 0,
                packet_rate: 3,
                traffic_class: param.traffic_class,
                hop_limit: ferroce_stack::wire::packet::DEFAULT_TTL,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: param.ack_timeout,
            },
            private_data: private,
        }));
        let tid = self.next_tid();
        self.conns.insert(
            local_comm_id,
            Conn {
                peer_gid,
                remote_comm_id: 0,
                remote_qpn: 0,
                tid,
                traffic_class: param.traffic_class,
                last_sent: None,
                disconnected: false,
                offer: Some((param.clone(), psn)),
            },
        );
        let sent = self.send_awaiting(
            local_comm_id,
            peer_gid,
            tid,
            req,
            param.traffic_class,
            Awaits::Rep,
        );
        if sent.is_err() {
            self.conns.remove(&local_comm_id);
        }
        sent.map(|()| local_comm_id)
    }

    /// What the active side's QP of connection `id` is moved with on the
    /// peer's REP `rep` (what [`CmAgent::finish_connect`] applies, and
    /// rdma_init_qp_attr reports for a QP its program moves).
    pub fn connect_terms(&self, id: u32, rep: &Rep) -> Result<(ConnectOptions, RemoteQp)> {
        let Some((peer_gid, Some((param, psn)))) =
            self.conns.get(&id).map(|c| (c.peer_gid, c.offer.clone()))
        else {
            return Err(Error::Cm(format!("no connection {id:#x} is being set up")));
        };
        // A REQ's starting PSN is what its sender expects to receive, a
        // REP's what its sender expects (the kernel's cm.c: rq_psn from the
        // REQ we sent, sq_psn from the REP).
        let mtu = self.ctx.query_port().active_mtu;
        let opts = ConnectOptions {
            local_psn: rep.starting_psn,
            timeout: param.ack_timeout,
            retry_cnt: param.retry_count,
            rnr_retry: rep.rnr_retry_count,
            max_rd_atomic: param.initiator_depth.min(rep.responder_resources).max(1),
            max_dest_rd_atomic: param.responder_resources.max(1),
            access: super::connected_access(rep.initiator_depth),
            ..self.options(peer_gid, mtu, param.traffic_class)
        };
        let remote = RemoteQp {
            qpn: rep.local_qpn,
            psn,
            gid: peer_gid,
        };
        Ok((opts, remote))
    }

    /// rdma_connect's second half, on [`CmEvent::Reply`] `rep` to
    /// connection `id`: moves `qp` (the one the REQ named) to RTS and
    /// confirms with an RTU. When `qp` cannot take the REP's terms the
    /// REP is rejected and the error returned.
    pub fn finish_connect(&mut self, id: u32, qp: &QueuePair<'_>, rep: &Rep) -> Result<Connection> {
        let (opts, remote) = self.connect_terms(id, rep)?;
        let Some((peer_gid, tid, tclass)) = self
            .conns
            .get(&id)
            .map(|c| (c.peer_gid, c.tid, c.traffic_class))
        else {
            return Err(Error::Cm(format!("no connection {id:#x} is being set up")));
        };
        let moved = super::grant_access(qp, opts.access)
            .and_then(|()| qp.connect(self.ctx, &remote, &opts));
        if let Err(e) = moved {
            // No resources for the connection the REP offered (IBTA table 109: 3).
            let msg = rej(id, rep.local_comm_id, answers::REP, 3);
            self.send(peer_gid, tid, &msg, tclass)?;
            self.conns.remove(&id);
            return Err(e);
        }
        self.establish(id, rep)
    }

    /// rdma_establish: the RTU for `rep` (the QP is at RTS, moved by its
    /// owner); the connection is up.
    pub fn establish(&mut self, id: u32, rep: &Rep) -> Result<Connection> {
        let Some(c) = self.conns.get_mut(&id) else {
            return Err(Error::Cm(format!("no connection {id:#x} is being set up")));
        };
        let rtu = CmMessage::Rtu(Ids {
            local_comm_id: id,
            remote_comm_id: rep.local_comm_id,
        });
        c.remote_comm_id = rep.local_comm_id;
        c.remote_qpn = rep.local_qpn;
        c.last_sent = Some(rtu.clone());
        c.offer = None;
        let (peer_gid, tid, tclass) = (c.peer_gid, c.tid, c.traffic_class);
        self.send(peer_gid, tid, &rtu, tclass)?;
        Ok(Connection {
            local_comm_id: id,
            remote_comm_id: rep.local_comm_id,
            peer_gid,
            remote_qpn: rep.local_qpn,
            private_data: rep.private_data.to_vec(),
            offer: PeerOffer::of_rep(rep),
        })
    }

    /// What the passive side's QP is moved with to accept `request` with
    /// `param` (what [`CmAgent::start_accept`] applies, and
    /// rdma_init_qp_attr reports for a QP its program moves).
    pub fn accept_terms(&self, request: &Request, param: &ConnParam) -> (ConnectOptions, RemoteQp) {
        let r = &request.req;
        let peer_gid = Ipv6Addr::from(r.primary.local_gid);
        let mtu = mtu_bytes(r.path_mtu).min(self.ctx.query_port().active_mtu);
        // Each side keeps out no more READs than the other answers.
        let responder = param.responder_resources.min(r.initiator_depth);
        let initiator = param.initiator_depth.min(r.responder_resources);
        // We send from the REQ's starting PSN and expect ours (see connect_terms).
        let opts = ConnectOptions {
            local_psn: r.starting_psn,
            timeout: if r.primary.local_ack_timeout == 0 {
                param.ack_timeout
            } else {
                r.primary.local_ack_timeout
            },
            retry_cnt: r.retry_count,
            rnr_retry: r.rnr_retry_count,
            max_rd_atomic: initiator.max(1),
            max_dest_rd_atomic: responder.max(1),
            access: super::connected_access(r.initiator_depth),
            ..self.options(peer_gid, mtu, r.primary.traffic_class)
        };
        let remote = RemoteQp {
            qpn: r.local_qpn,
            psn: request.psn,
            gid: peer_gid,
        };
        (opts, remote)
    }

    /// rdma_accept's first half: moves `qp` (RC, RESET or INIT) to RTS
    /// towards the requester and sends the REP (again until answered).
    /// Returns the connection; [`CmEvent::Established`] follows on the RTU
    /// (or [`CmEvent::Rejected`], [`CmEvent::TimedOut`]).
    pub fn start_accept(
        &mut self,
        request: &Request,
        qp: &QueuePair<'_>,
        param: &ConnParam,
    ) -> Result<Connection> {
        let r = &request.req;
        let peer_gid = Ipv6Addr::from(r.primary.local_gid);
        if qp.state()? == QpState::Reset {
            qp.to_init(&self.options(peer_gid, 1024, r.primary.traffic_class))?;
        }
        let (opts, remote) = self.accept_terms(request, param);
        super::grant_access(qp, opts.access)?;
        qp.connect(self.ctx, &remote, &opts)?;
        self.send_rep(request, qp.qpn(), qp.has_srq(), param)
    }

    /// rdma_accept for a QP its program has moved to RTS with
    /// [`CmAgent::accept_terms`]: the REP names QP `qpn`.
    pub fn send_rep(
        &mut self,
        request: &Request,
        qpn: u32,
        srq: bool,
        param: &ConnParam,
    ) -> Result<Connection> {
        let r = &request.req;
        let peer_gid = Ipv6Addr::from(r.primary.local_gid);
        self.forget_request(peer_gid, r.local_comm_id);
        let local_comm_id = self.new_comm_id();
        let rep = CmMessage::Rep(Box::new(Rep {
            local_comm_id,
            remote_comm_id: r.local_comm_id,
            local_qkey: 0,
            local_qpn: qpn,
            starting_psn: request.psn,
            responder_resources: param.responder_resources.min(r.initiator_depth),
            initiator_depth: param.initiator_depth.min(r.responder_resources),
            // rxe's local_ca_ack_delay.
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: param.rnr_retry_count,
            srq,
            local_ca_guid: self.guid,
            private_data: private_of(&param.private_data, mad::REP_PRIVATE_LEN)?,
        }));
        let tclass = r.primary.traffic_class;
        self.conns.insert(
            local_comm_id,
            Conn {
                peer_gid,
                remote_comm_id: r.local_comm_id,
                remote_qpn: r.local_qpn,
                tid: request.tid,
                traffic_class: tclass,
                last_sent: Some(rep.clone()),
                disconnected: false,
                offer: None,
            },
        );
        if let Err(e) = self.send_awaiting(
            local_comm_id,
            peer_gid,
            request.tid,
            rep,
            tclass,
            Awaits::Rtu,
        ) {
            self.conns.remove(&local_comm_id);
            return Err(e);
        }
        Ok(Connection {
            local_comm_id,
            remote_comm_id: r.local_comm_id,
            peer_gid,
            remote_qpn: r.local_qpn,
            private_data: request.private_data.clone(),
            offer: request.offer,
        })
    }

    /// rdma_reject: refuses `request` with `reason` (28, consumer defined,
    /// as rdma_reject) and `private_data` (at most 148 bytes).
    pub fn reject_with(
        &mut self,
        request: &Request,
        reason: u16,
        private_data: &[u8],
    ) -> Result<()> {
        let peer = Ipv6Addr::from(request.req.primary.local_gid);
        self.forget_request(peer, request.req.local_comm_id);
        let mut msg = rej(
            self.new_comm_id(),
            request.req.local_comm_id,
            answers::REQ,
            reason,
        );
        if let CmMessage::Rej(r) = &mut msg {
            r.private_data = private_of(private_data, mad::REJ_PRIVATE_LEN)?;
        }
        self.send(peer, request.tid, &msg, request.traffic_class)
    }

    /// rdma_reject: refuses `request` with `reason` (28, consumer defined, as rdma_reject).
    pub fn reject(&mut self, request: &Request, reason: u16) -> Result<()> {
        self.reject_with(request, reason, &[])
    }

    /// rdma_connect for a UD QP, first half: a SIDR_REQ asking the
    /// connection manager at `dst` which QP serves its port (sent again
    /// until answered), with `traffic_class` (rdma_cm's TOS of the ID).
    /// Returns the request ID; the answer comes as [`CmEvent::UdResolved`],
    /// [`CmEvent::UdRefused`] or [`CmEvent::TimedOut`].
    pub fn start_resolve_ud(
        &mut self,
        dst: SocketAddr,
        private_data: &[u8],
        traffic_class: u8,
    ) -> Result<u32> {
        let peer_gid = gid_of(dst.ip());
        let my_ip = self.local_ip_towards(peer_gid)?;
        let request_id = self.new_comm_id();
        let src = SocketAddr::new(my_ip, 0x8000 | (request_id as u16 & 0x7fff));
        let mut private: [u8; mad::SIDR_REQ_PRIVATE_LEN] =
            private_of(private_data, SIDR_USER_PRIVATE_LEN)?;
        private[..CMA_HDR_LEN].copy_from_slice(&cma_header(src, dst.ip()));
        let req = CmMessage::SidrReq(Box::new(SidrReq {
            request_id,
            partition_key: 0xffff,
            service_id: PS_UDP << 16 | u64::from(dst.port()),
            private_data: private,
        }));
        let tid = self.next_tid();
        self.send_awaiting(
            request_id,
            peer_gid,
            tid,
            req,
            traffic_class,
            Awaits::SidrRep,
        )?;
        Ok(request_id)
    }

    /// rdma_accept for a UD port: answers `request` with `qp`'s QPN and
    /// Q_Key (rdma_cm's UD QPs carry [`super::RDMA_UDP_QKEY`]). Nothing to
    /// wait for: a repeated request gets the same answer.
    pub fn accept_ud(
        &mut self,
        request: &UdRequest,
        qp: &QueuePair<'_>,
        private_data: &[u8],
    ) -> Result<()> {
        if qp.qp_type() != QpType::Ud {
            return Err(Error::Cm("SIDR answers with a UD QP".into()));
        }
        let qkey = qp.query()?.qkey;
        self.accept_ud_qpn(request, qp.qpn(), qkey, private_data)
    }

    /// [`CmAgent::accept_ud`] naming QP `qpn` and its Q_Key (a QP its
    /// program made without rdma_cm).
    pub fn accept_ud_qpn(
        &mut self,
        request: &UdRequest,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<()> {
        let private = private_of(private_data, mad::SIDR_REP_PRIVATE_LEN)?;
        self.answer_ud(request, sidr_status::SUCCESS, qpn, qkey, private)
    }

    /// rdma_reject for a UD port: a SIDR_REP with `status`.
    pub fn reject_ud(&mut self, request: &UdRequest, status: u8) -> Result<()> {
        self.answer_ud(request, status, 0, 0, [0; mad::SIDR_REP_PRIVATE_LEN])
    }

    fn answer_ud(
        &mut self,
        request: &UdRequest,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: [u8; mad::SIDR_REP_PRIVATE_LEN],
    ) -> Result<()> {
        let peer = gid_of(request.peer.ip());
        self.forget_request(peer, request.req.request_id);
        let rep = CmMessage::SidrRep(Box::new(SidrRep {
            request_id: request.req.request_id,
            status,
            add_info_len: 0,
            qpn,
            service_id: request.req.service_id,
            qkey,
            info: [0; mad::SIDR_REP_INFO_LEN],
            private_data,
        }));
        if self.sidr_answers.len() >= SIDR_ANSWERS_KEPT {
            self.sidr_answers.pop_front();
        }
        self.sidr_answers
            .push_back((peer, request.req.request_id, rep.clone()));
        self.send(peer, request.tid, &rep, request.traffic_class)
    }

    /// rdma_disconnect without a QP to flush: a DREQ for connection `id`
    /// (sent again until answered, a few times). Returns false when there
    /// is nothing to end (the peer's DREQ came first, or `id` is unknown):
    /// then no [`CmEvent::Disconnected`] follows for this call.
    pub fn start_disconnect(&mut self, id: u32) -> Result<bool> {
        let Some(c) = self.conns.get(&id) else {
            return Ok(false);
        };
        if c.disconnected
            || self
                .outstanding
                .get(&id)
                .is_some_and(|o| o.awaits == Awaits::Drep)
        {
            return Ok(false);
        }
        let dreq = CmMessage::Dreq(Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
        });
        let (peer, tclass) = (c.peer_gid, c.traffic_class);
        let tid = self.next_tid();
        // A REP still waiting for its RTU is answered by the DREQ now.
        self.outstanding.remove(&id);
        self.send_awaiting(id, peer, tid, dreq, tclass, Awaits::Drep)?;
        Ok(true)
    }

    /// rdma_destroy_id: connection `id` is forgotten (a repeat of its
    /// messages is no longer answered), with what waits for an answer.
    pub fn forget(&mut self, id: u32) {
        self.conns.remove(&id);
        self.outstanding.remove(&id);
        self.events.retain(|e| e.id() != Some(id));
    }
}

/// A REQ for rdma_cm's TCP port space as a [`Request`]; `tclass` is what
/// an answer to it goes with.
fn request_of(tid: u64, r: Req, tclass: u8) -> Option<Request> {
    if r.service_id >> 16 != PS_TCP || r.transport_service_type != 0 {
        return None;
    }
    let peer = cma_source(&r.private_data)?;
    Some(Request {
        peer,
        port: (r.service_id & 0xffff) as u16,
        private_data: r.private_data[CMA_HDR_LEN..].to_vec(),
        offer: PeerOffer {
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            flow_control: r.end_to_end_flow_control,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
        },
        remote_qpn: r.local_qpn,
        psn: crate::device::seed_from_os() as u32 & 0x00ff_ffff,
        req: r,
        tid,
        traffic_class: tclass,
    })
}

/// A SIDR_REQ for rdma_cm's UDP port space as a [`UdRequest`].
fn ud_request_of(tid: u64, r: SidrReq, tclass: u8) -> Option<UdRequest> {
    if r.service_id >> 16 != PS_UDP {
        return None;
    }
    let peer = cma_source(&r.private_data)?;
    Some(UdRequest {
        peer,
        port: (r.service_id & 0xffff) as u16,
        private_data: r.private_data[CMA_HDR_LEN..].to_vec(),
        req: r,
        tid,
        traffic_class: tclass,
    })
}
