//! Completion queues: fixed depth; a completion that does not fit is lost and
//! the CQ is marked in error, which the owner learns through an async event
//! (ibv_create_cq(3), IBV_EVENT_CQ_ERR).

use std::collections::VecDeque;

use super::wqe::WorkCompletion;

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqHandle(pub u32);

#[derive(Debug)]
pub(crate) struct Cq {
    depth: usize,
    entries: VecDeque<WorkCompletion>,
    /// Set once a completion was dropped for lack of room.
    pub overflowed: bool,
    /// Completions ever queued: an arming (ibv_req_notify_cq) fires on the
    /// first one after it, not on those already waiting.
    added: u64,
    /// The device's poll count at this CQ's last poll (Core::note_cq_poll).
    pub polled_at: u64,
}

/// The CQ had no room: the completion was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overflow;

impl Cq {
    pub fn new(depth: usize) -> Cq {
        Cq {
            depth,
            entries: VecDeque::with_capacity(depth),
            overflowed: false,
            added: 0,
            polled_at: 0,
        }
    }
    pub fn push(&mut self, wc: WorkCompletion) -> Result<(), Overflow> {
        if self.entries.len() >= self.depth {
            self.overflowed = true;
            return Err(Overflow);
        }
        self.entries.push_back(wc);
        self.added += 1;
        Ok(())
    }
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        let n = out.len().min(self.entries.len());
        for (slot, wc) in out.iter_mut().zip(self.entries.drain(..n)) {
            *slot = wc;
        }
        n
    }
    pub fn pop(&mut self) -> Option<WorkCompletion> {
        self.entries.pop_front()
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn added(&self) -> u64 {
        self.added
    }
}
