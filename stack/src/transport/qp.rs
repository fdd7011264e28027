//! Queue pairs: types, states, attributes, and the `modify` rules of the
//! IBTA state machine as ibv_modify_qp(3) checks them (the required and
//! optional attribute masks follow Linux drivers/infiniband/core/verbs.c
//! qp_state_table, for RC, UC and UD).

use crate::wire::{self, bth, EthernetHeader, ExtHeaders, IpHeader, Opcode, PacketRepr, VlanTag};
use core::net::Ipv6Addr;

use super::cq::CqHandle;
use super::error::ModifyError;
use super::mr::{AccessFlags, PdHandle};
use super::responder::RespState;
use super::srq::SrqHandle;
use super::timers::{Instant, TimerTable};
use super::wqe::{RecvWqe, Ring, SendWqe};

/// Transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
}

/// QP states (IBTA 10.3.1, ibv_qp_state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

/// Which attributes of a [`QpAttr`] a `modify_qp` call carries (ibv_qp_attr_mask values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttrMask(pub u32);

macro_rules! attr_mask {
    ($($name:ident = $bit:literal),* $(,)?) => {
        impl QpAttrMask {
            $(pub const $name: QpAttrMask = QpAttrMask(1 << $bit);)*
            /// Names of the set bits, for errors and snapshots.
            pub const NAMES: &'static [(QpAttrMask, &'static str)] = &[$((QpAttrMask::$name, stringify!($name)),)*];
        }
    };
}

attr_mask! {
    STATE = 0, CUR_STATE = 1, EN_SQD_ASYNC_NOTIFY = 2, ACCESS_FLAGS = 3, PKEY_INDEX = 4,
    PORT = 5, QKEY = 6, AV = 7, PATH_MTU = 8, TIMEOUT = 9, RETRY_CNT = 10, RNR_RETRY = 11,
    RQ_PSN = 12, MAX_QP_RD_ATOMIC = 13, ALT_PATH = 14, MIN_RNR_TIMER = 15, SQ_PSN = 16,
    MAX_DEST_RD_ATOMIC = 17, PATH_MIG_STATE = 18, CAP = 19, DEST_QPN = 20,
}

impl QpAttrMask {
    pub const NONE: QpAttrMask = QpAttrMask(0);
    pub const fn contains(self, o: QpAttrMask) -> bool {
        self.0 & o.0 == o.0
    }
    pub const fn union(self, o: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 | o.0)
    }
    /// The name of the lowest set bit.
    pub fn first_name(self) -> &'static str {
        QpAttrMask::NAMES
            .iter()
            .find(|(m, _)| self.0 & m.0 != 0)
            .map_or("?", |(_, n)| n)
    }
    pub fn names(self) -> Vec<&'static str> {
        QpAttrMask::NAMES
            .iter()
            .filter(|(m, _)| self.0 & m.0 != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

impl core::ops::BitOr for QpAttrMask {
    type Output = QpAttrMask;
    fn bitor(self, o: QpAttrMask) -> QpAttrMask {
        self.union(o)
    }
}

/// The path to the peer: what an ibv_ah_attr with a RoCE GRH resolves to.
/// MACs are resolved by the engine above; GIDs that are IPv4-mapped
/// (`::ffff:a.b.c.d`) on both ends give IPv4 frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Path {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub vlan: Option<VlanTag>,
    pub sgid: Ipv6Addr,
    pub dgid: Ipv6Addr,
    /// IPv6 traffic class / IPv4 TOS (DSCP << 2 | ECN).
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 0 = derive from the QPNs as rdma_calc_flow_label does.
    pub flow_label: u32,
    /// `None` = 0xC000 | hash of the QPNs (rxe, rdma_get_udp_sport).
    pub udp_sport: Option<u16>,
}

impl Default for Path {
    fn default() -> Path {
        Path {
            src_mac: [0; 6],
            dst_mac: [0; 6],
            vlan: None,
            sgid: Ipv6Addr::UNSPECIFIED,
            dgid: Ipv6Addr::UNSPECIFIED,
            traffic_class: 0,
            hop_limit: wire::packet::DEFAULT_TTL,
            flow_label: 0,
            udp_sport: None,
        }
    }
}

/// Linux include/rdma/ib_verbs.h rdma_calc_flow_label: 20 bits from the QPN pair.
pub fn flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = u64::from(lqpn) * u64::from(rqpn);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xf_ffff) as u32
}

/// Linux rdma_flow_label_to_udp_sport: fold 20 bits into 14, put in 0xC000-0xFFFF.
pub fn udp_sport(flow_label: u32) -> u16 {
    let low = flow_label & 0x3fff;
    let high = flow_label & 0xf_c000;
    ((low ^ (high >> 14)) as u16 & 0x3fff) | 0xc000
}

/// The UDP source port of a UD QP's packets: fixed per QP, from its number
/// (rxe_qp_init_req: 0xC000 + hash_32(qpn, 14), hash_32 being the
/// multiplication by GOLDEN_RATIO_32 of include/linux/hash.h). rxe sets a
/// connected QP's from the flow label instead (`udp_sport`), when it gets
/// its address vector.
pub fn ud_udp_sport(qpn: u32) -> u16 {
    let hash = qpn.wrapping_mul(0x61C8_8647) >> (32 - 14);
    0xc000 | (hash & 0x3fff) as u16
}

impl Path {
    /// A frame template for this path (BTH and extension headers filled per packet).
    pub fn packet_template(&self, lqpn: u32, rqpn: u32) -> PacketRepr {
        let fl = if self.flow_label != 0 {
            self.flow_label
        } else {
            flow_label(lqpn, rqpn)
        };
        let ip = match (self.sgid.to_ipv4_mapped(), self.dgid.to_ipv4_mapped()) {
            (Some(src), Some(dst)) => IpHeader::V4 {
                src,
                dst,
                dscp: self.traffic_class >> 2,
                ecn: self.traffic_class & 3,
                ttl: self.hop_limit,
                ident: 0,
            },
            _ => IpHeader::V6 {
                src: self.sgid,
                dst: self.dgid,
                traffic_class: self.traffic_class,
                flow_label: fl,
                hop_limit: self.hop_limit,
            },
        };
        PacketRepr {
            eth: EthernetHeader {
                dst: self.dst_mac,
                src: self.src_mac,
                vlan: self.vlan,
            },
            ip,
            udp_src_port: self.udp_sport.unwrap_or_else(|| udp_sport(fl)),
            bth: bth::Repr {
                opcode: Opcode::RC_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: bth::DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: rqpn & bth::MASK_24,
                ack_req: false,
                psn: 0,
            },
            ext: ExtHeaders::default(),
        }
    }
}

/// Queue sizes asked for at creation (ibv_qp_cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// What `create_qp` needs (ibv_qp_init_attr).
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    pub srq: Option<SrqHandle>,
    pub cap: QpCap,
    /// Every send WR generates a completion, regardless of its `signaled` flag.
    pub sq_sig_all: bool,
}

/// QP attributes (ibv_qp_attr); which ones a call carries is in the [`QpAttrMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    /// Bytes: 256, 512, 1024, 2048 or 4096.
    pub path_mtu: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: AccessFlags,
    pub ah_attr: Path,
    pub pkey_index: u16,
    pub port_num: u8,
    /// Local ACK timeout code: 4.096 µs × 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// 0-7, 7 = retry forever.
    pub retry_cnt: u8,
    /// 0-7, 7 = retry forever.
    pub rnr_retry: u8,
    /// RNR NAK timer code this QP sends (0-31).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic this QP may have as requester.
    pub max_rd_atomic: u8,
    /// READ/atomic resources this QP keeps as responder.
    pub max_dest_rd_atomic: u8,
    pub en_sqd_async_notify: bool,
    pub sq_draining: bool,
    pub cap: QpCap,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: 1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::NONE,
            ah_attr: Path::default(),
            pkey_index: 0,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            en_sqd_async_notify: false,
            sq_draining: false,
            cap: QpCap::default(),
        }
    }
}

/// Most READ/atomic operations in flight per QP, either direction (rxe: RXE_MAX_QP_RD_ATOM 128;
/// we keep the responder resources small).
pub const MAX_RD_ATOMIC: u8 = 16;

type M = QpAttrMask;

/// The required and optional attributes of a transition, `None` if it is not allowed.
pub fn transition_rule(t: QpType, from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpState::*;
    use QpType::*;
    let none = M::NONE;
    let rc_uc_init = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    let ud_init = M::PKEY_INDEX | M::PORT | M::QKEY;
    let rule = match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => match t {
            Rc | Uc => (rc_uc_init, none),
            Ud => (ud_init, none),
        },
        (Init, Init) => match t {
            Rc | Uc => (none, rc_uc_init),
            Ud => (none, ud_init),
        },
        (Init, Rtr) => match t {
            Rc => (
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Uc => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => match t {
            Rc => (
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            Uc => (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (Rts, Rts) | (Sqd, Rts) => match t {
            Rc => (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
            Uc => (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
            ),
            Ud => (none, M::CUR_STATE | M::QKEY),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match t {
            Rc => (
                none,
                M::AV
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC,
            ),
            Uc => (
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Sqe, Rts) => match t {
            Rc => return None,
            Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            Ud => (none, M::CUR_STATE | M::QKEY),
        },
        _ => return None,
    };
    Some(rule)
}

fn check_range(attr: &'static str, value: u64, max: u64) -> Result<(), ModifyError> {
    if value > max {
        return Err(ModifyError::InvalidValue { attr, value });
    }
    Ok(())
}

/// Check a `modify` against the table and the value ranges; returns the target state.
pub fn check_modify(
    t: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<QpState, ModifyError> {
    let to = if mask.contains(M::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(M::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(ModifyError::CurStateMismatch {
            given: attr.cur_qp_state,
            actual: cur,
        });
    }
    let (req, opt) = transition_rule(t, cur, to).ok_or(ModifyError::InvalidTransition {
        qp_type: t,
        from: cur,
        to,
    })?;
    let missing = QpAttrMask(req.0 & !mask.0);
    if missing.0 != 0 {
        return Err(ModifyError::MissingAttribute {
            from: cur,
            to,
            attr: missing.first_name(),
        });
    }
    let extra = QpAttrMask(mask.0 & !(req.0 | opt.0 | M::STATE.0));
    if extra.0 != 0 {
        return Err(ModifyError::UnexpectedAttribute {
            from: cur,
            to,
            attr: extra.first_name(),
        });
    }
    if mask.contains(M::PATH_MTU) && !matches!(attr.path_mtu, 256 | 512 | 1024 | 2048 | 4096) {
        return Err(ModifyError::InvalidValue {
            attr: "PATH_MTU",
            value: u64::from(attr.path_mtu),
        });
    }
    let m24 = u64::from(bth::MASK_24);
    let checks: [(QpAttrMask, &'static str, u64, u64); 12] = [
        (M::TIMEOUT, "TIMEOUT", attr.timeout.into(), 31),
        (M::RETRY_CNT, "RETRY_CNT", attr.retry_cnt.into(), 7),
        (M::RNR_RETRY, "RNR_RETRY", attr.rnr_retry.into(), 7),
        (
            M::MIN_RNR_TIMER,
            "MIN_RNR_TIMER",
            attr.min_rnr_timer.into(),
            31,
        ),
        (
            M::MAX_QP_RD_ATOMIC,
            "MAX_QP_RD_ATOMIC",
            attr.max_rd_atomic.into(),
            MAX_RD_ATOMIC.into(),
        ),
        (
            M::MAX_DEST_RD_ATOMIC,
            "MAX_DEST_RD_ATOMIC",
            attr.max_dest_rd_atomic.into(),
            MAX_RD_ATOMIC.into(),
        ),
        (M::DEST_QPN, "DEST_QPN", attr.dest_qp_num.into(), m24),
        (M::RQ_PSN, "RQ_PSN", attr.rq_psn.into(), m24),
        (M::SQ_PSN, "SQ_PSN", attr.sq_psn.into(), m24),
        (
            M::ACCESS_FLAGS,
            "ACCESS_FLAGS",
            attr.qp_access_flags.0.into(),
            AccessFlags::ALL.0.into(),
        ),
        // One port, one P_Key (the default, 0xFFFF) in the table.
        (M::PORT, "PORT", attr.port_num.into(), 1),
        (M::PKEY_INDEX, "PKEY_INDEX", attr.pkey_index.into(), 0),
    ];
    for (bit, name, value, max) in checks {
        if mask.contains(bit) {
            check_range(name, value, max)?;
        }
    }
    if mask.contains(M::PORT) && attr.port_num == 0 {
        return Err(ModifyError::InvalidValue {
            attr: "PORT",
            value: 0,
        });
    }
    if mask.contains(M::AV) && attr.ah_attr.dgid.is_unspecified() {
        return Err(ModifyError::InvalidValue {
            attr: "AV",
            value: 0,
        });
    }
    Ok(to)
}

/// Requester and completer state (rxe: qp->req and qp->comp).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReqState {
    /// Next PSN to send.
    pub psn: u32,
    /// Oldest PSN not yet acknowledged.
    pub comp_psn: u32,
    /// Send queue index of the WQE being transmitted.
    pub next: u64,
    /// READ/atomic WQEs in flight.
    pub rd_atomic: u8,
    /// Packets sent since the last AckReq.
    pub noack_pkts: u32,
    /// When the oldest of those was sent.
    pub unrequested_since: Option<Instant>,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// `comp_psn` when the last go-back-N started, until progress is made.
    pub retry_psn: Option<u32>,
}

/// A queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    pub pd: PdHandle,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    pub srq: Option<SrqHandle>,
    pub sq_sig_all: bool,
    pub attr: QpAttr,
    /// Frame template for RC/UC, built at RTR.
    pub hdr: PacketRepr,
    pub sq: Ring<SendWqe>,
    pub rq: Ring<RecvWqe>,
    pub req: ReqState,
    pub resp: RespState,
    pub timers: TimerTable,
    /// In the core's ready list.
    pub scheduled: bool,
    /// A request just went out ahead of the plain ACK at the front of the
    /// response queue; the ACK goes next (see `Core::transmit_next`).
    pub ack_overtaken: bool,
    /// Earliest deadline this QP has in the core's timer heap.
    pub timer_entry: Option<Instant>,
}

impl Qp {
    pub fn new(qpn: u32, pd: PdHandle, init: &QpInitAttr) -> Qp {
        let mut attr = QpAttr {
            cap: init.cap,
            ..QpAttr::default()
        };
        attr.qp_state = QpState::Reset;
        let mut send_slot = SendWqe::empty();
        send_slot.sges.reserve(init.cap.max_send_sge as usize);
        let mut recv_slot = RecvWqe::default();
        recv_slot.sges.reserve(init.cap.max_recv_sge as usize);
        let rq_len = if init.srq.is_some() {
            0
        } else {
            init.cap.max_recv_wr as usize
        };
        Qp {
            qpn,
            qp_type: init.qp_type,
            state: QpState::Reset,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            sq_sig_all: init.sq_sig_all,
            attr,
            hdr: Path::default().packet_template(qpn, 0),
            sq: Ring::new(init.cap.max_send_wr as usize, send_slot),
            rq: Ring::new(rq_len, recv_slot),
            req: ReqState::default(),
            resp: RespState::new(init.cap.max_recv_sge as usize),
            timers: TimerTable::default(),
            scheduled: false,
            ack_overtaken: false,
            timer_entry: None,
        }
    }

    pub fn mtu(&self) -> u64 {
        u64::from(self.attr.path_mtu)
    }

    /// Copy the attributes named in `mask` in (after [`check_modify`] passed).
    pub fn apply_attrs(&mut self, a: &QpAttr, mask: QpAttrMask) {
        let s = &mut self.attr;
        if mask.contains(M::PATH_MTU) {
            s.path_mtu = a.path_mtu;
        }
        if mask.contains(M::QKEY) {
            s.qkey = a.qkey;
        }
        if mask.contains(M::RQ_PSN) {
            s.rq_psn = a.rq_psn;
            self.resp.psn = a.rq_psn;
        }
        if mask.contains(M::SQ_PSN) {
            s.sq_psn = a.sq_psn;
            self.req.psn = a.sq_psn;
            self.req.comp_psn = a.sq_psn;
        }
        if mask.contains(M::DEST_QPN) {
            s.dest_qp_num = a.dest_qp_num;
        }
        if mask.contains(M::ACCESS_FLAGS) {
            s.qp_access_flags = a.qp_access_flags;
        }
        if mask.contains(M::AV) {
            s.ah_attr = a.ah_attr;
        }
        if mask.contains(M::PKEY_INDEX) {
            s.pkey_index = a.pkey_index;
        }
        if mask.contains(M::PORT) {
            s.port_num = a.port_num;
        }
        if mask.contains(M::TIMEOUT) {
            s.timeout = a.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            s.retry_cnt = a.retry_cnt;
            self.req.retry_cnt = a.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            s.rnr_retry = a.rnr_retry;
            self.req.rnr_retry = a.rnr_retry;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            s.min_rnr_timer = a.min_rnr_timer;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            s.max_rd_atomic = a.max_rd_atomic;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            s.max_dest_rd_atomic = a.max_dest_rd_atomic;
            self.resp
                .resize_resources(usize::from(a.max_dest_rd_atomic.max(1)));
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            s.en_sqd_async_notify = a.en_sqd_async_notify;
        }
        if mask.contains(M::AV) || mask.contains(M::DEST_QPN) {
            self.hdr = s.ah_attr.packet_template(self.qpn, s.dest_qp_num);
        }
    }

    /// Back to RESET: drop all work without completions (ibv_modify_qp to RESET).
    pub fn reset(&mut self) {
        self.sq.clear();
        self.rq.clear();
        self.req = ReqState::default();
        self.resp.reset();
        self.timers.stop_all();
        let cap = self.attr.cap;
        self.attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix() -> String {
        let mut out = String::new();
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    if let Some((req, opt)) = transition_rule(t, from, to) {
                        out += &format!(
                            "{t:?} {from:?} -> {to:?}: required [{}] optional [{}]\n",
                            req.names().join(" "),
                            opt.names().join(" ")
                        );
                    }
                }
            }
        }
        out
    }

    /// The state machine as data, snapshot-tested (STYLE rule 5).
    #[test]
    fn transition_matrix_snapshot() {
        let out = matrix();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/transport/qp_transitions.snap"
        );
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(path, &out).unwrap();
        }
        let expected = include_str!("qp_transitions.snap");
        assert_eq!(out, expected, "transition table changed:\n{out}");
    }

    #[test]
    fn ud_sport_is_rxes_hash_of_the_qpn() {
        // hash_32(qpn, 14) = (qpn * 0x61C88647 mod 2^32) >> 18, worked by hand for QPN 0x11:
        // 0x11 * 0x61C88647 = 0x6_7E50_EAB7 → 0x7E50EAB7 >> 18 = 0x1F94.
        assert_eq!(ud_udp_sport(0x11), 0xc000 | 0x1f94);
        assert!((0..1000).all(|q| ud_udp_sport(q) >= 0xc000));
    }

    #[test]
    fn udp_sport_matches_linux_fold() {
        // rxe: sport = 0xC000 | fold(flow label of the QPN pair).
        let fl = flow_label(0x11, 0x12);
        assert_eq!(fl, (0x11 * 0x12) & 0xfffff);
        assert_eq!(udp_sport(fl), 0xc000 | ((0x11 * 0x12) & 0x3fff));
        assert!(udp_sport(0xfffff) >= 0xc000);
    }
}
