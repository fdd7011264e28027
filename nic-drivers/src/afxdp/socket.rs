//! One AF_XDP socket: its UMEM, rings and bind (zero-copy first, then copy).

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use super::if_xdp::*;
use super::ring::{Map, Ring};
use super::{AfXdpConfig, CHUNK, TX_SLOT_CHUNKS};
use crate::sys;
use crate::NicError;

/// `len` bytes of the UMEM at `addr`, if in bounds.
pub(super) fn map_slice(m: &Map, addr: usize, len: usize) -> Option<&[u8]> {
    if addr.checked_add(len)? > m.len {
        return None;
    }
    // SAFETY: in bounds; the chunk is ours while its RX descriptor is held
    // (it goes back to the fill ring only after the sink returns).
    Some(unsafe { std::slice::from_raw_parts(m.ptr.add(addr), len) })
}

/// One AF_XDP socket bound to one queue, with its own UMEM.
#[derive(Debug)]
pub(super) struct Xsk {
    pub(super) fd: OwnedFd,
    pub(super) umem: Map,
    pub(super) fill: Ring<u64>,
    pub(super) comp: Ring<u64>,
    pub(super) rx: Ring<XdpDesc>,
    pub(super) tx: Ring<XdpDesc>,
    pub(super) rx_chunks: usize,
    pub(super) tx_free: Vec<u32>,
    // A multi-descriptor RX frame being put together.
    pub(super) partial: Vec<u8>,
    pub(super) in_frame: bool,
    pub(super) zero_copy: bool,
    // Bound with XDP_USE_SG: a frame may span several chunks.
    pub(super) frags: bool,
    pub(super) rx_frames: u64,
}

impl Xsk {
    pub(super) fn open(ifindex: u32, queue: u32, cfg: &AfXdpConfig) -> Result<Self, NicError> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        let fd = sys::owned(fd, "socket(AF_XDP)").map_err(|e| match e {
            NicError::Sys { source, .. } if source.raw_os_error() == Some(libc::EPERM) => {
                NicError::NeedsPrivilege("AF_XDP")
            }
            e => e,
        })?;
        let raw = fd.as_raw_fd();
        let rx_chunks = cfg.rx_chunks;
        let total = rx_chunks + cfg.tx_slots * TX_SLOT_CHUNKS;
        let umem = Map::anon(total * CHUNK)?;
        let reg = UmemReg {
            addr: umem.ptr as u64,
            len: umem.len as u64,
            chunk_size: CHUNK as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        sys::setsockopt(raw, SOL_XDP, XDP_UMEM_REG, &reg, "XDP_UMEM_REG")?;
        let (rxn, txn) = (rx_chunks as u32, cfg.tx_slots as u32);
        sys::setsockopt(raw, SOL_XDP, XDP_UMEM_FILL_RING, &rxn, "XDP_UMEM_FILL_RING")?;
        // A TX slot may use 3 descriptors: size TX/completion for that.
        let txd = (txn * TX_SLOT_CHUNKS as u32).next_power_of_two();
        sys::setsockopt(
            raw,
            SOL_XDP,
            XDP_UMEM_COMPLETION_RING,
            &txd,
            "XDP_UMEM_COMPLETION_RING",
        )?;
        sys::setsockopt(raw, SOL_XDP, XDP_RX_RING, &rxn, "XDP_RX_RING")?;
        sys::setsockopt(raw, SOL_XDP, XDP_TX_RING, &txd, "XDP_TX_RING")?;
        let off: MmapOffsets = sys::getsockopt(raw, SOL_XDP, XDP_MMAP_OFFSETS, "XDP_MMAP_OFFSETS")?;
        let fill = Ring::new(raw, &off.fr, rxn, XDP_UMEM_PGOFF_FILL_RING)?;
        let comp = Ring::new(raw, &off.cr, txd, XDP_UMEM_PGOFF_COMPLETION_RING)?;
        let rx = Ring::new(raw, &off.rx, rxn, XDP_PGOFF_RX_RING)?;
        let tx = Ring::new(raw, &off.tx, txd, XDP_PGOFF_TX_RING)?;

        let bind = |flags: u16| -> Result<(), NicError> {
            let mut sa = [0u8; 16]; // struct sockaddr_xdp
            sa[0..2].copy_from_slice(&(AF_XDP as u16).to_ne_bytes());
            sa[2..4].copy_from_slice(&flags.to_ne_bytes());
            sa[4..8].copy_from_slice(&ifindex.to_ne_bytes());
            sa[8..12].copy_from_slice(&queue.to_ne_bytes());
            // SAFETY: sa is a complete sockaddr_xdp.
            let r = unsafe { libc::bind(raw, sa.as_ptr().cast(), 16) };
            sys::cvt(r, &format!("bind AF_XDP queue {queue} flags {flags:#x}")).map(|_| ())
        };
        let mut zero_copy = false;
        let mut bound = false;
        // Kernels before 6.6 know no XDP_USE_SG and refuse it (EINVAL); there
        // a frame must fit one chunk, and `frags` says so to the caller.
        let mut sg = XDP_USE_SG;
        if cfg.try_zero_copy {
            match bind(XDP_ZEROCOPY | XDP_USE_NEED_WAKEUP | sg) {
                Ok(()) => {
                    zero_copy = true;
                    bound = true;
                }
                Err(e) => tracing::debug!("zero-copy bind refused ({e}); using copy mode"),
            }
        }
        if !bound && cfg.zero_copy_only {
            // Kernels before 6.6 refuse XDP_USE_SG alone: zero-copy without it.
            if cfg.try_zero_copy && bind(XDP_ZEROCOPY | XDP_USE_NEED_WAKEUP).is_ok() {
                zero_copy = true;
                bound = true;
                sg = 0;
            } else {
                return Err(NicError::Unsupported(format!(
                    "AF_XDP zero-copy on queue {queue} (the driver binds in copy mode only)"
                )));
            }
        }
        if !bound {
            // EBUSY: a socket of a process that just died may still hold the
            // queue while the kernel tears it down (deferred); wait for it.
            let t0 = std::time::Instant::now();
            loop {
                match bind(XDP_COPY | XDP_USE_NEED_WAKEUP | sg) {
                    Ok(()) => break,
                    Err(NicError::Sys { source, .. })
                        if source.raw_os_error() == Some(libc::EINVAL) && sg != 0 =>
                    {
                        tracing::debug!("XDP_USE_SG refused (kernel < 6.6): one chunk per frame");
                        sg = 0;
                        // The zero-copy try above carried the flag too and
                        // may have failed for that alone: try it without.
                        if cfg.try_zero_copy && bind(XDP_ZEROCOPY | XDP_USE_NEED_WAKEUP).is_ok() {
                            zero_copy = true;
                            break;
                        }
                    }
                    Err(NicError::Sys { source, .. })
                        if source.raw_os_error() == Some(libc::EBUSY)
                            && t0.elapsed() < Duration::from_secs(3) =>
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let mut x = Xsk {
            fd,
            umem,
            fill,
            comp,
            rx,
            tx,
            rx_chunks,
            tx_free: (0..txn).rev().collect(),
            partial: Vec::new(),
            in_frame: false,
            zero_copy,
            frags: sg != 0,
            rx_frames: 0,
        };
        for i in 0..rx_chunks {
            x.fill.push((i * CHUNK) as u64);
        }
        x.fill.publish();
        Ok(x)
    }

    pub(super) fn tx_slot_addr(&self, slot: u32) -> usize {
        (self.rx_chunks + slot as usize * TX_SLOT_CHUNKS) * CHUNK
    }

    pub(super) fn umem_slice_mut(&mut self, addr: usize, len: usize) -> Option<&mut [u8]> {
        if addr.checked_add(len)? > self.umem.len {
            return None;
        }
        // SAFETY: in bounds; free TX slots are not in any kernel ring.
        Some(unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(addr), len) })
    }

    /// A zero-length non-blocking receive: wakes the driver to refill the
    /// RX ring (`needs_wakeup`, busy polling). Fails with ENXIO once the
    /// kernel has unbound the socket (its interface is gone).
    pub(super) fn kick_rx(&self) -> std::io::Result<()> {
        // SAFETY: zero-length non-blocking recvfrom on our own socket.
        let r = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    pub(super) fn kick_tx(&self) -> bool {
        // SAFETY: zero-length sendto on our own socket: asks the kernel to
        // process the TX ring.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        r >= 0
            || matches!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS)
            )
    }

    /// Takes finished TX slots back from the completion ring.
    pub(super) fn reclaim(&mut self) {
        let mut any = false;
        while let Some(addr) = self.comp.pop() {
            any = true;
            let base = self.rx_chunks * CHUNK;
            let a = addr as usize;
            // One completion per descriptor; the slot frees with its first.
            if a >= base && (a - base).is_multiple_of(TX_SLOT_CHUNKS * CHUNK) {
                self.tx_free
                    .push(((a - base) / (TX_SLOT_CHUNKS * CHUNK)) as u32);
            }
        }
        if any {
            self.comp.release();
        }
    }

    pub(super) fn stats(&self) -> XdpStatistics {
        sys::getsockopt(
            self.fd.as_raw_fd(),
            SOL_XDP,
            XDP_STATISTICS,
            "XDP_STATISTICS",
        )
        .unwrap_or_default()
    }
}
