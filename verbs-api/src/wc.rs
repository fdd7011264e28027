//! Work-completion helpers: the status strings of `ibv_wc_status_str`, and
//! what the GRH area of a UD receive says about its sender.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::WcStatus;

/// The GRH area at the head of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// What `ibv_init_ah_from_wc` reads of a UD receive's GRH area: an IPv6
/// header, or (RoCE v2 over IPv4, as rxe and ferroce fill it) twenty zero
/// bytes and the IPv4 header. Addresses as GIDs (IPv4-mapped for IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrhInfo {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// IPv4 TOS or IPv6 traffic class: an answer carries the same.
    pub traffic_class: u8,
    pub hop_limit: u8,
}

impl GrhInfo {
    pub fn parse(g: &[u8; GRH_LEN]) -> GrhInfo {
        if g[20] >> 4 == 4 {
            let ip4 = |o: usize| Ipv4Addr::new(g[o], g[o + 1], g[o + 2], g[o + 3]);
            GrhInfo {
                src: ip4(32).to_ipv6_mapped(),
                dst: ip4(36).to_ipv6_mapped(),
                traffic_class: g[21],
                hop_limit: g[28],
            }
        } else {
            let ip6 = |o: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&g[o..o + 16]);
                Ipv6Addr::from(b)
            };
            GrhInfo {
                src: ip6(8),
                dst: ip6(24),
                traffic_class: (g[0] << 4) | (g[1] >> 4),
                hop_limit: g[7],
            }
        }
    }
}

/// The text rdma-core's `ibv_wc_status_str` gives for a status
/// (libibverbs/verbs.c), so tools print what users already know.
pub fn status_str(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "success",
        WcStatus::LocLenErr => "local length error",
        WcStatus::LocQpOpErr => "local QP operation error",
        WcStatus::LocProtErr => "local protection error",
        WcStatus::WrFlushErr => "Work Request Flushed Error",
        WcStatus::BadRespErr => "bad response error",
        WcStatus::LocAccessErr => "local access error",
        WcStatus::RemInvReqErr => "remote invalid request error",
        WcStatus::RemAccessErr => "remote access error",
        WcStatus::RemOpErr => "remote operational error",
        WcStatus::RetryExcErr => "transport retry counter exceeded",
        WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
        WcStatus::RemInvRdReqErr => "remote invalid RD request",
        WcStatus::RemAbortErr => "operation aborted",
        WcStatus::FatalErr => "fatal error",
        WcStatus::GeneralErr => "general error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_of_ipv4_and_ipv6_receives() {
        let mut g = [0u8; GRH_LEN];
        g[20..40].copy_from_slice(&[
            0x45, 0x60, 0, 0, 0, 0, 0x40, 0, 63, 17, 0, 0, 10, 77, 0, 11, 10, 77, 0, 1,
        ]);
        let i = GrhInfo::parse(&g);
        assert_eq!(i.src, "::ffff:10.77.0.11".parse::<Ipv6Addr>().unwrap());
        assert_eq!(i.dst, "::ffff:10.77.0.1".parse::<Ipv6Addr>().unwrap());
        assert_eq!((i.traffic_class, i.hop_limit), (0x60, 63));
        let mut g = [0u8; GRH_LEN];
        g[..8].copy_from_slice(&[0x66, 0xa0, 0, 0, 0, 8, 17, 64]);
        g[8..24].copy_from_slice(&"fd77::b".parse::<Ipv6Addr>().unwrap().octets());
        g[24..40].copy_from_slice(&"fd77::1".parse::<Ipv6Addr>().unwrap().octets());
        let i = GrhInfo::parse(&g);
        assert_eq!(i.src, "fd77::b".parse::<Ipv6Addr>().unwrap());
        assert_eq!((i.traffic_class, i.hop_limit), (0x6a, 64));
    }
}
