//! The opcode table: for every opcode we speak, its transport, the extension
//! headers that follow the BTH (in order), whether it carries payload, and
//! its place in a message.
//!
//! One declarative list generates the constants, the table and the lookup
//! (source: Linux include/rdma/ib_pack.h, drivers/infiniband/sw/rxe/rxe_opcode.c,
//! IBTA Vol 1 Table 38; CNP: IBTA Annex A17).

use super::error::{Error, Result};
use super::{aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, ieth, immdt, reth};
use core::fmt;

/// A BTH opcode byte. Any value can be held; [`Opcode::info`] tells whether it is one we speak.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Opcode(pub u8);

/// The transport service an opcode belongs to (top three bits of the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Transport {
    /// Reliable Connected (0x00–0x1F).
    Rc,
    /// Unreliable Connected (0x20–0x3F).
    Uc,
    /// Unreliable Datagram (0x60–0x7F).
    Ud,
    /// RoCE v2 Congestion Notification Packet (0x81).
    Cnp,
}

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum OpKind {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Acknowledge,
    AtomicAck,
    CompareSwap,
    FetchAdd,
    Cnp,
}

/// The packet's place within its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

/// An extension header that may follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Ext {
    Reth,
    Aeth,
    AtomicEth,
    AtomicAckEth,
    ImmDt,
    Ieth,
    Deth,
    Cnp,
}

impl Ext {
    /// Length of the header in bytes.
    pub const fn header_len(self) -> usize {
        match self {
            Ext::Reth => reth::HEADER_LEN,
            Ext::Aeth => aeth::HEADER_LEN,
            Ext::AtomicEth => atomic_eth::HEADER_LEN,
            Ext::AtomicAckEth => atomic_ack_eth::HEADER_LEN,
            Ext::ImmDt => immdt::HEADER_LEN,
            Ext::Ieth => ieth::HEADER_LEN,
            Ext::Deth => deth::HEADER_LEN,
            Ext::Cnp => cnp::HEADER_LEN,
        }
    }
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OpcodeInfo {
    pub opcode: Opcode,
    /// The name as in ib_pack.h without the `IB_OPCODE_` prefix.
    pub name: &'static str,
    pub transport: Transport,
    pub kind: OpKind,
    pub position: Position,
    /// Extension headers after the BTH, in wire order.
    pub headers: &'static [Ext],
    pub has_payload: bool,
}

impl OpcodeInfo {
    /// BTH plus extension headers, in bytes.
    pub const fn header_len(&self) -> usize {
        let mut n = bth::HEADER_LEN;
        let mut i = 0;
        while i < self.headers.len() {
            n += self.headers[i].header_len();
            i += 1;
        }
        n
    }
    pub fn has(&self, ext: Ext) -> bool {
        self.headers.contains(&ext)
    }
    /// True for packets a requester sends (the responder handles them).
    pub fn is_request(&self) -> bool {
        !matches!(
            self.kind,
            OpKind::ReadResponse | OpKind::Acknowledge | OpKind::AtomicAck | OpKind::Cnp
        )
    }
    pub fn is_first_or_only(&self) -> bool {
        matches!(self.position, Position::First | Position::Only)
    }
    pub fn is_last_or_only(&self) -> bool {
        matches!(self.position, Position::Last | Position::Only)
    }
}

macro_rules! opcode_table {
    ($( $konst:ident = $val:literal, $transport:ident, $kind:ident, $pos:ident, [$($ext:ident),*], $payload:literal; )*) => {
        impl Opcode {
            $( pub const $konst: Opcode = Opcode($val); )*
        }
        /// Every opcode we speak, in numeric order.
        pub static OPCODES: &[OpcodeInfo] = &[
            $( OpcodeInfo {
                opcode: Opcode($val),
                name: stringify!($konst),
                transport: Transport::$transport,
                kind: OpKind::$kind,
                position: Position::$pos,
                headers: &[$(Ext::$ext),*],
                has_payload: $payload,
            }, )*
        ];
    };
}

opcode_table! {
    RC_SEND_FIRST          = 0x00, Rc, Send,         First,  [],                   true;
    RC_SEND_MIDDLE         = 0x01, Rc, Send,         Middle, [],                   true;
    RC_SEND_LAST           = 0x02, Rc, Send,         Last,   [],                   true;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, Rc, Send,    Last,   [ImmDt],              true;
    RC_SEND_ONLY           = 0x04, Rc, Send,         Only,   [],                   true;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, Rc, Send,    Only,   [ImmDt],              true;
    RC_RDMA_WRITE_FIRST    = 0x06, Rc, Write,        First,  [Reth],               true;
    RC_RDMA_WRITE_MIDDLE   = 0x07, Rc, Write,        Middle, [],                   true;
    RC_RDMA_WRITE_LAST     = 0x08, Rc, Write,        Last,   [],                   true;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, Rc, Write, Last, [ImmDt],            true;
    RC_RDMA_WRITE_ONLY     = 0x0a, Rc, Write,        Only,   [Reth],               true;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, Rc, Write, Only, [Reth, ImmDt],      true;
    RC_RDMA_READ_REQUEST   = 0x0c, Rc, ReadRequest,  Only,   [Reth],               false;
    RC_RDMA_READ_RESPONSE_FIRST  = 0x0d, Rc, ReadResponse, First,  [Aeth],         true;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, Rc, ReadResponse, Middle, [],             true;
    RC_RDMA_READ_RESPONSE_LAST   = 0x0f, Rc, ReadResponse, Last,   [Aeth],         true;
    RC_RDMA_READ_RESPONSE_ONLY   = 0x10, Rc, ReadResponse, Only,   [Aeth],         true;
    RC_ACKNOWLEDGE         = 0x11, Rc, Acknowledge,  Only,   [Aeth],               false;
    RC_ATOMIC_ACKNOWLEDGE  = 0x12, Rc, AtomicAck,    Only,   [Aeth, AtomicAckEth], false;
    RC_COMPARE_SWAP        = 0x13, Rc, CompareSwap,  Only,   [AtomicEth],          false;
    RC_FETCH_ADD           = 0x14, Rc, FetchAdd,     Only,   [AtomicEth],          false;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, Rc, Send,   Last,   [Ieth],               true;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, Rc, Send,   Only,   [Ieth],               true;
    UC_SEND_FIRST          = 0x20, Uc, Send,         First,  [],                   true;
    UC_SEND_MIDDLE         = 0x21, Uc, Send,         Middle, [],                   true;
    UC_SEND_LAST           = 0x22, Uc, Send,         Last,   [],                   true;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, Uc, Send,    Last,   [ImmDt],              true;
    UC_SEND_ONLY           = 0x24, Uc, Send,         Only,   [],                   true;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, Uc, Send,    Only,   [ImmDt],              true;
    UC_RDMA_WRITE_FIRST    = 0x26, Uc, Write,        First,  [Reth],               true;
    UC_RDMA_WRITE_MIDDLE   = 0x27, Uc, Write,        Middle, [],                   true;
    UC_RDMA_WRITE_LAST     = 0x28, Uc, Write,        Last,   [],                   true;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, Uc, Write, Last, [ImmDt],            true;
    UC_RDMA_WRITE_ONLY     = 0x2a, Uc, Write,        Only,   [Reth],               true;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, Uc, Write, Only, [Reth, ImmDt],      true;
    UD_SEND_ONLY           = 0x64, Ud, Send,         Only,   [Deth],               true;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, Ud, Send,    Only,   [Deth, ImmDt],        true;
    CNP                    = 0x81, Cnp, Cnp,         Only,   [Cnp],                false;
}

/// Opcode byte → index into [`OPCODES`] (0xff = not an opcode we speak).
static INDEX: [u8; 256] = {
    let mut idx = [0xffu8; 256];
    let mut i = 0;
    while i < OPCODES.len() {
        idx[OPCODES[i].opcode.0 as usize] = i as u8;
        i += 1;
    }
    idx
};

impl Opcode {
    /// The table row, or [`Error::UnknownOpcode`] for reserved values and for
    /// transports we do not speak (RD, XRC, ...).
    #[inline]
    pub fn info(self) -> Result<&'static OpcodeInfo> {
        let i = INDEX[usize::from(self.0)];
        OPCODES
            .get(usize::from(i))
            .ok_or(Error::UnknownOpcode(self.0))
    }
    /// The ib_pack.h-style name, or `"UNKNOWN"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot of the whole table: any change to it must be deliberate.
    #[test]
    fn table_snapshot() {
        let mut out = String::new();
        for i in OPCODES {
            out += &format!(
                "{:#04x} {} {:?} {:?} {:?} {:?} payload={} hdr={}\n",
                i.opcode.0,
                i.name,
                i.transport,
                i.kind,
                i.position,
                i.headers,
                i.has_payload,
                i.header_len()
            );
        }
        let expected = include_str!("opcode_table.snap");
        assert_eq!(out, expected, "opcode table changed:\n{out}");
    }

    #[test]
    fn every_byte_is_known_or_a_typed_error() {
        let mut known = 0;
        for b in 0..=255u8 {
            match Opcode(b).info() {
                Ok(i) => {
                    assert_eq!(i.opcode.0, b);
                    known += 1;
                }
                Err(e) => assert_eq!(e, Error::UnknownOpcode(b)),
            }
        }
        assert_eq!(known, OPCODES.len());
        assert_eq!(known, 38);
        // 0x15 RESYNC (RD only) and 0x40.. RD are not spoken.
        assert!(Opcode(0x15).info().is_err());
        assert!(Opcode(0x40).info().is_err());
    }

    #[test]
    fn header_lengths_match_rxe() {
        // rxe_opcode.c: RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE has 12+16+4 bytes of headers.
        assert_eq!(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .header_len(),
            32
        );
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap().header_len(),
            24
        );
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().header_len(), 40);
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .header_len(),
            24
        );
    }
}
