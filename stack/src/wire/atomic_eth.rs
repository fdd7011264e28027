//! Atomic Extended Transport Header: VA, R_Key, swap (or add) data, compare
//! data (28 bytes, IBTA §9.3.4; ib_pack.h `IB_ATMETH_BYTES`).

use super::error::{check_len, Layer, Result};
use super::field::*;

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const SWAP_ADD: usize = 12;
    pub const COMPARE: usize = 20;
}
pub const HEADER_LEN: usize = 28;

/// A zero-copy view of an AtomicETH.
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
        check_len(Layer::AtomicEth, self.buffer.as_ref(), HEADER_LEN)
    }
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), field::VA)
    }
    pub fn rkey(&self) -> u32 {
        be32(self.buffer.as_ref(), field::RKEY)
    }
    pub fn swap_add(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SWAP_ADD)
    }
    pub fn compare(&self) -> u64 {
        be64(self.buffer.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_va(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::VA, v);
    }
    pub fn set_rkey(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::RKEY, v);
    }
    pub fn set_swap_add(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::SWAP_ADD, v);
    }
    pub fn set_compare(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::COMPARE, v);
    }
}

/// A parsed AtomicETH. For FETCH_ADD `swap_add` is the addend and `compare` is unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let bytes: [u8; 28] = [
            0, 0, 0, 0, 0, 0, 0x10, 0x08, // va
            0x11, 0x22, 0x33, 0x44, // rkey
            0, 0, 0, 0, 0, 0, 0, 5, // swap/add
            0, 0, 0, 0, 0, 0, 0, 9, // compare
        ];
        let r = Repr {
            va: 0x1008,
            rkey: 0x1122_3344,
            swap_add: 5,
            compare: 9,
        };
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
            r
        );
        let mut buf = [0u8; 28];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..27]).is_err());
    }
}
