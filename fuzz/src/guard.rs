//! A [`MemoryRegion`] that records every access the core should never make.
//!
//! The core checks bounds before it calls a region; a guard checks again and
//! also knows what the harness allows: an `Open` region may be read and
//! written anywhere in bounds (the target of remote WRITE/READ/atomics), a
//! `LocalSink` may be read anywhere but written only inside the SGEs the
//! harness posted (receive buffers, READ and atomic result buffers), and a
//! `Forbidden` region (no remote rights, or another PD) must never be touched.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use ferroce_stack::transport::{MemoryRegion, OutOfBounds};

/// What the harness allows on a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Open,
    LocalSink,
    Forbidden,
}

/// Shared between the region (owned by the core) and the harness.
#[derive(Debug)]
pub struct GuardState {
    pub name: &'static str,
    pub policy: Policy,
    /// Byte ranges (region offsets) a `LocalSink` may be written in.
    pub writable: Vec<Range<u64>>,
    pub violations: Vec<String>,
    pub reads: u64,
    pub writes: u64,
}

/// Handle the harness keeps to a guard's state.
pub type GuardHandle = Arc<Mutex<GuardState>>;

/// Lock a guard (a poisoned lock still holds valid data: the fuzzer panicked mid-check).
pub fn lock(h: &GuardHandle) -> std::sync::MutexGuard<'_, GuardState> {
    h.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Backing memory plus the shared record.
pub struct GuardRegion {
    mem: Vec<u8>,
    state: GuardHandle,
}

impl fmt::Debug for GuardRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GuardRegion({} bytes)", self.mem.len())
    }
}

impl GuardRegion {
    pub fn new(name: &'static str, len: usize, policy: Policy) -> (GuardRegion, GuardHandle) {
        let state = Arc::new(Mutex::new(GuardState {
            name,
            policy,
            writable: Vec::new(),
            violations: Vec::new(),
            reads: 0,
            writes: 0,
        }));
        (
            GuardRegion {
                mem: vec![0; len],
                state: state.clone(),
            },
            state,
        )
    }

    fn range(&self, what: &str, offset: u64, len: usize) -> Result<Range<usize>, OutOfBounds> {
        let oob = OutOfBounds { offset, len };
        let r = usize::try_from(offset)
            .ok()
            .and_then(|s| Some(s..s.checked_add(len)?))
            .filter(|r| r.end <= self.mem.len());
        let mut st = lock(&self.state);
        let Some(r) = r else {
            let v = format!(
                "{}: {what} of {len} bytes at offset {offset} outside the {}-byte region",
                st.name,
                self.mem.len()
            );
            st.violations.push(v);
            return Err(oob);
        };
        if st.policy == Policy::Forbidden {
            let v = format!(
                "{}: {what} of {len} bytes at offset {offset} in a region the peer has no right to",
                st.name
            );
            st.violations.push(v);
        }
        Ok(r)
    }
}

impl MemoryRegion for GuardRegion {
    fn len(&self) -> u64 {
        self.mem.len() as u64
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let r = self.range("read", offset, dst.len())?;
        lock(&self.state).reads += 1;
        dst.copy_from_slice(&self.mem[r]);
        Ok(())
    }
    fn write(&mut self, offset: u64, src: &[u8]) -> Result<(), OutOfBounds> {
        let r = self.range("write", offset, src.len())?;
        {
            let mut st = lock(&self.state);
            st.writes += 1;
            if st.policy == Policy::LocalSink && !src.is_empty() {
                let (lo, hi) = (offset, offset + src.len() as u64);
                if !st.writable.iter().any(|w| w.start <= lo && hi <= w.end) {
                    let v = format!(
                        "{}: write of {} bytes at offset {offset} outside every posted buffer {:?}",
                        st.name,
                        src.len(),
                        st.writable
                    );
                    st.violations.push(v);
                }
            }
        }
        self.mem[r].copy_from_slice(src);
        Ok(())
    }
}
