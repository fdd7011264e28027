//! Datagram Extended Transport Header: Q_Key and source QP (8 bytes, IBTA §9.3.2).

use super::error::{check_len, Layer, Result};
use super::field::*;

mod field {
    pub const QKEY: usize = 0;
    pub const RESV: usize = 4;
    pub const SRC_QP: usize = 5;
}
pub const HEADER_LEN: usize = 8;

/// A zero-copy view of a DETH.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Deth, self.buffer.as_ref(), HEADER_LEN)
    }
    pub fn qkey(&self) -> u32 {
        be32(self.buffer.as_ref(), field::QKEY)
    }
    pub fn src_qp(&self) -> u32 {
        be24(self.buffer.as_ref(), field::SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_qkey(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::QKEY, v);
    }
    /// Writes the source QP; the reserved byte before it is sent as zero.
    pub fn set_src_qp(&mut self, v: u32) {
        self.buffer.as_mut()[field::RESV] = 0;
        put24(self.buffer.as_mut(), field::SRC_QP, v & 0x00ff_ffff);
    }
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr {
    pub qkey: u32,
    /// 24-bit source QP number.
    pub src_qp: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_qkey(self.qkey);
        p.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let bytes = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x12];
        let r = Repr {
            qkey: 0x1111_1111,
            src_qp: 0x12,
        };
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
            r
        );
        let mut buf = [0xffu8; 8];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..7]).is_err());
    }
}
