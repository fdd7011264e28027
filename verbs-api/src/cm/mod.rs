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
//! One [`CmAgent`] per device owns QP1. Its core (`agent`) never waits for
//! the peer: MADs in and resends due are handled by [`CmAgent::progress`],
//! which reports what happened as [`CmEvent`]s, so many connections are
//! set up at once (the librdmacm drop-in serves it from a thread). The
//! blocking calls the tools use (`blocking`: [`CmAgent::connect`],
//! [`CmAgent::accept`], ...) wait for their own event and leave the others
//! queued; on the way a duplicate REQ or REP is answered again and a DREQ
//! gets its DREP.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ferroce_stack::transport::{AccessFlags, QpAttr, QpAttrMask, QpState, QpType};
use ferroce_stack::wire::mad::{self, CmMessage, Rep, Req, SidrReq};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::qp::{ConnectOptions, QueuePair, RemoteQp};
use crate::wc::GRH_LEN;

mod agent;
mod blocking;

pub use agent::CmAgent;

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
const RECV_LEN: usize = GRH_LEN + mad::MAD_LEN;
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
    /// What the peer's REQ or REP offered.
    pub offer: PeerOffer,
}

/// What a peer's REQ or REP offered (rdma_cm's `conn` event parameters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerOffer {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: bool,
    /// A REQ's transport retry count (a REP carries none: 0).
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// The peer's QP takes its receives from a shared receive queue.
    pub srq: bool,
}

impl PeerOffer {
    /// What a REP offered.
    pub fn of_rep(rep: &Rep) -> PeerOffer {
        PeerOffer {
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            flow_control: rep.end_to_end_flow_control,
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
        }
    }
}

/// What the agent saw happen, in order (rdma_cm's events). `id` is the
/// local comm ID of a connection (the request ID of a SIDR request).
#[derive(Debug, Clone)]
pub enum CmEvent {
    /// A REQ for a port listened on (`RDMA_CM_EVENT_CONNECT_REQUEST`).
    Request(Request),
    /// A SIDR_REQ for a UDP-space port listened on (also a connect request).
    UdRequest(UdRequest),
    /// The REP to our REQ: [`CmAgent::finish_connect`] (or
    /// [`CmAgent::establish`] when the caller moves the QP) completes it.
    Reply { id: u32, rep: Box<Rep> },
    /// The RTU to our REP: the passive side is connected (`ESTABLISHED`).
    Established { id: u32 },
    /// The peer refused our REQ or REP (`REJECTED`).
    Rejected {
        id: u32,
        reason: u16,
        private_data: Vec<u8>,
    },
    /// No answer to our REQ, REP or SIDR_REQ after every resend
    /// (`UNREACHABLE`); the connection is forgotten.
    TimedOut { id: u32 },
    /// The SIDR_REP to our request: the UD QP to send to (`ESTABLISHED`).
    UdResolved { id: u32, peer: UdPeer },
    /// The SIDR_REP refused our request with `status` (`UNREACHABLE`).
    UdRefused { id: u32, status: u8 },
    /// The connection ended: the peer's DREQ came (and was answered), or
    /// ours was answered or went unanswered (`DISCONNECTED`).
    Disconnected { id: u32 },
}

impl CmEvent {
    /// The connection or SIDR request the event is about (None: a request).
    pub fn id(&self) -> Option<u32> {
        match self {
            CmEvent::Request(_) | CmEvent::UdRequest(_) => None,
            CmEvent::Reply { id, .. }
            | CmEvent::Established { id }
            | CmEvent::Rejected { id, .. }
            | CmEvent::TimedOut { id }
            | CmEvent::UdResolved { id, .. }
            | CmEvent::UdRefused { id, .. }
            | CmEvent::Disconnected { id } => Some(*id),
        }
    }
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
    /// What the REQ offered.
    pub offer: PeerOffer,
    /// The requester's QP.
    pub remote_qpn: u32,
    /// The first PSN this side expects, chosen on arrival: the REP offers
    /// it, and a QP its program moves is given it before the REP goes.
    psn: u32,
    req: Req,
    tid: u64,
    /// The traffic class answers to it go with (the kernel's CM answers
    /// an unconnected request from its WC: see `agent::take_recv`).
    traffic_class: u8,
}

impl Request {
    /// The requester's GID (the REQ's primary path).
    pub fn peer_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.req.primary.local_gid)
    }
    /// The GID the REQ was sent to.
    pub fn local_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.req.primary.remote_gid)
    }
    /// The traffic class of the REQ's path.
    pub fn traffic_class(&self) -> u8 {
        self.req.primary.traffic_class
    }
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
    /// The traffic class the answer goes with (see [`Request`]).
    traffic_class: u8,
}

/// rdma_cm's private-data header: version 0, the IP version in the high
/// nibble, the source port, then both addresses (IPv4 in the last 4 bytes).
pub(super) fn cma_header(src: SocketAddr, dst: IpAddr) -> [u8; CMA_HDR_LEN] {
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
pub(super) fn cma_source(p: &[u8]) -> Option<SocketAddr> {
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
pub(super) fn mtu_bytes(e: u8) -> u32 {
    256 << (e.clamp(1, 5) - 1)
}

pub(super) fn private_of<const N: usize>(data: &[u8], room: usize) -> Result<[u8; N]> {
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

/// The remote access of an RC QP rdma_cm connects, as the kernel's CM grants it (cm.c,
/// cm_init_qp_init_attr): RDMA WRITE always, READ and atomics only when the peer said it
/// would issue them (its initiator depth, in its REQ or REP, is not 0). A program that
/// READs over a connection it opened with initiator depth 0 fails here as on rxe or an RNIC.
pub fn connected_access(peer_initiator_depth: u8) -> AccessFlags {
    if peer_initiator_depth == 0 {
        AccessFlags::REMOTE_WRITE
    } else {
        AccessFlags(
            AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_ATOMIC.0,
        )
    }
}

/// [`QueuePair::set_access`] for a QP still at INIT (one its program has moved further keeps
/// what it was given): the access of the connection's terms ([`connected_access`]).
pub(crate) fn grant_access(qp: &QueuePair<'_>, access: AccessFlags) -> Result<()> {
    if qp.state()? == QpState::Init {
        qp.set_access(access)?;
    }
    Ok(())
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
pub(super) fn to_error(qp: &QueuePair<'_>) -> Result<()> {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&attr, QpAttrMask::STATE)
}

/// A REJ of what `message_rejected` names, with no additional information.
pub(super) fn rej(local: u32, remote: u32, message_rejected: u8, reason: u16) -> CmMessage {
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
