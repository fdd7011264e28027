//! 24-bit packet sequence number arithmetic (IBTA 9.7.1: PSNs wrap modulo 2^24).

/// The PSN field is 24 bits wide.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// `psn + n` modulo 2^24.
#[inline]
pub fn add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a - b` in the 24-bit ring: positive when `a` is ahead of
/// `b` by less than 2^23 (rxe: rxe_hdr.h psn_compare, the same sign-extend trick).
#[inline]
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_across_2_pow_24() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(add(PSN_MASK - 1, 5), 3);
        assert_eq!(diff(3, PSN_MASK - 1), 5);
        assert_eq!(diff(PSN_MASK - 1, 3), -5);
        assert_eq!(diff(7, 7), 0);
        assert_eq!(diff(0x80_0000, 0), -0x80_0000);
        assert_eq!(diff(0x7f_ffff, 0), 0x7f_ffff);
    }
}
