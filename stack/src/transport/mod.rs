//! The sans-IO transport core: RC, UC and UD queue pairs over RoCE v2.
//!
//! [`Core`] holds protection domains, memory regions, CQs, SRQs and QPs, and
//! is driven by `handle_frame` / `poll_transmit` / `poll_timeout` /
//! `handle_timeout` with time passed in (see [`device`] for the call order).
//! Behaviour follows the IBTA spec and Linux rxe: requester
//! ([`requester`]), responder ([`responder`]) and completer ([`completer`]).

pub mod completer;
pub mod counters;
pub mod cq;
pub mod device;
pub mod dma;
pub mod error;
pub mod mcast;
pub mod mr;
pub mod psn;
pub mod qp;
pub mod requester;
pub mod responder;
pub mod split;
pub mod srq;
pub mod timers;
pub mod wqe;

pub use counters::{HwCounter, HwCounters};
pub use cq::CqHandle;
pub use device::{AsyncEvent, Config, Core, Stats};
pub use error::{ModifyError, VerbsError};
pub use mcast::{is_multicast_gid, MULTICAST_QPN};
pub use mr::{copy_bytes, copy_piece, AccessFlags, MemoryRegion, OutOfBounds, PdHandle, VecRegion};
pub use qp::{Path, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType};
pub use split::{TxPayload, TxSplit};
pub use srq::SrqHandle;
pub use timers::Instant;
pub use wqe::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion};

/// A buffer this long holds any frame the core emits: Ethernet + 802.1Q (18),
/// IPv6 (40), UDP (8), BTH + the longest extension headers (40), 4096 bytes
/// of payload and the ICRC (4).
pub const MAX_FRAME_LEN: usize = 18 + 40 + 8 + 40 + 4096 + 4;
