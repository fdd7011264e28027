//! Peers on this host for a raw device (AF_XDP, AF_PACKET).
//!
//! A raw device sends frames on its interface, but the kernel delivers
//! traffic to an address of this host over loopback: the frames never come
//! back, and nothing the kernel loops back reaches the interface's rings.
//! rxe serves such peers through the kernel's IP stack, and perftest and
//! `ibv_rc_pingpong` users often run a server and a client on one host. So a
//! raw device also holds a UDP socket on its address and port 4791
//! ([`UdpIo`]; one per address family, see [`LocalPeersIo::add_socket`]),
//! in the port's shared group ([`crate::port_share`]) with the QPN prefix
//! its interface gave it, so that datagrams to its QPs reach it whichever
//! ferroce process (raw or UDP backend) sent them:
//! - frames the transport addresses to this device's own MAC (its path to a
//!   local address) go out through the socket of their family instead of
//!   the interface;
//! - the sockets take only datagrams that came in on `lo`
//!   ([`UdpConfig::loopback_only`]); what arrives from the wire the raw
//!   rings already see.
//!
//! A socket costs a system call to read, while the raw rings cost none, so
//! each is read only when the raw backend has delivered less than asked: at
//! every such call for [`ACTIVE_CALLS`] calls after a local peer's datagram
//! on it, otherwise once [`QUIET_CHECK`] has passed, looked at every
//! [`CLOCK_EVERY`] calls (which keeps clock reads off the per-call path). A
//! device with no local peers spends about one system call per socket per
//! 200 µs of spinning on it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::{frame, sys};
use crate::{
    GatherFrame, NicError, PacketIo, PayloadRef, RxSink, RxSinkChecked, Stats, TxFill, TxSource,
    UdpConfig, UdpIo,
};

/// Calls after a local peer's last datagram during which the socket is read
/// at every call.
pub const ACTIVE_CALLS: u32 = 4096;
/// How often the socket is read while local peers are quiet. Under QEMU's
/// emulation a system call costs microseconds: with one per 50 µs, AF_XDP's
/// 64 KiB WRITE bandwidth between two VMs was ~6 % below that without the
/// socket (two interleaved runs each, within the VMs' noise), so a quiet
/// peer's first datagram may now wait up to 200 µs for a quarter of that.
pub const QUIET_CHECK: Duration = Duration::from_micros(200);
/// Calls between clock reads while local peers are quiet.
pub const CLOCK_EVERY: u32 = 16;

/// A raw backend and the UDP sockets its peers on this host reach it by.
pub struct LocalPeersIo {
    main: Box<dyn PacketIo>,
    /// One per address family; the first is never missing.
    locals: Vec<Local>,
    /// With two sockets, an epoll set of both, for [`PacketIo::second_poll_fd`]
    /// (only loopback datagrams wake it: the filter drops the rest before
    /// they are queued).
    epoll: Option<OwnedFd>,
    // Frames to a local peer of a family with no socket (no path leads
    // there: `resolve_path` checks the source GID), counted as dropped.
    unsent: u64,
    // When the sockets were last read while quiet, and calls since then.
    checked_at: Instant,
    calls: u32,
    // Frames for local peers taken from the transport during one `transmit`,
    // each with whether it is IPv6 (which socket sends it).
    pending: Vec<(bool, Vec<u8>)>,
    used: usize,
}

impl std::fmt::Debug for LocalPeersIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPeersIo")
            .field("main", &self.main.kind())
            .field("local", &self.local_addrs())
            .finish()
    }
}

impl LocalPeersIo {
    /// Binds the socket for `main` (a raw backend with a QPN prefix, see
    /// [`PacketIo::qpn_prefix`]) at `cfg.bind`, the address its frames
    /// carry as source; the sharing, prefix, filter and MAC fields of `cfg`
    /// are set here. On failure `main` comes back with the error.
    #[allow(clippy::result_large_err)]
    pub fn new(
        main: Box<dyn PacketIo>,
        cfg: UdpConfig,
    ) -> Result<Self, (Box<dyn PacketIo>, NicError)> {
        let local = match bind_for(main.as_ref(), cfg) {
            Ok(l) => l,
            Err(e) => return Err((main, e)),
        };
        Ok(LocalPeersIo {
            main,
            locals: vec![Local::new(local)],
            epoll: None,
            unsent: 0,
            checked_at: Instant::now(),
            calls: 0,
            pending: Vec::new(),
            used: 0,
        })
    }

    /// Adds the socket of the other address family (an IPv6 address beside
    /// the first socket's IPv4 one, say), so peers on this host reach the
    /// device from that family's GIDs too.
    pub fn add_socket(&mut self, cfg: UdpConfig) -> Result<(), NicError> {
        if self.locals.len() >= 2
            || self
                .locals
                .iter()
                .any(|l| l.io.local_addr().is_ipv6() == cfg.bind.is_ipv6())
        {
            return Err(NicError::Config(format!(
                "{}: one socket per address family",
                cfg.bind
            )));
        }
        let local = bind_for(self.main.as_ref(), cfg)?;
        let fds: Vec<RawFd> = self
            .locals
            .iter()
            .map(|l| &l.io)
            .chain([&local])
            .map(PacketIo::poll_fd)
            .collect();
        self.epoll = Some(sys::epoll_of(&fds)?);
        self.locals.push(Local::new(local));
        Ok(())
    }

    /// The sockets' addresses.
    pub fn local_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.locals.iter().map(|l| l.io.local_addr()).collect()
    }
}

/// One socket and how recently it gave something.
struct Local {
    io: UdpIo,
    /// Calls since its last datagram (from [`ACTIVE_CALLS`] on: quiet).
    since_active: u32,
}

impl Local {
    fn new(io: UdpIo) -> Self {
        Local {
            io,
            since_active: ACTIVE_CALLS,
        }
    }
}

/// The socket for `main`'s local peers at `cfg.bind`, with `main`'s QPN prefix.
fn bind_for(main: &dyn PacketIo, cfg: UdpConfig) -> Result<UdpIo, NicError> {
    let prefix = main.qpn_prefix().ok_or_else(|| {
        NicError::Config("a raw device reaches local peers only with a QPN prefix".into())
    })?;
    UdpIo::bind(UdpConfig {
        share_port: true,
        share_prefix: Some(prefix),
        loopback_only: true,
        // UDP_GRO where `main` takes super-frames. Frames from the wire to
        // this address reach the socket too (its filter drops them), and a
        // peer's GSO send over veth arrives as one super-frame: without GRO
        // the kernel cuts it into its frames for the filter to drop one by
        // one, on the sender's core (with GRO a 64 KiB WRITE stream over
        // AF_PACKET and veth moved 1.15x as much through the TX ring, 1.4x
        // gathered). Not otherwise: GRO looks a wire frame's socket up by
        // address, and a GRO socket here makes the kernel join `main`'s own
        // stream into super-frames, which Linux before 6.2 cannot hand an
        // AF_PACKET socket with PACKET_VNET_HDR and drops (in a Debian 12
        // VM, 94 % of a UDP GSO sender's frames were lost), and which would
        // not fit an AF_XDP socket's 4 KiB frames.
        gro: main.receives_super_frames(),
        mac: main.mac(),
        max_frame_len: main.max_frame_len(),
        ..cfg
    })
}

impl LocalPeersIo {
    /// Sends the frames diverted during a transmit of `n` frames through
    /// the sockets; returns all frames taken.
    fn send_diverted(&mut self, n: usize) -> Result<usize, NicError> {
        if self.used == 0 {
            return Ok(n);
        }
        let pending = &self.pending[..self.used];
        let mut sent = 0;
        for Local { io: local, .. } in &mut self.locals {
            let family = local.local_addr().is_ipv6();
            let frames: Vec<&[u8]> = pending
                .iter()
                .filter(|(v6, _)| *v6 == family)
                .map(|(_, f)| f.as_slice())
                .collect();
            if !frames.is_empty() {
                sent += frames.len();
                // Frames a socket could not take are lost, as on a full ring:
                // the transport retransmits them.
                local.send_frames(&frames)?;
            }
        }
        self.unsent += (self.used - sent) as u64;
        Ok(n + self.used)
    }
}

/// Keeps a copy of a frame (given in `parts`) for a local peer's socket.
fn divert(pending: &mut Vec<(bool, Vec<u8>)>, used: &mut usize, parts: &[&[u8]]) {
    if pending.len() == *used {
        pending.push((false, Vec::new()));
    }
    if let Some((v6, p)) = pending.get_mut(*used) {
        p.clear();
        for part in parts {
            p.extend_from_slice(part);
        }
        // Not UDP at all: to the IPv4 socket, which drops and counts it.
        *v6 = frame::parse_udp(p).is_ok_and(|i| i.src.is_ipv6());
        *used += 1;
    }
}

/// A [`TxSource`] that keeps the frames to this host's own MAC (see
/// [`divert`]) and hands the others on.
struct Diverting<'a, 'b> {
    src: &'a mut dyn TxSource,
    mac: [u8; 6],
    pending: &'b mut Vec<(bool, Vec<u8>)>,
    used: &'b mut usize,
    /// Frames whose payload the source no longer had.
    lost: &'b mut u64,
}

impl TxSource for Diverting<'_, '_> {
    fn fill(&mut self, buf: &mut [u8]) -> Option<GatherFrame> {
        loop {
            let f = self.src.fill(buf)?;
            if buf.get(..6) != Some(&self.mac[..]) {
                return Some(f);
            }
            let head = buf.get(..f.head).unwrap_or_default();
            match f.payload {
                None => divert(self.pending, self.used, &[head]),
                Some(p) => {
                    // The payload is valid until the next fill: copy it now.
                    let payload = self.src.payload(&p).unwrap_or_default();
                    let tail = buf.get(f.head..f.head + f.tail).unwrap_or_default();
                    if payload.len() == p.len {
                        divert(self.pending, self.used, &[head, payload, tail]);
                    } else {
                        *self.lost += 1;
                    }
                }
            }
        }
    }

    fn payload(&self, p: &PayloadRef) -> Option<&[u8]> {
        self.src.payload(p)
    }
}

impl PacketIo for LocalPeersIo {
    fn kind(&self) -> &'static str {
        self.main.kind()
    }

    fn max_frame_len(&self) -> usize {
        self.main.max_frame_len()
    }

    fn mac(&self) -> [u8; 6] {
        self.main.mac()
    }

    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        self.recv_checked(max, &mut |f: &[u8], _| sink(f))
    }

    fn recv_checked(
        &mut self,
        max: usize,
        sink: &mut RxSinkChecked<'_>,
    ) -> Result<usize, NicError> {
        let n = self.main.recv_checked(max, sink)?;
        if n >= max {
            return Ok(n);
        }
        self.calls += 1;
        let quiet_due = self.calls >= CLOCK_EVERY && {
            self.calls = 0;
            let now = Instant::now();
            let due = now.duration_since(self.checked_at) >= QUIET_CHECK;
            if due {
                self.checked_at = now;
            }
            due
        };
        let mut m = 0;
        for l in &mut self.locals {
            // A GRO datagram may give a socket more frames than asked.
            let room = max.saturating_sub(n + m);
            let active = l.since_active < ACTIVE_CALLS;
            if room == 0 || (!active && !quiet_due) {
                continue;
            }
            l.since_active = l.since_active.saturating_add(1);
            let got = l.io.recv_checked(room, sink)?;
            if got > 0 {
                l.since_active = 0;
            }
            m += got;
        }
        Ok(n + m)
    }

    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        let mac = self.main.mac();
        let (pending, used) = (&mut self.pending, &mut self.used);
        *used = 0;
        let n = self.main.transmit(max, &mut |buf: &mut [u8]| loop {
            let len = fill(buf)?;
            // Our own MAC as destination: the path to an address of this host
            // (a frame too long for the slot goes to the backend, which counts it).
            let Some(frame) = buf.get(..len).filter(|f| f.get(..6) == Some(&mac[..])) else {
                return Some(len);
            };
            divert(pending, used, &[frame]);
        })?;
        self.send_diverted(n)
    }

    fn gathers(&self) -> bool {
        self.main.gathers()
    }

    fn receives_super_frames(&self) -> bool {
        self.main.receives_super_frames()
    }

    fn transmit_gather(&mut self, max: usize, src: &mut dyn TxSource) -> Result<usize, NicError> {
        self.used = 0;
        let mut local = Diverting {
            src,
            mac: self.main.mac(),
            pending: &mut self.pending,
            used: &mut self.used,
            lost: &mut self.unsent,
        };
        let n = self.main.transmit_gather(max, &mut local)?;
        self.send_diverted(n)
    }

    fn poll_fd(&self) -> RawFd {
        self.main.poll_fd()
    }

    fn second_poll_fd(&self) -> Option<RawFd> {
        match &self.epoll {
            Some(e) => Some(e.as_raw_fd()),
            None => self.locals.first().map(|l| l.io.poll_fd()),
        }
    }

    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        self.main.set_busy_poll(on)?;
        for l in &mut self.locals {
            l.io.set_busy_poll(on)?;
        }
        Ok(())
    }

    fn qpn_prefix(&self) -> Option<u8> {
        self.main.qpn_prefix()
    }
    fn leave_shared(&mut self) {
        self.main.leave_shared();
        for l in &mut self.locals {
            l.io.leave_shared();
        }
    }

    fn join_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.main.join_multicast(group)
    }
    fn leave_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.main.leave_multicast(group)
    }

    fn stats(&self) -> Stats {
        let mut s = self.main.stats();
        s.tx_dropped += self.unsent;
        self.locals.iter().fold(s, |a, l| a.plus(&l.io.stats()))
    }
}
