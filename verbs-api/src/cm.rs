//! Connection management over QP1, as librdmacm (rdma_cm) and the kernel's
//! `ib_cm` speak it on RoCE: a REQ / REP / RTU exchange of CM MADs sets up an
//! RC connection, DREQ / DREP tears it down (IBTA Vol 1 §12). So ferroce can
//! connect to `rdma_server`, `rping -s`, `ib_write_bw -R` on rxe or an RNIC,
//! and accept their clients, without the out-of-band TCP exchange.
//!
//! Addressing is rdma_cm's for its TCP port space: the service ID is
//! `0x0106 << 16 | port` and the REQ's private data starts with rdma_cm's
//! 36-byte header (version 0, IP version, source port, source and
//! destination addresses), the application's private data after it.
//!
//! UD QPs are found by service ID resolution instead (SIDR_REQ / SIDR_REP,
//! rdma_cm's UDP port space `0x0111 << 16 | port`): the answer names the
//! QPN and Q_Key to send to; nothing is set up or torn down.
//!
//! One [`CmAgent`] per device owns QP1; calls block the calling thread and
//! handle, on the way, the messages of its other connections (a duplicate
//! REQ or REP is answered again, a DREQ gets its DREP).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce_stack::transport::{
    AccessFlags, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, SendOp, SendWr, UdDest,
    WcOpcode, WcStatus, WorkCompletion,
};
use ferroce_stack::wire::mad::{
    self, answers, sidr_status, CmMessage, Dreq, Ids, Path as CmPath, Rep, Req, SidrRep, SidrReq,
    GSI_QKEY, GSI_QPN, MAD_LEN,
};

use crate::context::{gid_of, Context};
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{ConnectOptions, QueuePair, RemoteQp};
use crate::wc::{GrhInfo, GRH_LEN};

/// rdma_cm's TCP port space (`RDMA_PS_TCP`): the service ID's bits 16-31.
pub const PS_TCP: u64 = 0x0106;
/// rdma_cm's UDP port space (`RDMA_PS_UDP`): UD QPs, found by SIDR.
pub const PS_UDP: u64 = 0x0111;
/// The Q_Key rdma_cm gives UD QPs of its UDP port space (`RDMA_UDP_QKEY`
/// in librdmacm and the kernel's rdma_cm).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// rdma_cm's private-data header in a REQ (`struct cma_hdr`).
pub const CMA_HDR_LEN: usize = 36;
/// What an application may put in a REQ after rdma_cm's header.
pub const REQ_USER_PRIVATE_LEN: usize = mad::REQ_PRIVATE_LEN - CMA_HDR_LEN;
/// What an application may put in a SIDR_REQ after rdma_cm's header.
pub const SIDR_USER_PRIVATE_LEN: usize = mad::SIDR_REQ_PRIVATE_LEN - CMA_HDR_LEN;
/// Requests (REQ or SIDR_REQ) kept for a listened port before anyone takes
/// them; more are dropped, as a full listen backlog drops them.
const PENDING_MAX: usize = 64;
/// SIDR answers kept to send again when their request is repeated.
const SIDR_ANSWERS_KEPT: usize = 32;
/// A UD receive: the 40-byte GRH area, then the MAD.
const RECV_LEN: usize = GRH_LEN + MAD_LEN;
/// Receives kept posted on QP1.
const RECV_SLOTS: usize = 32;
/// How long one attempt waits for the answer before sending again (the
/// kernel answers a duplicate REQ with its REP again, and a duplicate REP
/// with its RTU).
const RESEND_AFTER: Duration = Duration::from_millis(1000);
/// Sends of one message before giving up (rdma_cm's CMA_MAX_CM_RETRIES).
const MAX_CM_RETRIES: u8 = 15;
/// Response time-outs offered in a REQ: 4.096 µs × 2^20 ≈ 4.3 s
/// (rdma_cm's CMA_CM_RESPONSE_TIMEOUT).
const CM_RESPONSE_TIMEOUT: u8 = 20;
/// REJ reason for a REQ no one listens for (IBTA table 109; the kernel's
/// IB_CM_REJ_INVALID_SERVICE_ID).
pub const REJ_INVALID_SERVICE_ID: u16 = 8;
/// REJ reason an application gives (rdma_reject's).
pub const REJ_CONSUMER_DEFINED: u16 = 28;
/// wr_id of a send (receives use their slot number).
const SEND_WR_ID: u64 = u64::MAX;

/// The kernel's `ib_cm_rej_reason` names for the reasons a peer gives.
pub fn reject_reason_name(reason: u16) -> &'static str {
    match reason {
        1 => "no QP",
        2 => "no EEC",
        3 => "no resources",
        4 => "timeout",
        5 => "unsupported",
        6 => "invalid comm ID",
        7 => "invalid comm instance",
        8 => "invalid service ID",
        9 => "invalid transport type",
        10 => "stale connection",
        11 => "RDC not supported",
        12 => "invalid GID",
        13 => "invalid LID",
        14 => "invalid SL",
        15 => "invalid traffic class",
        16 => "invalid hop limit",
        17 => "invalid packet rate",
        18 => "invalid alternate GID",
        19 => "invalid alternate LID",
        20 => "invalid alternate SL",
        21 => "invalid alternate traffic class",
        22 => "invalid alternate hop limit",
        23 => "invalid alternate packet rate",
        24 => "port CM redirect",
        25 => "port redirect",
        26 => "invalid MTU",
        27 => "insufficient responder resources",
        28 => "consumer defined (the application refused; rdma_cm: nobody listening)",
        29 => "invalid RNR retry",
        30 => "duplicate local comm ID",
        31 => "invalid class version",
        32 => "invalid flow label",
        33 => "invalid alternate flow label",
        _ => "unknown",
    }
}

/// What one side offers for a connection (rdma_cm's `rdma_conn_param`).
#[derive(Debug, Clone)]
pub struct ConnParam {
    /// Sent to the peer: at most [`REQ_USER_PRIVATE_LEN`] bytes in a REQ,
    /// [`mad::REP_PRIVATE_LEN`] in a REP.
    pub private_data: Vec<u8>,
    /// RDMA READs / atomics this side answers at once.
    pub responder_resources: u8,
    /// RDMA READs / atomics this side keeps out at once.
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// The QP's local ACK time-out (4.096 µs × 2^n), also offered in a REQ.
    pub ack_timeout: u8,
    /// The connection's traffic class (IPv4 TOS / IPv6 traffic class), as
    /// rdma_set_option's TOS: in the REQ's path, so the passive side, which
    /// takes its path from the REQ, sends with it too.
    pub traffic_class: u8,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: ferroce_stack::transport::qp::MAX_RD_ATOMIC,
            initiator_depth: ferroce_stack::transport::qp::MAX_RD_ATOMIC,
            retry_count: 7,
            rnr_retry_count: 7,
            ack_timeout: 14,
            traffic_class: 0,
        }
    }
}

/// An established connection.
#[derive(Debug, Clone)]
pub struct Connection {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// The peer's GID and QPN.
    pub peer_gid: Ipv6Addr,
    pub remote_qpn: u32,
    /// What the peer sent in its REQ (after rdma_cm's header) or REP.
    pub private_data: Vec<u8>,
}

/// A connection request waiting for [`CmAgent::accept`] or [`CmAgent::reject`].
#[derive(Debug, Clone)]
pub struct Request {
    /// The peer's address and port, from rdma_cm's header.
    pub peer: SocketAddr,
    /// The port it asked for.
    pub port: u16,
    /// The application's private data (after rdma_cm's header).
    pub private_data: Vec<u8>,
    req: Req,
    tid: u64,
    /// The traffic class a REJ of it goes with (see `CmAgent::rx_tclass`).
    traffic_class: u8,
}

/// A UD QP a SIDR_REP named (rdma_cm's `ud` event parameters).
#[derive(Debug, Clone)]
pub struct UdPeer {
    pub peer_gid: Ipv6Addr,
    pub qpn: u32,
    pub qkey: u32,
    /// The SIDR_REP's private data.
    pub private_data: Vec<u8>,
}

/// A SIDR request waiting for [`CmAgent::accept_ud`] or [`CmAgent::reject_ud`].
#[derive(Debug, Clone)]
pub struct UdRequest {
    /// The peer's address and port, from rdma_cm's header.
    pub peer: SocketAddr,
    /// The port it asked for (rdma_cm's UDP port space).
    pub port: u16,
    /// The application's private data (after rdma_cm's header).
    pub private_data: Vec<u8>,
    req: SidrReq,
    tid: u64,
    /// The traffic class the answer goes with (see `CmAgent::rx_tclass`).
    traffic_class: u8,
}

/// Where a connection stands, for answering its peer's repeats.
#[derive(Debug)]
struct Conn {
    peer_gid: Ipv6Addr,
    remote_comm_id: u32,
    tid: u64,
    /// Every MAD of the connection goes with its path's traffic class, as
    /// the kernel's CM sends them.
    traffic_class: u8,
    /// What we sent last (resent when the peer repeats itself).
    last_sent: Option<CmMessage>,
    /// A DREQ came, or ours was answered.
    disconnected: bool,
}

/// QP1 of a device and the connections it manages.
pub struct CmAgent<'a> {
    ctx: &'a Context,
    qp: QueuePair<'a>,
    cq: CompletionQueue,
    mr: MemoryRegion<'a>,
    sgid_index: usize,
    guid: u64,
    next_tid: u64,
    conns: HashMap<u32, Conn>,
    /// Ports rdma_listen was called for: a REQ for another is rejected.
    listening: HashSet<u16>,
    /// Requests taken off QP1 before anyone asked for them.
    pending: Vec<Request>,
    /// Ports of rdma_cm's UDP space listened on: SIDR requests for them
    /// wait for [`CmAgent::get_ud_request`].
    listening_ud: HashSet<u16>,
    pending_ud: Vec<UdRequest>,
    /// The last SIDR answers sent: (requester's GID, request ID, answer).
    sidr_answers: VecDeque<(Ipv6Addr, u32, CmMessage)>,
    /// MADs received and not looked at yet (transaction ID, message, the
    /// traffic class to answer it with).
    inbox: VecDeque<(u64, CmMessage, u8)>,
    /// The traffic class the kernel's CM would answer the MAD taken last
    /// from the inbox with, when no connection gives one (an AH from its WC).
    rx_tclass: u8,
    /// MADs dropped (not CM, malformed, unknown connection).
    pub dropped: u64,
    /// The device's QPN prefix on a shared port (see `new_comm_id`).
    prefix: Option<u8>,
}

impl std::fmt::Debug for CmAgent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmAgent")
            .field("connections", &self.conns.len())
            .field("dropped", &self.dropped)
            .finish()
    }
}

/// rdma_cm's private-data header: version 0, the IP version in the high
/// nibble, the source port, then both addresses (IPv4 in the last 4 bytes).
fn cma_header(src: SocketAddr, dst: IpAddr) -> [u8; CMA_HDR_LEN] {
    let mut h = [0u8; CMA_HDR_LEN];
    let addr = |ip: IpAddr| -> [u8; 16] {
        match ip {
            IpAddr::V4(v4) => {
                let mut a = [0u8; 16];
                a[12..].copy_from_slice(&v4.octets());
                a
            }
            IpAddr::V6(v6) => v6.octets(),
        }
    };
    h[1] = if src.is_ipv4() { 4 << 4 } else { 6 << 4 };
    h[2..4].copy_from_slice(&src.port().to_be_bytes());
    h[4..20].copy_from_slice(&addr(src.ip()));
    h[20..36].copy_from_slice(&addr(dst));
    h
}

/// The peer's address in the rdma_cm header of a REQ's or SIDR_REQ's
/// private data.
fn cma_source(p: &[u8]) -> Option<SocketAddr> {
    let p: &[u8; CMA_HDR_LEN] = p.get(..CMA_HDR_LEN)?.try_into().ok()?;
    if p[0] != 0 {
        return None;
    }
    let port = u16::from_be_bytes([p[2], p[3]]);
    let ip = match p[1] >> 4 {
        4 => IpAddr::from([p[16], p[17], p[18], p[19]]),
        6 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&p[4..20]);
            IpAddr::from(a)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// IBTA's MTU enumeration back to bytes; a value outside 1..=5 is read as
/// the nearest one.
fn mtu_bytes(e: u8) -> u32 {
    256 << (e.clamp(1, 5) - 1)
}

fn private_of<const N: usize>(data: &[u8], room: usize) -> Result<[u8; N]> {
    if data.len() > room {
        return Err(Error::Cm(format!(
            "{} bytes of private data, at most {room} fit",
            data.len()
        )));
    }
    let mut p = [0u8; N];
    p[N - room..N - room + data.len()].copy_from_slice(data);
    Ok(p)
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
        let cq = ctx.create_cq((2 * RECV_SLOTS) as u32)?;
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
            .build_gsi(&cq, &cq)?;
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
            mr,
            sgid_index,
            guid,
            next_tid: u64::from(crate::device::seed_from_os() as u32) << 32,
            conns: HashMap::new(),
            listening: HashSet::new(),
            pending: Vec::new(),
            listening_ud: HashSet::new(),
            pending_ud: Vec::new(),
            sidr_answers: VecDeque::new(),
            inbox: VecDeque::new(),
            rx_tclass: 0,
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

    /// A local comm ID (or SIDR request ID). On a shared UDP port its top
    /// byte is the device's QPN prefix: the port's steering program sends
    /// MADs that name it (REP, RTU, DREQ, ..., SIDR_REP) to this device.
    fn new_comm_id(&self) -> u32 {
        loop {
            let mut id = crate::device::seed_from_os() as u32;
            if let Some(p) = self.prefix {
                id = u32::from(p) << 24 | id & 0x00ff_ffff;
            }
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Connection requests (REQ, SIDR_REQ) name no receiver: on a shared
    /// port they reach the first device, with QPN prefix 0, alone.
    fn can_listen(&self) -> Result<()> {
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
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.drain_cq()? {
                Some(WcStatus::Success) => return Ok(()),
                Some(status) => return Err(Error::Cm(format!("MAD send failed: {status:?}"))),
                None => {}
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(Duration::from_secs(5), "a MAD send"));
            }
            self.cq.wait(Duration::from_millis(10)).ok();
        }
    }

    /// Takes what QP1's CQ holds: each receive into the inbox
    /// ([`CmAgent::take_recv`]); returns the status of a send's completion
    /// among them.
    fn drain_cq(&mut self) -> Result<Option<WcStatus>> {
        let mut wcs = Vec::new();
        self.cq.poll(16, &mut wcs)?;
        let mut sent = None;
        for wc in &wcs {
            if wc.wr_id == SEND_WR_ID {
                sent = Some(wc.status);
            } else {
                self.take_recv(wc)?;
            }
        }
        Ok(sent)
    }

    /// A receive completion: the MAD parsed and queued for [`CmAgent::recv`].
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

    /// The next CM message, waiting up to `timeout` (None: none came).
    fn recv(&mut self, timeout: Duration) -> Result<Option<(u64, CmMessage)>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((tid, msg, tclass)) = self.inbox.pop_front() {
                self.rx_tclass = tclass;
                return Ok(Some((tid, msg)));
            }
            // `send` takes its own completion: none is left to look at here.
            self.drain_cq()?;
            if !self.inbox.is_empty() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let _ = self
                .cq
                .wait((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// The next message a caller may want (what [`CmAgent::background`]
    /// answered itself is skipped), or `None` once `deadline` passes.
    fn next_until(&mut self, deadline: Instant) -> Result<Option<(u64, CmMessage)>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((t, m)) = self.recv(left)? else {
                return Ok(None);
            };
            if let Some(got) = self.background(t, m)? {
                return Ok(Some(got));
            }
        }
    }

    /// Answers what needs no caller: a DREQ of a known connection gets its
    /// DREP, a repeated REQ or REP our last answer again. Returns the
    /// message when a caller may want it.
    fn background(&mut self, tid: u64, msg: CmMessage) -> Result<Option<(u64, CmMessage)>> {
        match &msg {
            CmMessage::Dreq(d) => {
                let Some(c) = self.conns.get_mut(&d.remote_comm_id) else {
                    self.dropped += 1;
                    return Ok(None);
                };
                c.disconnected = true;
                let (peer, tclass) = (c.peer_gid, c.traffic_class);
                let drep = CmMessage::Drep(Ids {
                    local_comm_id: d.remote_comm_id,
                    remote_comm_id: d.local_comm_id,
                });
                self.send(peer, tid, &drep, tclass)?;
            }
            CmMessage::Req(r) => {
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
                    return Ok(None);
                }
            }
            CmMessage::SidrReq(r) => {
                let from = cma_source(&r.private_data).map(|a| gid_of(a.ip()));
                let repeat = self
                    .sidr_answers
                    .iter()
                    .find(|(g, id, _)| Some(*g) == from && *id == r.request_id)
                    .map(|(g, _, m)| (*g, m.clone()));
                if let Some((peer, answer)) = repeat {
                    self.send(peer, tid, &answer, self.rx_tclass)?;
                    return Ok(None);
                }
            }
            CmMessage::Rep(r) => {
                let repeat = self
                    .conns
                    .get(&r.remote_comm_id)
                    .filter(|c| c.remote_comm_id == r.local_comm_id)
                    .map(|c| (c.peer_gid, c.tid, c.last_sent.clone(), c.traffic_class));
                if let Some((peer, tid, Some(last), tclass)) = repeat {
                    self.send(peer, tid, &last, tclass)?;
                    return Ok(None);
                }
            }
            _ => {}
        }
        Ok(Some((tid, msg)))
    }

    /// A REQ for rdma_cm's TCP port space as a [`Request`].
    /// The REQ was the last MAD taken: its traffic class is [`CmAgent::rx_tclass`].
    fn request_of(&self, tid: u64, r: Req) -> Option<Request> {
        if r.service_id >> 16 != PS_TCP || r.transport_service_type != 0 {
            return None;
        }
        let peer = cma_source(&r.private_data)?;
        Some(Request {
            peer,
            port: (r.service_id & 0xffff) as u16,
            private_data: r.private_data[CMA_HDR_LEN..].to_vec(),
            req: r,
            tid,
            traffic_class: self.rx_tclass,
        })
    }

    /// A SIDR_REQ for rdma_cm's UDP port space as a [`UdRequest`] (the last
    /// MAD taken, as for [`CmAgent::request_of`]).
    fn ud_request_of(&self, tid: u64, r: SidrReq) -> Option<UdRequest> {
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
            traffic_class: self.rx_tclass,
        })
    }

    /// Keeps a message no one is waiting for: a REQ (SIDR_REQ) for a port
    /// listened on waits for [`CmAgent::get_request`]
    /// ([`CmAgent::get_ud_request`]); one for another port is refused as
    /// the kernel's CM does (REJ: invalid service ID; SIDR_REP: service ID
    /// not supported); anything else is dropped.
    ///
    /// A request already waiting (its sender repeated it) or more than
    /// [`PENDING_MAX`] waiting is dropped: the first is answered once taken.
    fn stash(&mut self, tid: u64, msg: CmMessage) -> Result<()> {
        match msg {
            CmMessage::Req(r) => match self.request_of(tid, *r) {
                Some(req) if self.listening.contains(&req.port) => {
                    let waiting = self.pending.iter().any(|p| {
                        p.req.local_comm_id == req.req.local_comm_id
                            && p.req.primary.local_gid == req.req.primary.local_gid
                    });
                    if waiting || self.pending.len() >= PENDING_MAX {
                        self.dropped += 1;
                    } else {
                        self.pending.push(req);
                    }
                }
                Some(req) => self.reject(&req, REJ_INVALID_SERVICE_ID)?,
                None => self.dropped += 1,
            },
            CmMessage::SidrReq(r) => match self.ud_request_of(tid, *r) {
                Some(req) if self.listening_ud.contains(&req.port) => {
                    let waiting = self.pending_ud.iter().any(|p| {
                        p.req.request_id == req.req.request_id && p.peer.ip() == req.peer.ip()
                    });
                    if waiting || self.pending_ud.len() >= PENDING_MAX {
                        self.dropped += 1;
                    } else {
                        self.pending_ud.push(req);
                    }
                }
                Some(req) => self.reject_ud(&req, sidr_status::UNSUPPORTED)?,
                None => self.dropped += 1,
            },
            _ => self.dropped += 1,
        }
        Ok(())
    }

    /// rdma_listen: connection requests for `port` are kept for
    /// [`CmAgent::get_request`] (others are rejected).
    pub fn listen(&mut self, port: u16) {
        self.listening.insert(port);
    }

    /// A connected QP's options towards `peer`.
    fn options(&self, peer: Ipv6Addr, path_mtu: u32, traffic_class: u8) -> ConnectOptions {
        ConnectOptions {
            path_mtu,
            sgid_index: source_gid_index(self.ctx, self.sgid_index, peer),
            traffic_class,
            ..ConnectOptions::default()
        }
    }

    /// rdma_connect: asks the connection manager at `dst` (its port in
    /// rdma_cm's TCP port space) for a connection to `qp` (an RC QP in
    /// RESET or INIT; receives may be posted in INIT before), and on its
    /// REP moves `qp` to RTS and confirms with an RTU.
    pub fn connect(
        &mut self,
        qp: &QueuePair<'_>,
        dst: SocketAddr,
        param: &ConnParam,
    ) -> Result<Connection> {
        if qp.qp_type() != QpType::Rc {
            return Err(Error::Cm("rdma_cm connects RC QPs here".into()));
        }
        let peer_gid = gid_of(dst.ip());
        let my_gid = self
            .ctx
            .query_gid(source_gid_index(self.ctx, self.sgid_index, peer_gid))?;
        let my_ip = my_gid
            .to_ipv4_mapped()
            .map_or(IpAddr::V6(my_gid), IpAddr::V4);
        if qp.state()? == QpState::Reset {
            qp.to_init(&self.options(peer_gid, 1024, param.traffic_class))?;
        }
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
            local_qpn: qp.qpn(),
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
                tid,
                traffic_class: param.traffic_class,
                last_sent: None,
                disconnected: false,
            },
        );
        let tclass = param.traffic_class;
        let rep = match self.await_answer(peer_gid, tid, &req, local_comm_id, tclass, |m| {
            matches!(m, CmMessage::Rep(_))
        }) {
            Ok(CmMessage::Rep(rep)) => rep,
            Ok(other) => {
                self.conns.remove(&local_comm_id);
                return Err(Error::Cm(format!("a REP expected, got {other:?}")));
            }
            Err(e) => {
                self.conns.remove(&local_comm_id);
                return Err(e);
            }
        };
        // A REQ's starting PSN is what its sender expects to receive, a
        // REP's what its sender expects (the kernel's cm.c: rq_psn from the
        // REQ we sent, sq_psn from the REP).
        let opts = ConnectOptions {
            local_psn: rep.starting_psn,
            timeout: param.ack_timeout,
            retry_cnt: param.retry_count,
            rnr_retry: rep.rnr_retry_count,
            max_rd_atomic: param.initiator_depth.min(rep.responder_resources).max(1),
            max_dest_rd_atomic: param.responder_resources.max(1),
            ..self.options(peer_gid, mtu, param.traffic_class)
        };
        let remote = RemoteQp {
            qpn: rep.local_qpn,
            psn,
            gid: peer_gid,
        };
        let rtu = CmMessage::Rtu(Ids {
            local_comm_id,
            remote_comm_id: rep.local_comm_id,
        });
        if let Err(e) = qp.connect(self.ctx, &remote, &opts) {
            self.reject_rep(peer_gid, tid, local_comm_id, rep.local_comm_id, tclass)?;
            self.conns.remove(&local_comm_id);
            return Err(e);
        }
        if let Some(c) = self.conns.get_mut(&local_comm_id) {
            c.remote_comm_id = rep.local_comm_id;
            c.last_sent = Some(rtu.clone());
        }
        self.send(peer_gid, tid, &rtu, tclass)?;
        Ok(Connection {
            local_comm_id,
            remote_comm_id: rep.local_comm_id,
            peer_gid,
            remote_qpn: rep.local_qpn,
            private_data: rep.private_data.to_vec(),
        })
    }

    /// Sends `msg` (again every [`RESEND_AFTER`], up to [`MAX_CM_RETRIES`]
    /// times; an MRA buys the time it asks for) until the answer `wanted`
    /// picks arrives for connection `local_comm_id`; a REJ ends it. Sent
    /// with the connection's traffic class.
    fn await_answer(
        &mut self,
        peer: Ipv6Addr,
        tid: u64,
        msg: &CmMessage,
        local_comm_id: u32,
        traffic_class: u8,
        wanted: impl Fn(&CmMessage) -> bool,
    ) -> Result<CmMessage> {
        for _ in 0..MAX_CM_RETRIES {
            self.send(peer, tid, msg, traffic_class)?;
            let mut deadline = Instant::now() + RESEND_AFTER;
            while let Some((t, m)) = self.next_until(deadline)? {
                if m.remote_comm_id() != local_comm_id {
                    self.stash(t, m)?;
                    continue;
                }
                match m {
                    m if wanted(&m) => return Ok(m),
                    CmMessage::Rej(r) => return Err(Error::Rejected { reason: r.reason }),
                    CmMessage::Mra(m) => {
                        let wait = Duration::from_nanos(4096u64 << m.service_timeout.min(31));
                        deadline = Instant::now() + wait.max(RESEND_AFTER);
                    }
                    CmMessage::Dreq(_) => {
                        return Err(Error::Cm("the peer disconnected while connecting".into()))
                    }
                    other => self.stash(t, other)?,
                }
            }
        }
        Err(Error::Timeout(
            RESEND_AFTER * u32::from(MAX_CM_RETRIES),
            "the peer's connection manager",
        ))
    }

    fn reject_rep(
        &mut self,
        peer: Ipv6Addr,
        tid: u64,
        local: u32,
        remote: u32,
        traffic_class: u8,
    ) -> Result<()> {
        // No resources for the connection the REP offered (IBTA table 109: 3).
        let msg = rej(local, remote, answers::REP, 3);
        self.send(peer, tid, &msg, traffic_class)
    }

    /// rdma_get_request: the next connection request for `port` (rdma_cm's
    /// TCP port space), waiting up to `timeout`.
    pub fn get_request(&mut self, port: u16, timeout: Duration) -> Result<Request> {
        self.can_listen()?;
        self.listen(port);
        if let Some(i) = self.pending.iter().position(|r| r.port == port) {
            return Ok(self.pending.remove(i));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let Some((t, m)) = self.next_until(deadline)? else {
                return Err(Error::Timeout(timeout, "a connection request"));
            };
            match m {
                CmMessage::Req(r) => match self.request_of(t, *r) {
                    Some(req) if req.port == port => return Ok(req),
                    Some(req) => self.stash(req.tid, CmMessage::Req(Box::new(req.req)))?,
                    None => self.dropped += 1,
                },
                _ => self.dropped += 1,
            }
        }
    }

    /// rdma_accept: moves `qp` (RC, RESET or INIT) to RTS towards the
    /// requester, sends the REP and waits for the RTU.
    pub fn accept(
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
        let mtu = mtu_bytes(r.path_mtu).min(self.ctx.query_port().active_mtu);
        let psn = crate::device::seed_from_os() as u32 & 0x00ff_ffff;
        // Each side keeps out no more READs than the other answers.
        let responder = param.responder_resources.min(r.initiator_depth);
        let initiator = param.initiator_depth.min(r.responder_resources);
        // We send from the REQ's starting PSN and expect ours (see connect).
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
            ..self.options(peer_gid, mtu, r.primary.traffic_class)
        };
        let remote = RemoteQp {
            qpn: r.local_qpn,
            psn,
            gid: peer_gid,
        };
        qp.connect(self.ctx, &remote, &opts)?;
        let local_comm_id = self.new_comm_id();
        let rep = CmMessage::Rep(Box::new(Rep {
            local_comm_id,
            remote_comm_id: r.local_comm_id,
            local_qkey: 0,
            local_qpn: qp.qpn(),
            starting_psn: psn,
            responder_resources: responder,
            initiator_depth: initiator,
            // rxe's local_ca_ack_delay.
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: param.rnr_retry_count,
            srq: false,
            local_ca_guid: self.guid,
            private_data: private_of(&param.private_data, mad::REP_PRIVATE_LEN)?,
        }));
        self.conns.insert(
            local_comm_id,
            Conn {
                peer_gid,
                remote_comm_id: r.local_comm_id,
                tid: request.tid,
                traffic_class: r.primary.traffic_class,
                last_sent: Some(rep.clone()),
                disconnected: false,
            },
        );
        let tclass = r.primary.traffic_class;
        match self.await_answer(peer_gid, request.tid, &rep, local_comm_id, tclass, |m| {
            matches!(m, CmMessage::Rtu(_))
        }) {
            Ok(_) => Ok(Connection {
                local_comm_id,
                remote_comm_id: r.local_comm_id,
                peer_gid,
                remote_qpn: r.local_qpn,
                private_data: request.private_data.clone(),
            }),
            Err(e) => {
                self.conns.remove(&local_comm_id);
                Err(e)
            }
        }
    }

    /// rdma_reject: refuses `request` with `reason` (28, consumer defined, as rdma_reject).
    pub fn reject(&mut self, request: &Request, reason: u16) -> Result<()> {
        let peer = Ipv6Addr::from(request.req.primary.local_gid);
        let msg = rej(
            self.new_comm_id(),
            request.req.local_comm_id,
            answers::REQ,
            reason,
        );
        self.send(peer, request.tid, &msg, request.traffic_class)
    }

    /// rdma_connect for a UD QP (rdma_cm's UDP port space): asks the
    /// connection manager at `dst` which QP serves its port (SIDR_REQ,
    /// sent again until answered) and returns what the SIDR_REP names. A
    /// refusal comes back as [`Error::SidrRefused`]. The SIDR_REQ goes with
    /// `traffic_class` (rdma_cm's TOS of the ID).
    pub fn resolve_ud(
        &mut self,
        dst: SocketAddr,
        private_data: &[u8],
        traffic_class: u8,
    ) -> Result<UdPeer> {
        let peer_gid = gid_of(dst.ip());
        let my_gid = self
            .ctx
            .query_gid(source_gid_index(self.ctx, self.sgid_index, peer_gid))?;
        let my_ip = my_gid
            .to_ipv4_mapped()
            .map_or(IpAddr::V6(my_gid), IpAddr::V4);
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
        match self.await_answer(peer_gid, tid, &req, request_id, traffic_class, |m| {
            matches!(m, CmMessage::SidrRep(_))
        })? {
            CmMessage::SidrRep(rep) if rep.status == sidr_status::SUCCESS => Ok(UdPeer {
                peer_gid,
                qpn: rep.qpn,
                qkey: rep.qkey,
                private_data: rep.private_data.to_vec(),
            }),
            CmMessage::SidrRep(rep) => Err(Error::SidrRefused { status: rep.status }),
            other => Err(Error::Cm(format!("a SIDR_REP expected, got {other:?}"))),
        }
    }

    /// rdma_listen in rdma_cm's UDP port space: SIDR requests for `port`
    /// are kept for [`CmAgent::get_ud_request`] (others are refused).
    pub fn listen_ud(&mut self, port: u16) {
        self.listening_ud.insert(port);
    }

    /// rdma_get_request for a UD port: the next SIDR request for `port`,
    /// waiting up to `timeout`.
    pub fn get_ud_request(&mut self, port: u16, timeout: Duration) -> Result<UdRequest> {
        self.can_listen()?;
        self.listen_ud(port);
        if let Some(i) = self.pending_ud.iter().position(|r| r.port == port) {
            return Ok(self.pending_ud.remove(i));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let Some((t, m)) = self.next_until(deadline)? else {
                return Err(Error::Timeout(timeout, "a SIDR request"));
            };
            match m {
                CmMessage::SidrReq(r) => match self.ud_request_of(t, *r) {
                    Some(req) if req.port == port => return Ok(req),
                    Some(req) => self.stash(req.tid, CmMessage::SidrReq(Box::new(req.req)))?,
                    None => self.dropped += 1,
                },
                other => self.stash(t, other)?,
            }
        }
    }

    /// rdma_accept for a UD port: answers `request` with `qp`'s QPN and
    /// Q_Key (rdma_cm's UD QPs carry [`RDMA_UDP_QKEY`]). Nothing to wait
    /// for: a repeated request gets the same answer.
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
        let private = private_of(private_data, mad::SIDR_REP_PRIVATE_LEN)?;
        self.answer_ud(request, sidr_status::SUCCESS, qp.qpn(), qkey, private)
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

    /// rdma_disconnect: `qp` goes to ERR (what it still holds completes
    /// flushed) and the peer gets a DREQ; its DREP, or its own DREQ, ends it.
    /// Without an answer after a few sends the connection is dropped all the
    /// same (the peer's time-wait covers it).
    pub fn disconnect(&mut self, conn: &Connection, qp: &QueuePair<'_>) -> Result<()> {
        to_error(qp)?;
        self.disconnect_id(conn)
    }

    /// rdma_disconnect without a QP to flush: the DREQ exchange alone, as
    /// the kernel's CM sends it for a connected rdma_cm ID destroyed at
    /// process exit (the QP goes when it is dropped).
    pub fn disconnect_id(&mut self, conn: &Connection) -> Result<()> {
        if !self.gone(conn) {
            let tid = self.next_tid();
            let tclass = self
                .conns
                .get(&conn.local_comm_id)
                .map_or(0, |c| c.traffic_class);
            let dreq = CmMessage::Dreq(Dreq {
                local_comm_id: conn.local_comm_id,
                remote_comm_id: conn.remote_comm_id,
                remote_qpn: conn.remote_qpn,
            });
            'sends: for _ in 0..3 {
                self.send(conn.peer_gid, tid, &dreq, tclass)?;
                let deadline = Instant::now() + RESEND_AFTER;
                while let Some((t, m)) = self.next_until(deadline)? {
                    match m {
                        CmMessage::Drep(d) if d.remote_comm_id == conn.local_comm_id => {
                            break 'sends
                        }
                        CmMessage::Dreq(d) if d.remote_comm_id == conn.local_comm_id => {
                            break 'sends
                        }
                        other => self.stash(t, other)?,
                    }
                }
            }
        }
        self.conns.remove(&conn.local_comm_id);
        Ok(())
    }

    /// Waits up to `timeout` for the peer to disconnect (its DREQ, answered
    /// with a DREP); then `qp` goes to ERR. Returns whether it did.
    pub fn wait_disconnect(
        &mut self,
        conn: &Connection,
        qp: &QueuePair<'_>,
        timeout: Duration,
    ) -> Result<bool> {
        let gone = self.wait_disconnect_id(conn, timeout)?;
        if gone {
            to_error(qp)?;
        }
        Ok(gone)
    }

    /// [`CmAgent::wait_disconnect`] without a QP to flush.
    pub fn wait_disconnect_id(&mut self, conn: &Connection, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let gone = loop {
            if self.gone(conn) {
                break true;
            }
            let Some((t, m)) = self.next_until(deadline)? else {
                break false;
            };
            if !matches!(m, CmMessage::Dreq(_)) {
                self.stash(t, m)?;
            }
        };
        if gone {
            self.conns.remove(&conn.local_comm_id);
        }
        Ok(gone)
    }

    /// Whether `conn` has ended: the peer's DREQ came, or it is forgotten.
    fn gone(&self, conn: &Connection) -> bool {
        self.conns
            .get(&conn.local_comm_id)
            .is_none_or(|c| c.disconnected)
    }
}

/// librdmacm's `ucma_init_ud_qp`: a UD QP of rdma_cm's UDP port space goes
/// to RTS as soon as it is made, with [`RDMA_UDP_QKEY`] (the rest of `opts`
/// as given), so a peer may send to it as soon as SIDR has named it.
pub fn init_ud_qp(ctx: &Context, qp: &QueuePair<'_>, opts: &ConnectOptions) -> Result<()> {
    if qp.qp_type() != QpType::Ud {
        return Err(Error::Cm("rdma_cm's UDP port space takes UD QPs".into()));
    }
    let opts = ConnectOptions {
        qkey: RDMA_UDP_QKEY,
        ..*opts
    };
    qp.to_init(&opts)?;
    let me = RemoteQp {
        qpn: 0,
        psn: 0,
        gid: ctx.query_gid(opts.sgid_index)?,
    };
    qp.connect(ctx, &me, &opts)
}

/// The GID to reach `peer` from, as rdma_resolve_addr's route gives a
/// source address of the destination's family: `preferred` when it is of
/// the peer's kind (IPv4-mapped, IPv6 link-local, other IPv6), else the
/// first GID of that kind, else `preferred`.
pub fn source_gid_index(ctx: &Context, preferred: usize, peer: Ipv6Addr) -> usize {
    let kind = |g: &Ipv6Addr| {
        if g.to_ipv4_mapped().is_some() {
            0
        } else if g.segments()[0] & 0xffc0 == 0xfe80 {
            1
        } else {
            2
        }
    };
    let want = kind(&peer);
    let gids = ctx.gids();
    if gids.get(preferred).map(kind) == Some(want) {
        return preferred;
    }
    gids.iter()
        .position(|g| kind(g) == want)
        .unwrap_or(preferred)
}

/// rdma_disconnect's first step: the QP to ERR, its work requests flushed.
fn to_error(qp: &QueuePair<'_>) -> Result<()> {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&attr, QpAttrMask::STATE)
}

/// A REJ of what `message_rejected` names, with no additional information.
fn rej(local: u32, remote: u32, message_rejected: u8, reason: u16) -> CmMessage {
    CmMessage::Rej(Box::new(mad::Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected,
        reject_info_len: 0,
        reason,
        ari: [0; mad::REJ_ARI_LEN],
        private_data: [0; mad::REJ_PRIVATE_LEN],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_cm_header_and_service_id() {
        let src: SocketAddr = "198.18.0.2:40000".parse().unwrap();
        let h = cma_header(src, "198.18.0.1".parse().unwrap());
        assert_eq!(&h[..4], &[0x00, 0x40, 0x9c, 0x40]);
        assert_eq!(&h[16..20], &[198, 18, 0, 2]);
        assert_eq!(&h[32..36], &[198, 18, 0, 1]);
        let mut p = [0u8; mad::REQ_PRIVATE_LEN];
        p[..CMA_HDR_LEN].copy_from_slice(&h);
        assert_eq!(cma_source(&p), Some(src));
        // rdma_server's default port 7471 in rdma_cm's TCP space.
        assert_eq!(PS_TCP << 16 | 7471, 0x0000_0000_0106_1d2f);
        assert_eq!(mtu_bytes(3), 1024);
    }
}
