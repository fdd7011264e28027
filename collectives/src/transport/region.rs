//! A registered region the transport reads without the device lock: the
//! core keeps one handle (it writes arriving chunks through it), the
//! transport another, so a chunk can be reduced straight out of its receive
//! slot instead of being copied into a temporary first.

use std::sync::{Arc, Mutex, MutexGuard};

use ferroce_stack::transport::{copy_bytes, MemoryRegion, OutOfBounds};

/// Zeroed memory in 8-byte words (so every slot at a multiple of 8 bytes
/// is aligned for any element type), shared between the core and us.
#[derive(Clone)]
pub(crate) struct SharedRegion {
    words: Arc<Mutex<Vec<u64>>>,
    len: usize,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("len", &self.len)
            .finish()
    }
}

impl SharedRegion {
    /// `len` zero bytes, every page already mapped (see [`prefault`]).
    pub fn zeroed(len: usize) -> SharedRegion {
        let mut words = vec![0u64; len.div_ceil(8)];
        prefault(bytemuck::cast_slice_mut(&mut words));
        SharedRegion {
            words: Arc::new(Mutex::new(words)),
            len,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<u64>> {
        // A panic while holding it leaves plain bytes behind: go on.
        self.words.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on `len` bytes at `offset`, or fail when out of bounds.
    pub fn with<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, OutOfBounds> {
        let g = self.lock();
        let bytes: &[u8] = bytemuck::cast_slice(&g[..]);
        let oob = OutOfBounds {
            offset: offset as u64,
            len,
        };
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= self.len)
            .ok_or(oob)?;
        bytes.get(offset..end).map(f).ok_or(oob)
    }
}

/// Touch every page of fresh zeroed memory. Zeroed allocations come from
/// calloc/mmap and are mapped on first write: without this the first
/// messages through each slot pay page faults (a few µs each, hundreds of
/// them per rank for 64 KiB slots), which land in the first timed sizes.
pub(crate) fn prefault(bytes: &mut [u8]) {
    const PAGE: usize = 4096;
    for b in bytes.iter_mut().step_by(PAGE) {
        // black_box: a zero written over known zeros may be optimised away.
        *b = std::hint::black_box(0);
    }
}

/// `len` zero bytes with every page mapped, for an ordinary registered region.
pub(crate) fn prefaulted(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    prefault(&mut v);
    v
}

impl MemoryRegion for SharedRegion {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let off = usize::try_from(offset).map_err(|_| OutOfBounds {
            offset,
            len: dst.len(),
        })?;
        let n = dst.len();
        self.with(off, n, |src| copy_bytes(dst, src))
    }

    fn write(&mut self, offset: u64, src: &[u8]) -> Result<(), OutOfBounds> {
        let oob = OutOfBounds {
            offset,
            len: src.len(),
        };
        let off = usize::try_from(offset).map_err(|_| oob)?;
        let end = off
            .checked_add(src.len())
            .filter(|e| *e <= self.len)
            .ok_or(oob)?;
        let mut g = self.lock();
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut g[..]);
        let dst = bytes.get_mut(off..end).ok_or(oob)?;
        copy_bytes(dst, src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_handles_see_the_same_bytes_and_bounds_hold() {
        let mut core_side = SharedRegion::zeroed(20);
        let ours = core_side.clone();
        core_side.write(3, b"abcdef").unwrap();
        assert_eq!(ours.with(3, 6, |s| s.to_vec()).unwrap(), b"abcdef");
        let mut out = [0u8; 4];
        ours.read(16, &mut out).unwrap();
        assert!(ours.read(17, &mut out).is_err());
        assert!(core_side.write(18, b"xyz").is_err());
        assert!(ours.with(usize::MAX, 2, |_| ()).is_err());
        assert!(ours.with(20, 0, |s| s.len()).is_ok());
        assert_eq!(core_side.len(), 20);
    }
}
