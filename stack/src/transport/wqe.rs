//! Work requests going in, work completions coming out (the shapes of
//! ibv_send_wr / ibv_recv_wr / ibv_wc), and the queue entries the core keeps.

use super::qp::Path;

/// One scatter/gather element: `length` bytes at `addr` of the region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Most SGEs a work request may carry (rxe: RXE_MAX_SGE = 32; the issue asks for 30).
pub const MAX_SGE: usize = 30;

/// The operation of a send work request, with its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm {
        imm: u32,
    },
    SendWithInv {
        invalidate_rkey: u32,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    AtomicCmpSwp {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    AtomicFetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

impl SendOp {
    pub fn is_read(&self) -> bool {
        matches!(self, SendOp::RdmaRead { .. })
    }
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }
    pub fn is_read_or_atomic(&self) -> bool {
        self.is_read() || self.is_atomic()
    }
    pub fn is_send(&self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
        )
    }
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpSwp { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// `ibv_send_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// Wait for earlier READ/atomic WRs to complete first (IBV_SEND_FENCE).
    pub fence: bool,
    /// Generate a completion even if the QP was created with `sq_sig_all` off.
    pub signaled: bool,
    /// Set the solicited-event bit on the last packet.
    pub solicited: bool,
    /// Copy the payload at post time from `SendWr::inline_data`.
    pub inline: bool,
}

/// Where a UD send goes: an address handle plus the remote QP and its Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub path: Path,
    pub remote_qpn: u32,
    /// With the high bit set the QP's own Q_Key is used instead (IBTA C10-15).
    pub remote_qkey: u32,
}

/// A send work request (ibv_send_wr). With `flags.inline`, the payload is
/// `inline_data` and `sg_list` is ignored.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub sg_list: &'a [Sge],
    pub inline_data: &'a [u8],
    pub flags: SendFlags,
    pub ud: Option<UdDest>,
}

impl<'a> SendWr<'a> {
    /// A signaled work request with no inline data and no UD destination.
    pub fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            sg_list,
            inline_data: &[],
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
            ud: None,
        }
    }
}

/// A receive work request (ibv_recv_wr).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sg_list: &'a [Sge],
}

/// `ibv_wc_status`, with ibverbs' numeric values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    FatalErr = 19,
    GeneralErr = 21,
}

/// `ibv_wc_opcode`, with ibverbs' numeric values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// A work completion (ibv_wc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    /// IBV_WC_WITH_IMM: the immediate, as the 32-bit value the sender posted.
    pub imm_data: Option<u32>,
    /// IBV_WC_WITH_INV: the rkey the sender invalidated.
    pub invalidated_rkey: Option<u32>,
    pub qp_num: u32,
    /// UD: the sending QP.
    pub src_qp: u32,
    /// UD: a 40-byte GRH area heads the receive buffer (IBV_WC_GRH).
    pub grh: bool,
    /// UD: the packet came over IPv4, so the GRH area holds its IPv4 header
    /// in its last 20 bytes; else over IPv6, the whole area (the kernel's
    /// `ib_wc.network_hdr_type`, which `ibv_wc` has no field for).
    pub ipv4: bool,
    /// Whether the message carried the solicited-event bit.
    pub solicited: bool,
}

impl WorkCompletion {
    pub(crate) fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: 0,
            grh: false,
            ipv4: false,
            solicited: false,
        }
    }
}

/// Where a send queue entry is in its life (rxe: wqe_state_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeState {
    /// Posted, no packet sent yet.
    Posted,
    /// Some packets sent, more to send.
    Processing,
    /// Every packet sent; waiting for the ACK / response.
    Pending,
}

/// A send queue entry. Slots are reused so posting does not allocate once the
/// SGE and inline buffers have grown to their cap.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: SendOp,
    pub flags: SendFlags,
    pub sges: Vec<Sge>,
    pub inline: Vec<u8>,
    pub ud: Option<UdDest>,
    /// Message length in bytes.
    pub len: u64,
    pub state: WqeState,
    pub first_psn: u32,
    pub last_psn: u32,
    /// Bytes of the message already put on the wire (the next packet's offset).
    pub sent: u64,
    /// Counted against max_rd_atomic.
    pub rd_counted: bool,
}

impl SendWqe {
    pub fn empty() -> SendWqe {
        SendWqe {
            wr_id: 0,
            op: SendOp::Send,
            flags: SendFlags::default(),
            sges: Vec::new(),
            inline: Vec::new(),
            ud: None,
            len: 0,
            state: WqeState::Posted,
            first_psn: 0,
            last_psn: 0,
            sent: 0,
            rd_counted: false,
        }
    }
}

/// A receive queue entry.
#[derive(Debug, Clone, Default)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
    pub len: u64,
}

impl RecvWqe {
    pub fn fill(&mut self, wr: &RecvWr<'_>) {
        self.wr_id = wr.wr_id;
        self.sges.clear();
        self.sges.extend_from_slice(wr.sg_list);
        self.len = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    }
}

/// A fixed-capacity ring of reusable slots (send and receive queues).
///
/// The slot array is rounded up to a power of two (as rxe_queue.c does) so
/// that finding a slot is a mask, not a 64-bit division: the requester,
/// responder and completer look slots up several times per packet. The
/// queue still holds at most the `cap` entries it was created with.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    slots: Vec<T>,
    /// `slots.len() - 1`.
    mask: u64,
    cap: u64,
    /// Oldest entry, counted from zero forever (slot = head & mask).
    pub head: u64,
    /// One past the newest entry.
    pub tail: u64,
}

impl<T: Clone> Ring<T> {
    pub fn new(cap: usize, empty: T) -> Ring<T> {
        let cap = cap.max(1);
        let n = cap.next_power_of_two();
        Ring {
            slots: vec![empty; n],
            mask: n as u64 - 1,
            cap: cap as u64,
            head: 0,
            tail: 0,
        }
    }
    pub fn cap(&self) -> u64 {
        self.cap
    }
    pub fn len(&self) -> u64 {
        self.tail - self.head
    }
    pub fn is_empty(&self) -> bool {
        self.tail == self.head
    }
    pub fn is_full(&self) -> bool {
        self.len() >= self.cap()
    }
    fn idx(&self, i: u64) -> usize {
        (i & self.mask) as usize
    }
    pub fn at(&self, i: u64) -> &T {
        &self.slots[self.idx(i)]
    }
    pub fn at_mut(&mut self, i: u64) -> &mut T {
        let k = self.idx(i);
        &mut self.slots[k]
    }
    /// The slot to fill for the next push (caller then calls `commit_push`).
    pub fn next_slot(&mut self) -> Option<&mut T> {
        if self.is_full() {
            return None;
        }
        let t = self.tail;
        Some(self.at_mut(t))
    }
    pub fn commit_push(&mut self) {
        self.tail += 1;
    }
    pub fn pop(&mut self) {
        if self.head < self.tail {
            self.head += 1;
        }
    }
    pub fn clear(&mut self) {
        self.head = self.tail;
    }
}
