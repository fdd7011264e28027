//! The blocking calls the tools use, on the agent's events: each starts its
//! exchange and waits for the event that ends it; events for others stay
//! queued for their own callers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferroce_stack::transport::{QpState, QpType};

use super::{
    to_error, CmAgent, CmEvent, ConnParam, Connection, QueuePair, Request, UdPeer, UdRequest,
    MAX_CM_RETRIES, RESEND_AFTER,
};
use crate::context::gid_of;
use crate::error::{Error, Result};

/// How long one wait for a MAD lasts before the queue is looked at again.
const POLL: Duration = Duration::from_millis(20);

/// The error a set-up that did not end as asked for reports.
fn failure(event: CmEvent) -> Error {
    match event {
        CmEvent::Rejected { reason, .. } => Error::Rejected { reason },
        CmEvent::UdRefused { status, .. } => Error::SidrRefused { status },
        CmEvent::TimedOut { .. } => Error::Timeout(
            RESEND_AFTER * u32::from(MAX_CM_RETRIES),
            "the peer's connection manager",
        ),
        CmEvent::Disconnected { .. } => Error::Cm("the peer disconnected while connecting".into()),
        other => Error::Cm(format!("unexpected connection-manager event {other:?}")),
    }
}

impl CmAgent<'_> {
    /// The first queued event `pick` accepts (taken off the queue), waiting
    /// for MADs and making resends until one comes; None once `deadline`
    /// passes.
    pub fn wait_event(
        &mut self,
        deadline: Option<Instant>,
        mut pick: impl FnMut(&CmEvent) -> bool,
    ) -> Result<Option<CmEvent>> {
        loop {
            if let Some(i) = self.events.iter().position(&mut pick) {
                return Ok(self.events.remove(i));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let left = deadline.map_or(POLL, |d| (d - now).min(POLL));
            self.wait_and_progress(left)?;
        }
    }

    /// The next event about connection (or SIDR request) `id`. One always
    /// comes: every message awaiting an answer ends in one when resends run out.
    fn wait_for(&mut self, id: u32) -> Result<CmEvent> {
        self.wait_event(None, |e| e.id() == Some(id))?
            .ok_or_else(|| Error::Cm(format!("no event for connection {id:#x}")))
    }

    /// rdma_connect: asks the connection manager at `dst` (its port in
    /// rdma_cm's TCP port space) for a connection to `qp` (an RC QP in
    /// RESET or INIT; receives may be posted in INIT before), and on its
    /// REP moves `qp` to RTS and confirms with an RTU.
    pub fn connect(
        &mut self,
        qp: &QueuePair<'_>,
        dst: SocketAddr,
        param: &ConnParam,
    ) -> Result<Connection> {
        if qp.qp_type() != QpType::Rc {
            return Err(Error::Cm("rdma_cm connects RC QPs here".into()));
        }
        if qp.state()? == QpState::Reset {
            qp.to_init(&self.options(gid_of(dst.ip()), 1024, param.traffic_class))?;
        }
        let id = self.start_connect(qp.qpn(), dst, param)?;
        match self.wait_for(id)? {
            CmEvent::Reply { rep, .. } => self.finish_connect(id, qp, &rep),
            other => Err(failure(other)),
        }
    }

    /// rdma_get_request: the next connection request for `port` (rdma_cm's
    /// TCP port space), waiting up to `timeout`.
    pub fn get_request(&mut self, port: u16, timeout: Duration) -> Result<Request> {
        self.can_listen()?;
        self.listen(port);
        let deadline = Instant::now() + timeout;
        match self.wait_event(
            Some(deadline),
            |e| matches!(e, CmEvent::Request(r) if r.port == port),
        )? {
            Some(CmEvent::Request(r)) => Ok(r),
            _ => Err(Error::Timeout(timeout, "a connection request")),
        }
    }

    /// rdma_accept: moves `qp` (RC, RESET or INIT) to RTS towards the
    /// requester, sends the REP and waits for the RTU.
    pub fn accept(
        &mut self,
        request: &Request,
        qp: &QueuePair<'_>,
        param: &ConnParam,
    ) -> Result<Connection> {
        let conn = self.start_accept(request, qp, param)?;
        match self.wait_for(conn.local_comm_id)? {
            CmEvent::Established { .. } => Ok(conn),
            other => {
                self.forget(conn.local_comm_id);
                Err(failure(other))
            }
        }
    }

    /// rdma_connect for a UD QP (rdma_cm's UDP port space): asks the
    /// connection manager at `dst` which QP serves its port (SIDR_REQ,
    /// sent again until answered) and returns what the SIDR_REP names. A
    /// refusal comes back as [`Error::SidrRefused`]. The SIDR_REQ goes with
    /// `traffic_class` (rdma_cm's TOS of the ID).
    pub fn resolve_ud(
        &mut self,
        dst: SocketAddr,
        private_data: &[u8],
        traffic_class: u8,
    ) -> Result<UdPeer> {
        let id = self.start_resolve_ud(dst, private_data, traffic_class)?;
        match self.wait_for(id)? {
            CmEvent::UdResolved { peer, .. } => Ok(peer),
            other => Err(failure(other)),
        }
    }

    /// rdma_get_request for a UD port: the next SIDR request for `port`,
    /// waiting up to `timeout`.
    pub fn get_ud_request(&mut self, port: u16, timeout: Duration) -> Result<UdRequest> {
        self.can_listen()?;
        self.listen_ud(port);
        let deadline = Instant::now() + timeout;
        match self.wait_event(
            Some(deadline),
            |e| matches!(e, CmEvent::UdRequest(r) if r.port == port),
        )? {
            Some(CmEvent::UdRequest(r)) => Ok(r),
            _ => Err(Error::Timeout(timeout, "a SIDR request")),
        }
    }

    /// rdma_disconnect: `qp` goes to ERR (what it still holds completes
    /// flushed) and the peer gets a DREQ; its DREP, or its own DREQ, ends it.
    /// Without an answer after a few sends the connection is dropped all the
    /// same (the peer's time-wait covers it).
    pub fn disconnect(&mut self, conn: &Connection, qp: &QueuePair<'_>) -> Result<()> {
        to_error(qp)?;
        self.disconnect_id(conn)
    }

    /// rdma_disconnect without a QP to flush: the DREQ exchange alone, as
    /// the kernel's CM sends it for a connected rdma_cm ID destroyed at
    /// process exit (the QP goes when it is dropped).
    pub fn disconnect_id(&mut self, conn: &Connection) -> Result<()> {
        if self.start_disconnect(conn.local_comm_id)? {
            self.wait_for(conn.local_comm_id)?;
        }
        self.forget(conn.local_comm_id);
        Ok(())
    }

    /// Waits up to `timeout` for the peer to disconnect (its DREQ, answered
    /// with a DREP); then `qp` goes to ERR. Returns whether it did.
    pub fn wait_disconnect(
        &mut self,
        conn: &Connection,
        qp: &QueuePair<'_>,
        timeout: Duration,
    ) -> Result<bool> {
        let gone = self.wait_disconnect_id(conn, timeout)?;
        if gone {
            to_error(qp)?;
        }
        Ok(gone)
    }

    /// [`CmAgent::wait_disconnect`] without a QP to flush.
    pub fn wait_disconnect_id(&mut self, conn: &Connection, timeout: Duration) -> Result<bool> {
        let id = conn.local_comm_id;
        let gone = self.conns.get(&id).is_none_or(|c| c.disconnected)
            || self
                .wait_event(
                    Some(Instant::now() + timeout),
                    |e| matches!(e, CmEvent::Disconnected { id: i } if *i == id),
                )?
                .is_some();
        if gone {
            self.forget(id);
        }
        Ok(gone)
    }
}
