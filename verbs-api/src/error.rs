//! The verbs layer's error type: what went wrong, in which object, and why.

use ferroce_nic::NicError;
use ferroce_stack::transport::VerbsError;

/// Errors of the verbs API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The transport core refused the call (bad attribute, full queue, wrong state, ...).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The packet engine failed.
    #[error("packet engine: {0}")]
    Nic(#[from] NicError),
    /// No backend could be opened on the interface.
    #[error("no usable device: {0}")]
    NoDevice(String),
    /// `query_gid` / `modify` with a GID index the table does not have.
    #[error("GID index {index} is out of range (the table has {len} entries)")]
    GidIndex { index: usize, len: usize },
    /// The peer's MAC address could not be found for a raw backend.
    #[error("GID index {index} ({gid}) cannot be used here: {reason}")]
    GidUnusable {
        index: usize,
        gid: std::net::Ipv6Addr,
        reason: String,
    },

    #[error("cannot reach {ip}: {reason}")]
    Unreachable {
        ip: std::net::IpAddr,
        reason: String,
    },
    /// An access to a memory region outside its bounds.
    #[error("{len} bytes at offset {offset} are outside the {size}-byte memory region")]
    OutOfBounds { offset: u64, len: usize, size: u64 },
    /// Waiting for a completion or an event took longer than allowed.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(std::time::Duration, &'static str),
    /// The engine thread stopped (it hit an I/O error; see the log).
    #[error("the engine stopped: {0}")]
    EngineStopped(String),
    /// An I/O error outside the packet engine (files, commands).
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    /// The peer's connection manager refused the connection (a CM REJ).
    #[error("connection rejected by the peer: reason {reason} ({})", crate::cm::reject_reason_name(*reason))]
    Rejected { reason: u16 },
    /// The peer's connection manager answered a SIDR request with a status
    /// other than success.
    #[error("service ID resolution refused by the peer: status {status} ({})", ferroce_stack::wire::mad::sidr_status::name(*status))]
    SidrRefused { status: u8 },
    /// A connection-manager exchange went wrong (an unexpected message).
    #[error("connection manager: {0}")]
    Cm(String),
    /// The soak found lost or wrong data, a failed work request or a stuck QP.
    #[error("soak: {0}")]
    Soak(String),
}

/// The verbs layer's result type.
pub type Result<T> = std::result::Result<T, Error>;
