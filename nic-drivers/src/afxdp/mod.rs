//! AF_XDP backend: an XDP program steers UDP-to-4791 frames into one AF_XDP
//! socket per RX queue; everything else goes on to the kernel.
//!
//! Written on `libc` and the raw `bpf(2)` call (no libbpf, no xdpilone: the
//! rings are ~150 lines and this keeps the crate MIT OR Apache-2.0 with no
//! EUPL dependency). Per queue: a UMEM of 4 KiB chunks (first part RX, the
//! rest TX slots of 3 contiguous chunks so a 9 KB frame can be written in one
//! piece), fill/completion/RX/TX rings, bound with XDP_USE_SG so frames larger
//! than a chunk travel as several descriptors (XDP_PKT_CONTD); kernels before
//! 6.6 refuse that flag, and there a frame must fit one chunk (RoCE MTU 2048
//! at most, which the device then offers). Zero-copy bind
//! is tried first and falls back to copy mode (veth supports only copy).
//! Native (driver) mode is tried first with BPF_F_XDP_HAS_FRAGS (required on
//! veth at MTU 9000), then generic (skb) mode. The program is attached with
//! BPF_LINK_CREATE, so it is detached when the link fd closes: on drop, or by
//! the kernel when the process dies.

mod bpf;
mod if_xdp;
mod ring;
mod socket;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::frame::ROCE_V2_PORT;
use crate::mcast::Memberships;
use crate::raw_share::RawShare;
use crate::{offload, sys};
use crate::{NicError, PacketIo, RxSink, Stats, TxFill};
use if_xdp::{XdpDesc, XDP_PKT_CONTD};
use socket::{map_slice, Xsk};

// linux/ethtool.h
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// Chunk size: one page (the largest aligned-mode chunk).
pub(super) const CHUNK: usize = 4096;
/// What copy mode keeps free in front of each received frame
/// (include/uapi/linux/bpf.h), so without XDP_USE_SG a frame can be at most
/// `CHUNK - XDP_PACKET_HEADROOM` bytes.
const XDP_PACKET_HEADROOM: usize = 256;
/// Empty receives between two looks at whether the socket is still bound
/// ([`AfXdpIo::check_link`]): one system call per 64 empty polls, about
/// 1.3 s for an idle engine waking every 20 ms.
const LINK_CHECK_EVERY: u32 = 64;
/// Chunks per TX slot: 3 × 4 KiB holds a 9018-byte frame contiguously.
pub(super) const TX_SLOT_CHUNKS: usize = 3;

/// XDP attach mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// Try native (driver) mode, fall back to generic.
    Auto,
    /// Native XDP in the driver.
    Driver,
    /// Generic XDP on the skb path.
    Skb,
}

/// AF_XDP settings.
#[derive(Debug, Clone)]
pub struct AfXdpConfig {
    /// Interface (in the calling thread's namespace).
    pub ifname: String,
    /// UDP destination port steered to the sockets.
    pub port: u16,
    /// XDP attach mode.
    pub mode: XdpMode,
    /// Try a zero-copy bind before copy mode.
    pub try_zero_copy: bool,
    /// Fail to open (`NicError::Unsupported`) instead of binding in copy
    /// mode: for a caller that has a faster backend than a copy-mode socket
    /// (ferroce-verbs' `auto`: AF_PACKET with GSO).
    pub zero_copy_only: bool,
    /// RX chunks (and fill/RX ring size) per queue; a power of two.
    pub rx_chunks: usize,
    /// TX slots (and TX/completion ring size) per queue; a power of two.
    pub tx_slots: usize,
    /// Take a QPN prefix from the interface's table of ferroce devices
    /// ([`raw_share`](crate::raw_share)) and steer only frames to QPs under
    /// it to the sockets; the rest go on to the kernel, where another
    /// process's AF_PACKET device may take them. Off by default here (the
    /// program would pass test frames that carry no BTH); the verbs layer
    /// turns it on.
    pub share_qpns: bool,
}

impl AfXdpConfig {
    /// Defaults: auto mode, zero-copy attempt, 4096 RX chunks, 512 TX slots.
    pub fn new(ifname: &str) -> Self {
        AfXdpConfig {
            ifname: ifname.to_string(),
            port: ROCE_V2_PORT,
            mode: XdpMode::Auto,
            try_zero_copy: true,
            zero_copy_only: false,
            rx_chunks: 4096,
            tx_slots: 512,
            share_qpns: false,
        }
    }
}

/// The AF_XDP backend: one socket per RX queue, the program attached.
#[derive(Debug)]
pub struct AfXdpIo {
    xsks: Vec<Xsk>,
    // Fields drop in declaration order: the sockets first (the kernel takes
    // them out of the map), then the link (detaches the program), program, map.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    epoll: Option<OwnedFd>,
    mac: [u8; 6],
    max_frame_len: usize,
    mtu: usize,
    mode: &'static str,
    next_rx: usize,
    /// Receives in a row that found nothing (see [`AfXdpIo::check_link`]).
    empty_recvs: crate::link_check::EmptyRecvs,
    ifname: String,
    stats: Stats,
    busy_poll: bool,
    /// Multicast groups joined on the interface (frames arrive on the ring).
    mcast: Memberships,
    // Last: the prefix is given back once the program is gone.
    share: Option<RawShare>,
}

// SAFETY: the raw pointers in the rings and UMEM point into mappings owned by
// this struct only; the kernel side is synchronised via the ring indices.
unsafe impl Send for AfXdpIo {}

/// RX queue count of an interface (ETHTOOL_GCHANNELS; 1 if not reported).
fn queue_count(name: &str) -> u32 {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let Ok(fd) = sys::owned(fd, "socket") else {
        return 1;
    };
    let mut ch = [0u32; 9]; // struct ethtool_channels
    ch[0] = ETHTOOL_GCHANNELS;
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.as_bytes().iter().take(15)) {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = ch.as_mut_ptr().cast();
    // SAFETY: SIOCETHTOOL reads the command from ch and fills it in place.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
    if r < 0 {
        return 1;
    }
    // rx_count (index 5) or combined_count (index 8), whichever the driver uses.
    ch[5].max(ch[8]).max(1)
}

impl AfXdpIo {
    /// Attaches the program and opens one socket per queue of `cfg.ifname`.
    pub fn open(cfg: AfXdpConfig) -> Result<Self, NicError> {
        if !cfg.rx_chunks.is_power_of_two() || !cfg.tx_slots.is_power_of_two() {
            return Err(NicError::Config(format!("afxdp {cfg:?}")));
        }
        let ifindex = sys::if_index(&cfg.ifname)?;
        let probe = sys::owned(
            // SAFETY: plain syscall.
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) },
            "socket",
        )?;
        let mac = sys::if_mac(probe.as_raw_fd(), &cfg.ifname)?;
        let mtu = sys::if_mtu(probe.as_raw_fd(), &cfg.ifname)?;
        let queues = queue_count(&cfg.ifname);
        let map = bpf::create_xskmap(queues)?;
        let share = if cfg.share_qpns {
            Some(RawShare::join(ifindex)?)
        } else {
            None
        };
        let code = bpf::redirect_program(
            map.as_raw_fd(),
            cfg.port,
            share.as_ref().map(RawShare::prefix),
        )?;
        let mut xsks = Vec::new();
        for q in 0..queues {
            xsks.push(Xsk::open(ifindex, q, &cfg)?);
        }
        for (q, x) in xsks.iter().enumerate() {
            bpf::xskmap_set(&map, q as u32, x.fd.as_raw_fd())?;
        }
        let attempts: &[(u32, &'static str)] = match cfg.mode {
            XdpMode::Auto => &[
                (bpf::XDP_FLAGS_DRV_MODE, "drv"),
                (bpf::XDP_FLAGS_SKB_MODE, "skb"),
            ],
            XdpMode::Driver => &[(bpf::XDP_FLAGS_DRV_MODE, "drv")],
            XdpMode::Skb => &[(bpf::XDP_FLAGS_SKB_MODE, "skb")],
        };
        let mut last = None;
        let mut attached = None;
        for (flags, name) in attempts {
            // Frags-aware program: native mode on veth at MTU 9000 needs it.
            let prog = match bpf::load_xdp(&code, bpf::BPF_F_XDP_HAS_FRAGS) {
                Ok(p) => p,
                Err(_) => bpf::load_xdp(&code, 0)?,
            };
            match bpf::attach_xdp(&prog, ifindex, *flags) {
                Ok(link) => {
                    attached = Some((link, prog, *name));
                    break;
                }
                Err(e) => {
                    tracing::debug!("XDP {name} attach failed: {e}");
                    last = Some(e);
                }
            }
        }
        let Some((link, prog, mode)) = attached else {
            return Err(last.unwrap_or(NicError::Unsupported("XDP attach".into())));
        };
        let epoll = if xsks.len() > 1 {
            // SAFETY: plain syscall.
            let ep = sys::owned(
                unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
                "epoll_create1",
            )?;
            for x in &xsks {
                let mut ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: x.fd.as_raw_fd() as u64,
                };
                // SAFETY: both fds open; ev valid.
                let r = unsafe {
                    libc::epoll_ctl(
                        ep.as_raw_fd(),
                        libc::EPOLL_CTL_ADD,
                        x.fd.as_raw_fd(),
                        &mut ev,
                    )
                };
                sys::cvt(r, "epoll_ctl")?;
            }
            Some(ep)
        } else {
            None
        };
        tracing::info!(
            "AF_XDP on {} ({} mode, {} queue(s), {})",
            cfg.ifname,
            mode,
            xsks.len(),
            if xsks.iter().all(|x| x.zero_copy) {
                "zero-copy"
            } else {
                "copy"
            }
        );
        let max_frame_len = (mtu + 18).min(if xsks.iter().all(|x| x.frags) {
            TX_SLOT_CHUNKS * CHUNK
        } else {
            CHUNK - XDP_PACKET_HEADROOM
        });
        Ok(AfXdpIo {
            mcast: Memberships::new(ifindex, None, None),
            xsks,
            _link: link,
            _prog: prog,
            _map: map,
            epoll,
            mac,
            max_frame_len,
            mtu,
            mode,
            next_rx: 0,
            empty_recvs: Default::default(),
            ifname: cfg.ifname.clone(),
            stats: Stats::default(),
            busy_poll: false,
            share,
        })
    }

    /// When its interface is removed the kernel unbinds an XDP socket
    /// (NETDEV_UNREGISTER) and its `poll` never reports anything again, so
    /// the engine slept for ever and the application waited on completions
    /// that could not come. A receive call on an unbound socket fails with
    /// ENXIO (a link that is only down gives ENETDOWN and keeps the device:
    /// its frames resume when it comes back up), as rxe's device goes with
    /// its netdev.
    fn check_link(&mut self) -> Result<(), NicError> {
        let Some(x) = self.xsks.first() else {
            return Ok(());
        };
        let r = x.kick_rx();
        self.stats.syscalls += 1;
        match r {
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Err(NicError::Sys {
                op: format!("AF_XDP socket on {}: the interface is gone", self.ifname),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// `"drv"` or `"skb"`: the XDP mode actually attached.
    pub fn xdp_mode(&self) -> &'static str {
        self.mode
    }

    /// Whether every socket got a zero-copy bind.
    pub fn zero_copy(&self) -> bool {
        self.xsks.iter().all(|x| x.zero_copy)
    }

    /// Number of queues (sockets).
    pub fn queues(&self) -> usize {
        self.xsks.len()
    }

    /// Frames received on each queue's socket.
    pub fn rx_frames_per_queue(&self) -> Vec<u64> {
        self.xsks.iter().map(|x| x.rx_frames).collect()
    }
}

impl PacketIo for AfXdpIo {
    fn kind(&self) -> &'static str {
        "afxdp"
    }

    fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        let mut n = 0;
        let nq = self.xsks.len();
        for k in 0..nq {
            if n >= max {
                break;
            }
            let q = (self.next_rx + k) % nq;
            let Some(x) = self.xsks.get_mut(q) else {
                continue;
            };
            let mut returned = 0;
            let mut counted = 0u64;
            while n < max {
                let Some(d) = x.rx.pop() else { break };
                let addr = d.addr as usize;
                let contd = d.options & XDP_PKT_CONTD != 0;
                // A frame in one buffer; AF_XDP gives no checksum status: a
                // local UDP socket's frame over veth still holds the partial
                // form (see offload), whose finished checksum this works out.
                let whole = !contd && !x.in_frame;
                // Borrow the UMEM field alone so `partial` stays writable.
                let data = map_slice(&x.umem, addr, d.len as usize);
                let finish = data.filter(|_| whole).and_then(offload::partial_finish);
                match data {
                    Some(data) if whole && finish.is_none() => {
                        sink(data);
                        self.stats.rx_frames += 1;
                        self.stats.rx_bytes += data.len() as u64;
                        n += 1;
                        counted += 1;
                    }
                    Some(data) => {
                        // Multi-buffer frame, or one whose checksum needs finishing:
                        // gather the pieces (one copy).
                        if !x.in_frame {
                            x.partial.clear();
                        }
                        x.partial.extend_from_slice(data);
                        x.in_frame = contd;
                        if !contd {
                            // A multi-buffer frame is checked once gathered.
                            let finish = if whole {
                                finish
                            } else {
                                offload::partial_finish(&x.partial)
                            };
                            if let Some(fin) = finish {
                                fin.apply(&mut x.partial);
                            }
                            sink(&x.partial);
                            counted += 1;
                            self.stats.rx_frames += 1;
                            self.stats.rx_bytes += x.partial.len() as u64;
                            n += 1;
                        }
                    }
                    None => self.stats.rx_dropped += 1,
                }
                // The chunk goes straight back to the fill ring.
                x.fill.push((addr & !(CHUNK - 1)) as u64);
                returned += 1;
            }
            x.rx_frames += counted;
            if returned > 0 {
                x.rx.release();
                x.fill.publish();
            }
            if x.fill.needs_wakeup() || self.busy_poll {
                let _ = x.kick_rx();
                self.stats.syscalls += 1;
            }
        }
        self.next_rx = (self.next_rx + 1) % nq.max(1);
        if self.empty_recvs.due(n, LINK_CHECK_EVERY) {
            self.check_link()?;
        }
        Ok(n)
    }

    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        let max_len = self.max_frame_len;
        let mtu = self.mtu;
        let Some(x) = self.xsks.first_mut() else {
            return Ok(0);
        };
        x.reclaim();
        let mut n = 0;
        let mut queued = 0;
        while n < max {
            if x.tx_free.is_empty() {
                // Push what we have and wait briefly for completions.
                if queued > 0 {
                    x.tx.publish();
                    x.kick_tx();
                    self.stats.syscalls += 1;
                    queued = 0;
                }
                x.reclaim();
                if x.tx_free.is_empty() {
                    self.stats.tx_ring_full += 1;
                    break;
                }
            }
            if x.tx.free(TX_SLOT_CHUNKS as u32) < TX_SLOT_CHUNKS as u32 {
                self.stats.tx_ring_full += 1;
                break;
            }
            let Some(slot) = x.tx_free.pop() else { break };
            let base = x.tx_slot_addr(slot);
            let Some(buf) = x.umem_slice_mut(base, max_len) else {
                x.tx_free.push(slot);
                break;
            };
            let Some(len) = fill(buf) else {
                x.tx_free.push(slot);
                break;
            };
            n += 1;
            if len > max_len || !crate::frame::fits_mtu(buf, len, mtu) {
                x.tx_free.push(slot);
                self.stats.tx_dropped += 1;
                continue;
            }
            // Split at chunk boundaries: aligned-mode descriptors may not cross one.
            let mut off = 0;
            while off < len {
                let piece = (len - off).min(CHUNK);
                let last = off + piece == len;
                x.tx.push(XdpDesc {
                    addr: (base + off) as u64,
                    len: piece as u32,
                    options: if last { 0 } else { XDP_PKT_CONTD },
                });
                off += piece;
            }
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
            queued += 1;
        }
        x.tx.publish();
        // Copy mode sends at most a few dozen descriptors per kick: kick
        // until the kernel has taken everything (bounded).
        let mut spins = 0;
        while x.tx.pending() > 0 && spins < 10_000 {
            if !x.kick_tx() {
                break;
            }
            self.stats.syscalls += 1;
            spins += 1;
            x.reclaim();
        }
        x.reclaim();
        Ok(n)
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
        match (&self.epoll, self.xsks.first()) {
            (Some(ep), _) => ep.as_raw_fd(),
            (None, Some(x)) => x.fd.as_raw_fd(),
            (None, None) => -1,
        }
    }

    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        // asm-generic/socket.h: SO_BUSY_POLL 46, SO_PREFER_BUSY_POLL 69,
        // SO_BUSY_POLL_BUDGET 70. The kernel then polls the driver's NAPI from
        // our recvfrom/sendto instead of waiting for its softirq.
        let (us, prefer, budget): (libc::c_int, libc::c_int, libc::c_int) =
            if on { (20, 1, 64) } else { (0, 0, 8) };
        for x in &self.xsks {
            let fd = x.fd.as_raw_fd();
            sys::setsockopt(fd, libc::SOL_SOCKET, 69, &prefer, "SO_PREFER_BUSY_POLL")?;
            sys::setsockopt(fd, libc::SOL_SOCKET, 46, &us, "SO_BUSY_POLL")?;
            sys::setsockopt(fd, libc::SOL_SOCKET, 70, &budget, "SO_BUSY_POLL_BUDGET")?;
        }
        self.busy_poll = on;
        Ok(())
    }

    fn stats(&self) -> Stats {
        let mut s = self.stats;
        for x in &self.xsks {
            let k = x.stats();
            s.rx_dropped += k.rx_dropped + k.rx_ring_full;
            s.tx_dropped += k.tx_invalid_descs;
        }
        s
    }
}

impl Drop for AfXdpIo {
    fn drop(&mut self) {
        // Give in-flight TX a moment to complete before the UMEM goes away
        // (the kernel holds its own reference, so this is only for counters).
        if let Some(x) = self.xsks.first_mut() {
            let t0 = std::time::Instant::now();
            while x.tx.pending() > 0 && t0.elapsed() < Duration::from_millis(50) {
                x.kick_tx();
                x.reclaim();
            }
        }
    }
}
