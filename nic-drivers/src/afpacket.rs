//! AF_PACKET backend: a TPACKET_V3 mmap RX ring behind a classic-BPF filter
//! that keeps only UDP-to-4791 frames, and a TPACKET_V2 mmap TX ring through
//! the qdisc (PACKET_QDISC_BYPASS optional). Needs CAP_NET_RAW.
//!
//! Two sockets: the RX one (V3 ring, filter, PACKET_IGNORE_OUTGOING so our own
//! sends do not loop back) and the TX one (V2 ring: V3 TX rings exist but V2
//! is the long-tested path; bound with protocol 0 so it receives nothing).
//!
//! Latency note: a V3 block is handed to user space when it is full or when
//! its retire timer (`block_timeout_ms`, ≥ 1 ms) fires, so a lone frame may
//! wait up to that long. Throughput is unaffected.

mod gather;

use std::cell::Cell;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

use crate::frame::ROCE_V2_PORT;
use crate::gso::{self, Run, VNET_HDR_LEN};
use crate::ipv4_id::IdRecovery;
use crate::mcast::Memberships;
use crate::raw_share::RawShare;
use crate::{offload, sys};
use crate::{NicError, PacketIo, RxSink, RxSinkChecked, Stats, TxFill, TxSource};

// linux/if_packet.h
const SOL_PACKET: libc::c_int = 263;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_LOSS: libc::c_int = 14;
const PACKET_TX_RING: libc::c_int = 13;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_COPY_THRESH: libc::c_int = 7;
// A V2 slot holds a cut copy; the whole frame waits on the socket.
const TP_STATUS_COPY: u32 = 1 << 1;
/// The largest frame the socket can hand over whole: a 64 KiB GSO
/// super-frame with its headers and virtio-net header.
const MAX_WHOLE_FRAME: usize = (64 << 10) + 256;
const TPACKET_V2: libc::c_int = 1;
const TPACKET_V3: libc::c_int = 2;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
// The frame came from a local socket with its checksum left to the NIC.
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
const TP_STATUS_AVAILABLE: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_WRONG_FORMAT: u32 = 4;
/// How long `transmit` waits in all for send-buffer room before leaving
/// frames to its next call, and the step between kicks meanwhile.
const FLUSH_WAIT: Duration = Duration::from_millis(20);
const FLUSH_STEP: Duration = Duration::from_millis(1);
/// TX slot size with GSO: a 64 KiB super-frame, its headers and the slot's.
const GSO_TX_FRAME: usize = 64 << 10;
// linux/if_ether.h
const ETH_P_ALL: u16 = 0x0003;
// asm-generic/socket.h
const SO_ATTACH_FILTER: libc::c_int = 26;

// struct tpacket_block_desc / tpacket_hdr_v1 field offsets (linux/if_packet.h).
const BD_BLOCK_STATUS: usize = 8;
const BD_NUM_PKTS: usize = 12;
const BD_OFFSET_TO_FIRST_PKT: usize = 16;
// struct tpacket3_hdr field offsets.
const T3_NEXT_OFFSET: usize = 0;
const T3_SNAPLEN: usize = 12;
const T3_STATUS: usize = 20;
const T3_MAC: usize = 24;
const T3_VLAN_TCI: usize = 32;
const T3_VLAN_TPID: usize = 36;
// struct tpacket2_hdr: tp_status @0, tp_len @4; data starts at
// TPACKET2_HDRLEN - sizeof(struct sockaddr_ll) = TPACKET_ALIGN(32) = 32.
const T2_STATUS: usize = 0;
const T2_LEN: usize = 4;
const T2_SNAPLEN: usize = 8;
const T2_MAC: usize = 12;
const T2_VLAN_TCI: usize = 24;
const T2_VLAN_TPID: usize = 26;
const T2_DATA: usize = 32;
/// V2 RX slot size: the largest RoCE v2 frame (path MTU 4096 with IPv6,
/// RETH and ImmDt: 4198 bytes) behind the slot's headers (76 bytes with
/// PACKET_VNET_HDR), rounded up to TPACKET_ALIGNMENT (16). A larger frame (a
/// GSO super-frame, a jumbo datagram to the port) comes whole through the
/// socket (PACKET_COPY_THRESH). Small slots make a deep ring: 16 MiB holds
/// 3840, where 1024 slots of 16 KiB overflowed while a descheduled receiver
/// slept through a UD burst (perftest's `ib_send_bw -c UD` on a loaded host
/// lost frames and hung).
const V2_RX_FRAME: usize = 4352;
/// Receive buffer for frames larger than a V2 slot (see `V2_RX_FRAME`).
const V2_COPY_BUFFER: usize = 8 << 20;

/// RX ring layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxRing {
    /// TPACKET_V3: variable-size frames packed in blocks.
    V3,
    /// TPACKET_V2: fixed slots of 4352 bytes, one frame each.
    V2,
}

/// AF_PACKET settings.
#[derive(Debug, Clone)]
pub struct AfPacketConfig {
    /// Interface name (in the calling thread's network namespace).
    pub ifname: String,
    /// UDP destination port the RX filter keeps (4791).
    pub port: u16,
    /// RX block size (power of two, multiple of the page size).
    pub rx_block_size: usize,
    /// Number of RX blocks.
    pub rx_blocks: usize,
    /// A V3 block is retired after this many ms even if not full (≥ 1).
    pub block_timeout_ms: u32,
    /// RX ring layout: V3 (blocks; cheapest per frame, up to
    /// `block_timeout_ms` extra latency at low rates) or V2 (one slot per
    /// frame; each frame visible at once: use it for latency runs).
    pub rx_ring: RxRing,
    /// TX ring slots.
    pub tx_frames: usize,
    /// Send buffer of the TX socket in bytes; 0 (the default) makes room for
    /// every frame of the TX ring at once (see `open`).
    pub tx_socket_buffer: usize,
    /// Skip the qdisc layer on transmit (PACKET_QDISC_BYPASS): frames the
    /// device cannot take at once are then dropped, not queued.
    pub qdisc_bypass: bool,
    /// Hold UDP `port` with a socket that drops everything, so the kernel's
    /// own copy of each RoCE frame is discarded early instead of answered
    /// with ICMP port-unreachable (which costs the receive path ~15 % and
    /// sends ICMP to the peer). Bound with `SO_REUSEADDR`, so other
    /// processes' sinks and UDP-backend devices on the interface's own
    /// addresses can bind the port too; skipped silently if the port is
    /// taken all the same (a UDP-backend device bound to the wildcard).
    pub sink_socket: bool,
    /// Take a QPN prefix from the interface's table of ferroce devices
    /// ([`raw_share`](crate::raw_share)) and keep only frames to QPs under
    /// it, so several processes can each run a device on the interface.
    /// Off by default here (the filter would drop test frames that carry no
    /// BTH); the verbs layer turns it on.
    pub share_qpns: bool,
    /// Send runs of same-size frames of one flow as one UDP GSO frame
    /// ([`crate::gso`]) where the kernel takes them from a packet socket
    /// (Linux 6.2 and later; older kernels get every frame on its own).
    pub gso: bool,
    /// Every frame `transmit` is given is a RoCE v2 packet with a right ICRC
    /// (the transport core's are): a frame joining a GSO run then gets its
    /// IPv4 ID and ICRC updated without the ICRC being checked first, one CRC
    /// pass less per frame. Off by default, so other payloads pass unchanged.
    pub tx_icrc_valid: bool,
    /// Whether `transmit_gather` sends each frame's payload from where its
    /// source keeps it (sendmmsg on a second packet socket, without a ring:
    /// the kernel's copy is the only one) or joins each frame in the TX ring
    /// (our copy). `transmit` always uses the ring.
    pub gather: Gather,
}

/// How [`AfPacketIo`] transmits frames whose payload lies elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// Gathered on veth, through the TX ring elsewhere. veth hands a frame to
    /// the peer's namespace only after copying the ring's pages out of it
    /// (`__dev_forward_skb2` → `skb_copy_ubufs`), so there the ring costs
    /// two copies: a 64 KiB WRITE stream moved 1.25× as much gathered.
    /// A NIC or virtio-net sends the ring's pages as they are; in the test
    /// VMs (virtio-net, TCG) the ring moved 1.3× as much (4 interleaved
    /// runs each, 35.7 against 27.5 MB/s).
    Auto,
    /// Always gathered.
    Always,
    /// Always through the TX ring.
    Never,
}

impl AfPacketConfig {
    /// Defaults: 16 MiB RX ring in 256 KiB blocks, 1 ms retire, 256 TX slots.
    pub fn new(ifname: &str) -> Self {
        AfPacketConfig {
            ifname: ifname.to_string(),
            port: ROCE_V2_PORT,
            rx_block_size: 256 << 10,
            rx_blocks: 64,
            block_timeout_ms: 1,
            rx_ring: RxRing::V3,
            tx_frames: 256,
            tx_socket_buffer: 0,
            // Off: with the qdisc bypassed the kernel drops a frame when the
            // device's TX queue is stopped (packet(7)). In a QEMU VM a third
            // of a WRITE server's ACKs went missing with it (core 571 sent,
            // eth0 413 out), though part of that was frames stranded by a
            // full send buffer (see `flush`), found later; with that fixed,
            // bypass still moved 54-66 MB/s there against 72-81 through the
            // qdisc. No gain on veth (MACHINE.md).
            qdisc_bypass: false,
            sink_socket: true,
            share_qpns: false,
            gso: true,
            tx_icrc_valid: false,
            gather: Gather::Auto,
        }
    }
}

/// An mmap'ed ring, unmapped on drop.
#[derive(Debug)]
struct Mmap {
    ptr: *mut u8,
    len: usize,
}

impl Mmap {
    fn new(fd: RawFd, len: usize) -> Result<Self, NicError> {
        // SAFETY: maps `len` bytes of the socket's ring; the kernel checks len
        // against the ring it set up and fails otherwise.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_LOCKED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            // MAP_LOCKED can fail on RLIMIT_MEMLOCK: retry without it.
            // SAFETY: as above.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(NicError::last_os("mmap packet ring"));
            }
            return Ok(Mmap { ptr: p.cast(), len });
        }
        Ok(Mmap { ptr: p.cast(), len })
    }

    /// The u32 at `off`, as an atomic (ring status words are shared with the kernel).
    fn atomic_u32(&self, off: usize) -> Option<&AtomicU32> {
        if !off.is_multiple_of(4) || off + 4 > self.len {
            return None;
        }
        // SAFETY: in bounds and 4-aligned (the mapping is page-aligned); the
        // kernel and we access these words concurrently, hence atomic.
        Some(unsafe { &*(self.ptr.add(off) as *const AtomicU32) })
    }

    fn read_u32(&self, off: usize) -> u32 {
        self.atomic_u32(off)
            .map_or(0, |a| a.load(Ordering::Acquire))
    }

    fn read_u16(&self, off: usize) -> u16 {
        if off + 2 > self.len {
            return 0;
        }
        // SAFETY: in bounds; plain read of a field the kernel wrote before it
        // released the block (ordered by the acquire load of the status).
        unsafe { std::ptr::read_unaligned(self.ptr.add(off) as *const u16) }
    }

    fn slice(&self, off: usize, len: usize) -> Option<&[u8]> {
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds; the block belongs to user space until we give it back.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) })
    }

    fn slice_mut(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds; a TX slot is ours while its status is
        // AVAILABLE, an RX block or slot while it is TP_STATUS_USER.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) })
    }

    /// Copies `len` bytes from `src` to `dst` (ranges in bounds, may overlap).
    fn copy_within(&mut self, src: usize, dst: usize, len: usize) -> bool {
        let fits = |at: usize| at.checked_add(len).is_some_and(|end| end <= self.len);
        if !fits(src) || !fits(dst) {
            return false;
        }
        // SAFETY: both ranges are in bounds (checked above); ptr::copy allows
        // overlap; both slots are ours (AVAILABLE, or filled but not yet marked).
        unsafe { std::ptr::copy(self.ptr.add(src), self.ptr.add(dst), len) };
        true
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Whether this kernel takes UDP GSO frames from a packet socket (a
/// virtio-net header of kind `VIRTIO_NET_HDR_GSO_UDP_L4`): since Linux 6.2.
pub fn gso_supported() -> bool {
    crate::kernel_version().is_some_and(|v| v >= (6, 2))
}

/// Top byte of the multicast QPN 0xFFFFFF (IBTA 10.5.2.4); no device's QPN
/// prefix (`raw_share`) is ever 0xFF.
const MULTICAST_QPN_TOP: u32 = 0xFF;

/// The classic BPF program: accept Ethernet [+ one 802.1Q tag] / IPv4 (no
/// options, not a fragment) or IPv6 (no extension headers) / UDP to `port`,
/// and with `qpn_prefix`, only datagrams whose BTH destination QP has that
/// top byte (or that are too short to hold one: the stack counts those).
pub fn udp_port_filter(port: u16, qpn_prefix: Option<u8>) -> Vec<libc::sock_filter> {
    // Opcodes from linux/bpf_common.h + linux/filter.h.
    const LDX_IMM: u16 = 0x01; // BPF_LDX | BPF_W | BPF_IMM
    const LD_LEN: u16 = 0x80; // BPF_LD | BPF_W | BPF_LEN
    const SUB_X: u16 = 0x1c; // BPF_ALU | BPF_SUB | BPF_X
    const LDH_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
    const LDH_IND: u16 = 0x48; // BPF_LD | BPF_H | BPF_IND
    const LDB_IND: u16 = 0x50; // BPF_LD | BPF_B | BPF_IND
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const JSET: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K

    // Byte 5 of the BTH (the top byte of the destination QP), from the UDP header.
    const DEST_QP_TOP: u32 = 8 + 5;
    let i = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let p = u32::from(port);
    // Instructions 0..=18 end in "accept" (19 + `tail`) or "reject" (20 + `tail`);
    // with a prefix, the port checks go to the QPN checks (19.., 24..) first.
    let (tail, v6_ok) = if qpn_prefix.is_some() {
        (12, 6)
    } else {
        (0, 0)
    };
    let mut prog = vec![
        i(LDX_IMM, 0, 0, 0),          // 0: X = 0 (no VLAN)
        i(LDH_ABS, 0, 0, 12),         // 1: A = EtherType
        i(JEQ, 0, 2, 0x8100),         // 2: 802.1Q? else -> 5
        i(LDX_IMM, 0, 0, 4),          // 3: X = 4 (tag length)
        i(LDH_ABS, 0, 0, 16),         // 4: A = inner EtherType
        i(JEQ, 0, 8, 0x0800),         // 5: IPv4? else -> 14
        i(LDB_IND, 0, 0, 14),         // 6: version/IHL
        i(JEQ, 0, 12 + tail, 0x45),   // 7: IPv4 without options, else reject
        i(LDB_IND, 0, 0, 23),         // 8: protocol
        i(JEQ, 0, 10 + tail, 17),     // 9: UDP, else reject
        i(LDH_IND, 0, 0, 20),         // 10: flags + fragment offset
        i(JSET, 8 + tail, 0, 0x3FFF), // 11: MF or fragment offset -> reject
        i(LDH_IND, 0, 0, 36),         // 12: UDP dst port (14 + 20 + 2)
        i(JEQ, 5, 6 + tail, p),       // 13: -> accept (or QPN check) / reject
        i(JEQ, 0, 5 + tail, 0x86DD),  // 14: IPv6? else reject
        i(LDB_IND, 0, 0, 20),         // 15: next header
        i(JEQ, 0, 3 + tail, 17),      // 16: UDP, else reject
        i(LDH_IND, 0, 0, 56),         // 17: UDP dst port (14 + 40 + 2)
        i(JEQ, v6_ok, 1 + tail, p),   // 18: -> accept (or QPN check) / reject
    ];
    if let Some(q) = qpn_prefix {
        let q = u32::from(q);
        // The multicast QPN's top byte: every device on the interface takes
        // a copy, each for the QPs it attached to the group.
        let mc = MULTICAST_QPN_TOP;
        let (bth4, bth6) = (14 + 20 + DEST_QP_TOP, 14 + 40 + DEST_QP_TOP);
        prog.extend([
            i(LD_LEN, 0, 0, 0),     // 19: A = frame length
            i(SUB_X, 0, 0, 0),      // 20: less the VLAN tag
            i(JGE, 0, 9, bth4 + 1), // 21: no BTH byte 5 -> accept
            i(LDB_IND, 0, 0, bth4), // 22: A = destination QP >> 16
            i(JEQ, 7, 0, q),        // 23: ours -> accept
            i(JEQ, 6, 7, mc),       // 24: multicast -> accept, else reject
            i(LD_LEN, 0, 0, 0),     // 25: the same for IPv6
            i(SUB_X, 0, 0, 0),      // 26
            i(JGE, 0, 3, bth6 + 1), // 27
            i(LDB_IND, 0, 0, bth6), // 28
            i(JEQ, 1, 0, q),        // 29
            i(JEQ, 0, 1, mc),       // 30
        ]);
    }
    prog.push(i(RET, 0, 0, 0x0004_0000)); // accept whole frame
    prog.push(i(RET, 0, 0, 0)); // reject
    prog
}

/// Empty receives between two looks at the socket's pending error
/// ([`AfPacketIo::check_link`]): one system call per 256 empty polls.
const LINK_CHECK_EVERY: u32 = 256;

/// The AF_PACKET backend.
#[derive(Debug)]
pub struct AfPacketIo {
    rx_fd: OwnedFd,
    /// Receives in a row that found nothing (see [`AfPacketIo::check_link`]).
    empty_recvs: crate::link_check::EmptyRecvs,
    /// The last check found the link down: until a frame comes, every empty
    /// receive looks again (the interface's removal may follow, unannounced).
    link_down: bool,
    tx_fd: OwnedFd,
    // Sends of frames gathered from their sources (`AfPacketConfig::gather`).
    gather: Option<gather::GatherTx>,
    rx_ring: Mmap,
    tx_ring: Mmap,
    cfg: AfPacketConfig,
    mac: [u8; 6],
    max_frame_len: usize,
    // RX position: current block, packets already consumed in it, and the
    // offset of the next packet.
    rx_block: usize,
    rx_pkt: u32,
    rx_off: usize,
    tx_head: usize,
    tx_frame_size: usize,
    // Each TX slot starts with a virtio-net header; runs of frames go as
    // UDP GSO super-frames (crate::gso).
    tx_gso: bool,
    ids: IdRecovery,
    // Frames marked for sending that the kernel has not taken yet.
    tx_unsent: bool,
    mtu: usize,
    _sink: Option<OwnedFd>,
    share: Option<RawShare>,
    /// Multicast groups joined on the interface (frames arrive on the ring).
    mcast: Memberships,
    rx: RxScratch,
    // Frames too big for a V2 slot, read whole from the socket.
    whole: Vec<u8>,
    stats: Stats,
    kernel_drops: Cell<u64>,
}

// SAFETY: the mmap'ed rings are owned by this struct alone (no aliases are
// handed out beyond a &self/&mut self borrow); the kernel side is synchronised
// through the status words. Moving the struct to another thread is sound.
unsafe impl Send for AfPacketIo {}

fn packet_socket() -> Result<OwnedFd, NicError> {
    // Protocol 0: receives nothing until bound, so the filter and ring are in
    // place before the first frame arrives.
    // SAFETY: plain syscall with valid constants.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    sys::owned(fd, "socket(AF_PACKET)").map_err(|e| match e {
        NicError::Sys { source, .. } if source.raw_os_error() == Some(libc::EPERM) => {
            NicError::NeedsPrivilege("AF_PACKET")
        }
        e => e,
    })
}

fn bind_packet(fd: RawFd, ifindex: u32, proto: u16) -> Result<(), NicError> {
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto.to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: sll is a valid sockaddr_ll of the given size.
    let r = unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    sys::cvt(r, "bind AF_PACKET").map(|_| ())
}

/// What the receive path works with besides the ring.
#[derive(Debug)]
struct RxScratch {
    /// A frame with its VLAN tag put back.
    scratch: Vec<u8>,
    /// IPv4 IDs of the frames a GSO super-frame is cut into.
    ids: IdRecovery,
    /// The RX ring carries a virtio-net header before each frame (its GSO
    /// size). Without one (Linux < 6.2) a frame whose UDP checksum the
    /// kernel left to the device (from a socket on this host) may be a GSO
    /// super-frame, and is looked into.
    vnet: bool,
}

/// What the kernel left undone on a received frame (see `offload`).
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    /// The UDP checksum holds the partial form (TP_STATUS_CSUMNOTREADY).
    csum: bool,
    /// A UDP GSO super-frame of datagrams this long (0: a plain frame).
    gso_size: usize,
}

/// Hands one received frame to `sink`: with its VLAN tag put back in (a
/// copy), its partial checksum cleared, cut into wire frames if it is a GSO
/// super-frame (in place: `f` is ring memory or a buffer of ours that is
/// handed back after this). Returns the frames and bytes delivered ((0, 0):
/// dropped).
fn deliver(
    f: &mut [u8],
    vlan: Option<(u16, u16)>,
    mut pending: Pending,
    rx: &mut RxScratch,
    mtu: usize,
    sink: &mut RxSinkChecked<'_>,
) -> (usize, usize) {
    // A local UDP socket's GSO send the kernel could not describe (Linux <
    // 6.2), which a frame longer than the link carries can only be.
    let look_inside = pending.gso_size == 0 && ((!rx.vnet && pending.csum) || f.len() > mtu + 18);
    if vlan.is_none() && !pending.csum && !look_inside {
        sink(f, false);
        return (1, f.len());
    }
    let frame: &mut [u8] = match vlan {
        Some((tpid, tci)) if f.len() >= 12 => {
            rx.scratch.clear();
            rx.scratch.extend_from_slice(&f[..12]);
            rx.scratch.extend_from_slice(&tpid.to_be_bytes());
            rx.scratch.extend_from_slice(&tci.to_be_bytes());
            rx.scratch.extend_from_slice(&f[12..]);
            &mut rx.scratch
        }
        _ => f,
    };
    let l3 = match frame.get(12..14) {
        Some([0x81, 0x00] | [0x88, 0xA8]) => 18,
        _ => 14,
    };
    let mut checked = false;
    if look_inside {
        // Nearly every such frame is one datagram (from another host whose
        // NIC left the checksum, too): a whole frame whose ICRC is right is
        // one, and the check is one the transport need not repeat. Only
        // otherwise look for where packets start again, a pass that costs a
        // few times the CRC's (under emulation it starved the ring).
        checked = frame.get(l3..).is_some_and(crate::ipv4_id::icrc_ok);
        // IPv4 and UDP headers come off the MTU (IPv6's are longer still);
        // 0: a single datagram after all.
        if !checked {
            pending.gso_size = offload::infer_gso_size(frame, mtu.saturating_sub(28)).unwrap_or(0);
        }
    }
    if pending.gso_size > 0 {
        let (mut bytes, ids) = (0, &mut rx.ids);
        let mut each = |seg: &mut [u8]| {
            bytes += seg.len();
            // The cut numbers IPv4 IDs as the kernel's GSO does; checked
            // against the ICRC (which covers the ID), and found if it differs
            // after all, so the transport need not check the ICRC again.
            let checked = seg.get_mut(l3..).is_some_and(|h| ids.fix(h));
            sink(seg, checked);
        };
        // None: not UDP over IP or cut short by the ring (counted as a drop).
        let frames = offload::segment_udp(frame, pending.gso_size, pending.csum, &mut each);
        return (frames.unwrap_or(0), bytes);
    }
    if pending.csum {
        // A local UDP socket's frame over veth: the device was to finish it.
        offload::clear_partial(frame);
    }
    sink(frame, checked);
    (1, frame.len())
}

/// Whether the kernel would take a `len`-byte frame (it refuses longer
/// ones, and without PACKET_LOSS would stall the ring on them).
fn sendable(frame: &[u8], len: usize, max_len: usize, mtu: usize) -> bool {
    len <= max_len && crate::frame::fits_mtu(frame, len, mtu)
}

/// Gives a frame joining a GSO run the IPv4 ID the kernel will give its
/// segment, with the ICRC to match (see `AfPacketConfig::tx_icrc_valid`);
/// false if it cannot have it (not RoCE, or its ICRC was wrong already).
fn give_id(ids: &mut IdRecovery, icrc_valid: bool, frame: &mut [u8], id: Option<u16>) -> bool {
    let Some(id) = id else { return true };
    frame
        .get_mut(crate::frame::ETH_HLEN..)
        .is_some_and(|l3| ids.give_id(l3, id, icrc_valid))
}

/// A dual-stack UDP socket on `port` whose filter drops every datagram.
fn sink_socket(port: u16) -> Option<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let fd = sys::owned(fd, "socket(sink)").ok()?;
    let raw = fd.as_raw_fd();
    let zero: libc::c_int = 0;
    sys::setsockopt(
        raw,
        libc::IPPROTO_IPV6,
        libc::IPV6_V6ONLY,
        &zero,
        "IPV6_V6ONLY",
    )
    .ok()?;
    // Other processes' sinks and shared UDP-backend sockets on a specific
    // address (udp.rs) set it too, so all of them can bind; a datagram goes
    // to a socket on its own address before this wildcard one.
    let one: libc::c_int = 1;
    sys::setsockopt(
        raw,
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        &one,
        "SO_REUSEADDR",
    )
    .ok()?;
    // "ret #0": drop in sk_filter, before any receive-buffer accounting.
    let drop_all = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    sys::attach_cbpf(raw, SO_ATTACH_FILTER, &drop_all, "SO_ATTACH_FILTER sink").ok()?;
    // No UDP_GRO (which would let the kernel drop a peer's GSO super-frame
    // whole rather than cut it up first, see `LocalPeersIo`): on the
    // wildcard address it would make GRO join every interface's frames to
    // the port, also those of an AF_XDP device elsewhere on the host.
    let (ss, len) = crate::udp::to_sockaddr(&std::net::SocketAddr::new(
        std::net::Ipv6Addr::UNSPECIFIED.into(),
        port,
    ));
    // SAFETY: ss holds a valid sockaddr_in6 of `len` bytes.
    let r = unsafe { libc::bind(raw, (&ss as *const libc::sockaddr_storage).cast(), len) };
    if r < 0 {
        tracing::debug!("UDP port {port} taken; no sink socket");
        return None;
    }
    Some(fd)
}

impl AfPacketIo {
    /// Opens both rings on `cfg.ifname`.
    pub fn open(cfg: AfPacketConfig) -> Result<Self, NicError> {
        let page = 4096usize;
        if !cfg.rx_block_size.is_power_of_two()
            || cfg.rx_block_size < page
            || cfg.rx_blocks == 0
            || cfg.tx_frames == 0
            || cfg.block_timeout_ms == 0
        {
            return Err(NicError::Config(format!("afpacket {cfg:?}")));
        }
        let ifindex = sys::if_index(&cfg.ifname)?;
        let share = if cfg.share_qpns {
            Some(RawShare::join(ifindex)?)
        } else {
            None
        };

        // --- RX: V3 ring + filter ---
        let rx_fd = packet_socket()?;
        let rx = rx_fd.as_raw_fd();
        let mac = sys::if_mac(rx, &cfg.ifname)?;
        let mtu = sys::if_mtu(rx, &cfg.ifname)?;
        let prog = udp_port_filter(cfg.port, share.as_ref().map(RawShare::prefix));
        sys::attach_cbpf(rx, SO_ATTACH_FILTER, &prog, "SO_ATTACH_FILTER")?;
        let v3 = cfg.rx_ring == RxRing::V3;
        let version = if v3 { TPACKET_V3 } else { TPACKET_V2 };
        sys::setsockopt(
            rx,
            SOL_PACKET,
            PACKET_VERSION,
            &version,
            "PACKET_VERSION (RX)",
        )?;
        let one: libc::c_int = 1;
        // Available since Linux 4.20; older kernels just loop our sends back.
        if let Err(e) = sys::setsockopt(
            rx,
            SOL_PACKET,
            PACKET_IGNORE_OUTGOING,
            &one,
            "PACKET_IGNORE_OUTGOING",
        ) {
            tracing::warn!("{e}");
        }
        // A GSO sender's frames cross veth uncut; the virtio-net header in
        // front of each says how to cut them (see offload). Not before Linux
        // 6.2: its header has no kind for UDP, and the kernel drops such a
        // frame rather than hand it over without one (a UDP-backend device
        // sending to this one over veth lost every message of more than one
        // packet); without the header the frame comes whole, and the cut is
        // worked out from the RoCE packets inside (offload::infer_gso_size).
        let vnet = gso_supported()
            && match sys::setsockopt(rx, SOL_PACKET, PACKET_VNET_HDR, &one, "PACKET_VNET_HDR") {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("{e}");
                    false
                }
            };
        // V2: a frame larger than its slot (a GSO super-frame) is also queued
        // whole on the socket, to be read with recv.
        if !v3 {
            sys::setsockopt(
                rx,
                SOL_PACKET,
                PACKET_COPY_THRESH,
                &one,
                "PACKET_COPY_THRESH",
            )?;
            // Those whole frames count against the receive buffer: room for
            // a burst of jumbo frames (the default ~208 KiB held 25 of 8000
            // bytes). Forced past rmem_max where the capability allows.
            sys::set_socket_buffer(
                rx,
                sys::SO_RCVBUFFORCE,
                libc::SO_RCVBUF,
                V2_COPY_BUFFER,
                "SO_RCVBUF",
            );
        }
        // The ring must hold a 9 KB frame plus its header in one block; V3
        // also cuts frames at tp_frame_size, and a GSO super-frame (see
        // offload) is up to 64 KiB plus headers.
        let frame_size = if v3 {
            (128 << 10).min(cfg.rx_block_size)
        } else {
            V2_RX_FRAME
        };
        if v3 {
            let req = libc::tpacket_req3 {
                tp_block_size: cfg.rx_block_size as u32,
                tp_block_nr: cfg.rx_blocks as u32,
                tp_frame_size: frame_size as u32,
                tp_frame_nr: ((cfg.rx_block_size / frame_size) * cfg.rx_blocks) as u32,
                tp_retire_blk_tov: cfg.block_timeout_ms,
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            sys::setsockopt(rx, SOL_PACKET, PACKET_RX_RING, &req, "PACKET_RX_RING")?;
        } else {
            if cfg.rx_block_size < V2_RX_FRAME {
                return Err(NicError::Config(format!(
                    "V2 RX needs rx_block_size >= {V2_RX_FRAME}"
                )));
            }
            let req = libc::tpacket_req {
                tp_block_size: cfg.rx_block_size as u32,
                tp_block_nr: cfg.rx_blocks as u32,
                tp_frame_size: V2_RX_FRAME as u32,
                tp_frame_nr: ((cfg.rx_block_size / V2_RX_FRAME) * cfg.rx_blocks) as u32,
            };
            sys::setsockopt(rx, SOL_PACKET, PACKET_RX_RING, &req, "PACKET_RX_RING")?;
        }
        let rx_ring = Mmap::new(rx, cfg.rx_block_size * cfg.rx_blocks)?;
        bind_packet(rx, ifindex, ETH_P_ALL)?;

        // --- TX: V2 ring ---
        let tx_fd = packet_socket()?;
        let tx = tx_fd.as_raw_fd();
        sys::setsockopt(
            tx,
            SOL_PACKET,
            PACKET_VERSION,
            &TPACKET_V2,
            "PACKET_VERSION V2",
        )?;
        // Skip (rather than stop at) a frame the kernel refuses, so one bad
        // frame cannot stall the ring behind it.
        sys::setsockopt(tx, SOL_PACKET, PACKET_LOSS, &one, "PACKET_LOSS")?;
        if cfg.qdisc_bypass {
            sys::setsockopt(
                tx,
                SOL_PACKET,
                PACKET_QDISC_BYPASS,
                &one,
                "PACKET_QDISC_BYPASS",
            )?;
        }
        // UDP GSO through a packet socket: the virtio-net header kind
        // VIRTIO_NET_HDR_GSO_UDP_L4 is taken since Linux 6.2 (older kernels
        // refuse each such frame, which PACKET_LOSS would drop unseen).
        let gso = cfg.gso
            && gso_supported()
            && match sys::setsockopt(
                tx,
                SOL_PACKET,
                PACKET_VNET_HDR,
                &one,
                "PACKET_VNET_HDR (TX)",
            ) {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!("{e}: no GSO on transmit");
                    false
                }
            };
        // A GSO slot holds a super-frame of up to 64 KiB with its headers
        // (half as many slots, so the ring's memory stays 8 MiB by default).
        let (tx_frame_size, tx_block, tx_frames) = if gso {
            (GSO_TX_FRAME, GSO_TX_FRAME, cfg.tx_frames.div_ceil(2))
        } else {
            (16384usize, 65536usize, cfg.tx_frames)
        };
        let per_block = tx_block / tx_frame_size;
        let tx_blocks = tx_frames.div_ceil(per_block);
        let treq = libc::tpacket_req {
            tp_block_size: tx_block as u32,
            tp_block_nr: tx_blocks as u32,
            tp_frame_size: tx_frame_size as u32,
            tp_frame_nr: (tx_blocks * per_block) as u32,
        };
        sys::setsockopt(tx, SOL_PACKET, PACKET_TX_RING, &treq, "PACKET_TX_RING")?;
        let tx_ring = Mmap::new(tx, tx_block * tx_blocks)?;
        // Every frame in flight is charged to the socket's send buffer until
        // the driver frees it. At the default 208 KiB only ~44 frames of
        // 4 KiB fit, and the kernel leaves the rest of the ring waiting:
        // room for the whole ring instead (a slot is larger than a frame
        // plus the skb the kernel charges with it).
        let sndbuf = match cfg.tx_socket_buffer {
            0 => tx_block * tx_blocks,
            n => n,
        };
        sys::set_socket_buffer(
            tx,
            sys::SO_SNDBUFFORCE,
            libc::SO_SNDBUF,
            sndbuf,
            "SO_SNDBUF",
        );
        bind_packet(tx, ifindex, 0)?;

        // Ethernet header + one VLAN tag on top of the IP MTU.
        let vnet_len = if gso { VNET_HDR_LEN } else { 0 };
        let max_frame_len = (mtu + 18).min(tx_frame_size - T2_DATA - vnet_len);
        let gathered = match cfg.gather {
            Gather::Always => true,
            Gather::Never => false,
            Gather::Auto => sys::if_driver(tx, &cfg.ifname).as_deref() == Some("veth"),
        };
        let gather = if gathered {
            Some(gather::GatherTx::open(
                ifindex,
                (max_frame_len, mtu),
                gso,
                cfg.qdisc_bypass,
                cfg.tx_icrc_valid,
            )?)
        } else {
            None
        };
        Ok(AfPacketIo {
            gather,
            mcast: Memberships::new(ifindex, None, None),
            rx_fd,
            empty_recvs: Default::default(),
            link_down: false,
            tx_fd,
            rx_ring,
            tx_ring,
            mac,
            max_frame_len,
            rx_block: 0,
            rx_pkt: 0,
            rx_off: 0,
            tx_head: 0,
            tx_frame_size,
            tx_gso: gso,
            ids: IdRecovery::default(),
            tx_unsent: false,
            mtu,
            _sink: if cfg.sink_socket {
                sink_socket(cfg.port)
            } else {
                None
            },
            share,
            rx: RxScratch {
                scratch: vec![0u8; frame_size + 4],
                ids: IdRecovery::default(),
                vnet,
            },
            whole: Vec::new(),
            stats: Stats::default(),
            kernel_drops: Cell::new(0),
            cfg,
        })
    }

    /// TPACKET_V3: frames from the blocks the kernel handed over.
    fn recv_v3(&mut self, max: usize, sink: &mut RxSinkChecked<'_>) -> Result<usize, NicError> {
        let bs = self.cfg.rx_block_size;
        let mut n = 0;
        while n < max {
            let base = self.rx_block * bs;
            let status = self.rx_ring.read_u32(base + BD_BLOCK_STATUS);
            if status & TP_STATUS_USER == 0 {
                break;
            }
            let num = self.rx_ring.read_u32(base + BD_NUM_PKTS);
            if self.rx_pkt == 0 {
                self.rx_off = self.rx_ring.read_u32(base + BD_OFFSET_TO_FIRST_PKT) as usize;
            }
            while self.rx_pkt < num && n < max {
                let hdr = base + self.rx_off;
                if self.rx_off >= bs {
                    break; // corrupt offset: give the block back
                }
                let snaplen = self.rx_ring.read_u32(hdr + T3_SNAPLEN) as usize;
                let pstatus = self.rx_ring.read_u32(hdr + T3_STATUS);
                let mac_off = usize::from(self.rx_ring.read_u16(hdr + T3_MAC));
                let next = self.rx_ring.read_u32(hdr + T3_NEXT_OFFSET) as usize;
                let vlan = (pstatus & TP_STATUS_VLAN_VALID != 0).then(|| {
                    let tpid = if pstatus & TP_STATUS_VLAN_TPID_VALID != 0 {
                        self.rx_ring.read_u16(hdr + T3_VLAN_TPID)
                    } else {
                        0x8100
                    };
                    (tpid, self.rx_ring.read_u32(hdr + T3_VLAN_TCI) as u16)
                });
                let pending = self.pending(hdr, mac_off, pstatus);
                if let Some(f) = self.rx_ring.slice_mut(hdr + mac_off, snaplen) {
                    let (frames, len) = deliver(f, vlan, pending, &mut self.rx, self.mtu, sink);
                    self.count_rx(frames, len);
                    n += frames.max(1);
                } else {
                    self.stats.rx_dropped += 1;
                }
                self.rx_pkt += 1;
                if next == 0 {
                    self.rx_pkt = num;
                }
                self.rx_off += next;
            }
            if self.rx_pkt >= num || self.rx_off >= bs {
                // Block done: hand it back to the kernel.
                fence(Ordering::Release);
                if let Some(a) = self.rx_ring.atomic_u32(base + BD_BLOCK_STATUS) {
                    a.store(TP_STATUS_KERNEL, Ordering::Release);
                }
                self.rx_block = (self.rx_block + 1) % self.cfg.rx_blocks;
                self.rx_pkt = 0;
                self.rx_off = 0;
            }
        }
        Ok(n)
    }

    /// A removed interface leaves its error on the socket (`ENETDOWN`), and
    /// with the rings nothing ever reads it: `poll` said "error" at once for
    /// ever and the engine thread spun at full speed (found with a device
    /// whose namespace went away). Reading `SO_ERROR` clears it; a socket the
    /// kernel unbound (ifindex -1: the interface is gone) fails the backend,
    /// as rxe's device goes with its netdev. A link that is only down keeps
    /// the device (its frames resume when it comes back up).
    ///
    /// The binding is looked at whether or not an error waits: the kernel
    /// sets it when the link goes down, and unbinds the socket only later in
    /// the interface's removal, without a second error; a check in between
    /// took the error for a link that is only down, and the device then
    /// never learnt that the interface had gone. After an error the link is
    /// looked at on every empty receive until frames come again.
    fn check_link(&mut self) -> Result<(), NicError> {
        let fd = self.rx_fd.as_raw_fd();
        let err: libc::c_int = sys::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, "SO_ERROR")?;
        self.link_down |= err != 0;
        // SAFETY: zeroed sockaddr_ll is a valid out-buffer of its length.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: sll has room for len bytes; the kernel updates len.
        let r =
            unsafe { libc::getsockname(fd, (&mut sll as *mut libc::sockaddr_ll).cast(), &mut len) };
        if r == 0 && sll.sll_ifindex <= 0 {
            let errno = if err == 0 { libc::ENODEV } else { err };
            return Err(NicError::Sys {
                op: format!(
                    "AF_PACKET socket on {}: the interface is gone",
                    self.cfg.ifname
                ),
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        Ok(())
    }

    fn tx_slots(&self) -> usize {
        self.tx_ring.len / self.tx_frame_size
    }

    /// What the kernel left for a NIC on the frame whose ring header is at
    /// `hdr`: its status bits and, with PACKET_VNET_HDR, the virtio-net
    /// header just before the frame.
    fn pending(&self, hdr: usize, mac_off: usize, status: u32) -> Pending {
        let mut p = Pending {
            csum: status & TP_STATUS_CSUMNOTREADY != 0,
            gso_size: 0,
        };
        if self.rx.vnet && mac_off >= VNET_HDR_LEN {
            if let Some(v) = self
                .rx_ring
                .slice(hdr + mac_off - VNET_HDR_LEN, VNET_HDR_LEN)
            {
                p.gso_size = gso::udp_gso_size(v);
            }
        }
        p
    }

    fn count_rx(&mut self, frames: usize, bytes: usize) {
        if frames == 0 {
            self.stats.rx_dropped += 1;
        }
        self.stats.rx_frames += frames as u64;
        self.stats.rx_bytes += bytes as u64;
    }

    /// Reads from the socket the whole frame whose V2 slot holds a cut copy
    /// (a GSO super-frame larger than a slot; PACKET_COPY_THRESH queued it),
    /// virtio-net header first where there is one, and delivers it.
    fn recv_whole(
        &mut self,
        vlan: Option<(u16, u16)>,
        status: u32,
        sink: &mut RxSinkChecked<'_>,
    ) -> (usize, usize) {
        self.whole.resize(MAX_WHOLE_FRAME, 0);
        // SAFETY: the buffer is ours and `whole.len()` bytes long; the fd is our RX socket.
        let got = unsafe {
            libc::recv(
                self.rx_fd.as_raw_fd(),
                self.whole.as_mut_ptr().cast(),
                self.whole.len(),
                libc::MSG_DONTWAIT,
            )
        };
        self.stats.syscalls += 1;
        let hl = if self.rx.vnet { VNET_HDR_LEN } else { 0 };
        let Some(got) = usize::try_from(got).ok().filter(|&g| g > hl) else {
            return (0, 0);
        };
        let (v, f) = self.whole[..got].split_at_mut(hl);
        let pending = Pending {
            csum: status & TP_STATUS_CSUMNOTREADY != 0,
            gso_size: if self.rx.vnet {
                gso::udp_gso_size(v)
            } else {
                0
            },
        };
        deliver(f, vlan, pending, &mut self.rx, self.mtu, sink)
    }

    /// TPACKET_V2 receive: one frame per slot, slots in ring order.
    fn recv_v2(&mut self, max: usize, sink: &mut RxSinkChecked<'_>) -> usize {
        // The kernel puts whole slots in each block; a block's tail that
        // holds no whole slot stays unused.
        let bs = self.cfg.rx_block_size;
        let per_block = bs / V2_RX_FRAME;
        let slots = per_block * self.cfg.rx_blocks;
        let mut n = 0;
        while n < max && slots > 0 {
            let hdr = self.rx_block / per_block * bs + self.rx_block % per_block * V2_RX_FRAME;
            let status = self.rx_ring.read_u32(hdr + T2_STATUS);
            if status & TP_STATUS_USER == 0 {
                break;
            }
            let snaplen = self.rx_ring.read_u32(hdr + T2_SNAPLEN) as usize;
            let mac_off = usize::from(self.rx_ring.read_u16(hdr + T2_MAC));
            let vlan = (status & TP_STATUS_VLAN_VALID != 0).then(|| {
                let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 {
                    self.rx_ring.read_u16(hdr + T2_VLAN_TPID)
                } else {
                    0x8100
                };
                (tpid, self.rx_ring.read_u16(hdr + T2_VLAN_TCI))
            });
            let pending = self.pending(hdr, mac_off, status);
            if status & TP_STATUS_COPY != 0 {
                let (frames, len) = self.recv_whole(vlan, status, sink);
                self.count_rx(frames, len);
                n += frames.max(1);
            } else {
                match self.rx_ring.slice_mut(hdr + mac_off, snaplen) {
                    Some(f) if mac_off + snaplen <= V2_RX_FRAME => {
                        let (frames, len) = deliver(f, vlan, pending, &mut self.rx, self.mtu, sink);
                        self.count_rx(frames, len);
                        n += frames.max(1);
                    }
                    _ => self.stats.rx_dropped += 1,
                }
            }
            if let Some(a) = self.rx_ring.atomic_u32(hdr + T2_STATUS) {
                a.store(TP_STATUS_KERNEL, Ordering::Release);
            }
            self.rx_block = (self.rx_block + 1) % slots;
        }
        n
    }

    /// Each frame in a slot of its own.
    fn transmit_plain(&mut self, max: usize, fill: &mut TxFill<'_>) -> usize {
        let (max_len, mtu) = (self.max_frame_len, self.mtu);
        let (mut n, mut marked) = (0, false);
        while n < max && self.slot_free_after_kick(self.tx_head) {
            self.claim(self.tx_head);
            let off = self.tx_head * self.tx_frame_size + T2_DATA;
            let Some(buf) = self.tx_ring.slice_mut(off, max_len) else {
                break;
            };
            let Some(len) = fill(buf) else {
                break;
            };
            n += 1;
            if !sendable(buf, len, max_len, mtu) {
                self.stats.tx_dropped += 1;
                continue;
            }
            self.mark_head(len, 1, len);
            marked = true;
        }
        self.push_marked(marked);
        n
    }

    /// After a `transmit`: has the kernel send what was marked (waiting for
    /// send-buffer room), or else what an earlier call left.
    fn push_marked(&mut self, marked: bool) {
        if marked {
            self.flush(FLUSH_WAIT);
        } else if self.tx_unsent {
            // Left from an earlier call: one more kick, no wait (the engine
            // comes back within its idle sleep).
            self.flush(Duration::ZERO);
        }
    }

    /// Whether TX slot `i` is free, kicking the kernel once if not (it may
    /// have sent it meanwhile); counts a full ring.
    fn slot_free_after_kick(&mut self, i: usize) -> bool {
        if self.tx_slot_free(i) {
            return true;
        }
        self.kick();
        if self.tx_slot_free(i) {
            return true;
        }
        self.stats.tx_ring_full += 1;
        false
    }

    /// Whether TX slot `i` is ours to fill.
    fn tx_slot_free(&self, i: usize) -> bool {
        let status = self.tx_ring.read_u32(i * self.tx_frame_size + T2_STATUS);
        status == TP_STATUS_AVAILABLE || status == TP_STATUS_WRONG_FORMAT
    }

    /// Takes free slot `i`, counting a frame the kernel refused there last time round.
    fn claim(&mut self, i: usize) {
        if self.tx_ring.read_u32(i * self.tx_frame_size + T2_STATUS) == TP_STATUS_WRONG_FORMAT {
            self.stats.tx_dropped += 1;
        }
    }

    /// Hands slot `tx_head` (`len` bytes behind the slot header, virtio-net
    /// header included; `frames` wire frames, `bytes` on the wire) to the kernel.
    fn mark_head(&mut self, len: usize, frames: usize, bytes: usize) {
        let off = self.tx_head * self.tx_frame_size;
        if let (Some(l), Some(s)) = (
            self.tx_ring.atomic_u32(off + T2_LEN),
            self.tx_ring.atomic_u32(off + T2_STATUS),
        ) {
            l.store(len as u32, Ordering::Relaxed);
            s.store(TP_STATUS_SEND_REQUEST, Ordering::Release);
        }
        self.stats.tx_frames += frames as u64;
        self.stats.tx_bytes += bytes as u64;
        self.tx_head = (self.tx_head + 1) % self.tx_slots();
    }

    /// Sends the `len`-byte frame in slot `tx_head` as it is.
    fn mark_plain(&mut self, len: usize) {
        let off = self.tx_head * self.tx_frame_size + T2_DATA;
        if let Some(v) = self.tx_ring.slice_mut(off, VNET_HDR_LEN) {
            v.copy_from_slice(&gso::PLAIN);
        }
        self.mark_head(VNET_HDR_LEN + len, 1, len);
    }

    /// Sends the run built in slot `tx_head`.
    fn mark_run(&mut self, run: &Run) {
        let off = self.tx_head * self.tx_frame_size + T2_DATA;
        let len = VNET_HDR_LEN + run.frame_len();
        if let Some(slot) = self.tx_ring.slice_mut(off, len) {
            let (vnet, frame) = slot.split_at_mut(VNET_HDR_LEN);
            run.finish(vnet, frame);
        }
        let wire = run.frame_len() + (run.segments() - 1) * run.header_len();
        self.stats.tx_gso += u64::from(run.segments() > 1);
        self.mark_head(len, run.segments(), wire);
    }

    /// Frames with a virtio-net header each; runs of one flow joined into
    /// UDP GSO super-frames (crate::gso). A frame is written where it would
    /// join the run in slot `tx_head`: its headers over the run's last bytes
    /// (saved first, put back after), its UDP payload right behind. One that
    /// does not join is moved to the next slot (a copy) and starts a run there.
    fn transmit_gso(&mut self, max: usize, fill: &mut TxFill<'_>) -> usize {
        const DATA: usize = T2_DATA + VNET_HDR_LEN;
        let slots = self.tx_slots();
        let cap = self.tx_frame_size - DATA;
        let max_len = self.max_frame_len;
        let (mut n, mut marked) = (0, false);
        let mut run: Option<Run> = None;
        while n < max {
            // A frame goes to the run's slot, or to the next one if it does not join.
            let need = match run {
                Some(_) => (self.tx_head + 1) % slots,
                None => self.tx_head,
            };
            if !self.slot_free_after_kick(need) {
                break;
            }
            let Some(mut r) = run.take() else {
                let off = self.tx_head * self.tx_frame_size + DATA;
                self.claim(self.tx_head);
                let Some(buf) = self.tx_ring.slice_mut(off, max_len) else {
                    break;
                };
                let Some(len) = fill(buf) else {
                    break;
                };
                n += 1;
                if !sendable(buf, len, max_len, self.mtu) {
                    self.stats.tx_dropped += 1;
                    continue;
                }
                match Run::start(&buf[..len]) {
                    Some(r) => run = Some(r),
                    None => {
                        self.mark_plain(len);
                        marked = true;
                    }
                }
                continue;
            };
            let hl = r.header_len();
            let used = r.frame_len() - hl;
            if cap - used < max_len {
                // A frame might not fit behind the run: send it.
                self.mark_run(&r);
                marked = true;
                continue;
            }
            let at = self.tx_head * self.tx_frame_size + DATA + used;
            let mut saved = [0u8; 64];
            match self.tx_ring.slice(at, hl) {
                Some(tail) if hl <= saved.len() => saved[..hl].copy_from_slice(tail),
                _ => {
                    self.mark_run(&r);
                    marked = true;
                    continue;
                }
            }
            let Some(buf) = self.tx_ring.slice_mut(at, max_len) else {
                run = Some(r);
                break;
            };
            let Some(len) = fill(buf) else {
                buf[..hl].copy_from_slice(&saved[..hl]);
                run = Some(r);
                break;
            };
            n += 1;
            let ok = sendable(buf, len, max_len, self.mtu);
            let joins = ok
                && r.admits(&buf[..len], cap)
                && give_id(
                    &mut self.ids,
                    self.cfg.tx_icrc_valid,
                    &mut buf[..len],
                    r.next_id(),
                );
            if joins {
                buf[..hl].copy_from_slice(&saved[..hl]);
                r.push(len - hl);
                if r.is_closed() {
                    self.mark_run(&r);
                    marked = true;
                } else {
                    run = Some(r);
                }
                continue;
            }
            // Does not join: move it to the next slot and send the run.
            let next = (self.tx_head + 1) % slots;
            self.claim(next);
            let moved = ok
                && self
                    .tx_ring
                    .copy_within(at, next * self.tx_frame_size + DATA, len);
            if let Some(b) = self.tx_ring.slice_mut(at, hl) {
                b.copy_from_slice(&saved[..hl]);
            }
            self.mark_run(&r);
            marked = true;
            if !moved {
                self.stats.tx_dropped += 1;
                continue;
            }
            let off = self.tx_head * self.tx_frame_size + DATA;
            match self.tx_ring.slice(off, len).and_then(Run::start) {
                Some(r) => run = Some(r),
                None => self.mark_plain(len),
            }
        }
        if let Some(r) = run {
            self.mark_run(&r);
            marked = true;
        }
        self.push_marked(marked);
        n
    }

    fn kick(&mut self) {
        // Zero-length send: the kernel sends every SEND_REQUEST slot.
        // SAFETY: no buffer is passed; the fd is our TX packet socket.
        unsafe {
            libc::send(
                self.tx_fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
            )
        };
        self.stats.syscalls += 1;
    }

    /// Kicks until the kernel has taken every marked frame, waiting for
    /// send-buffer room in between (up to `wait`). The kernel stops early when
    /// the socket's send buffer is full (EAGAIN, or a short count without an
    /// error) and leaves the rest marked; nothing would kick them again until
    /// the core had a new frame, so a stalled ACK or last packet of a burst
    /// became a retransmission time-out at the peer.
    fn flush(&mut self, wait: Duration) {
        self.kick();
        let mut waited = Duration::ZERO;
        while self.last_marked_unsent() && waited < wait {
            self.stats.tx_ring_full += 1;
            // POLLOUT: the send buffer is half empty again (or the kernel's
            // next slot is free).
            let _ = sys::poll_fd(self.tx_fd.as_raw_fd(), libc::POLLOUT, Some(FLUSH_STEP));
            waited += FLUSH_STEP;
            self.kick();
        }
        // Still stuck: the next `transmit` (the engine calls it every step)
        // tries again.
        self.tx_unsent = self.last_marked_unsent();
    }

    /// Whether the frame marked last is still waiting for the kernel (it
    /// takes them in ring order, so then it has not finished this batch).
    fn last_marked_unsent(&self) -> bool {
        let slots = self.tx_slots();
        let last = (self.tx_head + slots - 1) % slots;
        self.tx_ring.read_u32(last * self.tx_frame_size + T2_STATUS) == TP_STATUS_SEND_REQUEST
    }
}

impl PacketIo for AfPacketIo {
    fn kind(&self) -> &'static str {
        "afpacket"
    }

    fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        self.recv_checked(max, &mut |f: &[u8], _| sink(f))
    }

    /// Frames cut from a GSO super-frame, and before Linux 6.2 whole frames
    /// whose checksum the NIC left, come with their ICRC checked (see
    /// `deliver`); others are left to the transport to check.
    fn recv_checked(
        &mut self,
        max: usize,
        sink: &mut RxSinkChecked<'_>,
    ) -> Result<usize, NicError> {
        let n = if self.cfg.rx_ring == RxRing::V2 {
            self.recv_v2(max, sink)
        } else {
            self.recv_v3(max, sink)?
        };
        let due = self.empty_recvs.due(n, LINK_CHECK_EVERY);
        self.link_down &= n == 0;
        if due || self.link_down {
            self.check_link()?;
        }
        Ok(n)
    }

    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        let n = if self.tx_gso {
            self.transmit_gso(max, fill)
        } else {
            self.transmit_plain(max, fill)
        };
        Ok(n)
    }

    fn gathers(&self) -> bool {
        self.gather.is_some()
    }

    fn receives_super_frames(&self) -> bool {
        self.rx.vnet
    }

    fn transmit_gather(&mut self, max: usize, src: &mut dyn TxSource) -> Result<usize, NicError> {
        if self.gather.is_none() {
            return crate::transmit_joined(self, max, src);
        }
        // Frames left in the ring by an earlier `transmit` go first.
        if self.tx_unsent {
            self.flush(Duration::ZERO);
        }
        match self.gather.as_mut() {
            Some(g) => g.send(max, src, &mut self.stats),
            None => Ok(0),
        }
    }

    fn qpn_prefix(&self) -> Option<u8> {
        self.share.as_ref().map(RawShare::prefix)
    }

    fn leave_shared(&mut self) {
        // Dropping the membership takes its line out of the table.
        self.share = None;
    }

    fn join_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.mcast.join(group)
    }

    fn leave_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.mcast.leave(group).map(drop)
    }

    fn poll_fd(&self) -> RawFd {
        self.rx_fd.as_raw_fd()
    }

    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        let us: libc::c_int = if on { 50 } else { 0 };
        // asm-generic/socket.h SO_BUSY_POLL
        sys::setsockopt(
            self.rx_fd.as_raw_fd(),
            libc::SOL_SOCKET,
            46,
            &us,
            "SO_BUSY_POLL",
        )
    }

    fn stats(&self) -> Stats {
        // PACKET_STATISTICS resets on read: accumulate (struct tpacket_stats_v3).
        if let Ok(st) = sys::getsockopt::<[u32; 3]>(
            self.rx_fd.as_raw_fd(),
            SOL_PACKET,
            PACKET_STATISTICS,
            "PACKET_STATISTICS",
        ) {
            self.kernel_drops
                .set(self.kernel_drops.get() + u64::from(st[1]));
        }
        let mut s = self.stats;
        s.rx_dropped += self.kernel_drops.get();
        s
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::frame::{build_udp_frame, HeaderSpec};

    /// A tiny classic-BPF interpreter for the opcodes the filter uses.
    pub(crate) fn run_cbpf(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let ld = |off: usize, n: usize| -> Option<u32> {
            let b = pkt.get(off..off + n)?;
            Some(b.iter().fold(0u32, |acc, v| (acc << 8) | u32::from(*v)))
        };
        while let Some(i) = prog.get(pc) {
            pc += 1;
            let k = i.k as usize;
            match i.code {
                0x00 => a = i.k,
                0x01 => x = i.k,
                0x05 => pc += k,
                0x54 => a &= i.k,
                0x16 => return a,
                0x20 | 0x30 => match ld(k, if i.code == 0x20 { 4 } else { 1 }) {
                    Some(v) => a = v,
                    None => return 0,
                },
                0x80 => a = pkt.len() as u32,
                0x1c => a = a.wrapping_sub(x),
                0x28 => match ld(k, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                0x48 | 0x50 => match ld(x as usize + k, if i.code == 0x48 { 2 } else { 1 }) {
                    Some(v) => a = v,
                    None => return 0,
                },
                0x15 | 0x35 | 0x45 => {
                    let t = match i.code {
                        0x15 => a == i.k,
                        0x35 => a >= i.k,
                        _ => a & i.k != 0,
                    };
                    pc += usize::from(if t { i.jt } else { i.jf });
                }
                0x06 => return i.k,
                c => panic!("opcode {c:#x}"),
            }
        }
        0
    }

    fn f(src: &str, dst: &str) -> Vec<u8> {
        to_qp(src, dst, 0, 32)
    }

    /// A frame whose UDP payload (`len` bytes) starts like a BTH to QP `qpn`.
    fn to_qp(src: &str, dst: &str, qpn: u32, len: usize) -> Vec<u8> {
        let spec = HeaderSpec {
            dst_mac: [2; 6],
            src_mac: [4; 6],
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            tos: 0,
            ttl: 64,
        };
        let mut bth = vec![0u8; len];
        for (b, v) in bth.iter_mut().skip(4).zip(qpn.to_be_bytes()) {
            *b = v;
        }
        build_udp_frame(&spec, &bth).unwrap()
    }

    #[test]
    fn a_shared_device_keeps_only_frames_to_its_qpns() {
        let p = udp_port_filter(4791, Some(3));
        for (src, dst) in [
            ("1.1.1.1:5", "2.2.2.2:4791"),
            ("[fd00::1]:5", "[fd00::2]:4791"),
        ] {
            assert!(run_cbpf(&p, &to_qp(src, dst, 0x03_0011, 32)) > 0, "{dst}");
            assert!(run_cbpf(&p, &to_qp(src, dst, 0x03_FFFF, 32)) > 0);
            assert_eq!(run_cbpf(&p, &to_qp(src, dst, 0x00_0011, 32)), 0, "{dst}");
            assert_eq!(run_cbpf(&p, &to_qp(src, dst, 0x04_0011, 32)), 0);
            // The multicast QPN: every device takes a copy.
            assert!(run_cbpf(&p, &to_qp(src, dst, 0xFF_FFFF, 32)) > 0, "{dst}");
            assert_eq!(run_cbpf(&p, &to_qp(src, dst, 0xFE_FFFF, 32)), 0);
            // Too short for a BTH's QP: handed up, for the stack to count.
            assert!(run_cbpf(&p, &to_qp(src, dst, 0, 5)) > 0, "{dst}");
            assert_eq!(run_cbpf(&p, &to_qp(src, dst, 0x00_0011, 6)), 0);
            let mut tagged = to_qp(src, dst, 0x03_0011, 32);
            tagged.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
            assert!(run_cbpf(&p, &tagged) > 0, "one VLAN tag");
            let mut tagged = to_qp(src, dst, 0x02_0011, 32);
            tagged.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
            assert_eq!(run_cbpf(&p, &tagged), 0);
            let mut other_port = to_qp(src, dst, 0x03_0011, 32);
            let at = other_port.len() - 32 - 6;
            other_port[at] ^= 1;
            assert_eq!(run_cbpf(&p, &other_port), 0, "other ports still refused");
        }
        // Everything the prefix-less filter refuses, this one refuses too.
        let plain = udp_port_filter(4791, None);
        let mut tcp = f("1.1.1.1:5", "2.2.2.2:4791");
        tcp[23] = 6;
        let mut frag = f("[fd00::1]:5", "[fd00::2]:4791");
        frag[20] = 6;
        for x in [tcp, frag, vec![0u8; 60]] {
            assert_eq!(run_cbpf(&plain, &x), 0);
            assert_eq!(run_cbpf(&p, &x), 0);
        }
    }

    #[test]
    fn filter_keeps_only_udp_4791() {
        let p = udp_port_filter(4791, None);
        assert!(run_cbpf(&p, &f("1.1.1.1:5", "2.2.2.2:4791")) > 0);
        assert!(run_cbpf(&p, &f("[fd00::1]:5", "[fd00::2]:4791")) > 0);
        assert_eq!(run_cbpf(&p, &f("1.1.1.1:4791", "2.2.2.2:4792")), 0);
        assert_eq!(run_cbpf(&p, &f("[fd00::1]:4791", "[fd00::2]:53")), 0);
        let mut tagged = f("1.1.1.1:5", "2.2.2.2:4791");
        tagged.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        assert!(run_cbpf(&p, &tagged) > 0, "one VLAN tag");
        let mut tagged6 = f("[fd00::1]:5", "[fd00::2]:4791");
        tagged6.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        assert!(run_cbpf(&p, &tagged6) > 0);
        let mut frag = f("1.1.1.1:5", "2.2.2.2:4791");
        frag[20] = 0x20; // MF
        assert_eq!(run_cbpf(&p, &frag), 0, "fragments refused");
        let mut tcp = f("1.1.1.1:5", "2.2.2.2:4791");
        tcp[23] = 6;
        assert_eq!(run_cbpf(&p, &tcp), 0);
        let arp = [0u8; 60];
        assert_eq!(run_cbpf(&p, &arp), 0);
        for n in 0..f("1.1.1.1:5", "2.2.2.2:4791").len() {
            let full = f("1.1.1.1:5", "2.2.2.2:4791");
            let _ = run_cbpf(&p, &full[..n]); // truncated: no panic
        }
    }

    /// An RC RDMA WRITE MIDDLE (or FIRST, with a RETH, when `first`) on QP
    /// 0x12 with `psn`, `n` bytes of data, from a UDP socket on this host
    /// to 198.18.0.1 over IPv4 with ID `id`; its ICRC right, its UDP
    /// checksum 0 ("none", as a raw receiver leaves a partial one).
    fn roce_v4(first: bool, psn: u32, id: u16, n: usize) -> Vec<u8> {
        let mut bth = vec![
            if first { 0x06 } else { 0x07 },
            0,
            0xff,
            0xff,
            0,
            0,
            0,
            0x12,
            0,
        ];
        bth.extend_from_slice(&psn.to_be_bytes()[1..]);
        if first {
            bth.extend_from_slice(&[0u8; 16]);
        }
        bth.extend((0..n).map(|i| (i * 7 + psn as usize) as u8));
        bth.extend_from_slice(&[0u8; 4]);
        let spec = HeaderSpec {
            dst_mac: [2, 0, 0, 0, 0, 1],
            src_mac: [2, 0, 0, 0, 0, 2],
            src: "198.18.0.2:49152".parse().unwrap(),
            dst: "198.18.0.1:4791".parse().unwrap(),
            tos: 0,
            ttl: 64,
        };
        let mut f = build_udp_frame(&spec, &bth).unwrap();
        f[18..20].copy_from_slice(&id.to_be_bytes());
        f[24..26].fill(0);
        let c = crate::frame::ipv4_checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let end = f.len() - 4;
        let icrc = crate::ipv4_id::icrc::compute(&f[14..end], false).unwrap();
        f[end..].copy_from_slice(&icrc.to_le_bytes());
        f
    }

    /// What a local UDP socket's GSO send of `frames` looks like at a packet
    /// socket: the first one's headers, every payload behind them, the
    /// lengths of the whole, ID 0, the UDP checksum left to the device.
    fn super_frame(frames: &[Vec<u8>]) -> Vec<u8> {
        let hl = 14 + 20 + 8;
        let mut s = frames[0][..hl].to_vec();
        for f in frames {
            s.extend_from_slice(&f[hl..]);
        }
        let udp_len = (s.len() - 34) as u16;
        s[16..18].copy_from_slice(&(udp_len + 20).to_be_bytes());
        s[18..20].fill(0);
        s[38..40].copy_from_slice(&udp_len.to_be_bytes());
        s[40..42].copy_from_slice(&0x1234u16.to_be_bytes());
        s
    }

    /// The receive path's state; `sized`: virtio-net headers give GSO sizes (Linux >= 6.2).
    fn rx(sized: bool) -> RxScratch {
        RxScratch {
            scratch: Vec::new(),
            ids: IdRecovery::default(),
            vnet: sized,
        }
    }

    /// Runs `deliver` on `f` as the ring gave it (the checksum left to the
    /// device: TP_STATUS_CSUMNOTREADY); the frames out, each with whether
    /// its ICRC was checked on the way.
    fn delivered(f: &mut [u8], rx: &mut RxScratch) -> Vec<(Vec<u8>, bool)> {
        let mut out = Vec::new();
        let pending = Pending {
            csum: true,
            gso_size: 0,
        };
        let (n, _) = deliver(f, None, pending, rx, 9000, &mut |s: &[u8], checked| {
            out.push((s.to_vec(), checked))
        });
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn gso_sends_without_a_size_are_cut_from_the_packets_inside() {
        // A WRITE's FIRST (with RETH) and a MIDDLE in one send (the shorter
        // one last, as GSO allows), and a run of equal MIDDLEs; Linux numbers
        // the segments' IDs 0, 1, 2, ... (the sender's ICRCs cover them).
        let runs = [
            vec![roce_v4(true, 7, 0, 4096), roce_v4(false, 8, 1, 4096)],
            (0..8)
                .map(|k| roce_v4(false, 0xff_fffc + k, k as u16, 1024))
                .collect(),
            vec![roce_v4(false, 3, 0, 4096), roce_v4(false, 4, 1, 100)],
            // Requests with a RETH and no data, PSNs apart (as READ requests are).
            (0..5)
                .map(|k| roce_v4(true, 90 + 3 * k, k as u16, 0))
                .collect(),
        ];
        for frames in runs {
            let mut sup = super_frame(&frames);
            let out = delivered(&mut sup, &mut rx(false));
            assert_eq!(out.len(), frames.len());
            for ((got, checked), want) in out.iter().zip(&frames) {
                assert_eq!(got, want);
                assert!(checked, "ICRC checked on the way");
            }
            // Where the kernel says the size (Linux >= 6.2) nothing is guessed.
            let mut sup = super_frame(&frames);
            assert_eq!(delivered(&mut sup, &mut rx(true)).len(), 1);
        }
    }

    #[test]
    fn joined_frames_get_the_ids_their_icrcs_cover() {
        // A sender that gave every frame ID 0 (a raw one, as rxe and our
        // core do): the cut's 0, 1, 2, ... are wrong and get put right.
        let frames: Vec<Vec<u8>> = (0..4).map(|k| roce_v4(false, 40 + k, 0, 2048)).collect();
        let mut sup = super_frame(&frames);
        let mut r = rx(false);
        let out = delivered(&mut sup, &mut r);
        assert_eq!(out.len(), 4);
        for ((got, checked), want) in out.iter().zip(&frames) {
            assert_eq!(got, want);
            assert!(checked);
        }
        assert_eq!(r.ids.recovered, 3);
    }

    #[test]
    fn a_single_local_datagram_passes_whole() {
        for n in [0, 16, 1024, 4096] {
            let want = roce_v4(false, 5, 0, n);
            let mut f = want.clone();
            f[40..42].copy_from_slice(&0x1234u16.to_be_bytes());
            let out = delivered(&mut f, &mut rx(false));
            assert_eq!(out, vec![(want, true)], "{n} bytes: its ICRC checked");
        }
        // A payload holding what looks like the next packet's BTH where a cut
        // could fall (past half: the only place to check): still one datagram.
        let mut want = roce_v4(false, 5, 0, 4096);
        let next = roce_v4(false, 6, 0, 0);
        want.copy_within(42..54, 42 + 3000);
        want[42 + 3000 + 9..42 + 3000 + 12].copy_from_slice(&next[51..54]);
        let end = want.len() - 4;
        let icrc = crate::ipv4_id::icrc::compute(&want[14..end], false).unwrap();
        want[end..].copy_from_slice(&icrc.to_le_bytes());
        assert_eq!(offload::infer_gso_size(&want, 8972), Some(3000));
        let mut f = want.clone();
        assert_eq!(delivered(&mut f, &mut rx(false)), vec![(want, true)]);
        // Over IPv6 too (its UDP checksum, which the ICRC masks, left partial).
        let spec = HeaderSpec {
            dst_mac: [2, 0, 0, 0, 0, 1],
            src_mac: [2, 0, 0, 0, 0, 2],
            src: "[fd00::2]:49152".parse().unwrap(),
            dst: "[fd00::1]:4791".parse().unwrap(),
            tos: 0,
            ttl: 64,
        };
        let mut v6 = roce_v4(false, 5, 0, 2048)[42..].to_vec();
        let n = v6.len();
        v6[n - 4..].fill(0);
        let mut want = build_udp_frame(&spec, &v6).unwrap();
        let end = want.len() - 4;
        let icrc = crate::ipv4_id::icrc::compute(&want[14..end], true).unwrap();
        want[end..].copy_from_slice(&icrc.to_le_bytes());
        want[60..62].fill(0);
        let mut f = want.clone();
        f[60..62].copy_from_slice(&0x4321u16.to_be_bytes());
        assert_eq!(delivered(&mut f, &mut rx(false)), vec![(want, true)]);
        // A single datagram whose ICRC is wrong goes up unchecked, for the
        // transport to count.
        let mut bad = roce_v4(false, 5, 0, 1024);
        bad[100] ^= 1;
        let out = delivered(&mut bad.clone(), &mut rx(false));
        bad[40..42].fill(0);
        assert_eq!(out, vec![(bad, false)]);
        // Not RoCE, or cut short: left as it is, no panic.
        for len in [0, 13, 14, 41, 60] {
            let mut f = vec![0x45u8; len];
            let _ = delivered(&mut f, &mut rx(false));
        }
    }
}
