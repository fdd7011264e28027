//! Queue pairs (ibv_qp): a builder for the create attributes, `modify` with
//! ibverbs' attributes and mask, and posting.

use std::net::Ipv6Addr;

use ferroce_stack::transport::{
    AccessFlags, Core, Path, PdHandle, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendWr, VerbsError,
};

use crate::cq::CompletionQueue;
use crate::error::Result;
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;

/// Builds a queue pair (ibv_qp_init_attr).
#[derive(Debug)]
pub struct QpBuilder<'pd> {
    pd: &'pd ProtectionDomain,
    qp_type: QpType,
    cap: QpCap,
    sq_sig_all: bool,
    srq: Option<ferroce_stack::transport::SrqHandle>,
}

impl<'pd> QpBuilder<'pd> {
    pub(crate) fn new(pd: &'pd ProtectionDomain) -> Self {
        QpBuilder {
            pd,
            qp_type: QpType::Rc,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
        }
    }
    pub fn qp_type(mut self, t: QpType) -> Self {
        self.qp_type = t;
        self
    }
    pub fn cap(mut self, cap: QpCap) -> Self {
        self.cap = cap;
        self
    }
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.cap.max_send_wr = n;
        self
    }
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.cap.max_recv_wr = n;
        self
    }
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.cap.max_inline_data = n;
        self
    }
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }
    pub fn srq(mut self, srq: &SharedReceiveQueue<'pd>) -> Self {
        self.srq = Some(srq.handle);
        self
    }

    /// Create the QP (state RESET) with its send and receive CQs.
    pub fn build(
        self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair<'pd>> {
        self.create(send_cq, recv_cq, Core::create_qp)
    }

    /// QP1 of the device, for its connection manager ([`crate::cm`]): a UD
    /// QP with this builder's capacities, every send signaled.
    pub(crate) fn build_gsi(
        self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair<'pd>> {
        self.qp_type(QpType::Ud)
            .sq_sig_all(true)
            .create(send_cq, recv_cq, Core::create_gsi_qp)
    }

    fn create(
        self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        make: fn(&mut Core, PdHandle, &QpInitAttr) -> std::result::Result<u32, VerbsError>,
    ) -> Result<QueuePair<'pd>> {
        let init = QpInitAttr {
            qp_type: self.qp_type,
            send_cq: send_cq.handle,
            recv_cq: recv_cq.handle,
            srq: self.srq,
            cap: self.cap,
            sq_sig_all: self.sq_sig_all,
        };
        let qpn = make(
            &mut self.pd.shared.engine.lock().core,
            self.pd.handle,
            &init,
        )?;
        Ok(QueuePair {
            pd: self.pd,
            qpn,
            qp_type: self.qp_type,
            has_srq: self.srq.is_some(),
        })
    }
}

/// What the other side of a connection told us (over the out-of-band exchange).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    pub qpn: u32,
    pub psn: u32,
    pub gid: Ipv6Addr,
}

/// Connection settings for [`QueuePair::connect`], with ibv_rc_pingpong's defaults.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    pub path_mtu: u32,
    pub sgid_index: usize,
    pub local_psn: u32,
    pub access: AccessFlags,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub qkey: u32,
    /// The GRH traffic class (`ah_attr.grh.traffic_class`): every packet's
    /// IPv4 TOS or IPv6 traffic class, DSCP << 2 | ECN (perftest's `--tclass`).
    pub traffic_class: u8,
    /// The GRH hop limit: every packet's IPv4 TTL or IPv6 hop limit
    /// (perftest's `-L`).
    pub hop_limit: u8,
    /// The GRH flow label (IPv6's flow label; also what the UDP source port
    /// is folded from, as in rxe). 0: derived from the two QPNs, as
    /// `rdma_calc_flow_label` does.
    pub flow_label: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        // ibv_rc_pingpong: mtu 1024, timeout 14, retry_cnt 7, rnr_retry 7,
        // min_rnr_timer 12, max_rd_atomic 1, max_dest_rd_atomic 1.
        ConnectOptions {
            path_mtu: 1024,
            sgid_index: 0,
            local_psn: 0,
            access: AccessFlags(
                AccessFlags::LOCAL_WRITE.0
                    | AccessFlags::REMOTE_WRITE.0
                    | AccessFlags::REMOTE_READ.0
                    | AccessFlags::REMOTE_ATOMIC.0,
            ),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            qkey: 0x1111_1111,
            traffic_class: 0,
            hop_limit: ferroce_stack::wire::packet::DEFAULT_TTL,
            flow_label: 0,
        }
    }
}

impl ConnectOptions {
    /// The path from GID `sgid_index` to `dgid` with these GRH fields: a
    /// connected QP's (what [`QueuePair::connect`] sets) or a UD address
    /// handle's.
    pub fn path_to(&self, ctx: &crate::Context, dgid: Ipv6Addr) -> Result<Path> {
        let mut path = ctx.resolve_path(self.sgid_index, dgid)?;
        path.traffic_class = self.traffic_class;
        path.hop_limit = self.hop_limit;
        path.flow_label = self.flow_label & 0xf_ffff;
        Ok(path)
    }
}

/// A queue pair. Destroyed on drop.
#[derive(Debug)]
pub struct QueuePair<'pd> {
    pd: &'pd ProtectionDomain,
    qpn: u32,
    qp_type: QpType,
    has_srq: bool,
}

impl<'pd> QueuePair<'pd> {
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Whether its receives come from a shared receive queue.
    pub fn has_srq(&self) -> bool {
        self.has_srq
    }

    /// ibv_modify_qp: the attributes named in `mask` are applied; missing
    /// required or out-of-range ones are refused with the attribute's name.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        Ok(self
            .pd
            .shared
            .engine
            .lock()
            .core
            .modify_qp(self.qpn, attr, mask)?)
    }

    /// ibv_attach_mcast: packets sent to the multicast QPN and group `mgid`
    /// (an IPv4 group as `::ffff:a.b.c.d`, or an IPv6 one) reach this UD QP.
    /// The device joins the group on its link (IGMP/MLD), as the kernel's
    /// rdma_cm does for rxe; attaching twice is one attachment.
    pub fn attach_mcast(&self, mgid: Ipv6Addr) -> Result<()> {
        let mut inner = self.pd.shared.engine.lock();
        if inner.core.mcast_groups_of(self.qpn).contains(&mgid) {
            return Ok(());
        }
        inner.core.attach_mcast(self.qpn, mgid)?;
        if let Err(e) = inner.io.join_multicast(mgid.into()) {
            let _ = inner.core.detach_mcast(self.qpn, mgid);
            return Err(e.into());
        }
        self.pd.shared.engine.refresh_poll_fds(&inner);
        Ok(())
    }

    /// The multicast groups this QP is attached to.
    pub fn mcast_groups(&self) -> Vec<Ipv6Addr> {
        self.pd.shared.engine.lock().core.mcast_groups_of(self.qpn)
    }

    /// ibv_detach_mcast: undoes [`QueuePair::attach_mcast`]; a group the QP
    /// is not attached to is an error (EINVAL).
    pub fn detach_mcast(&self, mgid: Ipv6Addr) -> Result<()> {
        let mut inner = self.pd.shared.engine.lock();
        inner.core.detach_mcast(self.qpn, mgid)?;
        inner.io.leave_multicast(mgid.into())?;
        self.pd.shared.engine.refresh_poll_fds(&inner);
        Ok(())
    }

    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.pd.shared.engine.lock().core.query_qp(self.qpn)?)
    }

    pub fn state(&self) -> Result<QpState> {
        Ok(self.query()?.qp_state)
    }

    /// RESET → INIT with the port, P_Key index and access flags (and Q_Key for UD).
    pub fn to_init(&self, opts: &ConnectOptions) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: opts.access,
            qkey: opts.qkey,
            ..QpAttr::default()
        };
        let mask = match self.qp_type {
            QpType::Ud => QpAttrMask::STATE
                .union(QpAttrMask::PKEY_INDEX)
                .union(QpAttrMask::PORT)
                .union(QpAttrMask::QKEY),
            _ => QpAttrMask::STATE
                .union(QpAttrMask::PKEY_INDEX)
                .union(QpAttrMask::PORT)
                .union(QpAttrMask::ACCESS_FLAGS),
        };
        self.modify(&attr, mask)
    }

    /// INIT → INIT with new remote access flags (rdma_cm's step before RTR).
    pub fn set_access(&self, access: AccessFlags) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        self.modify(&attr, QpAttrMask::STATE.union(QpAttrMask::ACCESS_FLAGS))
    }

    /// INIT → RTR → RTS towards `remote`, as ibv_rc_pingpong's
    /// `pp_connect_ctx` does (UD: RTR and RTS with only the PSN).
    pub fn connect(
        &self,
        ctx: &crate::Context,
        remote: &RemoteQp,
        opts: &ConnectOptions,
    ) -> Result<()> {
        let path = opts.path_to(ctx, remote.gid)?;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: opts.path_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: opts.max_dest_rd_atomic,
            min_rnr_timer: opts.min_rnr_timer,
            ah_attr: path,
            ..QpAttr::default()
        };
        let rtr_mask = match self.qp_type {
            QpType::Rc => QpAttrMask::STATE
                .union(QpAttrMask::AV)
                .union(QpAttrMask::PATH_MTU)
                .union(QpAttrMask::DEST_QPN)
                .union(QpAttrMask::RQ_PSN)
                .union(QpAttrMask::MAX_DEST_RD_ATOMIC)
                .union(QpAttrMask::MIN_RNR_TIMER),
            QpType::Uc => QpAttrMask::STATE
                .union(QpAttrMask::AV)
                .union(QpAttrMask::PATH_MTU)
                .union(QpAttrMask::DEST_QPN)
                .union(QpAttrMask::RQ_PSN),
            QpType::Ud => QpAttrMask::STATE,
        };
        self.modify(&rtr, rtr_mask)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: opts.local_psn,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            max_rd_atomic: opts.max_rd_atomic,
            ..QpAttr::default()
        };
        let rts_mask = match self.qp_type {
            QpType::Rc => QpAttrMask::STATE
                .union(QpAttrMask::SQ_PSN)
                .union(QpAttrMask::TIMEOUT)
                .union(QpAttrMask::RETRY_CNT)
                .union(QpAttrMask::RNR_RETRY)
                .union(QpAttrMask::MAX_QP_RD_ATOMIC),
            _ => QpAttrMask::STATE.union(QpAttrMask::SQ_PSN),
        };
        self.modify(&rts, rts_mask)
    }

    /// Post send work requests and ring the doorbell once: the frames leave
    /// from this thread before the call returns (as far as the window allows).
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_send_partial(wrs).1
    }

    /// Post send work requests, ringing the doorbell once, and say how many
    /// the core took before the first refusal (ibv_post_send's `bad_wr`).
    pub fn post_send_partial(&self, wrs: &[SendWr<'_>]) -> (usize, Result<()>) {
        let mut inner = self.pd.shared.engine.lock();
        let mut posted = 0;
        let mut result = Ok(());
        for wr in wrs {
            if let Err(e) = inner.core.post_send(self.qpn, wr) {
                result = Err(e.into());
                break;
            }
            posted += 1;
        }
        let now = inner.now();
        if let Err(e) = inner.flush_tx(now) {
            if result.is_ok() {
                result = Err(e.into());
            }
        }
        (posted, result)
    }

    /// Post receive work requests and say how many the core took before
    /// the first refusal (ibv_post_recv's `bad_wr`).
    pub fn post_recv_partial(&self, wrs: &[RecvWr<'_>]) -> (usize, Result<()>) {
        let mut inner = self.pd.shared.engine.lock();
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = inner.core.post_recv(self.qpn, wr) {
                return (i, Err(e.into()));
            }
        }
        (wrs.len(), Ok(()))
    }

    /// Post receive work requests (stops at the first refused, like bad_wr).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.post_recv_partial(wrs).1
    }
}

impl Drop for QueuePair<'_> {
    fn drop(&mut self) {
        let mut inner = self.pd.shared.engine.lock();
        // As at a process's exit with rxe: the QP leaves its groups first.
        for mgid in inner.core.mcast_groups_of(self.qpn) {
            if inner.core.detach_mcast(self.qpn, mgid).is_ok() {
                let _ = inner.io.leave_multicast(mgid.into());
                self.pd.shared.engine.refresh_poll_fds(&inner);
            }
        }
        let _ = inner.core.destroy_qp(self.qpn);
    }
}
