//! Immediate Data Extended Transport Header: 4 bytes of immediate data (IBTA §9.3.7),
//! carried in network byte order.

use super::error::{check_len, Layer, Result};
use super::field::*;

pub const HEADER_LEN: usize = 4;

/// A zero-copy view of an ImmDt header.
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
        check_len(Layer::ImmDt, self.buffer.as_ref(), HEADER_LEN)
    }
    pub fn imm(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_imm(&mut self, v: u32) {
        put32(self.buffer.as_mut(), 0, v);
    }
}

/// A parsed ImmDt header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr {
    pub imm: u32,
}

impl Repr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { imm: p.imm() })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_imm(self.imm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let bytes = 0x1234_5678u32.to_be_bytes();
        let r = Repr { imm: 0x1234_5678 };
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
            r
        );
        let mut buf = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..3]).is_err());
    }
}
