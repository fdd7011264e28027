//! The RoCE v2 wire format.
//!
//! One module per header, each a zero-copy `Packet<T>` view (checked once
//! with `new_checked`, after which no accessor panics) plus a plain `Repr`
//! value with `parse` / `emit` / `buffer_len`, in the manner of smoltcp's
//! `wire`. Ethernet, IPv4, IPv6 and UDP come from smoltcp itself;
//! [`packet`] puts a whole frame together and takes one apart.

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cnp;
pub mod deth;
mod error;
mod field;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod reth;
pub mod sample;

pub use error::{Error, Layer, Result};
pub use opcode::{Ext, OpKind, Opcode, OpcodeInfo, Position, Transport, OPCODES};
pub use packet::{
    pad_for, EthernetHeader, ExtHeaders, IpHeader, PacketRepr, ParsedPacket, VlanTag, MAX_PAYLOAD,
    ROCEV2_UDP_PORT,
};
