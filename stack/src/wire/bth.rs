//! Base Transport Header (IBTA Vol 1 §9.2; Linux include/rdma/ib_pack.h).
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! | OpCode |S|M|Pad|TVer|     P_Key    |
//! +--------+--------+--------+--------+
//! |F|B|resv|        Dest QP            |
//! +--------+--------+--------+--------+
//! |A| resv |          PSN              |
//! +--------+--------+--------+--------+
//! ```

use super::error::{check_len, Error, Layer, Result};
use super::field::*;
use super::opcode::Opcode;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const ECN_RESV: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK_RESV: usize = 8;
    pub const PSN: usize = 9;
}

/// BTH length in bytes.
pub const HEADER_LEN: usize = 12;
/// Byte offset of the FECN/BECN/resv byte, masked to ones in the ICRC.
pub const ECN_BYTE: usize = field::ECN_RESV;

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_MASK: u8 = 0x30;
const PAD_SHIFT: u8 = 4;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;
/// PSNs and QP numbers are 24 bits wide.
pub const MASK_24: u32 = 0x00ff_ffff;
/// The default partition key (IBTA §10.9.1.2).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// A zero-copy view of a BTH.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap without checking the length; accessors may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wrap and check the length, so no accessor can panic.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }
    /// Fails with [`Error::Truncated`] unless the buffer holds a whole BTH.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Bth, self.buffer.as_ref(), HEADER_LEN)
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }
    pub fn pkey(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PKEY)
    }
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::ECN_RESV] & FECN != 0
    }
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::ECN_RESV] & BECN != 0
    }
    pub fn dest_qp(&self) -> u32 {
        be24(self.buffer.as_ref(), field::DEST_QP)
    }
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_RESV] & ACK_REQ != 0
    }
    pub fn psn(&self) -> u32 {
        be24(self.buffer.as_ref(), field::PSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = op.0;
    }
    /// Writes SE, MigReq, PadCnt and TVer at once.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        let mut b = (pad_count << PAD_SHIFT) & PAD_MASK | (tver & TVER_MASK);
        if solicited {
            b |= SE;
        }
        if mig_req {
            b |= MIG_REQ;
        }
        self.buffer.as_mut()[field::FLAGS] = b;
    }
    pub fn set_pad_count(&mut self, pad: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !PAD_MASK) | ((pad << PAD_SHIFT) & PAD_MASK);
    }
    pub fn set_pkey(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::PKEY, v);
    }
    /// Writes FECN and BECN; the six reserved bits are sent as zero.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::ECN_RESV] =
            if fecn { FECN } else { 0 } | if becn { BECN } else { 0 };
    }
    pub fn set_dest_qp(&mut self, qpn: u32) {
        put24(self.buffer.as_mut(), field::DEST_QP, qpn & MASK_24);
    }
    /// Writes AckReq; the seven reserved bits are sent as zero.
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_RESV] = if v { ACK_REQ } else { 0 };
    }
    pub fn set_psn(&mut self, psn: u32) {
        put24(self.buffer.as_mut(), field::PSN, psn & MASK_24);
    }
}

/// A parsed BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    /// Pad bytes after the payload (0..=3). The whole-frame emitter computes it.
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// 24-bit destination QP number.
    pub dest_qp: u32,
    pub ack_req: bool,
    /// 24-bit packet sequence number.
    pub psn: u32,
}

impl Repr {
    /// Parse a BTH; rejects a transport version other than 0 (IBTA C9-? : TVer must be 0).
    /// Always inlined: returned through memory, its fields written one by one
    /// and read back whole stalled every receive (store-to-load forwarding).
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if p.tver() != 0 {
            return Err(Error::BthVersion(p.tver()));
        }
        Ok(Repr {
            opcode: p.opcode(),
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Emit into a view whose length was checked.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_opcode(self.opcode);
        p.set_flags(self.solicited, self.mig_req, self.pad_count, 0);
        p.set_pkey(self.pkey);
        p.set_ecn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An RC SEND_ONLY to QP 0x11, PSN 0x123456, AckReq, pad 2, SE, default P_Key.
    static BYTES: [u8; 12] = [
        0x04, 0xa0, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56,
    ];

    fn repr() -> Repr {
        Repr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: true,
            mig_req: false,
            pad_count: 2,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 0x12_3456,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_SEND_ONLY);
        assert!(p.solicited());
        assert_eq!(p.pad_count(), 2);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), 0xffff);
        assert_eq!(p.dest_qp(), 0x11);
        assert!(p.ack_req());
        assert_eq!(p.psn(), 0x12_3456);
    }

    #[test]
    fn parse_emit_golden() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
        let mut buf = [0u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated_and_tver() {
        assert_eq!(
            Packet::new_checked(&BYTES[..11]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Bth,
                needed: 12,
                have: 11
            }
        );
        let mut b = BYTES;
        b[1] |= 0x01;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap_err(), Error::BthVersion(1));
    }
}
