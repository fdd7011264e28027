//! ferroce-stack: the RoCE v2 protocol itself, with no I/O.
//!
//! - [`wire`]: every header of a RoCE v2 frame as a zero-copy view plus a
//!   plain `Repr` value (parse / emit / buffer_len), the opcode table, the
//!   ICRC, and a whole-frame codec (Ethernet, optional 802.1Q tag, IPv4 or
//!   IPv6, UDP 4791, BTH, extension headers, payload, pad, ICRC).
//! - `transport` (sans-IO): queue pairs, requester / responder / completer,
//!   memory regions, completion and shared receive queues. Frames in, frames
//!   out, time passed in; no sockets, threads or clocks.
#![forbid(unsafe_code)]
// Nothing a peer sends may unwrap; tests may.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod sim;
pub mod transport;
pub mod wire;
