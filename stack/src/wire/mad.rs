//! Communication Management MADs: the 256-byte management datagrams the
//! connection manager (rdma_cm, the kernel's `ib_cm`) exchanges between the
//! general service QPs (QP1) to set up and tear down RC connections
//! (IBTA Vol 1 §12.6, §13.4), and to resolve a service ID to a UD QP
//! (SIDR, §12.11). Carried as the payload of a UD SEND to QP1
//! with Q_Key [`GSI_QKEY`].
//!
//! Field positions from IBTA Vol 1 tables 106-113 (the kernel's
//! `include/rdma/ibta_vol1_c12.h` lists the same offsets): every offset
//! below is from the start of the CM message, after the 24-byte MAD header.

/// A MAD is always this long (IBTA §13.4.2).
pub const MAD_LEN: usize = 256;
/// The common MAD header.
pub const HEADER_LEN: usize = 24;
/// The Q_Key of QP1 (IBTA §10.2.5: 0x80010000).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// QP1, the general service interface.
pub const GSI_QPN: u32 = 1;
/// MAD base version.
pub const BASE_VERSION: u8 = 1;
/// Management class of the CM.
pub const CLASS_CM: u8 = 0x07;
/// CM class version (IBTA 1.2; the kernel's IB_CM_CLASS_VERSION).
pub const CM_CLASS_VERSION: u8 = 2;
/// The method of every CM message.
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (IBTA table 104).
pub mod attr {
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
}

/// Private data each message carries (IBTA tables 106-113).
pub const REQ_PRIVATE_LEN: usize = 92;
pub const MRA_PRIVATE_LEN: usize = 222;
pub const REJ_PRIVATE_LEN: usize = 148;
pub const REP_PRIVATE_LEN: usize = 196;
pub const RTU_PRIVATE_LEN: usize = 224;
pub const DREQ_PRIVATE_LEN: usize = 220;
pub const DREP_PRIVATE_LEN: usize = 224;
/// A REJ's additional rejection information.
pub const REJ_ARI_LEN: usize = 72;
/// SIDR messages (IBTA tables 114-115; the kernel's cm_msgs.h sizes).
pub const SIDR_REQ_PRIVATE_LEN: usize = 216;
pub const SIDR_REP_INFO_LEN: usize = 72;
pub const SIDR_REP_PRIVATE_LEN: usize = 136;

/// SIDR_REP status values (IBTA table 116; the kernel's `ib_cm_sidr_status`).
pub mod sidr_status {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// No one serves the service ID.
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
    pub const NO_QP: u8 = 3;
    pub const REDIRECT: u8 = 4;
    pub const UNSUPPORTED_VERSION: u8 = 5;

    /// The kernel's name for a status.
    pub fn name(status: u8) -> &'static str {
        match status {
            SUCCESS => "success",
            UNSUPPORTED => "service ID not supported",
            REJECT => "rejected",
            NO_QP => "no QP",
            REDIRECT => "redirect",
            UNSUPPORTED_VERSION => "unsupported version",
            _ => "unknown",
        }
    }
}

/// Why a MAD was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("MAD of {0} bytes, expected {MAD_LEN}")]
    Length(usize),
    #[error("MAD base version {0}, expected 1")]
    BaseVersion(u8),
    #[error("management class {0:#04x} is not the CM's")]
    Class(u8),
    #[error("CM class version {0}, expected 2")]
    ClassVersion(u8),
    #[error("CM method {0:#04x}, expected Send")]
    Method(u8),
    #[error("CM attribute {0:#06x} not handled")]
    Attribute(u16),
}

pub type Result<T> = core::result::Result<T, Error>;

/// The common MAD header (IBTA §13.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub status: u16,
    pub class_specific: u16,
    pub transaction_id: u64,
    pub attribute_id: u16,
    pub attribute_modifier: u32,
}

/// One side's path as a REQ describes it (the primary path; ferroce offers
/// no alternate path: its LIDs and GIDs are sent as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Path {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits (IBTA's rate encoding).
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 5 bits: 4.096 µs × 2^n.
    pub local_ack_timeout: u8,
}

/// Connection request (IBTA table 106).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub remote_cm_response_timeout: u8,
    /// 2 bits: 0 RC, 1 UC, 3 XRC.
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    /// 5 bits.
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    pub partition_key: u16,
    /// 4 bits: IBTA's MTU enumeration (1: 256 ... 5: 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    pub primary: Path,
    pub private_data: [u8; REQ_PRIVATE_LEN],
}

/// Connection reply (IBTA table 110).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: [u8; REP_PRIVATE_LEN],
}

/// Which message a REJ or MRA answers (2 bits).
pub mod answers {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const OTHER: u8 = 2;
}

/// Connection reject (IBTA table 108).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits, [`answers`].
    pub message_rejected: u8,
    /// 7 bits.
    pub reject_info_len: u8,
    pub reason: u16,
    pub ari: [u8; REJ_ARI_LEN],
    pub private_data: [u8; REJ_PRIVATE_LEN],
}

/// Message receipt acknowledgement: more time needed (IBTA table 107).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits, [`answers`].
    pub message_mraed: u8,
    /// 5 bits: 4.096 µs × 2^n.
    pub service_timeout: u8,
}

/// Ready to use, disconnect reply: the two IDs (and private data, not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
}

/// Disconnect request (IBTA table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dreq {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits: the QPN the DREQ's receiver is to disconnect.
    pub remote_qpn: u32,
}

/// Service ID resolution request (IBTA table 114): which UD QP serves
/// `service_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    pub request_id: u32,
    pub partition_key: u16,
    pub service_id: u64,
    pub private_data: [u8; SIDR_REQ_PRIVATE_LEN],
}

/// Service ID resolution response (IBTA table 115).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// The request's.
    pub request_id: u32,
    /// [`sidr_status`].
    pub status: u8,
    pub add_info_len: u8,
    /// 24 bits.
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    /// ClassPortInfo for a redirect, else zero.
    pub info: [u8; SIDR_REP_INFO_LEN],
    pub private_data: [u8; SIDR_REP_PRIVATE_LEN],
}

/// The CM messages ferroce speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    Req(Box<Req>),
    Mra(Mra),
    Rej(Box<Rej>),
    Rep(Box<Rep>),
    Rtu(Ids),
    Dreq(Dreq),
    Drep(Ids),
    SidrReq(Box<SidrReq>),
    SidrRep(Box<SidrRep>),
}

impl CmMessage {
    pub fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The sender's communication ID (a SIDR_REQ's request ID; 0 in a
    /// SIDR_REP, which answers with the requester's).
    pub fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(_) => 0,
        }
    }

    /// The receiver's communication ID (0 in a REQ and a SIDR_REQ; a
    /// SIDR_REP's request ID).
    pub fn remote_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(_) => 0,
            CmMessage::Mra(m) => m.remote_comm_id,
            CmMessage::Rej(m) => m.remote_comm_id,
            CmMessage::Rep(m) => m.remote_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.remote_comm_id,
            CmMessage::Dreq(m) => m.remote_comm_id,
            CmMessage::SidrReq(_) => 0,
            CmMessage::SidrRep(m) => m.request_id,
        }
    }
}

// The accessors index directly: `parse` has checked the MAD is MAD_LEN
// bytes, and every offset below lies inside it.
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}
/// The top 24 bits of the big-endian word at `at` (a QPN or PSN field).
fn be24(b: &[u8], at: usize) -> u32 {
    be32(b, at) >> 8
}
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
/// The top 24 bits of the word at `at`; its low byte is left alone.
fn put24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&(v & 0x00ff_ffff).to_be_bytes()[1..]);
}
fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

fn parse_path(m: &[u8], at: usize) -> Path {
    Path {
        local_lid: be16(m, at),
        remote_lid: be16(m, at + 2),
        local_gid: array(m, at + 4),
        remote_gid: array(m, at + 20),
        flow_label: be32(m, at + 36) >> 12,
        packet_rate: m[at + 39] & 0x3f,
        traffic_class: m[at + 40],
        hop_limit: m[at + 41],
        sl: m[at + 42] >> 4,
        subnet_local: m[at + 42] & 0x08 != 0,
        local_ack_timeout: m[at + 43] >> 3,
    }
}

fn emit_path(p: &Path, m: &mut [u8], at: usize) {
    put16(m, at, p.local_lid);
    put16(m, at + 2, p.remote_lid);
    m[at + 4..at + 20].copy_from_slice(&p.local_gid);
    m[at + 20..at + 36].copy_from_slice(&p.remote_gid);
    put32(
        m,
        at + 36,
        ((p.flow_label & 0xf_ffff) << 12) | u32::from(p.packet_rate & 0x3f),
    );
    m[at + 40] = p.traffic_class;
    m[at + 41] = p.hop_limit;
    m[at + 42] = (p.sl & 0x0f) << 4 | u8::from(p.subnet_local) << 3;
    m[at + 43] = (p.local_ack_timeout & 0x1f) << 3;
}

/// Parses a CM MAD (the whole 256 bytes of a UD SEND to QP1).
pub fn parse(mad: &[u8]) -> Result<(Header, CmMessage)> {
    if mad.len() != MAD_LEN {
        return Err(Error::Length(mad.len()));
    }
    if mad[0] != BASE_VERSION {
        return Err(Error::BaseVersion(mad[0]));
    }
    if mad[1] != CLASS_CM {
        return Err(Error::Class(mad[1]));
    }
    if mad[2] != CM_CLASS_VERSION {
        return Err(Error::ClassVersion(mad[2]));
    }
    if mad[3] != METHOD_SEND {
        return Err(Error::Method(mad[3]));
    }
    let h = Header {
        status: be16(mad, 4),
        class_specific: be16(mad, 6),
        transaction_id: be64(mad, 8),
        attribute_id: be16(mad, 16),
        attribute_modifier: be32(mad, 20),
    };
    let m = &mad[HEADER_LEN..];
    let ids = |m: &[u8]| Ids {
        local_comm_id: be32(m, 0),
        remote_comm_id: be32(m, 4),
    };
    let msg = match h.attribute_id {
        attr::REQ => CmMessage::Req(Box::new(Req {
            local_comm_id: be32(m, 0),
            service_id: be64(m, 8),
            local_ca_guid: be64(m, 16),
            local_qkey: be32(m, 28),
            local_qpn: be24(m, 32),
            responder_resources: m[35],
            initiator_depth: m[39],
            remote_cm_response_timeout: m[43] >> 3,
            transport_service_type: (m[43] >> 1) & 0x03,
            end_to_end_flow_control: m[43] & 0x01 != 0,
            starting_psn: be24(m, 44),
            local_cm_response_timeout: m[47] >> 3,
            retry_count: m[47] & 0x07,
            partition_key: be16(m, 48),
            path_mtu: m[50] >> 4,
            rdc_exists: m[50] & 0x08 != 0,
            rnr_retry_count: m[50] & 0x07,
            max_cm_retries: m[51] >> 4,
            srq: m[51] & 0x08 != 0,
            primary: parse_path(m, 52),
            private_data: array(m, 140),
        })),
        attr::MRA => CmMessage::Mra(Mra {
            local_comm_id: be32(m, 0),
            remote_comm_id: be32(m, 4),
            message_mraed: m[8] >> 6,
            service_timeout: m[9] >> 3,
        }),
        attr::REJ => CmMessage::Rej(Box::new(Rej {
            local_comm_id: be32(m, 0),
            remote_comm_id: be32(m, 4),
            message_rejected: m[8] >> 6,
            reject_info_len: m[9] >> 1,
            reason: be16(m, 10),
            ari: array(m, 12),
            private_data: array(m, 84),
        })),
        attr::REP => CmMessage::Rep(Box::new(Rep {
            local_comm_id: be32(m, 0),
            remote_comm_id: be32(m, 4),
            local_qkey: be32(m, 8),
            local_qpn: be24(m, 12),
            starting_psn: be24(m, 20),
            responder_resources: m[24],
            initiator_depth: m[25],
            target_ack_delay: m[26] >> 3,
            failover_accepted: (m[26] >> 1) & 0x03,
            end_to_end_flow_control: m[26] & 0x01 != 0,
            rnr_retry_count: m[27] >> 5,
            srq: m[27] & 0x10 != 0,
            local_ca_guid: be64(m, 28),
            private_data: array(m, 36),
        })),
        attr::RTU => CmMessage::Rtu(ids(m)),
        attr::DREQ => CmMessage::Dreq(Dreq {
            local_comm_id: be32(m, 0),
            remote_comm_id: be32(m, 4),
            remote_qpn: be24(m, 8),
        }),
        attr::DREP => CmMessage::Drep(ids(m)),
        attr::SIDR_REQ => CmMessage::SidrReq(Box::new(SidrReq {
            request_id: be32(m, 0),
            partition_key: be16(m, 4),
            service_id: be64(m, 8),
            private_data: array(m, 16),
        })),
        attr::SIDR_REP => CmMessage::SidrRep(Box::new(SidrRep {
            request_id: be32(m, 0),
            status: m[4],
            add_info_len: m[5],
            qpn: be24(m, 8),
            service_id: be64(m, 12),
            qkey: be32(m, 20),
            info: array(m, 24),
            private_data: array(m, 96),
        })),
        other => return Err(Error::Attribute(other)),
    };
    Ok((h, msg))
}

/// Writes `msg` as a whole MAD with `transaction_id`; every reserved bit and
/// unused private byte is zero.
pub fn emit(transaction_id: u64, msg: &CmMessage) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    mad[0] = BASE_VERSION;
    mad[1] = CLASS_CM;
    mad[2] = CM_CLASS_VERSION;
    mad[3] = METHOD_SEND;
    put64(&mut mad, 8, transaction_id);
    put16(&mut mad, 16, msg.attribute_id());
    let m = &mut mad[HEADER_LEN..];
    if !matches!(msg, CmMessage::SidrReq(_) | CmMessage::SidrRep(_)) {
        put32(m, 0, msg.local_comm_id());
        put32(m, 4, msg.remote_comm_id());
    }
    match msg {
        CmMessage::Req(r) => {
            put32(m, 4, 0);
            put64(m, 8, r.service_id);
            put64(m, 16, r.local_ca_guid);
            put32(m, 28, r.local_qkey);
            put24(m, 32, r.local_qpn);
            m[35] = r.responder_resources;
            m[39] = r.initiator_depth;
            m[43] = (r.remote_cm_response_timeout & 0x1f) << 3
                | (r.transport_service_type & 0x03) << 1
                | u8::from(r.end_to_end_flow_control);
            put24(m, 44, r.starting_psn);
            m[47] = (r.local_cm_response_timeout & 0x1f) << 3 | (r.retry_count & 0x07);
            put16(m, 48, r.partition_key);
            m[50] =
                (r.path_mtu & 0x0f) << 4 | u8::from(r.rdc_exists) << 3 | (r.rnr_retry_count & 0x07);
            m[51] = (r.max_cm_retries & 0x0f) << 4 | u8::from(r.srq) << 3;
            emit_path(&r.primary, m, 52);
            m[140..140 + REQ_PRIVATE_LEN].copy_from_slice(&r.private_data);
        }
        CmMessage::Mra(r) => {
            m[8] = (r.message_mraed & 0x03) << 6;
            m[9] = (r.service_timeout & 0x1f) << 3;
        }
        CmMessage::Rej(r) => {
            m[8] = (r.message_rejected & 0x03) << 6;
            m[9] = (r.reject_info_len & 0x7f) << 1;
            put16(m, 10, r.reason);
            m[12..12 + REJ_ARI_LEN].copy_from_slice(&r.ari);
            m[84..84 + REJ_PRIVATE_LEN].copy_from_slice(&r.private_data);
        }
        CmMessage::Rep(r) => {
            put32(m, 8, r.local_qkey);
            put24(m, 12, r.local_qpn);
            put24(m, 20, r.starting_psn);
            m[24] = r.responder_resources;
            m[25] = r.initiator_depth;
            m[26] = (r.target_ack_delay & 0x1f) << 3
                | (r.failover_accepted & 0x03) << 1
                | u8::from(r.end_to_end_flow_control);
            m[27] = (r.rnr_retry_count & 0x07) << 5 | u8::from(r.srq) << 4;
            put64(m, 28, r.local_ca_guid);
            m[36..36 + REP_PRIVATE_LEN].copy_from_slice(&r.private_data);
        }
        CmMessage::Rtu(_) | CmMessage::Drep(_) => {}
        CmMessage::Dreq(r) => put24(m, 8, r.remote_qpn),
        CmMessage::SidrReq(r) => {
            put32(m, 0, r.request_id);
            put16(m, 4, r.partition_key);
            put64(m, 8, r.service_id);
            m[16..16 + SIDR_REQ_PRIVATE_LEN].copy_from_slice(&r.private_data);
        }
        CmMessage::SidrRep(r) => {
            put32(m, 0, r.request_id);
            m[4] = r.status;
            m[5] = r.add_info_len;
            put24(m, 8, r.qpn);
            put64(m, 12, r.service_id);
            put32(m, 20, r.qkey);
            m[24..24 + SIDR_REP_INFO_LEN].copy_from_slice(&r.info);
            m[96..96 + SIDR_REP_PRIVATE_LEN].copy_from_slice(&r.private_data);
        }
    }
    mad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Req {
        let mut private_data = [0u8; REQ_PRIVATE_LEN];
        private_data[1] = 0x40;
        Req {
            local_comm_id: 0x1234_5678,
            service_id: 0x0000_0000_0106_1d2f,
            local_ca_guid: 0x02fe_00ff_fe00_0001,
            local_qkey: 0,
            local_qpn: 0x00_0011,
            responder_resources: 16,
            initiator_depth: 16,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: true,
            starting_psn: 0xab_cdef,
            local_cm_response_timeout: 20,
            retry_count: 7,
            partition_key: 0xffff,
            path_mtu: 5,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            primary: Path {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1],
                remote_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2],
                flow_label: 0xa_bcde,
                packet_rate: 3,
                traffic_class: 106,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: 18,
            },
            private_data,
        }
    }

    #[test]
    fn req_fields_sit_where_ibta_table_106_puts_them() {
        let mad = emit(0x0000_0001_0000_0002, &CmMessage::Req(Box::new(req())));
        assert_eq!(&mad[..4], &[1, 0x07, 2, 0x03]);
        assert_eq!(&mad[16..18], &[0x00, 0x10]);
        let m = &mad[HEADER_LEN..];
        assert_eq!(&m[0..4], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(&m[8..16], &[0, 0, 0, 0, 0x01, 0x06, 0x1d, 0x2f]);
        // Local QPN in the top 24 bits, responder resources in the low byte.
        assert_eq!(&m[32..36], &[0x00, 0x00, 0x11, 16]);
        assert_eq!(m[39], 16);
        // Remote CM response timeout 20 (10100), RC (00), flow control 1.
        assert_eq!(m[43], 0b1010_0001);
        assert_eq!(&m[44..48], &[0xab, 0xcd, 0xef, 0b1010_0111]);
        assert_eq!(&m[48..52], &[0xff, 0xff, 0x57, 0xf0]);
        assert_eq!(&m[52..56], &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&m[68..72], &[198, 18, 0, 1]);
        // Flow label 0xabcde in the top 20 bits, rate 3 in the low 6.
        assert_eq!(&m[88..92], &[0xab, 0xcd, 0xe0, 0x03]);
        assert_eq!(&m[92..96], &[106, 64, 0x00, 18 << 3]);
        assert_eq!(m[141], 0x40);
        let (h, back) = parse(&mad).unwrap();
        assert_eq!(h.transaction_id, 0x0000_0001_0000_0002);
        assert_eq!(back, CmMessage::Req(Box::new(req())));
    }

    #[test]
    fn every_message_round_trips() {
        let mut private = [0u8; REP_PRIVATE_LEN];
        private[0] = 9;
        let msgs = [
            CmMessage::Rep(Box::new(Rep {
                local_comm_id: 7,
                remote_comm_id: 0x1234_5678,
                local_qkey: 0,
                local_qpn: 0x12,
                starting_psn: 0x33_4455,
                responder_resources: 4,
                initiator_depth: 8,
                target_ack_delay: 15,
                failover_accepted: 0,
                end_to_end_flow_control: true,
                rnr_retry_count: 7,
                srq: false,
                local_ca_guid: 9,
                private_data: private,
            })),
            CmMessage::Rtu(Ids {
                local_comm_id: 1,
                remote_comm_id: 2,
            }),
            CmMessage::Dreq(Dreq {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn: 0x11,
            }),
            CmMessage::Drep(Ids {
                local_comm_id: 2,
                remote_comm_id: 1,
            }),
            CmMessage::Mra(Mra {
                local_comm_id: 2,
                remote_comm_id: 1,
                message_mraed: answers::REQ,
                service_timeout: 20,
            }),
            CmMessage::Rej(Box::new(Rej {
                local_comm_id: 2,
                remote_comm_id: 1,
                message_rejected: answers::REQ,
                reject_info_len: 0,
                reason: 28,
                ari: [0; REJ_ARI_LEN],
                private_data: [0; REJ_PRIVATE_LEN],
            })),
        ];
        for msg in msgs {
            let mad = emit(5, &msg);
            assert_eq!(
                parse(&mad).unwrap(),
                (
                    Header {
                        transaction_id: 5,
                        attribute_id: msg.attribute_id(),
                        ..Header::default()
                    },
                    msg.clone()
                )
            );
        }
        // REP: RNR retry count in the top 3 bits of byte 27 (IBTA table 110).
        let rep = emit(
            5,
            &CmMessage::Rep(Box::new(Rep {
                local_comm_id: 0,
                remote_comm_id: 0,
                local_qkey: 0,
                local_qpn: 0,
                starting_psn: 0,
                responder_resources: 0,
                initiator_depth: 0,
                target_ack_delay: 0,
                failover_accepted: 0,
                end_to_end_flow_control: false,
                rnr_retry_count: 7,
                srq: false,
                local_ca_guid: 0,
                private_data: [0; REP_PRIVATE_LEN],
            })),
        );
        assert_eq!(rep[HEADER_LEN + 27], 0xe0);
    }

    /// `ib_send_bw -R -c UD` between two rxe peers (perftest 4.5, Debian
    /// 12), the MADs of the SIDR_REQ and SIDR_REP it sent.
    #[test]
    fn sidr_messages_match_an_rxe_capture() {
        let mut req = [0u8; MAD_LEN];
        req[..24].copy_from_slice(&[
            0x01, 0x07, 0x02, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x02, 0xb8, 0x47, 0xee, 0x94, 0x00, 0x17,
            0, 0, 0, 0, 0, 0,
        ]);
        req[24..48].copy_from_slice(&[
            0x94, 0xee, 0x47, 0xb8, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0x01, 0x11, 0x48, 0x53, 0x00,
            0x40, 0xbb, 0x38, 0, 0, 0, 0,
        ]);
        req[60..64].copy_from_slice(&[10, 77, 0, 11]);
        req[76..80].copy_from_slice(&[10, 77, 0, 10]);
        let (h, msg) = parse(&req).unwrap();
        assert_eq!(h.transaction_id, 0x0000_0002_b847_ee94);
        let CmMessage::SidrReq(r) = &msg else {
            panic!("{msg:?}")
        };
        assert_eq!(r.request_id, 0x94ee_47b8);
        assert_eq!(r.partition_key, 0xffff);
        // rdma_cm's UDP port space (0x0111), port 18515.
        assert_eq!(r.service_id, 0x0111_4853);
        assert_eq!(&r.private_data[..4], &[0x00, 0x40, 0xbb, 0x38]);
        assert_eq!(emit(h.transaction_id, &msg), req);

        let mut rep = [0u8; MAD_LEN];
        rep[..24].copy_from_slice(&req[..24]);
        rep[17] = 0x18;
        rep[24..48].copy_from_slice(&[
            0x94, 0xee, 0x47, 0xb8, 0, 0, 0, 0, 0x00, 0x00, 0x12, 0x00, 0, 0, 0, 0, 0x01, 0x11,
            0x48, 0x53, 0x01, 0x23, 0x45, 0x67,
        ]);
        let (_, msg) = parse(&rep).unwrap();
        let want = SidrRep {
            request_id: 0x94ee_47b8,
            status: sidr_status::SUCCESS,
            add_info_len: 0,
            qpn: 0x12,
            service_id: 0x0111_4853,
            qkey: 0x0123_4567,
            info: [0; SIDR_REP_INFO_LEN],
            private_data: [0; SIDR_REP_PRIVATE_LEN],
        };
        assert_eq!(msg, CmMessage::SidrRep(Box::new(want)));
        assert_eq!(msg.remote_comm_id(), 0x94ee_47b8);
        assert_eq!(emit(h.transaction_id, &msg), rep);
    }

    #[test]
    fn other_mads_are_refused() {
        let mut mad = emit(
            1,
            &CmMessage::Rtu(Ids {
                local_comm_id: 1,
                remote_comm_id: 2,
            }),
        );
        assert_eq!(parse(&mad[..255]), Err(Error::Length(255)));
        mad[1] = 0x01;
        assert_eq!(parse(&mad), Err(Error::Class(0x01)));
        mad[1] = CLASS_CM;
        mad[17] = 0x19;
        assert_eq!(parse(&mad), Err(Error::Attribute(0x19)));
    }
}
