//! The UD endpoint librdmacm's UD examples (`udaddy`, `mckey`) each make
//! per connection: a CQ of 2 × count, a UD QP of count work requests each
//! way in RTS with rdma_cm's Q_Key (as librdmacm leaves it), and one buffer
//! of GRH + message size that every receive and every send uses.

use std::time::Duration;

use ferroce_stack::transport::Path;
use ferroce_verbs::cm::init_ud_qp;
use ferroce_verbs::wc::GRH_LEN;
use ferroce_verbs::{
    AccessFlags, CompletionQueue, ConnectOptions, Context, MemoryRegion, ProtectionDomain, QpType,
    QueuePair, RecvWr, SendOp, SendWr, UdDest, WcOpcode, WcStatus, WorkCompletion,
};

/// A UD receive starts with the 40-byte GRH.
pub const GRH: u32 = GRH_LEN as u32;

/// The set-up step that failed, for each tool to name in its own words.
#[derive(Debug)]
pub enum Step {
    Cq,
    Qp,
    Mr,
    PostRecv,
}

pub struct UdNode<'pd> {
    pub qp: QueuePair<'pd>,
    pub cq: CompletionQueue,
    pub mr: MemoryRegion<'pd>,
}

impl<'pd> UdNode<'pd> {
    /// The endpoint for `count` messages of `size` bytes; with `receives`,
    /// count receives of GRH + size are posted on its buffer.
    pub fn new(
        ctx: &Context,
        pd: &'pd ProtectionDomain,
        opts: &ConnectOptions,
        count: u32,
        size: u32,
        receives: bool,
    ) -> Result<UdNode<'pd>, (Step, String)> {
        let depth = count.max(1);
        let cq = ctx
            .create_cq(2 * depth)
            .map_err(|e| (Step::Cq, e.to_string()))?;
        let qp = pd
            .create_qp()
            .qp_type(QpType::Ud)
            .max_send_wr(depth)
            .max_recv_wr(depth)
            .build(&cq, &cq)
            .map_err(|e| (Step::Qp, e.to_string()))?;
        init_ud_qp(ctx, &qp, opts).map_err(|e| (Step::Qp, e.to_string()))?;
        let mr = pd
            .reg_mr((size + GRH) as usize, AccessFlags::LOCAL_WRITE)
            .map_err(|e| (Step::Mr, e.to_string()))?;
        if receives {
            let sge = [mr.sge(0, size + GRH)];
            for i in 0..count {
                qp.post_recv(&[RecvWr {
                    wr_id: u64::from(i),
                    sg_list: &sge,
                }])
                .map_err(|e| (Step::PostRecv, e.to_string()))?;
            }
        }
        Ok(UdNode { qp, cq, mr })
    }

    /// count SENDs WITH IMMEDIATE (this QP's number, as both examples send)
    /// of `size` bytes from the buffer's start along `path` to `remote`
    /// (QPN, Q_Key); `signaled(i)` says which ask for a completion.
    pub fn post_sends(
        &self,
        path: Path,
        remote: (u32, u32),
        size: u32,
        count: u32,
        signaled: impl Fn(u32) -> bool,
    ) -> ferroce_verbs::Result<()> {
        let sge = [self.mr.sge(0, size)];
        for i in 0..count {
            let mut wr = SendWr::new(
                u64::from(i),
                SendOp::SendWithImm { imm: self.qp.qpn() },
                &sge,
            );
            wr.flags.signaled = signaled(i);
            wr.ud = Some(UdDest {
                path,
                remote_qpn: remote.0,
                remote_qkey: remote.1,
            });
            self.qp.post_send(&[wr])?;
        }
        Ok(())
    }

    /// Waits for `count` completions; the first one that is not a
    /// successful receive (of `len` bytes, GRH included, when given) is an
    /// error that names it.
    pub fn receive(
        &self,
        count: u32,
        len: Option<u32>,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, String> {
        let wcs = self
            .cq
            .poll_n(count as usize, timeout)
            .map_err(|e| e.to_string())?;
        match wcs.iter().find(|wc| {
            wc.status != WcStatus::Success
                || wc.opcode != WcOpcode::Recv
                || len.is_some_and(|l| wc.byte_len != l)
        }) {
            Some(wc) => Err(format!(
                "receive completion {:?} with status {:?}, {} bytes",
                wc.opcode, wc.status, wc.byte_len
            )),
            None => Ok(wcs),
        }
    }

    /// Waits for `count` send completions, all successful.
    pub fn sent(&self, count: u32, timeout: Duration) -> Result<(), String> {
        let wcs = self
            .cq
            .poll_n(count as usize, timeout)
            .map_err(|e| e.to_string())?;
        match wcs.iter().find(|wc| wc.status != WcStatus::Success) {
            Some(wc) => Err(format!("send completion with status {:?}", wc.status)),
            None => Ok(()),
        }
    }
}
