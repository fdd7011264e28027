//! Atomic Acknowledge Extended Transport Header: the original remote data
//! (8 bytes, IBTA §9.3.6; ib_pack.h `IB_ATMACK_BYTES`).

use super::error::{check_len, Layer, Result};
use super::field::*;

pub const HEADER_LEN: usize = 8;

/// A zero-copy view of an AtomicAckETH.
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
        check_len(Layer::AtomicAckEth, self.buffer.as_ref(), HEADER_LEN)
    }
    pub fn orig_data(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_orig_data(&mut self, v: u64) {
        put64(self.buffer.as_mut(), 0, v);
    }
}

/// A parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr {
    pub orig_data: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            orig_data: p.orig_data(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_orig_data(self.orig_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let bytes = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
        let r = Repr {
            orig_data: 0x0102_0304_0506_0708,
        };
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
            r
        );
        let mut buf = [0u8; 8];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..7]).is_err());
    }
}
