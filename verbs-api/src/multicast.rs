//! rdma_cm's multicast join over RoCE v2 (rdma_join_multicast /
//! rdma_leave_multicast), as the kernel's rdma_cm and librdmacm do it for
//! rxe. On RoCE nothing goes to a subnet manager: the join is local
//! (cma_iboe_join_multicast). The group's MGID is its IPv4 address mapped
//! (`::ffff:a.b.c.d`, cma_iboe_set_mgid), the device joins the IP group on
//! its link (IGMP, as ip_mc_inc_group), and librdmacm attaches the QP to the
//! MGID (ucma_process_join → ibv_attach_mcast) unless the join is
//! send-only. The join event hands the sender what it needs for its address
//! handle: the MGID as destination GID, hop limit 64, traffic class 0, the
//! multicast QPN and rdma_cm's UDP Q_Key.

use std::net::{IpAddr, Ipv6Addr};

use ferroce_stack::transport::{is_multicast_gid, MULTICAST_QPN};

use crate::cm::RDMA_UDP_QKEY;
use crate::context::gid_of;
use crate::error::{Error, Result};
use crate::qp::QueuePair;

/// Hop limit of the join's address handle: IPV6_DEFAULT_HOPLIMIT, which
/// cma_iboe_join_multicast gives RoCE v2 IPv4 groups.
pub const JOIN_HOP_LIMIT: u8 = 64;

/// How a QP joins (rdma_join_multicast_ex's join flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    /// RDMA_MC_JOIN_FLAG_FULLMEMBER: sends to and hears the group.
    FullMember,
    /// RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: sends only (no attach, no
    /// IGMP join).
    SendOnlyFullMember,
}

/// What RDMA_CM_EVENT_MULTICAST_JOIN reports (`event->param.ud` of a RoCE
/// join; the MLID and SL are 0 on RoCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    pub group: IpAddr,
    /// The address handle's destination GID.
    pub mgid: Ipv6Addr,
    /// 0xFFFFFF, the remote QPN to send to.
    pub qpn: u32,
    pub qkey: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub mlid: u16,
    pub sl: u8,
    pub kind: JoinKind,
}

/// The MGID of a group, as rdma_cm forms it for RoCE v2; refuses what
/// cma_iboe_join_multicast refuses (0.0.0.0/8 and `::` with EINVAL) and
/// what cannot be a group. IPv6 groups are their own MGID (Linux 6.1's
/// rdma_cm refuses them on RoCE v2 with ENOTSUPP; ibv_attach_mcast takes
/// them, and so does ferroce).
pub fn mgid_of(group: IpAddr) -> Result<Ipv6Addr> {
    // 0.0.0.0/8 is no multicast group either: no check of its own.
    let mgid = gid_of(group);
    if is_multicast_gid(&mgid) {
        Ok(mgid)
    } else {
        Err(Error::Cm(format!("{group} is not a multicast group")))
    }
}

/// rdma_join_multicast of UD QP `qp` (initialised by
/// [`crate::cm::init_ud_qp`], whose Q_Key is rdma_cm's) to `group`.
pub fn join(qp: &QueuePair<'_>, group: IpAddr, kind: JoinKind) -> Result<Joined> {
    let mgid = mgid_of(group)?;
    if kind == JoinKind::FullMember {
        qp.attach_mcast(mgid)?;
    }
    Ok(Joined {
        group,
        mgid,
        qpn: MULTICAST_QPN,
        qkey: RDMA_UDP_QKEY,
        hop_limit: JOIN_HOP_LIMIT,
        traffic_class: 0,
        mlid: 0,
        sl: 0,
        kind,
    })
}

/// rdma_leave_multicast: detaches what [`join`] attached.
pub fn leave(qp: &QueuePair<'_>, joined: &Joined) -> Result<()> {
    match joined.kind {
        JoinKind::FullMember => qp.detach_mcast(joined.mgid),
        JoinKind::SendOnlyFullMember => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mgids_as_rdma_cm_forms_them() {
        let m = |s: &str| mgid_of(s.parse().unwrap());
        assert_eq!(
            m("239.1.2.3").unwrap(),
            "::ffff:239.1.2.3".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            m("::ffff:224.0.0.9").unwrap(),
            "::ffff:224.0.0.9".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            m("ff0e::7").unwrap(),
            "ff0e::7".parse::<Ipv6Addr>().unwrap()
        );
        assert!(m("0.0.0.0").is_err());
        assert!(m("198.18.0.1").is_err());
        assert!(m("fd00::1").is_err());
    }
}
