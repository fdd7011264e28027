//! Multicast groups: which UD QPs are attached to which MGID
//! (ibv_attach_mcast / ibv_detach_mcast), for the receive fan-out of
//! packets sent to the multicast QPN.
//!
//! Over RoCE v2 the MGID is the IP destination of the packet: an IPv4 group
//! `a.b.c.d` is `::ffff:a.b.c.d`, an IPv6 group is itself (Linux
//! cma_iboe_set_mgid; rxe_rcv_mcast_pkt looks groups up the same way).

use std::collections::BTreeMap;
use std::net::Ipv6Addr;

use super::error::VerbsError;

/// BTH destination QPN of a multicast packet (IBTA 10.5.2.4; rxe
/// IB_MULTICAST_QPN).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// rxe_param.h RXE_MAX_MCAST_GRP.
pub const MAX_MCAST_GRP: u32 = 8192;
/// rxe_param.h RXE_MAX_MCAST_QP_ATTACH (QPs in one group).
pub const MAX_MCAST_QP_ATTACH: u32 = 56;
/// rxe_param.h RXE_MAX_TOT_MCAST_QP_ATTACH (attachments over all groups).
pub const MAX_TOTAL_MCAST_QP_ATTACH: u32 = 0x70000;

/// Whether `gid` names a multicast group: an IPv4-mapped multicast address
/// or an IPv6 one (first byte 0xff), as Linux rdma_is_multicast_addr.
pub fn is_multicast_gid(gid: &Ipv6Addr) -> bool {
    match gid.to_ipv4_mapped() {
        Some(v4) => v4.is_multicast(),
        None => gid.is_multicast(),
    }
}

/// The groups of one device and the QPs attached to each.
#[derive(Debug, Default)]
pub struct McastTable {
    groups: BTreeMap<Ipv6Addr, Vec<u32>>,
    total: u32,
}

impl McastTable {
    /// Attaches `qpn` to `mgid`. Attaching twice is no error (uverbs keeps
    /// one attachment, rxe_attach_mcg likewise).
    pub fn attach(&mut self, qpn: u32, mgid: Ipv6Addr) -> Result<(), VerbsError> {
        if !is_multicast_gid(&mgid) {
            return Err(VerbsError::Invalid("not a multicast GID"));
        }
        if self.groups.get(&mgid).is_some_and(|g| g.contains(&qpn)) {
            return Ok(());
        }
        // rxe checks the total before the per-group limit (__rxe_init_mca).
        if self.total >= MAX_TOTAL_MCAST_QP_ATTACH {
            return Err(VerbsError::Exhausted("multicast attachments"));
        }
        if !self.groups.contains_key(&mgid) && self.groups.len() >= MAX_MCAST_GRP as usize {
            return Err(VerbsError::Exhausted("multicast groups"));
        }
        let group = self.groups.entry(mgid).or_default();
        if group.len() >= MAX_MCAST_QP_ATTACH as usize {
            return Err(VerbsError::Exhausted("QPs in the multicast group"));
        }
        group.push(qpn);
        self.total += 1;
        Ok(())
    }

    /// Detaches `qpn` from `mgid`; one not attached is EINVAL, as in rxe.
    pub fn detach(&mut self, qpn: u32, mgid: Ipv6Addr) -> Result<(), VerbsError> {
        let Some(group) = self.groups.get_mut(&mgid) else {
            return Err(VerbsError::Invalid("QP is not attached to that group"));
        };
        let Some(i) = group.iter().position(|&q| q == qpn) else {
            return Err(VerbsError::Invalid("QP is not attached to that group"));
        };
        group.swap_remove(i);
        self.total -= 1;
        if group.is_empty() {
            self.groups.remove(&mgid);
        }
        Ok(())
    }

    /// The QPs attached to `mgid`, in the order they were attached (but for
    /// detaches in between).
    pub fn members(&self, mgid: &Ipv6Addr) -> &[u32] {
        self.groups.get(mgid).map_or(&[], Vec::as_slice)
    }

    /// Whether `qpn` is attached to any group (ibv_destroy_qp then fails
    /// with EBUSY, as in rxe).
    pub fn has_qp(&self, qpn: u32) -> bool {
        self.groups.values().any(|g| g.contains(&qpn))
    }

    /// The groups `qpn` is attached to.
    pub fn groups_of(&self, qpn: u32) -> Vec<Ipv6Addr> {
        self.groups
            .iter()
            .filter(|(_, g)| g.contains(&qpn))
            .map(|(m, _)| *m)
            .collect()
    }

    /// Number of groups with at least one QP.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> Ipv6Addr {
        std::net::Ipv4Addr::from(a).to_ipv6_mapped()
    }

    #[test]
    fn multicast_gids_are_ipv4_mapped_multicast_or_ff() {
        assert!(is_multicast_gid(&v4([239, 1, 2, 3])));
        assert!(is_multicast_gid(&v4([224, 0, 0, 1])));
        assert!(!is_multicast_gid(&v4([198, 18, 0, 1])));
        assert!(is_multicast_gid(&"ff0e::1".parse().unwrap()));
        assert!(!is_multicast_gid(&"fd00::1".parse().unwrap()));
        // RoCE v1's form of an IPv4 group is not what RoCE v2 uses, but is multicast.
        assert!(is_multicast_gid(&"ff0e::ffff:239.1.2.3".parse().unwrap()));
    }

    #[test]
    fn attach_detach_and_limits() {
        let mut t = McastTable::default();
        let g = v4([239, 0, 0, 1]);
        assert_eq!(
            t.attach(0x11, v4([10, 0, 0, 1])),
            Err(VerbsError::Invalid("not a multicast GID"))
        );
        t.attach(0x11, g).unwrap();
        t.attach(0x11, g).unwrap();
        assert_eq!(t.members(&g), &[0x11]);
        assert!(t.has_qp(0x11));
        for q in 1..MAX_MCAST_QP_ATTACH {
            t.attach(0x100 + q, g).unwrap();
        }
        assert_eq!(
            t.attach(0x999, g),
            Err(VerbsError::Exhausted("QPs in the multicast group"))
        );
        t.detach(0x11, g).unwrap();
        assert!(t.detach(0x11, g).is_err());
        assert!(!t.has_qp(0x11));
        for q in 1..MAX_MCAST_QP_ATTACH {
            t.detach(0x100 + q, g).unwrap();
        }
        assert_eq!(t.group_count(), 0);
        assert_eq!(t.total, 0);
        for i in 0..MAX_MCAST_GRP {
            let [_, _, a, b] = i.to_be_bytes();
            t.attach(0x11, v4([239, 1, a, b])).unwrap();
        }
        assert_eq!(
            t.attach(0x11, v4([239, 2, 0, 0])),
            Err(VerbsError::Exhausted("multicast groups"))
        );
        assert_eq!(t.groups_of(0x11).len(), MAX_MCAST_GRP as usize);
    }
}
