//! linux/if_xdp.h: socket options, bind flags, ring offsets and the
//! structures the kernel and we share.

// linux/if_xdp.h
pub(super) const SOL_XDP: libc::c_int = 283;
pub(super) const XDP_MMAP_OFFSETS: libc::c_int = 1;
pub(super) const XDP_RX_RING: libc::c_int = 2;
pub(super) const XDP_TX_RING: libc::c_int = 3;
pub(super) const XDP_UMEM_REG: libc::c_int = 4;
pub(super) const XDP_UMEM_FILL_RING: libc::c_int = 5;
pub(super) const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
pub(super) const XDP_STATISTICS: libc::c_int = 7;
pub(super) const XDP_COPY: u16 = 1 << 1;
pub(super) const XDP_ZEROCOPY: u16 = 1 << 2;
pub(super) const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
pub(super) const XDP_USE_SG: u16 = 1 << 4;
pub(super) const XDP_RING_NEED_WAKEUP: u32 = 1;
pub(super) const XDP_PKT_CONTD: u32 = 1;
pub(super) const XDP_PGOFF_RX_RING: libc::off_t = 0;
pub(super) const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
pub(super) const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
pub(super) const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
// linux/socket.h
pub(super) const AF_XDP: libc::c_int = 44;
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RingOffset {
    pub(super) producer: u64,
    pub(super) consumer: u64,
    pub(super) desc: u64,
    pub(super) flags: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct MmapOffsets {
    pub(super) rx: RingOffset,
    pub(super) tx: RingOffset,
    pub(super) fr: RingOffset,
    pub(super) cr: RingOffset,
}

#[repr(C)]
pub(super) struct UmemReg {
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) chunk_size: u32,
    pub(super) headroom: u32,
    pub(super) flags: u32,
    pub(super) tx_metadata_len: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct XdpDesc {
    pub(super) addr: u64,
    pub(super) len: u32,
    pub(super) options: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct XdpStatistics {
    pub(super) rx_dropped: u64,
    pub(super) rx_invalid_descs: u64,
    pub(super) tx_invalid_descs: u64,
    pub(super) rx_ring_full: u64,
    pub(super) rx_fill_ring_empty_descs: u64,
    pub(super) tx_ring_empty_descs: u64,
}
