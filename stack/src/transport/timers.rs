//! Virtual time and the per-QP timer table.
//!
//! The core never reads a clock: every entry point takes an [`Instant`]. It is
//! a plain count of nanoseconds since an epoch the caller picks (an engine
//! converts from `std::time::Instant`, the simulator counts from zero), so
//! tests are deterministic and printable.

use core::ops::Add;
use core::time::Duration;

use crate::wire::aeth::RNR_TIMER_US;

/// A point in time, in nanoseconds since the caller's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);

    pub const fn from_nanos(ns: u64) -> Instant {
        Instant(ns)
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(ns))
    }
}

/// Local ACK timeout: 4.096 µs × 2^code; code 0 means "wait forever"
/// (IBTA C9-141, ibv_modify_qp(3) `timeout`).
pub fn local_ack_timeout(code: u8) -> Option<Duration> {
    if code == 0 {
        return None;
    }
    let ns = 4096u64.checked_shl(u32::from(code.min(31)))?;
    Some(Duration::from_nanos(ns))
}

/// The RNR NAK timer for a 5-bit code (IBTA table 45, via `aeth::RNR_TIMER_US`).
pub fn rnr_delay(code: u8) -> Duration {
    let us = RNR_TIMER_US
        .get(usize::from(code & 0x1f))
        .copied()
        .unwrap_or(655_360);
    Duration::from_micros(u64::from(us))
}

/// The timers a QP runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Local ACK timeout of the requester.
    Retransmit = 0,
    /// Waiting out an RNR NAK before retrying.
    Rnr = 1,
    /// The responder's held-back ACK is due (`Config::ack_delay`).
    AckDelay = 2,
}

/// How many [`Timer`]s there are.
pub const TIMERS: usize = 3;

/// A small fixed table of deadlines (quinn-proto style), one per [`Timer`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerTable([Option<Instant>; TIMERS]);

impl TimerTable {
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.0[t as usize] = Some(at);
    }
    pub fn stop(&mut self, t: Timer) {
        self.0[t as usize] = None;
    }
    pub fn get(&self, t: Timer) -> Option<Instant> {
        self.0[t as usize]
    }
    pub fn is_armed(&self, t: Timer) -> bool {
        self.0[t as usize].is_some()
    }
    pub fn stop_all(&mut self) {
        self.0 = [None; TIMERS];
    }
    /// The earliest armed deadline.
    pub fn next(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }
    /// Timers whose deadline is at or before `now`, cleared as they are returned.
    pub fn expire(&mut self, now: Instant) -> [bool; TIMERS] {
        let mut fired = [false; TIMERS];
        for (i, slot) in self.0.iter_mut().enumerate() {
            if matches!(slot, Some(at) if *at <= now) {
                *slot = None;
                fired[i] = true;
            }
        }
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_formula() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(4096 << 14))
        );
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(1), Duration::from_micros(10));
    }

    #[test]
    fn table_expires_in_place() {
        let mut t = TimerTable::default();
        t.set(Timer::Rnr, Instant::from_nanos(10));
        t.set(Timer::Retransmit, Instant::from_nanos(5));
        assert_eq!(t.next(), Some(Instant::from_nanos(5)));
        assert_eq!(t.expire(Instant::from_nanos(7)), [true, false, false]);
        assert_eq!(t.next(), Some(Instant::from_nanos(10)));
    }
}
