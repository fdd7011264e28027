//! Shared receive queues (ibv_srq).

use ferroce_stack::transport::{RecvWr, SrqHandle};

use crate::error::Result;
use crate::pd::ProtectionDomain;

/// A shared receive queue; QPs created with it take their receives from it.
#[derive(Debug)]
pub struct SharedReceiveQueue<'pd> {
    pd: &'pd ProtectionDomain,
    pub(crate) handle: SrqHandle,
}

impl<'pd> SharedReceiveQueue<'pd> {
    pub(crate) fn new(pd: &'pd ProtectionDomain, max_wr: u32, max_sge: u32) -> Result<Self> {
        let handle = pd
            .shared
            .engine
            .lock()
            .core
            .create_srq(pd.handle, max_wr, max_sge)?;
        Ok(SharedReceiveQueue { pd, handle })
    }

    /// The core's handle (what asynchronous events name).
    pub fn handle(&self) -> SrqHandle {
        self.handle
    }

    /// Arm the limit event: an async event fires when fewer than `limit` WRs remain.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        Ok(self
            .pd
            .shared
            .engine
            .lock()
            .core
            .modify_srq(self.handle, limit)?)
    }

    /// Post receive work requests and say how many the core took before
    /// the first refusal (ibv_post_srq_recv's `bad_wr`).
    pub fn post_recv_partial(&self, wrs: &[RecvWr<'_>]) -> (usize, Result<()>) {
        let mut inner = self.pd.shared.engine.lock();
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = inner.core.post_srq_recv(self.handle, wr) {
                return (i, Err(e.into()));
            }
        }
        (wrs.len(), Ok(()))
    }

    /// Post receive work requests; stops at the first the core refuses
    /// and returns its error (earlier ones stay posted, as with bad_wr).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.post_recv_partial(wrs).1
    }
}

impl Drop for SharedReceiveQueue<'_> {
    fn drop(&mut self) {
        let _ = self.pd.shared.engine.lock().core.destroy_srq(self.handle);
    }
}
