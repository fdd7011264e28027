//! Congestion Notification Packet body (RoCE v2, IBTA Annex A17 §A17.9.3):
//! after a BTH with opcode 0x81, 16 reserved bytes, then the ICRC.

use super::error::{check_len, Layer, Result};

pub const HEADER_LEN: usize = 16;

/// A zero-copy view of the CNP's reserved block.
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
        check_len(Layer::Cnp, self.buffer.as_ref(), HEADER_LEN)
    }
    /// The reserved bytes as sent (senders send zeros; receivers ignore them).
    pub fn reserved(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[..HEADER_LEN].fill(0);
    }
}

/// A parsed CNP body; it carries no information beyond its presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr;

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr)
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.clear_reserved();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let mut buf = [0xaau8; 16];
        Repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, [0u8; 16]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(),
            Repr
        );
        assert!(Packet::new_checked(&buf[..15]).is_err());
    }
}
