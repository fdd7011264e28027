//! Memory mappings and the four single-producer/single-consumer rings
//! (fill, completion, RX, TX) shared with the kernel.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};

use super::if_xdp::{RingOffset, XDP_RING_NEED_WAKEUP};
use crate::NicError;

/// An anonymous or ring mapping, unmapped on drop.
#[derive(Debug)]
pub(super) struct Map {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

impl Map {
    pub(super) fn anon(len: usize) -> Result<Self, NicError> {
        // SAFETY: anonymous private mapping; no fd involved.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(NicError::last_os("mmap UMEM"));
        }
        Ok(Map { ptr: p.cast(), len })
    }

    pub(super) fn ring(fd: RawFd, len: usize, pgoff: libc::off_t) -> Result<Self, NicError> {
        // SAFETY: maps the ring the kernel created for this socket at `pgoff`;
        // the kernel validates the length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(NicError::last_os("mmap XDP ring"));
        }
        Ok(Map { ptr: p.cast(), len })
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One of the four rings: a power-of-two array of `T` plus shared
/// producer/consumer indices, with locally cached copies.
#[derive(Debug)]
pub(super) struct Ring<T> {
    // Held for its Drop (unmaps the ring); accessed through the pointers below.
    _map: Map,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
}

impl<T: Copy> Ring<T> {
    pub(super) fn new(
        fd: RawFd,
        off: &RingOffset,
        size: u32,
        pgoff: libc::off_t,
    ) -> Result<Self, NicError> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Map::ring(fd, len, pgoff)?;
        let at = |o: u64| -> Result<*mut u8, NicError> {
            if o as usize + 4 > map.len {
                return Err(NicError::Malformed("XDP ring offset out of the mapping"));
            }
            // SAFETY: in bounds of the mapping (checked above).
            Ok(unsafe { map.ptr.add(o as usize) })
        };
        let producer = at(off.producer)?.cast::<AtomicU32>();
        let consumer = at(off.consumer)?.cast::<AtomicU32>();
        let flags = at(off.flags)?.cast::<AtomicU32>();
        let descs = at(off.desc)?.cast::<T>();
        let mut r = Ring {
            _map: map,
            producer,
            consumer,
            flags,
            descs,
            mask: size - 1,
            size,
            cached_prod: 0,
            cached_cons: 0,
        };
        r.cached_prod = r.prod().load(Ordering::Relaxed);
        r.cached_cons = r.cons().load(Ordering::Relaxed);
        Ok(r)
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into our live mapping, 4-aligned (kernel offsets).
        unsafe { &*self.producer }
    }
    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }
    pub(super) fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }
    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY: idx & mask < size, and the mapping holds size entries after desc.
        unsafe { self.descs.add((idx & self.mask) as usize) }
    }

    // --- producer side (fill, tx) ---
    /// Free entries, refreshing the kernel's consumer index when fewer than `want`.
    pub(super) fn free(&mut self, want: u32) -> u32 {
        let free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        self.cached_cons = self.cons().load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }
    pub(super) fn push(&mut self, v: T) -> bool {
        if self.free(1) == 0 {
            return false;
        }
        // SAFETY: the slot is owned by user space until the producer index
        // is published (free() > 0).
        unsafe { self.slot(self.cached_prod).write(v) };
        self.cached_prod = self.cached_prod.wrapping_add(1);
        true
    }
    pub(super) fn publish(&mut self) {
        self.prod().store(self.cached_prod, Ordering::Release);
    }
    /// Entries the kernel has not consumed yet (producer rings).
    pub(super) fn pending(&self) -> u32 {
        self.cached_prod
            .wrapping_sub(self.cons().load(Ordering::Acquire))
    }

    // --- consumer side (rx, completion) ---
    pub(super) fn available(&mut self) -> u32 {
        let avail = self.cached_prod.wrapping_sub(self.cached_cons);
        if avail > 0 {
            return avail;
        }
        self.cached_prod = self.prod().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }
    pub(super) fn pop(&mut self) -> Option<T> {
        if self.available() == 0 {
            return None;
        }
        // SAFETY: the kernel published this entry (acquire on producer).
        let v = unsafe { self.slot(self.cached_cons).read() };
        self.cached_cons = self.cached_cons.wrapping_add(1);
        Some(v)
    }
    pub(super) fn release(&mut self) {
        self.cons().store(self.cached_cons, Ordering::Release);
    }
}
