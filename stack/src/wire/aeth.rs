//! ACK Extended Transport Header: syndrome and MSN (4 bytes, IBTA §9.3.5).
//!
//! The syndrome's top three bits give its kind (IBTA Table 44, ib_pack.h):
//! 000 ACK (low 5 bits: credit count, 0x1F = unlimited), 001 RNR NAK (low 5
//! bits: RNR timer code), 011 NAK (low 5 bits: NAK code).

use super::error::{check_len, Layer, Result};
use super::field::*;

mod field {
    pub const SYNDROME: usize = 0;
    pub const MSN: usize = 1;
}
pub const HEADER_LEN: usize = 4;

/// Credit count meaning "no end-to-end flow control" (IBTA §9.7.7.2.5).
pub const CREDITS_UNLIMITED: u8 = 0x1f;

/// NAK codes (IBTA Table 45; rxe's `enum aeth_syndrome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// A reserved code (5..=31); kept so a round trip loses nothing.
    Reserved(u8),
}

impl NakCode {
    pub fn from_code(code: u8) -> NakCode {
        match code & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
    pub fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN-seq-err",
            NakCode::InvalidRequest => "invalid-req",
            NakCode::RemoteAccessError => "rem-access-err",
            NakCode::RemoteOperationalError => "rem-op-err",
            NakCode::InvalidRdRequest => "invalid-rd-req",
            NakCode::Reserved(_) => "reserved",
        }
    }
}

/// The decoded meaning of an AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit count.
    Ack {
        credits: u8,
    },
    /// Receiver not ready; retry after the time the timer code names.
    RnrNak {
        timer: u8,
    },
    Nak(NakCode),
    /// Kinds 010, 100–111 are reserved.
    Reserved(u8),
}

impl Syndrome {
    pub fn from_byte(b: u8) -> Syndrome {
        let low = b & 0x1f;
        match b >> 5 {
            0b000 => Syndrome::Ack { credits: low },
            0b001 => Syndrome::RnrNak { timer: low },
            0b011 => Syndrome::Nak(NakCode::from_code(low)),
            _ => Syndrome::Reserved(b),
        }
    }
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.code(),
            Syndrome::Reserved(b) => b,
        }
    }
}

/// RNR NAK timer code → microseconds (IBTA Table 46; DESIGN.md).
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// A zero-copy view of an AETH.
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
        check_len(Layer::Aeth, self.buffer.as_ref(), HEADER_LEN)
    }
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    pub fn msn(&self) -> u32 {
        be24(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_syndrome(&mut self, v: u8) {
        self.buffer.as_mut()[field::SYNDROME] = v;
    }
    pub fn set_msn(&mut self, v: u32) {
        put24(self.buffer.as_mut(), field::MSN, v & 0x00ff_ffff);
    }
}

/// A parsed AETH. The syndrome is kept raw so that reserved values survive a
/// round trip; [`Repr::kind`] decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr {
    pub syndrome: u8,
    /// 24-bit message sequence number.
    pub msn: u32,
}

impl Repr {
    pub fn new(syndrome: Syndrome, msn: u32) -> Repr {
        Repr {
            syndrome: syndrome.to_byte(),
            msn: msn & 0x00ff_ffff,
        }
    }
    pub fn kind(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome)
    }
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            syndrome: p.syndrome(),
            msn: p.msn(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_syndrome(self.syndrome);
        p.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        // A PSN sequence error NAK with MSN 7, as rxe sends it (syndrome 0x60).
        let bytes = [0x60, 0x00, 0x00, 0x07];
        let r = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.kind(), Syndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(r.msn, 7);
        let mut buf = [0u8; 4];
        Repr::new(Syndrome::Nak(NakCode::PsnSequenceError), 7)
            .emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..3]).is_err());
    }

    #[test]
    fn every_syndrome_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::Ack { credits: 31 });
        assert_eq!(Syndrome::from_byte(0x2e), Syndrome::RnrNak { timer: 14 });
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(RNR_TIMER_US[14], 1280);
    }
}
