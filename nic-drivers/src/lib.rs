//! ferroce-nic: packet engines that move raw Ethernet frames between the
//! ferroce transport core and a network interface.
//!
//! Every backend (AF_XDP, AF_PACKET with TPACKET_V3 rings, a kernel UDP
//! socket on port 4791, and an in-memory switch for tests) sits behind one
//! batch receive/transmit trait, [`PacketIo`], so the layers above never learn
//! which one carries their frames. The crate knows frames, not queue pairs: it
//! does not depend on `ferroce-stack`.
//!
//! The trait *lends* buffers instead of handing out owned ones: a received
//! frame is borrowed by a callback straight from the ring (or socket buffer)
//! and goes back to the pool when the callback returns; a frame to send is
//! written by a callback straight into the TX slot. That matches the core's
//! `handle_frame(now, &[u8])` / `poll_transmit(now, &mut [u8]) -> Option<len>`
//! shape and costs no copy where the backend has mapped memory.

use std::os::fd::RawFd;
use std::time::Duration;

pub mod afpacket;
pub mod afxdp;
pub mod frame;
pub mod gso;
pub mod ifaces;
pub mod ipv4_id;
mod link_check;
pub mod local_peers;
pub mod mcast;
pub mod mem;
pub mod middleware;
pub mod neigh;
mod netlink;
pub mod netns;
pub mod offload;
pub mod port_share;
pub mod raw_share;
mod sys;
pub mod udp;
mod uring_rx;

pub use afpacket::{AfPacketConfig, AfPacketIo, RxRing};
pub use afxdp::{AfXdpConfig, AfXdpIo, XdpMode};
pub use frame::{FrameInfo, ROCE_V2_PORT};
pub use local_peers::LocalPeersIo;
pub use mem::{MemPort, Switch, SwitchConfig};
pub use middleware::fault::{FaultConfig, FaultIo};
pub use middleware::pcap::PcapIo;
pub use udp::{UdpConfig, UdpIo};

/// Errors of the packet engines. Each names the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// The call and, where useful, its argument (`"bind 127.0.0.1:4791"`).
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The named interface does not exist (in the current namespace).
    #[error("no interface named {0:?}")]
    NoSuchInterface(String),
    /// A frame is longer than the backend's buffers.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLong {
        /// Length of the frame.
        len: usize,
        /// Largest frame the backend carries.
        max: usize,
    },
    /// A frame handed to a backend that needs Ethernet/IP/UDP is not one.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    /// An external command (`ip`, `tc`) failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Exit status as text.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The backend needs privileges (CAP_NET_RAW / CAP_NET_ADMIN) we lack.
    #[error("{0} needs root (CAP_NET_RAW/CAP_NET_ADMIN)")]
    NeedsPrivilege(&'static str),
    /// The kernel or the interface does not support what was asked.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Writing the capture file failed.
    #[error("pcap: {0}")]
    Pcap(String),
    /// A neighbour (MAC for an IP) could not be resolved in time.
    #[error("no neighbour entry for {0} after resolution")]
    NoNeighbour(std::net::IpAddr),
    /// The destination is an address of this host (this namespace): the
    /// kernel delivers to it over loopback and never resolves it, so frames
    /// sent on an interface cannot reach it.
    #[error(
        "{0} is an address of this host: frames sent on the interface do not come back to it \
         (rxe reaches it through the kernel's loopback). A raw device reaches such peers \
         through its UDP sockets on the interface's first IPv4 and first non-link-local IPv6 \
         address, from those GIDs only; otherwise use the UDP backend (--backend udp) for \
         processes on one host"
    )]
    LocalPeer(std::net::IpAddr),
    /// A configuration value is out of range.
    #[error("bad configuration: {0}")]
    Config(String),
}

impl NicError {
    /// The last OS error, tagged with the operation.
    pub(crate) fn last_os(op: impl Into<String>) -> Self {
        NicError::Sys {
            op: op.into(),
            source: std::io::Error::last_os_error(),
        }
    }

    /// Wraps an `io::Error` with the operation.
    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        NicError::Sys {
            op: op.into(),
            source,
        }
    }
}

/// Counters every backend keeps. Monotonic from creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames handed to the `recv` sink.
    pub rx_frames: u64,
    /// Bytes of those frames (whole Ethernet frames, no FCS).
    pub rx_bytes: u64,
    /// Frames accepted by `transmit` and handed to the kernel / wire.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames lost on receive: ring/queue overflow reported by the kernel or
    /// the in-memory switch, or frames that could not be parsed.
    pub rx_dropped: u64,
    /// Frames the `fill` callback produced that could not be sent (malformed
    /// for this backend, or the kernel refused them).
    pub tx_dropped: u64,
    /// Times `transmit` stopped early because the TX ring / socket buffer was
    /// full (the caller should retry after `wait_writable` or a short pause).
    pub tx_ring_full: u64,
    /// System calls (or ring kicks) made, for cost-per-frame reports.
    pub syscalls: u64,
    /// GSO super-frames handed to the kernel, each carrying two or more of
    /// the frames counted in `tx_frames` (AF_PACKET, UDP).
    pub tx_gso: u64,
}

impl Stats {
    /// Field-wise difference `self - earlier`, for rates.
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            rx_frames: self.rx_frames.wrapping_sub(earlier.rx_frames),
            rx_bytes: self.rx_bytes.wrapping_sub(earlier.rx_bytes),
            tx_frames: self.tx_frames.wrapping_sub(earlier.tx_frames),
            tx_bytes: self.tx_bytes.wrapping_sub(earlier.tx_bytes),
            rx_dropped: self.rx_dropped.wrapping_sub(earlier.rx_dropped),
            tx_dropped: self.tx_dropped.wrapping_sub(earlier.tx_dropped),
            tx_ring_full: self.tx_ring_full.wrapping_sub(earlier.tx_ring_full),
            syscalls: self.syscalls.wrapping_sub(earlier.syscalls),
            tx_gso: self.tx_gso.wrapping_sub(earlier.tx_gso),
        }
    }

    /// Field-wise sum, for a backend made of two ([`local_peers`]).
    pub fn plus(&self, other: &Stats) -> Stats {
        Stats {
            rx_frames: self.rx_frames.wrapping_add(other.rx_frames),
            rx_bytes: self.rx_bytes.wrapping_add(other.rx_bytes),
            tx_frames: self.tx_frames.wrapping_add(other.tx_frames),
            tx_bytes: self.tx_bytes.wrapping_add(other.tx_bytes),
            rx_dropped: self.rx_dropped.wrapping_add(other.rx_dropped),
            tx_dropped: self.tx_dropped.wrapping_add(other.tx_dropped),
            tx_ring_full: self.tx_ring_full.wrapping_add(other.tx_ring_full),
            syscalls: self.syscalls.wrapping_add(other.syscalls),
            tx_gso: self.tx_gso.wrapping_add(other.tx_gso),
        }
    }
}

/// The callback `recv` lends each received frame to.
pub type RxSink<'a> = dyn FnMut(&[u8]) + 'a;
/// The callback `recv_checked` lends each received frame to, saying whether
/// the backend has already verified the frame's RoCE ICRC.
pub type RxSinkChecked<'a> = dyn FnMut(&[u8], bool) + 'a;
/// The callback `transmit` asks for each frame: write a whole Ethernet frame
/// into the buffer and return its length, or `None` when there is nothing
/// more to send (the slot is then given back unused).
pub type TxFill<'a> = dyn FnMut(&mut [u8]) -> Option<usize> + 'a;

/// Where a gathered frame's payload lies: a reference only the frame's
/// [`TxSource`] can resolve (for ferroce's core: a memory region's local key
/// and an offset in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    pub key: u32,
    pub offset: u64,
    pub len: usize,
}

/// A frame [`TxSource::fill`] wrote in two parts around a payload left where
/// it lies: on the wire it is `buf[..head]`, the payload, `buf[head..head +
/// tail]`. Without a payload it is `buf[..head]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherFrame {
    pub head: usize,
    pub tail: usize,
    pub payload: Option<PayloadRef>,
}

/// Where [`PacketIo::transmit_gather`] takes frames from.
pub trait TxSource {
    /// Write the next frame into `buf` (at least [`PacketIo::max_frame_len`]
    /// bytes), or `None` when there is nothing more to send.
    fn fill(&mut self, buf: &mut [u8]) -> Option<GatherFrame>;
    /// The bytes of a payload `fill` returned. They stay valid and unchanged
    /// until `fill` is called again: a backend resolves the payloads of the
    /// frames it holds only after its last `fill` call for them, and hands
    /// them to the kernel before the next.
    fn payload(&self, p: &PayloadRef) -> Option<&[u8]>;
}

/// Longest tail (pad and ICRC) a gathered frame may have.
const MAX_GATHER_TAIL: usize = 16;

/// A packet engine: batches of whole Ethernet frames in and out.
///
/// Frames are Ethernet / IPv4 or IPv6 / UDP / payload, as on the wire, without
/// FCS. Object safe, so an engine can hold a `Box<dyn PacketIo>`.
///
/// How an engine drives it:
/// 1. `recv(64, &mut |f| core.handle_frame(now, f))` until it returns 0;
/// 2. `transmit(64, &mut |buf| core.poll_transmit(now, buf))` until it returns
///    less than asked (nothing left, or the ring is full: `stats().tx_ring_full`);
/// 3. when idle, sleep in `epoll`/`poll` on [`PacketIo::poll_fd`] (readable =
///    frames may be waiting) with the core's next timeout, or — in busy-poll
///    mode — just loop.
pub trait PacketIo: Send {
    /// Short backend name (`"mem"`, `"udp"`, `"afpacket"`, `"afxdp"`).
    fn kind(&self) -> &'static str;

    /// Largest frame (Ethernet header included, FCS excluded) this backend
    /// carries; `transmit` buffers are at least this long.
    fn max_frame_len(&self) -> usize;

    /// The MAC address frames from this port carry as source.
    fn mac(&self) -> [u8; 6];

    /// Receives up to `max` frames, lending each to `sink` in arrival order.
    /// The buffer returns to the backend's pool when `sink` returns, so copy
    /// what must outlive the call. Never blocks; returns how many frames were
    /// delivered (0 = nothing waiting).
    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError>;

    /// [`PacketIo::recv`], also telling the sink whether the frame's ICRC
    /// has been verified on the way (the UDP socket backend checks it while
    /// recovering the IPv4 ID, so the transport need not hash the frame
    /// again). The default verifies nothing.
    fn recv_checked(
        &mut self,
        max: usize,
        sink: &mut RxSinkChecked<'_>,
    ) -> Result<usize, NicError> {
        self.recv(max, &mut |f: &[u8]| sink(f, false))
    }

    /// Sends up to `max` frames. For each free TX slot the backend calls
    /// `fill` with the slot's memory (at least [`PacketIo::max_frame_len`]
    /// bytes) and sends the first `n` bytes when it returns `Some(n)`. Stops at
    /// the first `None`, or early when the TX ring is full. The frames have
    /// been handed to the kernel (kicked) when this returns. Returns the number
    /// of frames taken from `fill` (including any counted in `tx_dropped`).
    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError>;

    /// A file descriptor that polls readable (`POLLIN`/`EPOLLIN`) when frames
    /// may be waiting. Level-triggered; spurious wake-ups are possible.
    fn poll_fd(&self) -> RawFd;

    /// A second fd to sleep on beside [`PacketIo::poll_fd`], for a backend
    /// with two sources ([`local_peers`]). A sleeper polls both with
    /// `poll(2)` ([`wait_readable_any`]) rather than joining them in an
    /// epoll set: an epoll set stays on each fd's wait queue, so every
    /// frame's wake-up would run through it, sleeping or not (AF_XDP over
    /// veth lost ~10 % of its bandwidth to that). It may change with
    /// [`PacketIo::join_multicast`] / [`PacketIo::leave_multicast`] (the UDP
    /// backend's group sockets), so a sleeper asks again after those.
    fn second_poll_fd(&self) -> Option<RawFd> {
        None
    }

    /// Leaves the tables this backend shares with other processes under
    /// `/dev/shm` (a shared UDP port's members, raw devices' QPN prefixes)
    /// as closing it would, for a process that exits with the device still
    /// open (a C program that never calls ibv_close_device; librdmacm's
    /// devices). The backend then serves this process alone until dropped.
    fn leave_shared(&mut self) {}

    /// Joins IP multicast group `group` (IPv4, or IPv6 and IPv4-mapped) on
    /// the backend's link, so that frames to it arrive ([`crate::mcast`]).
    /// Joins are counted: each needs its [`PacketIo::leave_multicast`].
    fn join_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        Err(NicError::Unsupported(format!(
            "multicast group {group} on the {} backend",
            self.kind()
        )))
    }

    /// Undoes one [`PacketIo::join_multicast`].
    fn leave_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        Err(NicError::Unsupported(format!(
            "multicast group {group} on the {} backend",
            self.kind()
        )))
    }

    /// Whether [`PacketIo::transmit_gather`] sends payloads from where they
    /// lie (the UDP socket's scatter/gather send). Otherwise it joins each
    /// frame in its TX slot, which is no better than `transmit`.
    fn gathers(&self) -> bool {
        false
    }

    /// Whether UDP GSO super-frames reach this backend whole and are cut by
    /// it: frames of one flow the kernel's GRO joined (it does for a UDP
    /// socket that asks for GRO on the address the frames go to), or a
    /// peer's GSO send over veth. A socket beside it may then take UDP_GRO,
    /// which also lets the kernel drop such a super-frame whole at that
    /// socket instead of cutting it up first.
    fn receives_super_frames(&self) -> bool {
        false
    }

    /// [`PacketIo::transmit`] for frames whose payload may stay where it
    /// lies (see [`TxSource`]). This default joins each frame in its TX slot
    /// (one copy of the payload, as `transmit`); a frame that does not fit
    /// is dropped and counted.
    fn transmit_gather(&mut self, max: usize, src: &mut dyn TxSource) -> Result<usize, NicError> {
        transmit_joined(self, max, src)
    }

    /// Busy-poll mode for latency runs: the backend may spin in the kernel
    /// (SO_BUSY_POLL, XDP_USE_NEED_WAKEUP off, ...) instead of sleeping. The
    /// engine then loops on `recv` without waiting on `poll_fd`.
    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        let _ = on;
        Ok(())
    }

    /// The top byte the QPNs of the device on this backend must carry,
    /// when it shares its port ([`port_share`]) or interface ([`raw_share`])
    /// with other processes' devices: frames are steered to it by that byte.
    fn qpn_prefix(&self) -> Option<u8> {
        None
    }

    /// Counters since creation.
    fn stats(&self) -> Stats;

    /// Sends already-built frames (a convenience over `transmit`; copies each
    /// frame into its TX slot). Returns how many were taken.
    fn send_frames(&mut self, frames: &[&[u8]]) -> Result<usize, NicError> {
        let max = self.max_frame_len();
        let mut next = 0usize;
        let mut too_long = None;
        let n = self.transmit(frames.len(), &mut |buf: &mut [u8]| {
            let f = frames.get(next)?;
            if f.len() > buf.len().min(max) {
                too_long = Some(f.len());
                return None;
            }
            buf[..f.len()].copy_from_slice(f);
            next += 1;
            Some(f.len())
        })?;
        if let Some(len) = too_long {
            return Err(NicError::FrameTooLong { len, max });
        }
        Ok(n)
    }

    /// Receives up to `max` frames as owned copies, appended to `out`.
    fn recv_owned(&mut self, max: usize, out: &mut Vec<Vec<u8>>) -> Result<usize, NicError> {
        self.recv(max, &mut |f: &[u8]| out.push(f.to_vec()))
    }

    /// Waits until [`PacketIo::poll_fd`] (or the second one) is readable
    /// or `timeout` passes (`None` = forever). Returns whether it became
    /// readable.
    fn wait(&self, timeout: Option<Duration>) -> Result<bool, NicError> {
        match self.second_poll_fd() {
            None => sys::poll_readable(self.poll_fd(), timeout),
            Some(fd) => wait_readable_any(&[self.poll_fd(), fd], timeout),
        }
    }
}

impl<T: PacketIo + ?Sized> PacketIo for Box<T> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn max_frame_len(&self) -> usize {
        (**self).max_frame_len()
    }
    fn mac(&self) -> [u8; 6] {
        (**self).mac()
    }
    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        (**self).recv(max, sink)
    }
    fn recv_checked(
        &mut self,
        max: usize,
        sink: &mut RxSinkChecked<'_>,
    ) -> Result<usize, NicError> {
        (**self).recv_checked(max, sink)
    }
    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        (**self).transmit(max, fill)
    }
    fn poll_fd(&self) -> RawFd {
        (**self).poll_fd()
    }
    fn second_poll_fd(&self) -> Option<RawFd> {
        (**self).second_poll_fd()
    }
    fn gathers(&self) -> bool {
        (**self).gathers()
    }
    fn receives_super_frames(&self) -> bool {
        (**self).receives_super_frames()
    }
    fn leave_shared(&mut self) {
        (**self).leave_shared()
    }
    fn join_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        (**self).join_multicast(group)
    }
    fn leave_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        (**self).leave_multicast(group)
    }
    fn transmit_gather(&mut self, max: usize, src: &mut dyn TxSource) -> Result<usize, NicError> {
        (**self).transmit_gather(max, src)
    }
    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        (**self).set_busy_poll(on)
    }
    fn qpn_prefix(&self) -> Option<u8> {
        (**self).qpn_prefix()
    }
    fn stats(&self) -> Stats {
        (**self).stats()
    }
}

/// [`PacketIo::transmit_gather`] for a backend that does not gather: each
/// frame is joined in its TX slot (one copy of the payload, as `transmit`);
/// a frame that does not fit is dropped and counted.
pub fn transmit_joined<P: PacketIo + ?Sized>(
    io: &mut P,
    max: usize,
    src: &mut dyn TxSource,
) -> Result<usize, NicError> {
    io.transmit(max, &mut |buf: &mut [u8]| {
        let f = src.fill(buf)?;
        let Some(p) = f.payload else {
            return Some(f.head);
        };
        let end = f.head + p.len + f.tail;
        let mut tail = [0u8; MAX_GATHER_TAIL];
        let (Some(t), Some(bytes)) = (
            buf.get(f.head..f.head + f.tail)
                .filter(|t| t.len() <= MAX_GATHER_TAIL),
            src.payload(&p)
                .filter(|b| b.len() == p.len && end <= buf.len()),
        ) else {
            // Not a frame: the backend drops an empty one and counts it.
            return Some(0);
        };
        tail[..f.tail].copy_from_slice(t);
        buf[f.head..f.head + p.len].copy_from_slice(bytes);
        buf[f.head + p.len..end].copy_from_slice(&tail[..f.tail]);
        Some(end)
    })
}

/// Is this process root? Tests that need CAP_NET_ADMIN skip without it.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The running kernel's version as (major, minor), from uname(2): what a
/// kernel interface can be expected to take (see [`parse_kernel_release`]).
pub fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    let release: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    parse_kernel_release(&String::from_utf8_lossy(&release))
}

/// `(major, minor)` of a kernel release string such as `6.1.0-57-amd64` or
/// `6.18.44-fc-v1272`.
pub fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Restores the default action of SIGPIPE (Rust ignores it), so that a
/// command-line tool whose output pipe closes (`ferroce devices | head`) ends
/// quietly, as C tools do, instead of panicking in `println!`.
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no handler
    // and touches no memory; called once at start-up.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Waits until `fd` polls readable or `timeout` passes (`None` = forever), for
/// engines that sleep on a backend's [`PacketIo::poll_fd`] without holding the
/// backend itself (it may be locked by another thread meanwhile).
pub fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> Result<bool, NicError> {
    sys::poll_readable(fd, timeout)
}

/// [`wait_readable`] for the two fds of a backend with a
/// [`PacketIo::second_poll_fd`]: true when either polls readable.
pub fn wait_readable_any(fds: &[RawFd], timeout: Option<Duration>) -> Result<bool, NicError> {
    sys::poll_fds(fds, libc::POLLIN, timeout)
}

/// Opens a backend from a short spec, for command lines:
/// `udp:<ip>:<port>` (`udp:[::]:4791` is dual-stack), `afpacket:<ifname>`,
/// `afpacket-v2:<ifname>` (latency), `afxdp:<ifname>`, `afxdp-skb:<ifname>`.
/// Raw backends open in the calling thread's network namespace.
pub fn open(spec: &str) -> Result<Box<dyn PacketIo>, NicError> {
    let (kind, arg) = spec
        .split_once(':')
        .ok_or_else(|| NicError::Config(format!("backend spec {spec:?}: expected KIND:ARG")))?;
    Ok(match kind {
        "udp" => {
            let addr: std::net::SocketAddr = arg
                .parse()
                .map_err(|_| NicError::Config(format!("udp address {arg:?}")))?;
            Box::new(udp::UdpIo::bind(udp::UdpConfig::new(addr))?)
        }
        "afpacket" => Box::new(afpacket::AfPacketIo::open(afpacket::AfPacketConfig::new(
            arg,
        ))?),
        "afpacket-v2" => {
            let mut c = afpacket::AfPacketConfig::new(arg);
            c.rx_ring = afpacket::RxRing::V2;
            c.rx_block_size = 64 << 10;
            c.rx_blocks = 256;
            Box::new(afpacket::AfPacketIo::open(c)?)
        }
        "afxdp" => Box::new(afxdp::AfXdpIo::open(afxdp::AfXdpConfig::new(arg))?),
        "afxdp-skb" => {
            let mut c = afxdp::AfXdpConfig::new(arg);
            c.mode = afxdp::XdpMode::Skb;
            Box::new(afxdp::AfXdpIo::open(c)?)
        }
        other => return Err(NicError::Config(format!("unknown backend {other:?}"))),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_releases_parse() {
        use super::parse_kernel_release as v;
        assert_eq!(v("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(v("6.18.44-fc-v1272"), Some((6, 18)));
        assert_eq!(v("5.15.0-91-generic"), Some((5, 15)));
        assert!(v("6.18.2") >= Some((6, 6)));
        assert_eq!(v("garbage"), None);
        assert!(super::kernel_version().is_some());
    }

    #[test]
    fn open_specs() {
        let io = super::open("udp:127.0.0.1:0").unwrap();
        assert_eq!(io.kind(), "udp");
        assert!(super::open("udp").is_err());
        assert!(super::open("carrier-pigeon:x").is_err());
        assert!(super::open("afpacket:no-such-if0").is_err());
    }
}
