//! Memory regions (ibv_mr): memory the core reads and writes for local SGEs
//! and for remote peers holding the rkey.

use ferroce_stack::transport::{MemoryRegion as CoreRegion, Sge};

use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;

/// A registered region. It borrows its protection domain, and
/// [`MemoryRegion::deregister`] consumes it, so safe code cannot use a region
/// after deregistration. Dropping it deregisters too.
#[derive(Debug)]
pub struct MemoryRegion<'pd> {
    pd: &'pd ProtectionDomain,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: u64,
    registered: bool,
}

impl<'pd> MemoryRegion<'pd> {
    pub(crate) fn new(
        pd: &'pd ProtectionDomain,
        lkey: u32,
        rkey: u32,
        addr: u64,
        len: u64,
    ) -> Self {
        MemoryRegion {
            pd,
            lkey,
            rkey,
            addr,
            len,
            registered: true,
        }
    }

    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The I/O virtual address peers use in RETH/AtomicETH for offset 0.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.lkey,
        }
    }

    fn oob(&self, offset: u64, len: usize) -> Error {
        Error::OutOfBounds {
            offset,
            len,
            size: self.len,
        }
    }

    /// Copy `data` into the region at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut inner = self.pd.shared.engine.lock();
        let r = inner.core.mr_region_mut(self.lkey).ok_or(Error::Verbs(
            ferroce_stack::transport::VerbsError::NotFound("memory region"),
        ))?;
        r.write(offset, data)
            .map_err(|_| self.oob(offset, data.len()))
    }

    /// Copy from the region at `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let inner = self.pd.shared.engine.lock();
        let r = inner.core.mr_region(self.lkey).ok_or(Error::Verbs(
            ferroce_stack::transport::VerbsError::NotFound("memory region"),
        ))?;
        r.read(offset, out).map_err(|_| self.oob(offset, out.len()))
    }

    /// The whole region as a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len as usize];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Deregister and get the memory back. The keys stop working at once.
    pub fn deregister(mut self) -> Result<Box<dyn CoreRegion>> {
        self.registered = false;
        Ok(self.pd.shared.engine.lock().core.dereg_mr(self.lkey)?)
    }
}

impl Drop for MemoryRegion<'_> {
    fn drop(&mut self) {
        if self.registered {
            let _ = self.pd.shared.engine.lock().core.dereg_mr(self.lkey);
        }
    }
}
