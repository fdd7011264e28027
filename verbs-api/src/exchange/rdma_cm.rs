//! perftest's `-R` control channel: an RC connection that rdma_cm sets up
//! before the test QPs, over which every exchange message travels as one
//! SEND (`rdma_write_keys` / `rdma_read_keys` in perftest_communication.c).
//! Like perftest's, the QP has one receive of 56 bytes (`struct
//! pingpong_dest`, the largest message) posted at all times, re-posted as
//! each message is taken; a SEND that finds none waits out an RNR NAK.

use std::io;
use std::time::{Duration, Instant};

use ferroce_stack::transport::{
    AccessFlags, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::perftest::MessageChannel;
use super::PerftestDest;
use crate::context::Context;
use crate::cq::CompletionQueue;
use crate::error::Result;
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{ConnectOptions, QueuePair};

/// The receive buffer, and the largest message: `sizeof(struct pingpong_dest)`.
const MSG_MAX: usize = PerftestDest::WIRE_LEN_BINARY;
const RECV_WR_ID: u64 = 1;
// perftest posts its channel's SENDs with wr_id 5 (`rdma_write_keys`).
const SEND_WR_ID: u64 = 5;
/// How long a SEND may wait for its completion (RNR retries included).
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The channel's QP, CQ and buffers; connect [`RdmaCmChannel::qp`] with
/// [`crate::cm::CmAgent`], then hand the channel to
/// [`super::perftest::PerftestConn::over_channel`].
pub struct RdmaCmChannel<'a> {
    // Field order is drop order: the QP before its CQ.
    qp: QueuePair<'a>,
    cq: CompletionQueue,
    // Receive buffer at 0, send buffer at MSG_MAX.
    mr: MemoryRegion<'a>,
    /// A receive that completed while a SEND was waiting for its own.
    early: Option<WorkCompletion>,
    peer: String,
}

impl std::fmt::Debug for RdmaCmChannel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaCmChannel")
            .field("qpn", &self.qp.qpn())
            .field("peer", &self.peer)
            .finish()
    }
}

impl<'a> RdmaCmChannel<'a> {
    /// An RC QP in INIT with its receive posted (perftest posts it before
    /// `rdma_connect` / `rdma_accept`), as perftest sizes it: one send, one
    /// receive, one SGE each.
    pub fn new(ctx: &Context, pd: &'a ProtectionDomain, sgid_index: usize) -> Result<Self> {
        let cq = ctx.create_cq(4)?;
        let qp = pd
            .create_qp()
            .qp_type(QpType::Rc)
            .max_send_wr(1)
            .max_recv_wr(1)
            .sq_sig_all(true)
            .build(&cq, &cq)?;
        let mr = pd.reg_mr(2 * MSG_MAX, AccessFlags::LOCAL_WRITE)?;
        qp.to_init(&ConnectOptions {
            sgid_index,
            ..ConnectOptions::default()
        })?;
        let ch = RdmaCmChannel {
            qp,
            cq,
            mr,
            early: None,
            peer: "rdma_cm peer".into(),
        };
        ch.post_recv()?;
        Ok(ch)
    }

    /// The QP to connect.
    pub fn qp(&self) -> &QueuePair<'a> {
        &self.qp
    }

    /// Names the peer in messages (its address, once known).
    pub fn set_peer(&mut self, peer: String) {
        self.peer = peer;
    }

    fn post_recv(&self) -> Result<()> {
        let sge = [self.mr.sge(0, MSG_MAX as u32)];
        self.qp.post_recv(&[RecvWr {
            wr_id: RECV_WR_ID,
            sg_list: &sge,
        }])
    }

    /// The next completion within `deadline` (None: no limit).
    fn next(&mut self, deadline: Option<Instant>) -> io::Result<Option<WorkCompletion>> {
        let mut got = Vec::with_capacity(1);
        loop {
            self.cq.poll(1, &mut got).map_err(io::Error::other)?;
            if let Some(wc) = got.pop() {
                if wc.status != WcStatus::Success {
                    return Err(io::Error::other(format!(
                        "the rdma_cm channel's {:?} completed with {:?}",
                        wc.opcode, wc.status
                    )));
                }
                return Ok(Some(wc));
            }
            // A QP in error flushes its posted receive (and any SEND) with an
            // error status, which the check above reports.
            let wait = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if wait.is_zero() {
                return Ok(None);
            }
            match self.cq.wait(wait) {
                Ok(()) | Err(crate::Error::Timeout(..)) => {}
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }
}

impl MessageChannel for RdmaCmChannel<'_> {
    fn peer(&self) -> String {
        self.peer.clone()
    }

    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        if msg.len() > MSG_MAX {
            return Err(io::Error::other(format!(
                "a {}-byte message does not fit the peer's {MSG_MAX}-byte receive",
                msg.len()
            )));
        }
        self.mr
            .write(MSG_MAX as u64, msg)
            .map_err(io::Error::other)?;
        let sge = [self.mr.sge(MSG_MAX as u64, msg.len() as u32)];
        self.qp
            .post_send(&[SendWr::new(SEND_WR_ID, SendOp::Send, &sge)])
            .map_err(io::Error::other)?;
        let deadline = Instant::now() + SEND_TIMEOUT;
        loop {
            match self.next(Some(deadline))? {
                Some(wc) if wc.opcode == WcOpcode::Recv => self.early = Some(wc),
                Some(_) => return Ok(()),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no completion for a SEND within {SEND_TIMEOUT:?}"),
                    ))
                }
            }
        }
    }

    fn recv(&mut self, buf: &mut [u8], limit: Option<Duration>) -> io::Result<Option<usize>> {
        let deadline = limit.map(|l| Instant::now() + l);
        let wc = match self.early.take() {
            Some(wc) => wc,
            None => loop {
                match self.next(deadline)? {
                    Some(wc) if wc.opcode == WcOpcode::Recv => break wc,
                    // A late SEND completion: ours already counted as sent.
                    Some(_) => {}
                    None => return Ok(None),
                }
            },
        };
        let n = (wc.byte_len as usize).min(MSG_MAX);
        let mut msg = [0u8; MSG_MAX];
        self.mr.read(0, &mut msg[..n]).map_err(io::Error::other)?;
        self.post_recv().map_err(io::Error::other)?;
        let take = n.min(buf.len());
        buf[..take].copy_from_slice(&msg[..take]);
        Ok(Some(wc.byte_len as usize))
    }
}
