//! ferroce-verbs: the user-facing, ibverbs-shaped API of ferroce.
//!
//! It joins one `ferroce-stack` transport core and one `ferroce-nic` packet
//! engine into a device that applications program the way they program
//! rdma-core (context, protection domain, memory region, completion queue,
//! queue pair, `post_send` / `post_recv` / `poll_cq`). It also holds the
//! out-of-band connection set-up compatible with `ibv_rc_pingpong` and
//! perftest, and the `ferroce` command-line tool.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod cm;
pub mod context;
pub mod counters;
pub mod cq;
pub mod decode;
pub mod device;
pub mod engine;
pub mod error;
pub mod exchange;
pub mod mr;
pub mod multicast;
pub mod pd;
pub mod perf;
pub mod qp;
pub mod soak;
pub mod srq;
pub mod wc;

pub use context::{Context, DeviceAttr, DeviceStats, OpenOptions, PortAttr, WeakContext};
pub use cq::CompletionQueue;
pub use device::{Backend, DeviceConfig};
pub use engine::{EngineMode, PortEvent};
pub use error::{Error, Result};
/// The work-request, completion and attribute types come straight from the core.
pub use ferroce_stack::transport::{
    AccessFlags, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr,
    Sge, UdDest, WcOpcode, WcStatus, WorkCompletion,
};
pub use mr::MemoryRegion;
pub use pd::ProtectionDomain;
pub use qp::{ConnectOptions, QpBuilder, QueuePair, RemoteQp};
pub use srq::SharedReceiveQueue;
