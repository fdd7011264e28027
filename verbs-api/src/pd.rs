//! Protection domains (ibv_pd): the scope in which MRs, QPs and SRQs meet.

use std::sync::Arc;

use ferroce_stack::transport::{AccessFlags, MemoryRegion as CoreRegion, PdHandle, VecRegion};

use crate::context::Shared;
use crate::error::Result;
use crate::mr::MemoryRegion;
use crate::qp::QpBuilder;
use crate::srq::SharedReceiveQueue;

/// A protection domain. Deallocated on drop (after every object in it).
#[derive(Debug)]
pub struct ProtectionDomain {
    pub(crate) shared: Arc<Shared>,
    pub(crate) handle: PdHandle,
}

impl ProtectionDomain {
    pub(crate) fn new(shared: Arc<Shared>, handle: PdHandle) -> Self {
        ProtectionDomain { shared, handle }
    }

    /// Register `len` bytes of zeroed memory owned by the region.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion<'_>> {
        self.reg_mr_with(Box::new(VecRegion::zeroed(len)), access)
    }

    /// Register caller-provided memory. The region owns it until
    /// [`MemoryRegion::deregister`] gives it back, so no access after
    /// deregistration is possible.
    pub fn reg_mr_with(
        &self,
        region: Box<dyn CoreRegion>,
        access: AccessFlags,
    ) -> Result<MemoryRegion<'_>> {
        let iova = self.shared.alloc_iova(region.len());
        self.reg_mr_at(region, iova, access)
    }

    /// Register caller-provided memory at a caller-chosen I/O virtual
    /// address (ibv_reg_mr_iova: peers address it by the application's own
    /// pointers, as rdma-core applications send them).
    pub fn reg_mr_at(
        &self,
        region: Box<dyn CoreRegion>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion<'_>> {
        let len = region.len();
        let (lkey, rkey) =
            self.shared
                .engine
                .lock()
                .core
                .reg_mr(self.handle, iova, access, region)?;
        Ok(MemoryRegion::new(self, lkey, rkey, iova, len))
    }

    /// A queue pair builder in this domain.
    pub fn create_qp(&self) -> QpBuilder<'_> {
        QpBuilder::new(self)
    }

    /// A shared receive queue with `max_wr` entries of `max_sge` SGEs and
    /// limit event threshold `limit` (0 = disarmed).
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<SharedReceiveQueue<'_>> {
        SharedReceiveQueue::new(self, max_wr, max_sge)
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        let _ = self.shared.engine.lock().core.dealloc_pd(self.handle);
    }
}
