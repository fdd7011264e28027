//! Kernel UDP socket backend: needs no privileges.
//!
//! The socket is bound to UDP port 4791 (configurable for tests). Receive
//! synthesises the Ethernet/IP/UDP headers the layers above (and the ICRC)
//! expect from what the kernel reports: peer address and port from the
//! socket address, local address from IP_PKTINFO / IPV6_PKTINFO, ToS and TTL
//! from IP_RECVTOS / IP_RECVTTL (IPV6_RECVTCLASS / IPV6_RECVHOPLIMIT), lengths
//! from the datagram. Transmit strips the Ethernet/IP/UDP headers the core
//! built and sends the UDP payload to the destination IP and port, carrying
//! the ToS byte (ECN) along as a control message.
//!
//! Batching: recvmmsg/sendmmsg, with UDP GRO (one receive returns many
//! same-size datagrams) and UDP GSO (one send carries up to 64 same-size
//! datagrams to one peer) when the kernel supports them. An io_uring path
//! ([`UdpConfig::uring`]) submits the same message batches through a ring;
//! it falls back to the plain calls when io_uring cannot be set up. With
//! [`UdpConfig::multishot`] one armed multishot recvmsg takes datagrams
//! into ring buffers as they arrive, so polling an idle socket makes no
//! system call (`crate::uring_rx`).
//!
//! No payload is copied in user space beyond the core's one copy from the
//! memory region into the frame. A sent message is a list of iovecs over
//! the TX arena, where each frame's UDP payload follows the previous one's;
//! with [`UdpConfig::gather`] a frame's payload stays where the transport
//! keeps it and the kernel's copy is the only one (`send_from`). A received
//! datagram's headers are synthesised in place in front of it (`deliver`),
//! and an IPv4 one comes out with its ICRC verified (`recv_checked`).
//!
//! Several processes' devices may bind one address and port 4791 (ranks
//! of a job on one host): [`crate::port_share`] steers each datagram to the
//! one that owns its destination QP.
//!
//! What is lost compared with a raw backend: the UDP *source* port of sent
//! frames is always the socket's (the core's per-QP entropy port is not
//! carried), the MACs are synthetic (from [`crate::frame::mac_for_ip`]), and
//! the IPv4 identification, DF and IPv6 flow label of received packets are
//! not reported. The ICRC masks the flow label but *covers* the IPv4
//! identification; [`crate::ipv4_id`] makes that work: sends use
//! `IP_PMTUDISC_DO`, under which the kernel's IDs are predictable (0, and
//! 0, 1, 2, ... for the segments of a GSO send) and each frame's ICRC is
//! computed over the ID it will carry; on receive the sender's ID is
//! recovered from the ICRC (a 16-bit check remains instead of 32 bits), so
//! rxe and RNICs interoperate over IPv4 too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::frame::{self, HeaderSpec};
use crate::ipv4_id::IdRecovery;
use crate::mcast::Memberships;
use crate::port_share::{self, PortShare};
use crate::uring_rx::MultishotRx;
use crate::{offload, sys};
use crate::{
    GatherFrame, NicError, PacketIo, PayloadRef, RxSink, RxSinkChecked, Stats, TxFill, TxSource,
};

// asm-generic/socket.h (x86-64 and arm64 use the generic values).
const SO_RXQ_OVFL: libc::c_int = 40;
const SO_BUSY_POLL: libc::c_int = 46;
// linux/udp.h
const UDP_SEGMENT: libc::c_int = 103;
const UDP_NO_CHECK6_RX: libc::c_int = 102;
const UDP_GRO: libc::c_int = 104;
// UDP_MAX_SEGMENTS in include/linux/udp.h is 64 on older kernels (128 later).
const GSO_MAX_SEGS: usize = 64;
/// Buffers of the multishot receive ([`UdpConfig::multishot`]).
const MULTISHOT_BUFFERS: u16 = 8;
/// How long a send waits for a full socket buffer to take anything more
/// before it gives up on its messages.
const TX_STALL: Duration = Duration::from_millis(50);
// Largest UDP payload in one datagram (65535 - IPv6-less UDP header - IPv4 header).
const MAX_DGRAM: usize = 65_507;
/// The socket's own TTL and hop limit: the transport core's default hop
/// limit (ferroce_stack::wire::packet::DEFAULT_TTL, 64, as Linux's default
/// route gives rxe), set on the socket so frames with it need no control message.
const SOCKET_TTL: u8 = 64;
// Room for the control messages we ask for (pktinfo, tos, ttl, gro, ovfl).
const CMSG_ROOM: usize = 256;
/// Empty receives between two looks at whether the interface is still
/// there ([`UdpIo::check_link`]): nothing wakes an idle engine when it goes,
/// so it is seen after 64 of its longest sleeps (20 ms): ~1.3 s, as AF_XDP.
const LINK_CHECK_EVERY: u32 = 64;
// IPv4 + UDP header bytes in front of the RoCE payload (the core builds no IP options).
const IPV4_UDP_HLEN: usize = 28;
// Room for a frame's Ethernet/IP/UDP headers in front of a UDP payload: the longest the
// backend synthesises (14 + 40 + 8 for IPv6) rounded up to a cache line.
const HEADROOM: usize = 64;

/// UDP backend settings.
#[derive(Debug, Clone, Copy)]
pub struct UdpConfig {
    /// Local address. `0.0.0.0:4791` / `[::]:4791` (dual-stack) for real use;
    /// tests use `127.0.0.1:<port>` or `[::1]:<port>`.
    pub bind: SocketAddr,
    /// Datagrams per recvmmsg/sendmmsg call (messages, each maybe GRO/GSO).
    pub batch: usize,
    /// Largest frame handed up or accepted (Ethernet + IP + UDP + payload).
    pub max_frame_len: usize,
    /// Coalesce same-size sends to one peer with UDP_SEGMENT.
    pub gso: bool,
    /// Ask for coalesced receives with UDP_GRO.
    pub gro: bool,
    /// Submit through io_uring (falls back to recvmmsg/sendmmsg if it fails).
    pub uring: bool,
    /// Receive through one armed io_uring multishot recvmsg into buffers the
    /// ring is given (`uring_rx.rs`): a poll that finds nothing then
    /// costs no system call. Falls back to recvmmsg where the kernel cannot
    /// (before 6.0, io_uring disabled).
    pub multishot: bool,
    /// Socket buffer size to request (SO_RCVBUF/SO_SNDBUF, forced when root).
    pub socket_buffer: usize,
    /// MAC placed as destination in synthesised frames (this host's "MAC").
    pub mac: [u8; 6],
    /// Every frame `transmit` is given is a RoCE v2 packet with a right ICRC
    /// (the transport core's are): giving a GSO segment its IPv4 ID then
    /// updates the ICRC without checking it first, one CRC pass less per
    /// frame. Off by default, so other payloads pass through unchanged.
    pub tx_icrc_valid: bool,
    /// `transmit_gather` sends payloads from where the source keeps them
    /// (scatter/gather sendmsg), so the kernel's copy is the only one; off,
    /// it joins each frame in the arena first, as `transmit`. On by default:
    /// over veth, 64 KiB WRITEs in interleaved runs, it was ahead of the
    /// joined path by 2-3 % in the client's CPU per GB (10 rounds, 2026-12-04)
    /// and by 2-11 % in bandwidth between two TCG VMs, after earlier sessions
    /// had measured it from ~15 % slower to ~10 % faster. Both paths meet
    /// the kernel's copy, whose `rep movsb` is 15-20x slower on AMD EPYC
    /// when the destination lies 1-15 bytes past the source modulo 4 KiB
    /// (64 KiB copies): the joined path copies a GSO message's payloads at
    /// one offset, so a whole message can land on it, gather at one that
    /// moves by 16 bytes a packet, so at most one packet in 256 does;
    /// neither can choose the kernel's destination offset.
    pub gather: bool,
    /// Lets other processes' ferroce devices bind the same address and port
    /// (`SO_REUSEPORT`), each datagram reaching the one that owns its QP
    /// ([`crate::port_share`]). On by default; not for port 0 (an ephemeral
    /// port is never shared).
    pub share_port: bool,
    /// With `share_port`: join the port's group with this QPN prefix
    /// instead of a free one. A raw device's socket for its local peers
    /// ([`crate::local_peers`]) takes the prefix its interface gave it.
    pub share_prefix: Option<u8>,
    /// Take only datagrams that came in on the loopback interface: the
    /// socket of a raw device, which receives everything from the wire on
    /// its own (the kernel's copy of those frames must not arrive twice).
    pub loopback_only: bool,
    /// The index of the interface `bind`'s address is on (0: none, or not
    /// watched). When that interface goes, the backend fails, as an rxe
    /// device goes with its netdev: the socket stays bound and would
    /// otherwise just never receive again.
    pub ifindex: u32,
}

impl UdpConfig {
    /// Defaults for `bind`: batch 64, 9000-byte MTU frames, GSO, GRO and
    /// gather on, io_uring off (no gain measured on this kind of machine,
    /// MACHINE.md §3).
    pub fn new(bind: SocketAddr) -> Self {
        UdpConfig {
            bind,
            batch: 64,
            max_frame_len: 9018,
            gso: true,
            gro: true,
            uring: false,
            multishot: false,
            socket_buffer: 8 << 20,
            mac: frame::mac_for_ip(bind.ip()),
            tx_icrc_valid: false,
            gather: true,
            share_port: true,
            share_prefix: None,
            loopback_only: false,
            ifindex: 0,
        }
    }
}

/// Makes the socket drop every datagram that did not come in on `lo`
/// (before it is queued: a classic BPF socket filter).
fn attach_loopback_filter(fd: RawFd) -> Result<(), NicError> {
    // Opcodes from linux/filter.h; SKF_AD_IFINDEX (8) reads skb->dev->ifindex.
    const LD_IFINDEX: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const SKF_AD_IFINDEX: u32 = 8;
    let lo = sys::if_index("lo")?;
    let prog = [
        libc::sock_filter {
            code: LD_IFINDEX,
            jt: 0,
            jf: 0,
            k: (libc::SKF_AD_OFF as u32).wrapping_add(SKF_AD_IFINDEX),
        },
        libc::sock_filter {
            code: JEQ,
            jt: 0,
            jf: 1,
            k: lo,
        },
        // Accept the whole datagram.
        libc::sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: u32::MAX,
        },
        libc::sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ];
    sys::attach_cbpf(
        fd,
        libc::SO_ATTACH_FILTER,
        &prog,
        "SO_ATTACH_FILTER (loopback only)",
    )
}

/// Turns UDP_GRO on or off; returns whether the socket took it.
/// Asks for what `deliver` rebuilds the IP header from, with every
/// datagram: destination address, TOS / traffic class, TTL / hop limit (on
/// a v6 socket the IPv4 options report v4(-mapped) packets' fields).
pub(crate) fn report_rx_headers(fd: RawFd, v6: bool) -> Result<(), NicError> {
    let one: libc::c_int = 1;
    if v6 {
        for (opt, what) in [
            (libc::IPV6_RECVPKTINFO, "IPV6_RECVPKTINFO"),
            (libc::IPV6_RECVTCLASS, "IPV6_RECVTCLASS"),
            (libc::IPV6_RECVHOPLIMIT, "IPV6_RECVHOPLIMIT"),
        ] {
            sys::setsockopt(fd, libc::IPPROTO_IPV6, opt, &one, what)?;
        }
    }
    for (opt, what) in [
        (libc::IP_PKTINFO, "IP_PKTINFO"),
        (libc::IP_RECVTOS, "IP_RECVTOS"),
        (libc::IP_RECVTTL, "IP_RECVTTL"),
    ] {
        sys::setsockopt(fd, libc::IPPROTO_IP, opt, &one, what)?;
    }
    Ok(())
}

fn set_gro(fd: RawFd, on: bool) -> bool {
    let v = libc::c_int::from(on);
    sys::setsockopt(fd, libc::SOL_UDP, UDP_GRO, &v, "UDP_GRO").is_ok()
}

/// Socket address in kernel form.
pub(crate) fn to_sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Kernel socket address back to std; v4-mapped IPv6 becomes IPv4.
pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: family says this storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((ss as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: family says this storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((ss as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, sin6.sin6_scope_id)),
            })
        }
        _ => None,
    }
}

/// One receive slot: a buffer plus the kernel structures pointing into it.
/// Boxed so the pointers stay valid when the Vec of slots moves. The kernel
/// writes the datagram(s) after `HEADROOM` bytes, so each datagram's headers
/// can be synthesised in place just in front of it (see `UdpIo::deliver`).
struct Slot {
    buf: Vec<u8>,
    name: libc::sockaddr_storage,
    iov: libc::iovec,
    control: [u64; CMSG_ROOM / 8],
}

/// One outgoing message: its UDP payload is one contiguous run of the TX
/// arena (the payloads of its GSO segments back to back, see
/// `UdpIo::transmit`), so it needs no buffer of its own. Boxed like [`Slot`].
struct TxMsg {
    name: libc::sockaddr_storage,
    control: [u64; CMSG_ROOM / 8],
    // UDP_SEGMENT size of this message (0 = one datagram).
    seg: usize,
    // Bytes in the message (all its iovecs).
    len: usize,
}

/// What the kernel said about one received datagram.
#[derive(Debug, Default, Clone, Copy)]
struct RxMeta {
    local: Option<IpAddr>,
    tos: u8,
    ttl: u8,
    gro_size: usize,
}

/// One received datagram, as `UdpIo::deliver_datagram` takes it.
struct Received<'a> {
    /// Its buffer; the payload starts at `at` (at least `HEADROOM`).
    buf: &'a mut [u8],
    at: usize,
    total: usize,
    peer: Option<SocketAddr>,
    meta: RxMeta,
    truncated: bool,
}

/// The UDP socket backend.
// Slots are boxed on purpose: the mmsghdrs point into each slot's inline
// name/iovec/control fields, which must not move when slots are swapped.
#[allow(clippy::vec_box)]
pub struct UdpIo {
    sock: OwnedFd,
    cfg: UdpConfig,
    local: SocketAddr,
    v6_socket: bool,
    rx_slots: Vec<Box<Slot>>,
    rx_hdrs: Vec<libc::mmsghdr>,
    // rx_hdrs[..rx_armed] point into their slots; the first rx_dirty of
    // them were written back by the kernel since (see `prepare_rx`).
    rx_armed: usize,
    rx_dirty: usize,
    tx_slots: Vec<Box<TxMsg>>,
    tx_hdrs: Vec<libc::mmsghdr>,
    // The fill callback writes frames here; messages point into it (transmit).
    tx_arena: Vec<u8>,
    // Header length of the last frame sent: where the next one is placed.
    tx_hlen: usize,
    // The frames and messages of the batch being sent (`send_from`), each
    // message's iovecs (None: dropped), and the iovecs themselves.
    gather_frames: Vec<GatherPiece>,
    gather_runs: Vec<GatherRun>,
    gather_spans: Vec<Option<(usize, usize)>>,
    tx_iov: Vec<libc::iovec>,
    stats: Stats,
    kernel_drops: u32,
    // Frames per message in the last receive (GRO), to size the next one.
    rx_frames_per_msg: usize,
    gso: bool,
    uring: Option<uring::Uring>,
    uring_depth: usize,
    // The multishot receive, and what the engine sleeps on while it is in
    // use: the ring (completions waiting) and the socket (datagrams the ring
    // has not taken yet: it was not armed, or its task work waits).
    multishot: Option<MultishotRx>,
    rx_epoll: Option<OwnedFd>,
    ids: IdRecovery,
    // Membership of a port shared with other processes' devices.
    share: Option<PortShare>,
    // Whether UDP_GRO is on now (off while another member of the shared
    // port would take it too), and whether it was at bind (the receive
    // slots are sized for it).
    gro_on: bool,
    /// GRO went off while datagrams may have been queued whole (a GSO
    /// send taken with GRO on): until the queue is next found empty, a
    /// datagram without a segment size may still hold several frames.
    gro_stale: bool,
    gro_capable: bool,
    /// When to look whether the interface is still there (`UdpConfig::ifindex`).
    empty_recvs: crate::link_check::EmptyRecvs,
    // Receives since the socket was bound (when to check the share).
    share_polls: u32,
    share_warned: bool,
    // Multicast groups joined, each through a socket bound to the group and
    // port (`crate::mcast`), read after the main socket; `mcast_epoll` holds
    // them for the engine to sleep on.
    mcast: Memberships,
    mcast_fds: Vec<RawFd>,
    mcast_epoll: OwnedFd,
}

impl Drop for UdpIo {
    fn drop(&mut self) {
        if let Some(s) = self.share.take() {
            s.leave(self.sock.as_raw_fd());
        }
    }
}

impl std::fmt::Debug for UdpIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpIo")
            .field("local", &self.local)
            .field("gso", &self.gso)
            .field("uring", &self.uring.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers inside the mmsghdr/iovec arrays point only into
// buffers this struct owns (boxed, never shared); moving the whole struct to
// another thread keeps them valid and nothing else aliases them.
unsafe impl Send for UdpIo {}

fn new_slot(len: usize) -> Box<Slot> {
    Box::new(Slot {
        buf: vec![0u8; HEADROOM + len],
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
        name: unsafe { std::mem::zeroed() },
        iov: libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        },
        control: [0; CMSG_ROOM / 8],
    })
}

fn new_tx_msg() -> Box<TxMsg> {
    Box::new(TxMsg {
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
        name: unsafe { std::mem::zeroed() },
        control: [0; CMSG_ROOM / 8],
        seg: 0,
        len: 0,
    })
}

/// A receive header's fields the kernel writes back (name and control
/// lengths, flags, datagram length), set for the next receive.
fn reset_written_back(h: &mut libc::mmsghdr) {
    h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    h.msg_hdr.msg_controllen = CMSG_ROOM as _;
    h.msg_hdr.msg_flags = 0;
    h.msg_len = 0;
}

fn empty_mmsghdr() -> libc::mmsghdr {
    // SAFETY: mmsghdr is plain old data; all-zero (null pointers, 0 lengths) is valid.
    unsafe { std::mem::zeroed() }
}

impl UdpIo {
    /// Opens and binds the socket.
    pub fn bind(cfg: UdpConfig) -> Result<Self, NicError> {
        if cfg.batch == 0 || cfg.batch > 1024 || cfg.max_frame_len < 64 {
            return Err(NicError::Config(format!("udp {cfg:?}")));
        }
        let v6 = cfg.bind.is_ipv6();
        let sock = sys::udp_socket(v6, "socket(UDP)")?;
        let raw = sock.as_raw_fd();
        let one: libc::c_int = 1;
        if v6 {
            // Dual-stack when bound to [::]: v4 peers show up as v4-mapped.
            let only: libc::c_int = 0;
            sys::setsockopt(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                &only,
                "IPV6_V6ONLY",
            )?;
        }
        report_rx_headers(raw, v6)?;
        // The TTL (hop limit) frames usually carry, so only others need a
        // control message (one more on every send cost a bulk sender ~12 %).
        let ttl = libc::c_int::from(SOCKET_TTL);
        sys::setsockopt(raw, libc::IPPROTO_IP, libc::IP_TTL, &ttl, "IP_TTL")?;
        if v6 {
            sys::setsockopt(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_UNICAST_HOPS,
                &ttl,
                "IPV6_UNICAST_HOPS",
            )?;
            // A RoCE v2 sender may put UDP checksum 0 over IPv6 too (ferroce's raw backends do;
            // the ICRC covers the packet, and RFC 6935 allows 0 for tunnels); Linux drops such
            // datagrams unless the socket accepts them.
            if let Err(e) = sys::setsockopt(
                raw,
                libc::SOL_UDP,
                UDP_NO_CHECK6_RX,
                &one,
                "UDP_NO_CHECK6_RX",
            ) {
                tracing::warn!("{e}: IPv6 datagrams with UDP checksum 0 will be dropped");
            }
        }
        // Predictable IPv4 IDs on what we send (see crate::ipv4_id). On a v6 socket it covers
        // the v4-mapped traffic (Linux passes SOL_IP options of UDPv6 sockets to IPv4); should
        // a kernel refuse it there, only that traffic's ICRC would disagree with rxe's.
        let pmtu: libc::c_int = libc::IP_PMTUDISC_DO;
        let r = sys::setsockopt(
            raw,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &pmtu,
            "IP_MTU_DISCOVER",
        );
        if !v6 {
            // (Not SO_NO_CHECK, though rxe sends UDP checksum 0: the kernel refuses GSO sends
            // without a checksum.)
            r?;
        }
        // Kernel drop counter (cumulative) on every receive. Not with
        // `loopback_only`: the kernel counts the filter's refusals there too
        // (every wire frame to our port), so `rx_dropped` would report
        // nearly all of the raw device's traffic as lost.
        if !cfg.loopback_only {
            let _ = sys::setsockopt(raw, libc::SOL_SOCKET, SO_RXQ_OVFL, &one, "SO_RXQ_OVFL");
        }
        for (force, plain, what) in [
            (sys::SO_RCVBUFFORCE, libc::SO_RCVBUF, "SO_RCVBUF"),
            (sys::SO_SNDBUFFORCE, libc::SO_SNDBUF, "SO_SNDBUF"),
        ] {
            sys::set_socket_buffer(raw, force, plain, cfg.socket_buffer, what);
        }
        if cfg.loopback_only {
            attach_loopback_filter(raw)?;
        }
        let mut gro = cfg.gro && set_gro(raw, true);
        let joining = if cfg.share_port && cfg.bind.port() != 0 {
            sys::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_REUSEPORT,
                &one,
                "SO_REUSEPORT",
            )?;
            // A raw device's sink socket holds the wildcard address of the
            // port with SO_REUSEADDR (afpacket::sink_socket); with it here
            // too the kernel lets both bind, and hands datagrams to our
            // address to us. Not on a wildcard bind: that would tie with
            // the sink, and the sink could win.
            if !cfg.bind.ip().is_unspecified() {
                sys::setsockopt(
                    raw,
                    libc::SOL_SOCKET,
                    libc::SO_REUSEADDR,
                    &one,
                    "SO_REUSEADDR",
                )?;
            }
            Some(PortShare::prepare(cfg.bind)?)
        } else {
            None
        };
        let (ss, len) = to_sockaddr(&cfg.bind);
        // SAFETY: ss holds a valid sockaddr of `len` bytes.
        let r = unsafe { libc::bind(raw, (&ss as *const libc::sockaddr_storage).cast(), len) };
        if let Err(e) = sys::cvt(r, &format!("bind {}", cfg.bind)) {
            if let Some(j) = joining {
                j.abandon();
            }
            return Err(e);
        }
        let local = local_addr(raw)?;
        // What the kernel sends to a group gets the TTL unicast frames get
        // (64, rxe's from rdma_cm's join) rather than the socket default 1.
        let _ = sys::setsockopt(
            raw,
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_TTL,
            &ttl,
            "IP_MULTICAST_TTL",
        );
        if v6 {
            let _ = sys::setsockopt(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_MULTICAST_HOPS,
                &ttl,
                "IPV6_MULTICAST_HOPS",
            );
        }
        if cfg.ifindex != 0 {
            multicast_out_of(raw, v6, cfg.ifindex);
        }
        let share = joining
            .map(|j| j.join(raw, cfg.share_prefix, gro))
            .transpose()?;
        let rx_gro = gro;
        if gro && share.as_ref().is_some_and(|s| s.gro_others() > 0) {
            gro = !set_gro(raw, false);
        }

        // Sized for GRO even while sharing turns it off: it comes back on
        // when the other members that would take it leave.
        let rx_len = if rx_gro {
            MAX_DGRAM + 1
        } else {
            cfg.max_frame_len
        };
        let mut io = UdpIo {
            sock,
            v6_socket: v6,
            local,
            rx_slots: (0..cfg.batch).map(|_| new_slot(rx_len)).collect(),
            rx_hdrs: (0..cfg.batch).map(|_| empty_mmsghdr()).collect(),
            rx_armed: 0,
            rx_dirty: 0,
            tx_slots: (0..cfg.batch).map(|_| new_tx_msg()).collect(),
            tx_hdrs: (0..cfg.batch).map(|_| empty_mmsghdr()).collect(),
            // A batch of full-size frames; the payloads of a GSO message (at most
            // MAX_DGRAM bytes) fit in any batch of frames that can carry them.
            tx_arena: vec![0u8; HEADROOM + cfg.batch * cfg.max_frame_len],
            tx_hlen: frame::header_len(false),
            gather_frames: Vec::with_capacity(cfg.batch * GSO_MAX_SEGS),
            gather_runs: Vec::with_capacity(cfg.batch),
            gather_spans: Vec::with_capacity(cfg.batch),
            tx_iov: Vec::with_capacity(cfg.batch * (2 * GSO_MAX_SEGS + 1)),
            stats: Stats::default(),
            kernel_drops: 0,
            rx_frames_per_msg: 1,
            gso: cfg.gso,
            uring: None,
            uring_depth: 4,
            multishot: None,
            rx_epoll: None,
            ids: IdRecovery::default(),
            share,
            gro_on: gro,
            gro_stale: false,
            gro_capable: rx_gro,
            empty_recvs: Default::default(),
            share_polls: 0,
            share_warned: false,
            mcast: Memberships::new(0, Some(local.ip()), Some(local.port())),
            mcast_fds: Vec::new(),
            mcast_epoll: sys::epoll_of(&[])?,
            cfg,
        };
        if cfg.uring {
            match uring::Uring::new(cfg.batch) {
                Ok(u) => io.uring = Some(u),
                Err(e) => tracing::info!("io_uring unavailable, using recvmmsg/sendmmsg: {e}"),
            }
        }
        if cfg.multishot {
            // Few buffers: they are taken in turn, so all of them are the receive's
            // working set. With 64 (of 64 KiB, for GRO) an 8 MiB allreduce of 4
            // ranks over veth took 10-30 % longer than with recvmmsg, whose
            // adaptive batch reuses the first few slots; with 4-16 it was even.
            let ms = MultishotRx::new(raw, MULTISHOT_BUFFERS, rx_len, CMSG_ROOM).and_then(|ms| {
                let epoll = sys::epoll_of(&[raw, ms.ring_fd()])?;
                Ok((ms, epoll))
            });
            match ms {
                Ok((ms, epoll)) => {
                    io.multishot = Some(ms);
                    io.rx_epoll = Some(epoll);
                }
                Err(e) => {
                    tracing::info!("io_uring multishot receive unavailable, using recvmmsg: {e}")
                }
            }
        }
        Ok(io)
    }

    /// The bound local address (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether the io_uring multishot receive is in use.
    pub fn uses_multishot(&self) -> bool {
        self.multishot.is_some()
    }

    /// Whether the io_uring path is in use.
    pub fn uses_uring(&self) -> bool {
        self.uring.is_some()
    }

    /// Makes the first `n` receive headers ready for a recvmmsg of `n`
    /// messages. Headers keep their pointers into their (boxed) slots, so
    /// only the ones the kernel wrote back since (`rx_dirty`) get their
    /// lengths and flags reset, and only never-used ones are set up whole:
    /// a poll that finds nothing then touches no slot at all, where setting
    /// up all of them on every call cost a polling rank ~14 % of its time.
    fn prepare_rx(&mut self, n: usize) {
        for h in self.rx_hdrs.iter_mut().take(self.rx_dirty) {
            reset_written_back(h);
        }
        self.rx_dirty = 0;
        for (slot, h) in self
            .rx_slots
            .iter_mut()
            .zip(self.rx_hdrs.iter_mut())
            .take(n)
            .skip(self.rx_armed)
        {
            let data = &mut slot.buf[HEADROOM..];
            slot.iov.iov_base = data.as_mut_ptr().cast();
            slot.iov.iov_len = data.len();
            h.msg_hdr.msg_name = (&mut slot.name as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_iov = &mut slot.iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = slot.control.as_mut_ptr().cast();
            reset_written_back(h);
        }
        self.rx_armed = self.rx_armed.max(n.min(self.rx_hdrs.len()));
    }

    /// What a received datagram's control messages say. `hdr` is the
    /// header the kernel filled: its control area points into a slot or a
    /// multishot buffer.
    fn parse_cmsgs(&mut self, hdr: &libc::msghdr) -> RxMeta {
        let mut m = RxMeta {
            ttl: 64,
            ..RxMeta::default()
        };
        // SAFETY: hdr was filled by the kernel; CMSG_* walk only within
        // msg_control[..msg_controllen], which points into our buffer.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(hdr);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                let level = (*c).cmsg_level;
                let ty = (*c).cmsg_type;
                let int = || std::ptr::read_unaligned(data.cast::<libc::c_int>());
                match (level, ty) {
                    (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                        let p: libc::in_pktinfo = std::ptr::read_unaligned(data.cast());
                        m.local = Some(IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes())));
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                        let p: libc::in6_pktinfo = std::ptr::read_unaligned(data.cast());
                        let a = Ipv6Addr::from(p.ipi6_addr.s6_addr);
                        if m.local.is_none() {
                            m.local = Some(match a.to_ipv4_mapped() {
                                Some(v4) => IpAddr::V4(v4),
                                None => IpAddr::V6(a),
                            });
                        }
                    }
                    // IP_TOS arrives as one byte, IP_TTL as an int.
                    (libc::IPPROTO_IP, libc::IP_TOS) => m.tos = *data,
                    (libc::IPPROTO_IP, libc::IP_TTL) => m.ttl = int().clamp(0, 255) as u8,
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => m.tos = int().clamp(0, 255) as u8,
                    (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => m.ttl = int().clamp(0, 255) as u8,
                    (libc::SOL_UDP, UDP_GRO) => m.gro_size = int().max(0) as usize,
                    (libc::SOL_SOCKET, SO_RXQ_OVFL) => {
                        let n = std::ptr::read_unaligned(data.cast::<u32>());
                        let new = n.wrapping_sub(self.kernel_drops);
                        self.kernel_drops = n;
                        self.stats.rx_dropped += u64::from(new);
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(hdr, c);
            }
        }
        m
    }

    /// Turns received datagram `idx` (maybe GRO-coalesced) into frames.
    fn deliver(&mut self, idx: usize, sink: &mut RxSinkChecked<'_>) -> usize {
        let Some(h) = self.rx_hdrs.get(idx).copied() else {
            return 0;
        };
        let meta = self.parse_cmsgs(&h.msg_hdr);
        // Taken out while its buffer is handed on (a Vec moves, its boxed slots do not).
        let mut slots = std::mem::take(&mut self.rx_slots);
        let n = match slots.get_mut(idx) {
            Some(slot) => {
                let total = (h.msg_len as usize).min(slot.buf.len() - HEADROOM);
                let peer = from_sockaddr(&slot.name);
                let d = Received {
                    buf: &mut slot.buf,
                    at: HEADROOM,
                    total,
                    peer,
                    meta,
                    truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                };
                self.deliver_datagram(d, sink)
            }
            None => 0,
        };
        self.rx_slots = slots;
        n
    }

    /// Turns one received datagram (maybe GRO-coalesced) into frames.
    ///
    /// No copy: each datagram's headers are written in place just in front of
    /// it, over the tail of the datagram before (already handed to the sink,
    /// which cannot keep it) or, for the first, into the bytes before
    /// `d.at` (a slot's headroom, a multishot buffer's name and control
    /// areas, both read by then).
    fn deliver_datagram(&mut self, d: Received<'_>, sink: &mut RxSinkChecked<'_>) -> usize {
        let Received {
            buf,
            at,
            total,
            peer,
            meta,
            truncated,
        } = d;
        if truncated {
            // Larger than our buffer (cannot happen with the sizes we use):
            // a cut frame would fail the ICRC anyway, so drop it here.
            self.stats.rx_dropped += 1;
            return 0;
        }
        let total = total.min(buf.len().saturating_sub(at));
        if let Some(share) = self.share.as_mut() {
            let payload = buf.get(at..at + total).unwrap_or_default();
            if total > 0 && total.is_multiple_of(port_share::PROBE_LEN) && share.take_probe(payload)
            {
                return 0;
            }
        }
        let Some(peer) = peer else {
            self.stats.rx_dropped += 1;
            return 0;
        };
        let local_ip = meta.local.unwrap_or(self.local.ip());
        // Family of the header: follow the peer (v4-mapped already unmapped).
        let local_ip = match (peer.ip(), local_ip) {
            (IpAddr::V4(_), IpAddr::V6(a)) => a.to_ipv4_mapped().map_or(local_ip, IpAddr::V4),
            _ => local_ip,
        };
        let spec = HeaderSpec {
            dst_mac: self.cfg.mac,
            src_mac: frame::mac_for_ip(peer.ip()),
            src: peer,
            dst: SocketAddr::new(local_ip, self.local.port()),
            tos: meta.tos,
            ttl: meta.ttl,
        };
        let hl = frame::header_len(peer.is_ipv6());
        let seg = if meta.gro_size > 0 {
            meta.gro_size
        } else if self.gro_stale || hl + total > self.cfg.max_frame_len {
            // A GSO send queued whole while UDP GRO was on and read after it
            // went off (a second process joined the port, `maintain_share`):
            // the kernel reports no segment size then. Dropping it would cost
            // RC a go-back-N and UC its messages at every start on one host;
            // taking two short segments (their sum within a frame) as one
            // frame failed its ICRC, with the same cost.
            let payload = buf.get(at..at + total).unwrap_or_default();
            offload::roce_segment_len(payload, self.cfg.max_frame_len.saturating_sub(hl))
                .unwrap_or(total)
        } else {
            total.max(1)
        };
        // The headers of the last datagram and its length: the datagrams of one receive
        // share them but for the last, which may be shorter.
        let mut last = [0u8; HEADROOM];
        let mut last_len = None;
        let mut n = 0;
        let mut off = 0;
        while off < total || (total == 0 && off == 0) {
            let len = seg.min(total - off);
            // The frame: headers in the bytes before the payload (hl <= HEADROOM <= at).
            let start = at + off - hl;
            let f = buf.get_mut(start..start + hl + len);
            match f {
                Some(f) if hl + len <= self.cfg.max_frame_len => {
                    let headers = if last_len == Some(len) {
                        f[..hl].copy_from_slice(&last[..hl]);
                        true
                    } else if frame::write_headers(f, &spec, len).is_ok() {
                        last[..hl].copy_from_slice(&f[..hl]);
                        last_len = Some(len);
                        true
                    } else {
                        false
                    };
                    if headers {
                        let checked = !peer.is_ipv6() && {
                            // The header says ID 0; make it the ID the sender's ICRC covers.
                            let l3 = frame::header_len(false) - IPV4_UDP_HLEN;
                            self.ids.fix(&mut f[l3..])
                        };
                        sink(f, checked);
                        self.stats.rx_frames += 1;
                        self.stats.rx_bytes += (hl + len) as u64;
                        n += 1;
                    } else {
                        self.stats.rx_dropped += 1;
                    }
                }
                _ => self.stats.rx_dropped += 1,
            }
            if total == 0 {
                break;
            }
            off += len;
        }
        n
    }

    /// A receive found the socket's queue empty: what comes next was queued
    /// with GRO as it is now, so no datagram is left from before it went off.
    fn queue_drained(&mut self) {
        self.gro_stale = false;
    }

    /// Receives from `fd`: the device's socket (`main`) or a multicast
    /// group's, which has no GRO.
    fn recv_mmsg(
        &mut self,
        fd: RawFd,
        main: bool,
        max: usize,
        sink: &mut RxSinkChecked<'_>,
    ) -> Result<usize, NicError> {
        let mut delivered = 0;
        while delivered < max {
            // With GRO one message carries many frames: ask for as many messages as
            // should hold the frames still wanted, judging by the last receive.
            let per_msg = if main { self.rx_frames_per_msg } else { 1 };
            let want = (max - delivered).div_ceil(per_msg).min(self.rx_hdrs.len());
            self.prepare_rx(want);
            let want = want as libc::c_uint;
            // SAFETY: rx_hdrs[..want] are initialised and point into live slots.
            let r = unsafe {
                libc::recvmmsg(
                    fd,
                    self.rx_hdrs.as_mut_ptr(),
                    want,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            self.stats.syscalls += 1;
            if r < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        if main {
                            self.queue_drained();
                        }
                        break;
                    }
                    Some(libc::EINTR) => break,
                    // An ICMP error queued from an earlier send; not ours to fail on.
                    Some(libc::ECONNREFUSED)
                    | Some(libc::EHOSTUNREACH)
                    | Some(libc::ENETUNREACH) => continue,
                    _ => return Err(NicError::io("recvmmsg", e)),
                }
            }
            let got = r as usize;
            self.rx_dirty = got;
            let before = delivered;
            for i in 0..got {
                delivered += self.deliver(i, sink);
            }
            if !main {
                if got < want as usize {
                    break;
                }
                continue;
            }
            if let Some(per) = (delivered - before).checked_div(got) {
                self.rx_frames_per_msg = per.max(1);
            }
            if got < want as usize {
                self.queue_drained();
                break;
            }
        }
        Ok(delivered)
    }

    /// Sends tx_hdrs[..n], waiting for room while a full socket buffer drains.
    fn flush_tx(&mut self, n: usize) -> Result<(), NicError> {
        if let Some(mut u) = self.uring.take() {
            let fd = self.sock.as_raw_fd();
            let res = u.send_batch(fd, &mut self.tx_hdrs[..n]).map(<[_]>::to_vec);
            self.uring = Some(u);
            self.stats.syscalls += 1;
            // Messages the ring could not send (EAGAIN, ...) go through the
            // plain path below, which waits for room.
            let res = res?;
            let mut retry = Vec::new();
            for (i, r) in res.iter().enumerate() {
                match (r, self.tx_slots.get(i)) {
                    (Some(_), Some(slot)) => {
                        let (segs, bytes) = tx_segments(slot);
                        self.stats.tx_frames += segs as u64;
                        self.stats.tx_bytes += bytes as u64;
                        self.stats.tx_gso += u64::from(segs > 1);
                    }
                    _ => retry.push(i),
                }
            }
            if retry.is_empty() {
                return Ok(());
            }
            // Keep it simple: resend the failed ones one by one in order.
            for i in retry {
                self.tx_hdrs.swap(0, i);
                self.tx_slots.swap(0, i);
                let r = self.flush_plain(0, 1);
                self.tx_hdrs.swap(0, i);
                self.tx_slots.swap(0, i);
                r?;
            }
            return Ok(());
        }
        self.flush_plain(0, n)
    }

    fn flush_plain(&mut self, mut done: usize, n: usize) -> Result<(), NicError> {
        // Since when the socket buffer has been full with nothing sent.
        let mut stalled: Option<std::time::Instant> = None;
        while done < n {
            // SAFETY: tx_hdrs[done..n] are initialised and point into live slots; their
            // iovecs point into the TX arena and at payloads `send_from`'s source keeps
            // unchanged until it returns (it is only borrowed shared meanwhile).
            let r = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    self.tx_hdrs.as_mut_ptr().add(done),
                    (n - done) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            self.stats.syscalls += 1;
            if r > 0 {
                stalled = None;
                for slot in &self.tx_slots[done..done + r as usize] {
                    let segs = tx_segments(slot);
                    self.stats.tx_frames += segs.0 as u64;
                    self.stats.tx_bytes += segs.1 as u64;
                    self.stats.tx_gso += u64::from(segs.0 > 1);
                }
                done += r as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    // Wait for room as long as some frees up: a message given
                    // up here is lost until the transport's retransmission
                    // time-out. Only a buffer that stays full for TX_STALL
                    // (the link is not draining) costs messages.
                    let since = *stalled.get_or_insert_with(|| {
                        self.stats.tx_ring_full += 1;
                        std::time::Instant::now()
                    });
                    let left = TX_STALL.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        tracing::debug!("sendmmsg: send buffer full for {TX_STALL:?}: {e}");
                        self.stats.tx_dropped += tx_segments(&self.tx_slots[done]).0 as u64;
                        done += 1;
                    } else {
                        sys::poll_fd(self.sock.as_raw_fd(), libc::POLLOUT, Some(left))?;
                    }
                }
                Some(libc::EIO) | Some(libc::EINVAL)
                    if self.gso && tx_segments(&self.tx_slots[done]).0 > 1 =>
                {
                    // The route cannot segment (no GSO): drop this message and stop coalescing.
                    tracing::warn!("UDP GSO send failed ({e}); disabling GSO");
                    self.gso = false;
                    self.stats.tx_dropped += tx_segments(&self.tx_slots[done]).0 as u64;
                    done += 1;
                }
                _ => {
                    // Unreachable peer, too big, ...: this message is lost, go on.
                    tracing::debug!("sendmmsg: {e}");
                    self.stats.tx_dropped += tx_segments(&self.tx_slots[done]).0 as u64;
                    done += 1;
                }
            }
        }
        Ok(())
    }
}

/// Whole frames from a `transmit` fill callback, as a [`TxSource`].
struct Whole<'a, 'b> {
    fill: &'a mut TxFill<'b>,
}

impl TxSource for Whole<'_, '_> {
    fn fill(&mut self, buf: &mut [u8]) -> Option<GatherFrame> {
        let n = (self.fill)(buf)?;
        Some(GatherFrame {
            head: n,
            tail: 0,
            payload: None,
        })
    }

    fn payload(&self, _: &PayloadRef) -> Option<&[u8]> {
        None
    }
}

/// Sends to multicast groups out of interface `ifindex`, as rxe sends out
/// of its netdev. A socket bound to an address of the interface goes there
/// anyway (Linux routes a group send by its source address); one bound to
/// the wildcard address went by route: another interface on a host with
/// several, none in a namespace without a default route (ENETUNREACH,
/// every multicast frame lost).
fn multicast_out_of(fd: RawFd, v6: bool, ifindex: u32) {
    let mreq = libc::ip_mreqn {
        imr_multiaddr: libc::in_addr { s_addr: 0 },
        imr_address: libc::in_addr { s_addr: 0 },
        imr_ifindex: ifindex as libc::c_int,
    };
    // A dual-stack socket sends to IPv4 groups (v4-mapped) through the IPv4
    // path, which reads the IPv4 option.
    if let Err(e) = sys::setsockopt(
        fd,
        libc::IPPROTO_IP,
        libc::IP_MULTICAST_IF,
        &mreq,
        "IP_MULTICAST_IF",
    ) {
        tracing::debug!("{e}");
    }
    if v6 {
        let index = ifindex as libc::c_int;
        if let Err(e) = sys::setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MULTICAST_IF,
            &index,
            "IPV6_MULTICAST_IF",
        ) {
            tracing::debug!("{e}");
        }
    }
}

/// The destination in the socket's family (v4 peers on a v6 socket go
/// v4-mapped); None for a v6 peer on a v4 socket.
fn socket_dst(v6_socket: bool, dst: SocketAddr) -> Option<SocketAddr> {
    match (v6_socket, dst) {
        (true, SocketAddr::V4(a)) => Some(SocketAddr::new(
            IpAddr::V6(a.ip().to_ipv6_mapped()),
            a.port(),
        )),
        (false, SocketAddr::V6(_)) => None,
        _ => Some(dst),
    }
}

/// (segments, synthetic frame bytes) a prepared send carries.
fn tx_segments(slot: &TxMsg) -> (usize, usize) {
    let total = slot.len;
    let hl = frame::header_len(libc::c_int::from(slot.name.ss_family) == libc::AF_INET6);
    if slot.seg == 0 || slot.seg >= total {
        return (1, total + hl);
    }
    let n = total.div_ceil(slot.seg);
    (n, total + n * hl)
}

fn local_addr(fd: RawFd) -> Result<SocketAddr, NicError> {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: ss has room for len bytes.
    let r = unsafe {
        libc::getsockname(
            fd,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    sys::cvt(r, "getsockname")?;
    from_sockaddr(&ss).ok_or(NicError::Malformed(
        "getsockname returned an unknown family",
    ))
}

/// A gathered frame's UDP payload in the TX arena: its head part (BTH and
/// extension headers) at `at`, its tail (pad, ICRC) right after, and the
/// payload between them where the source keeps it.
#[derive(Debug, Clone, Copy)]
struct GatherPiece {
    at: usize,
    head: usize,
    payload: Option<PayloadRef>,
    tail: usize,
}

/// A message of gathered frames: `frames` pieces from `first` on.
#[derive(Debug, Clone, Copy)]
struct GatherRun {
    dst: SocketAddr,
    tos: u8,
    ttl: u8,
    qp_top: Option<u8>,
    seg: usize,
    len: usize,
    segs: usize,
    closed: bool,
    first: usize,
    frames: usize,
}

impl PacketIo for UdpIo {
    fn kind(&self) -> &'static str {
        "udp"
    }

    fn max_frame_len(&self) -> usize {
        self.cfg.max_frame_len
    }

    fn mac(&self) -> [u8; 6] {
        self.cfg.mac
    }

    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        self.recv_checked(max, &mut |f: &[u8], _| sink(f))
    }

    /// IPv4 frames come out checked: recovering their ID verifies the ICRC.
    fn recv_checked(
        &mut self,
        max: usize,
        sink: &mut RxSinkChecked<'_>,
    ) -> Result<usize, NicError> {
        self.maintain_share();
        let mut n = if self.multishot.is_some() {
            self.recv_multishot(max, sink)?
        } else if self.uring.is_some() {
            self.recv_uring(max, sink)?
        } else {
            self.recv_mmsg(self.sock.as_raw_fd(), true, max, sink)?
        };
        for i in 0..self.mcast_fds.len() {
            let Some(&fd) = self.mcast_fds.get(i) else {
                break;
            };
            if n >= max {
                break;
            }
            n += self.recv_mmsg(fd, false, max - n, sink)?;
        }
        if self.cfg.ifindex != 0 && self.empty_recvs.due(n, LINK_CHECK_EVERY) {
            self.check_link()?;
        }
        Ok(n)
    }

    /// Only while a group is joined: an idle second fd would still cost
    /// every sleep of the engine a little.
    fn second_poll_fd(&self) -> Option<RawFd> {
        (!self.mcast_fds.is_empty()).then(|| self.mcast_epoll.as_raw_fd())
    }

    /// A socket bound to the group and port receives its datagrams (with a
    /// socket of its own: the device's is bound to a unicast address). The
    /// kernel's IP_MULTICAST_LOOP is left on, so QPs of this host attached
    /// to the group also hear what is sent to it, as with rxe.
    fn leave_shared(&mut self) {
        if let Some(s) = self.share.take() {
            s.leave(self.sock.as_raw_fd());
        }
    }

    fn join_multicast(&mut self, group: IpAddr) -> Result<(), NicError> {
        self.mcast.join(group)?;
        if let Some(fd) = self.mcast.receive_fd(group) {
            if !self.mcast_fds.contains(&fd) {
                sys::epoll_add(&self.mcast_epoll, fd)?;
                self.mcast_fds.push(fd);
            }
        }
        Ok(())
    }

    fn leave_multicast(&mut self, group: IpAddr) -> Result<(), NicError> {
        // Closing the socket takes it out of the epoll set too.
        if let Some(sock) = self.mcast.leave(group)? {
            let fd = sock.as_raw_fd();
            self.mcast_fds.retain(|&f| f != fd);
        }
        Ok(())
    }

    /// No copy: see `UdpIo::send_from`, here with whole frames.
    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        self.send_from(max, &mut Whole { fill })
    }

    fn gathers(&self) -> bool {
        self.cfg.gather
    }

    fn qpn_prefix(&self) -> Option<u8> {
        self.share.as_ref().map(PortShare::prefix)
    }

    /// Frames whose payload lies elsewhere go out with it gathered from
    /// there (`UdpIo::send_from`).
    fn transmit_gather(&mut self, max: usize, src: &mut dyn TxSource) -> Result<usize, NicError> {
        if !self.cfg.gather {
            return crate::transmit_joined(self, max, src);
        }
        self.send_from(max, src)
    }

    fn poll_fd(&self) -> RawFd {
        match &self.rx_epoll {
            Some(e) => e.as_raw_fd(),
            None => self.sock.as_raw_fd(),
        }
    }

    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        // Microseconds the kernel may spin in recv; needs CAP_NET_ADMIN to raise.
        let us: libc::c_int = if on { 50 } else { 0 };
        sys::setsockopt(
            self.sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_BUSY_POLL,
            &us,
            "SO_BUSY_POLL",
        )
    }

    fn stats(&self) -> Stats {
        self.stats
    }
}

impl UdpIo {
    /// Fails once the interface `UdpConfig::ifindex` is gone. The kernel
    /// leaves a socket bound to a removed address as it was, so it is asked
    /// for the index's name (SIOCGIFNAME) through the socket itself, which
    /// looks in the socket's network namespace, whatever thread asks.
    fn check_link(&self) -> Result<(), NicError> {
        match sys::ifreq_of_index(self.sock.as_raw_fd(), self.cfg.ifindex) {
            Err(err) if err.raw_os_error() == Some(libc::ENODEV) => Err(NicError::Sys {
                op: format!(
                    "UDP socket on {} (interface {}): the interface is gone",
                    self.local, self.cfg.ifindex
                ),
                source: err,
            }),
            _ => Ok(()),
        }
    }

    /// Sends frames from `src` without copying any payload in user space.
    /// Each frame's headers are written into the TX arena where its UDP
    /// payload follows the previous frame's (its Ethernet/IP/UDP headers land
    /// on the previous one's last bytes, saved before and put back once read:
    /// the kernel builds its own). A whole frame's UDP payload lies there; a
    /// split one leaves its head part (BTH, extension headers) and tail (pad,
    /// ICRC) there and its payload where the source keeps it. A message is
    /// the iovecs of its frames (arena pieces that follow each other merged,
    /// so whole frames make one), with consecutive same-size frames to one
    /// peer sent as one GSO message. Payloads are resolved once the batch is
    /// full, right before it is sent ([`UdpIo::flush_gathered`]).
    fn send_from(&mut self, max: usize, src: &mut dyn TxSource) -> Result<usize, NicError> {
        let mut taken = 0;
        let max_frame = self.cfg.max_frame_len;
        self.gather_frames.clear();
        self.gather_runs.clear();
        let mut run: Option<GatherRun> = None;
        // Every message of the last call has been sent: the arena is free.
        let mut pos = HEADROOM;
        while taken < max {
            // Full: the arena, or every message slot (the open one counted).
            if pos + max_frame > self.tx_arena.len()
                || self.gather_runs.len() + usize::from(run.is_some()) >= self.tx_slots.len()
            {
                self.gather_runs.extend(run.take());
                self.flush_gathered(src)?;
                pos = HEADROOM;
            }
            // Where the frame goes if its headers are as long as the last one's.
            let guess = self.tx_hlen;
            let at = pos - guess;
            let mut saved = [0u8; HEADROOM];
            saved[..guess].copy_from_slice(&self.tx_arena[at..pos]);
            let Some(f) = src.fill(&mut self.tx_arena[at..at + max_frame]) else {
                self.tx_arena[at..pos].copy_from_slice(&saved[..guess]);
                break;
            };
            taken += 1;
            let in_arena = f.head + f.tail;
            let total = f.head + f.payload.map_or(0, |p| p.len) + f.tail;
            let info = match self.tx_arena.get(at..at + f.head) {
                Some(h) if in_arena <= max_frame && total <= max_frame => {
                    frame::parse_udp_of(h, total).ok()
                }
                _ => None,
            };
            let dst = info.and_then(|i| socket_dst(self.v6_socket, i.dst));
            let (Some(info), Some(dst)) = (info, dst) else {
                self.tx_arena[at..pos].copy_from_slice(&saved[..guess]);
                self.stats.tx_dropped += 1;
                continue;
            };
            let (hl, plen) = (info.payload_offset, info.payload_len);
            // A whole frame may carry bytes past its UDP datagram (Ethernet
            // padding; not sent); a split one is exactly its parts.
            let exact = f.payload.is_none() || plen + hl == total;
            if !exact || hl + plen > total || hl > f.head {
                self.tx_arena[at..pos].copy_from_slice(&saved[..guess]);
                self.stats.tx_dropped += 1;
                continue;
            }
            let frame_at = if hl == guess {
                at
            } else {
                // Other headers (the other IP family, a VLAN tag): move the frame past the
                // previous payload (a copy, rarely) and expect this length from now on.
                self.tx_arena.copy_within(at..at + in_arena, pos);
                self.tx_arena[at..pos].copy_from_slice(&saved[..guess]);
                if hl <= HEADROOM {
                    self.tx_hlen = hl;
                }
                pos
            };
            // The top byte of the BTH's destination QP: a GSO send goes whole
            // to one member of a shared port (crate::port_share).
            let qp_top = self
                .tx_arena
                .get(frame_at + hl + 5)
                .copied()
                .filter(|_| f.head >= hl + 6);
            let appendable = match &run {
                Some(r)
                    if self.gso
                        && !r.closed
                        && r.dst == dst
                        && r.tos == info.tos
                        && r.ttl == info.ttl
                        && r.qp_top == qp_top =>
                {
                    plen > 0 && plen <= r.seg && r.len + plen <= MAX_DGRAM && r.segs < GSO_MAX_SEGS
                }
                _ => false,
            };
            if info.dst.is_ipv4() {
                // The kernel gives segment k of a send the IPv4 ID k (crate::ipv4_id).
                let k = match &run {
                    Some(r) if appendable => r.segs as u16,
                    _ => 0,
                };
                // IdRecovery leaves a frame that is not RoCE as it is.
                if let Some(l3) = hl.checked_sub(IPV4_UDP_HLEN) {
                    match f.payload {
                        // Frames split by the source are the core's, ICRC right.
                        Some(_) => {
                            let pkt = &mut self.tx_arena[frame_at + l3..frame_at + in_arena];
                            self.ids.give_id_split(pkt, f.head - l3, total - l3, k);
                        }
                        None => {
                            let pkt = &mut self.tx_arena[frame_at + l3..frame_at + hl + plen];
                            self.ids.give_id(pkt, k, self.cfg.tx_icrc_valid);
                        }
                    }
                }
            }
            if frame_at == at {
                // The headers have been read: the previous payload gets its bytes back.
                self.tx_arena[at..pos].copy_from_slice(&saved[..guess]);
            }
            let p = frame_at + hl;
            self.gather_frames.push(GatherPiece {
                at: p,
                head: if f.payload.is_some() {
                    f.head - hl
                } else {
                    plen
                },
                payload: f.payload,
                tail: f.tail,
            });
            pos = frame_at + in_arena;
            if appendable {
                if let Some(r) = run.as_mut() {
                    r.len += plen;
                    r.segs += 1;
                    r.frames += 1;
                    // A shorter segment must be the last one (UDP_SEGMENT rule).
                    r.closed = plen < r.seg;
                }
                continue;
            }
            self.gather_runs.extend(run.take());
            run = Some(GatherRun {
                dst,
                tos: info.tos,
                ttl: info.ttl,
                qp_top,
                seg: plen,
                len: plen,
                segs: 1,
                closed: plen == 0,
                first: self.gather_frames.len() - 1,
                frames: 1,
            });
        }
        self.gather_runs.extend(run.take());
        self.flush_gathered(src)?;
        Ok(taken)
    }

    /// A shared port's periodic check ([`PortShare::tick`]), with UDP GRO
    /// off while others share the port and back on when they have gone.
    fn maintain_share(&mut self) {
        let Some(share) = self.share.as_mut() else {
            return;
        };
        // A clock read on every receive would cost a busy-polling engine
        // ~5 % of an empty poll; every 16th is often enough for 100 ms.
        self.share_polls = self.share_polls.wrapping_add(1);
        if self.share_polls % 16 != 1 {
            return;
        }
        let fd = self.sock.as_raw_fd();
        // The table or a probe failing (a full /dev/shm, say) costs the
        // steering its mending, not the device its traffic.
        let checked = share
            .tick(fd, std::time::Instant::now())
            .unwrap_or_else(|e| {
                // Once loudly; a lasting fault would repeat every check.
                if std::mem::replace(&mut self.share_warned, true) {
                    tracing::debug!("shared UDP port {}: {e}", self.local);
                } else {
                    tracing::warn!("shared UDP port {}: {e}", self.local);
                }
                None
            });
        if checked.is_some() {
            let want = self.gro_capable && share.gro_others() == 0;
            if want != self.gro_on && set_gro(fd, want) {
                self.gro_stale |= self.gro_on;
                self.gro_on = want;
            }
        }
    }

    /// Whether the socket takes UDP GRO now (off while another member of a
    /// shared port would take it too).
    pub fn gro_on(&self) -> bool {
        self.gro_on
    }

    /// This socket's membership of a port shared with other processes'
    /// devices (`None`: the port is its own).
    pub fn share(&self) -> Option<&PortShare> {
        self.share.as_ref()
    }

    /// Fills in message header `i`: to `dst` with ToS `tos` and TTL (hop
    /// limit) `ttl`, `segs` segments of `seg` bytes (the last maybe shorter),
    /// `len` bytes in `iovs`.
    fn seal_msg(
        &mut self,
        i: usize,
        (dst, tos, ttl): (SocketAddr, u8, u8),
        (seg, segs): (usize, usize),
        len: usize,
        iovs: (*mut libc::iovec, usize),
    ) {
        let (Some(slot), Some(h)) = (self.tx_slots.get_mut(i), self.tx_hdrs.get_mut(i)) else {
            return;
        };
        let (ss, namelen) = to_sockaddr(&dst);
        slot.name = ss;
        slot.len = len;
        h.msg_hdr.msg_name = (&mut slot.name as *mut libc::sockaddr_storage).cast();
        h.msg_hdr.msg_namelen = namelen;
        h.msg_hdr.msg_iov = iovs.0;
        h.msg_hdr.msg_iovlen = iovs.1 as _;
        h.msg_hdr.msg_flags = 0;
        slot.seg = if segs > 1 { seg } else { 0 };
        let mut used = 0usize;
        let ctl = slot.control.as_mut_ptr().cast::<u8>();
        h.msg_hdr.msg_control = ctl.cast();
        h.msg_hdr.msg_controllen = CMSG_ROOM as _;
        // The IP level of the packet, not of the socket: a dual-stack socket
        // sends to an IPv4-mapped address through the IPv4 path, which reads
        // only SOL_IP messages (Linux ip_cmsg_send).
        let v4 = match dst {
            SocketAddr::V4(_) => true,
            SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
        };
        let (tos_msg, ttl_msg) = if v4 {
            (
                (libc::IPPROTO_IP, libc::IP_TOS),
                (libc::IPPROTO_IP, libc::IP_TTL),
            )
        } else {
            (
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
                (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT),
            )
        };
        // A TTL other than the socket's goes with the message (the frame's,
        // the QP's hop limit, is the one to send). Linux refuses an IPv4
        // TTL of 0 there; such a frame leaves with the socket's.
        let ints = [
            (tos != 0).then_some((tos_msg, tos)),
            (ttl != SOCKET_TTL && (ttl != 0 || !v4)).then_some((ttl_msg, ttl)),
        ];
        // SAFETY: the control buffer is CMSG_ROOM bytes, 8-aligned; we write at
        // most three small cmsgs (UDP_SEGMENT u16, TOS and TTL ints), well
        // within it, each after CMSG_NXTHDR checked there is room for it.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
            if segs > 1 && !c.is_null() {
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg as u16);
                used += libc::CMSG_SPACE(2) as usize;
                c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
            }
            for ((level, ty), v) in ints.into_iter().flatten() {
                if c.is_null() {
                    break;
                }
                (*c).cmsg_level = level;
                (*c).cmsg_type = ty;
                (*c).cmsg_len = libc::CMSG_LEN(4) as _;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c).cast::<libc::c_int>(),
                    libc::c_int::from(v),
                );
                used += libc::CMSG_SPACE(4) as usize;
                c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
            }
        }
        h.msg_hdr.msg_controllen = used as _;
        if used == 0 {
            h.msg_hdr.msg_control = std::ptr::null_mut();
        }
    }

    /// Sends the gathered messages: their iovecs first (all of them, so the
    /// vector does not move under the headers that point into it), then the
    /// headers. A message with a payload its source no longer has is dropped
    /// whole (the transport retransmits it).
    fn flush_gathered(&mut self, src: &dyn TxSource) -> Result<(), NicError> {
        self.tx_iov.clear();
        let mut spans = std::mem::take(&mut self.gather_spans);
        spans.clear();
        let base = self.tx_arena.as_mut_ptr();
        for r in &self.gather_runs {
            let start = self.tx_iov.len();
            let mut ok = true;
            for g in self.gather_frames.iter().skip(r.first).take(r.frames) {
                ok &= sys::push_gathered(
                    &mut self.tx_iov,
                    start,
                    (base.wrapping_add(g.at), g.head),
                    g.payload.as_ref(),
                    src,
                    (base.wrapping_add(g.at + g.head), g.tail),
                );
            }
            if ok {
                spans.push(Some((start, self.tx_iov.len() - start)));
            } else {
                self.tx_iov.truncate(start);
                self.stats.tx_dropped += r.segs as u64;
                spans.push(None);
            }
        }
        let runs = std::mem::take(&mut self.gather_runs);
        let mut msgs = 0;
        for (r, span) in runs.iter().zip(&spans) {
            let Some((start, n)) = *span else {
                continue;
            };
            let iov = self.tx_iov[start..].as_mut_ptr();
            self.seal_msg(
                msgs,
                (r.dst, r.tos, r.ttl),
                (r.seg, r.segs),
                r.len,
                (iov, n),
            );
            msgs += 1;
        }
        self.gather_runs = runs;
        self.gather_runs.clear();
        self.gather_spans = spans;
        self.gather_frames.clear();
        if msgs > 0 {
            // The payload iovecs point into `src`, which nothing can change
            // before this returns (we only hold it shared).
            self.flush_tx(msgs)?;
        }
        Ok(())
    }

    /// Takes what the armed multishot receive holds. Should the kernel
    /// refuse it, the socket goes back to recvmmsg for good.
    fn recv_multishot(
        &mut self,
        max: usize,
        sink: &mut RxSinkChecked<'_>,
    ) -> Result<usize, NicError> {
        let Some(mut ms) = self.multishot.take() else {
            return Ok(0);
        };
        let enters = ms.enters;
        let mut got = 0;
        let r = ms.poll(max, |d| {
            got += 1;
            let meta = self.parse_cmsgs(&d.control);
            let received = Received {
                peer: from_sockaddr(&d.name),
                buf: d.buf,
                at: d.payload_at,
                total: d.len,
                meta,
                truncated: d.truncated,
            };
            self.deliver_datagram(received, sink)
        });
        self.stats.syscalls += ms.enters - enters;
        match r {
            Ok(n) => {
                if got == 0 {
                    // Nothing waited in the ring; the socket's queue is (near enough) empty.
                    self.queue_drained();
                }
                self.multishot = Some(ms);
                Ok(n)
            }
            Err(e) => {
                tracing::info!("io_uring multishot receive failed ({e}); using recvmmsg");
                // rx_epoll stays: the engine sleeps on it, and it still holds the socket.
                drop(ms);
                self.recv_mmsg(self.sock.as_raw_fd(), true, max, sink)
            }
        }
    }

    fn recv_uring(&mut self, max: usize, sink: &mut RxSinkChecked<'_>) -> Result<usize, NicError> {
        // Adaptive depth: every submitted RecvMsg costs ~1 µs even when it
        // finds nothing, so submit about as many as the last call filled.
        let want = max.min(self.rx_hdrs.len()).min(self.uring_depth).max(1);
        self.prepare_rx(want);
        let fd = self.sock.as_raw_fd();
        // Taken out while frames are delivered (deliver needs &mut self).
        let Some(mut u) = self.uring.take() else {
            return Ok(0);
        };
        let res = u
            .recv_batch(fd, &mut self.rx_hdrs[..want])
            .map(<[_]>::to_vec);
        self.uring = Some(u);
        // Any submitted header may have been written back.
        self.rx_dirty = want;
        let results = res?;
        self.stats.syscalls += 1;
        let mut delivered = 0;
        let mut filled = 0;
        for (i, r) in results.iter().enumerate() {
            if let Some(len) = r {
                if let Some(h) = self.rx_hdrs.get_mut(i) {
                    h.msg_len = *len as libc::c_uint;
                }
                delivered += self.deliver(i, sink);
                filled += 1;
            }
        }
        if filled < want {
            self.queue_drained();
        }
        self.uring_depth = if filled == want {
            (want * 2).min(self.rx_hdrs.len())
        } else {
            (filled + 1).max(want / 2).max(1)
        };
        Ok(delivered)
    }
}

mod uring {
    //! io_uring submission of recvmsg batches. Each call submits one RecvMsg
    //! per slot with MSG_DONTWAIT and waits for all completions, so it has the
    //! same non-blocking semantics as recvmmsg (one io_uring_enter instead of
    //! one recvmmsg).

    use io_uring::{opcode, types, IoUring};

    use crate::NicError;

    pub(super) struct Uring {
        ring: IoUring,
        results: Vec<Option<usize>>,
    }

    impl Uring {
        pub(super) fn new(entries: usize) -> Result<Self, NicError> {
            let ring = IoUring::new(entries.next_power_of_two() as u32)
                .map_err(|e| NicError::io("io_uring_setup", e))?;
            Ok(Uring {
                ring,
                results: Vec::new(),
            })
        }

        pub(super) fn send_batch(
            &mut self,
            fd: i32,
            hdrs: &mut [libc::mmsghdr],
        ) -> Result<&[Option<usize>], NicError> {
            self.results.clear();
            self.results.resize(hdrs.len(), None);
            let mut queued = 0;
            for (i, h) in hdrs.iter().enumerate() {
                let e = opcode::SendMsg::new(types::Fd(fd), &h.msg_hdr)
                    .flags(libc::MSG_DONTWAIT as u32)
                    .build()
                    .user_data(i as u64);
                // SAFETY: as in recv_batch: everything the msghdr points to
                // outlives the wait for all completions below.
                if unsafe { self.ring.submission().push(&e) }.is_err() {
                    break;
                }
                queued += 1;
            }
            self.ring
                .submit_and_wait(queued)
                .map_err(|e| NicError::io("io_uring_enter", e))?;
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                if cqe.result() >= 0 {
                    if let Some(slot) = self.results.get_mut(i) {
                        *slot = Some(cqe.result() as usize);
                    }
                }
            }
            Ok(&self.results)
        }

        pub(super) fn recv_batch(
            &mut self,
            fd: i32,
            hdrs: &mut [libc::mmsghdr],
        ) -> Result<&[Option<usize>], NicError> {
            self.results.clear();
            self.results.resize(hdrs.len(), None);
            let mut queued = 0;
            for (i, h) in hdrs.iter_mut().enumerate() {
                let e = opcode::RecvMsg::new(types::Fd(fd), &mut h.msg_hdr)
                    .flags(libc::MSG_DONTWAIT as u32)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the msghdr and every buffer it points to live in the
                // UdpIo and outlive the submission: we wait for all completions
                // below before returning.
                if unsafe { self.ring.submission().push(&e) }.is_err() {
                    break;
                }
                queued += 1;
            }
            self.ring
                .submit_and_wait(queued)
                .map_err(|e| NicError::io("io_uring_enter", e))?;
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                if cqe.result() >= 0 {
                    if let Some(slot) = self.results.get_mut(i) {
                        *slot = Some(cqe.result() as usize);
                    }
                }
            }
            Ok(&self.results)
        }
    }
}
