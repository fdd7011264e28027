//! Shared receive queues, with the limit event (ibv_modify_srq(3)
//! IBV_SRQ_LIMIT: when fewer than `limit` WRs remain, raise
//! IBV_EVENT_SRQ_LIMIT_REACHED once and disarm).

use super::mr::PdHandle;
use super::wqe::{RecvWqe, Ring};

/// A shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqHandle(pub u32);

#[derive(Debug)]
pub(crate) struct Srq {
    pub pd: PdHandle,
    pub max_sge: usize,
    pub queue: Ring<RecvWqe>,
    /// Armed limit; 0 = disarmed.
    pub limit: u32,
}

impl Srq {
    pub fn new(pd: PdHandle, max_wr: usize, max_sge: usize) -> Srq {
        Srq {
            pd,
            max_sge,
            queue: Ring::new(max_wr, RecvWqe::default()),
            limit: 0,
        }
    }

    /// Move the oldest entry into `into` (swapping buffers so neither side
    /// allocates). Returns whether the limit event fires.
    pub fn take(&mut self, into: &mut RecvWqe) -> Option<bool> {
        if self.queue.is_empty() {
            return None;
        }
        let h = self.queue.head;
        core::mem::swap(self.queue.at_mut(h), into);
        self.queue.pop();
        let fire = self.limit != 0 && self.queue.len() < u64::from(self.limit);
        if fire {
            self.limit = 0;
        }
        Some(fire)
    }
}
