//! RDMA Extended Transport Header: virtual address, R_Key, DMA length (16 bytes,
//! IBTA §9.3.3; ib_pack.h `IB_RETH_BYTES`).

use super::error::{check_len, Layer, Result};
use super::field::*;

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const DMA_LEN: usize = 12;
}
pub const HEADER_LEN: usize = 16;

/// A zero-copy view of a RETH.
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
        check_len(Layer::Reth, self.buffer.as_ref(), HEADER_LEN)
    }
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), field::VA)
    }
    pub fn rkey(&self) -> u32 {
        be32(self.buffer.as_ref(), field::RKEY)
    }
    pub fn dma_len(&self) -> u32 {
        be32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_va(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::VA, v);
    }
    pub fn set_rkey(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::RKEY, v);
    }
    pub fn set_dma_len(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::DMA_LEN, v);
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl Repr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00,
        0x00,
    ];
    const REPR: Repr = Repr {
        va: 0x7f12_3456_7800,
        rkey: 0xdead_beef,
        dma_len: 65536,
    };

    #[test]
    fn golden() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.va(), REPR.va);
        assert_eq!(Repr::parse(&p).unwrap(), REPR);
        let mut buf = [0u8; HEADER_LEN];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert!(matches!(
            Packet::new_checked(&BYTES[..15]),
            Err(Error::Truncated {
                layer: Layer::Reth,
                needed: 16,
                have: 15
            })
        ));
    }
}
