//! Peers on this host for a raw device (AF_XDP, AF_PACKET).
//!
//! A raw device sends frames on its interface, but the kernel delivers
//! traffic to an address of this host over loopback: the frames never come
//! back, and nothing the kernel loops back reaches the interface's rings.
//! rxe serves such peers through the kernel's IP stack, and perftest and
//! `ibv_rc_pingpong` users often run a server and a client on one host. So a
//! raw device also holds a UDP socket on its address and port 4791
//! ([`UdpIo`]), in the port's shared group ([`crate::port_share`]) with the
//! QPN prefix its interface gave it, so that datagrams to its QPs reach it
//! whichever ferroce process (raw or UDP backend) sent them:
//! - frames the transport addresses to this device's own MAC (its path to a
//!   local address) go out through the socket instead of the interface;
//! - the socket takes only datagrams that came in on `lo`
//!   ([`UdpConfig::loopback_only`]); what arrives from the wire the raw
//!   rings already see.
//!
//! The socket costs a system call to read, while the raw rings cost none, so
//! it is read only when the raw backend has delivered less than asked: at
//! every such call for [`ACTIVE_CALLS`] calls after a local peer's datagram,
//! otherwise once [`QUIET_CHECK`] has passed, looked at every
//! [`CLOCK_EVERY`] calls (a clock read per call cost AF_PACKET a few
//! per cent). A device with no local peers spends about one system call per
//! 200 µs of spinning on it.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::{NicError, PacketIo, RxSink, RxSinkChecked, Stats, TxFill, UdpConfig, UdpIo};

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

/// A raw backend and the UDP socket its peers on this host reach it by.
pub struct LocalPeersIo {
    main: Box<dyn PacketIo>,
    local: UdpIo,
    mac: [u8; 6],
    // When the socket was last read while quiet; calls since then, and
    // since it last gave something.
    checked_at: Instant,
    calls: u32,
    since_active: u32,
    // Frames for local peers taken from the transport during one `transmit`.
    pending: Vec<Vec<u8>>,
    used: usize,
}

impl std::fmt::Debug for LocalPeersIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPeersIo")
            .field("main", &self.main.kind())
            .field("local", &self.local.local_addr())
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
        let Some(prefix) = main.qpn_prefix() else {
            let e =
                NicError::Config("a raw device reaches local peers only with a QPN prefix".into());
            return Err((main, e));
        };
        let mac = main.mac();
        let opened = UdpIo::bind(UdpConfig {
            share_port: true,
            share_prefix: Some(prefix),
            loopback_only: true,
            mac,
            max_frame_len: main.max_frame_len(),
            ..cfg
        });
        let local = match opened {
            Ok(l) => l,
            Err(e) => return Err((main, e)),
        };
        Ok(LocalPeersIo {
            main,
            local,
            mac,
            checked_at: Instant::now(),
            calls: 0,
            since_active: ACTIVE_CALLS,
            pending: Vec::new(),
            used: 0,
        })
    }

    /// The socket's address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local.local_addr()
    }

    /// The socket's counters alone ([`PacketIo::stats`] adds them to the raw
    /// backend's).
    pub fn local_stats(&self) -> Stats {
        self.local.stats()
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
        self.mac
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
        let due = if self.since_active < ACTIVE_CALLS {
            self.since_active += 1;
            true
        } else {
            self.calls += 1;
            self.calls >= CLOCK_EVERY && {
                self.calls = 0;
                let now = Instant::now();
                let quiet_long = now.duration_since(self.checked_at) >= QUIET_CHECK;
                if quiet_long {
                    self.checked_at = now;
                }
                quiet_long
            }
        };
        if !due {
            return Ok(n);
        }
        let m = self.local.recv_checked(max - n, sink)?;
        if m > 0 {
            self.since_active = 0;
        }
        Ok(n + m)
    }

    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        let mac = self.mac;
        let (pending, used) = (&mut self.pending, &mut self.used);
        *used = 0;
        let n = self.main.transmit(max, &mut |buf: &mut [u8]| loop {
            let len = fill(buf)?;
            // Our own MAC as destination: the path to an address of this host
            // (a frame too long for the slot goes to the backend, which counts it).
            let Some(frame) = buf.get(..len).filter(|f| f.get(..6) == Some(&mac[..])) else {
                return Some(len);
            };
            if pending.len() == *used {
                pending.push(Vec::new());
            }
            if let Some(p) = pending.get_mut(*used) {
                p.clear();
                p.extend_from_slice(frame);
                *used += 1;
            }
        })?;
        if self.used == 0 {
            return Ok(n);
        }
        let frames: Vec<&[u8]> = self.pending[..self.used]
            .iter()
            .map(Vec::as_slice)
            .collect();
        // Frames the socket could not take are lost, as on a full ring: the
        // transport retransmits them.
        self.local.send_frames(&frames)?;
        Ok(n + self.used)
    }

    fn poll_fd(&self) -> RawFd {
        self.main.poll_fd()
    }

    fn second_poll_fd(&self) -> Option<RawFd> {
        Some(self.local.poll_fd())
    }

    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        self.main.set_busy_poll(on)?;
        self.local.set_busy_poll(on)
    }

    fn qpn_prefix(&self) -> Option<u8> {
        self.main.qpn_prefix()
    }

    fn stats(&self) -> Stats {
        let (a, b) = (self.main.stats(), self.local.stats());
        Stats {
            rx_frames: a.rx_frames + b.rx_frames,
            rx_bytes: a.rx_bytes + b.rx_bytes,
            tx_frames: a.tx_frames + b.tx_frames,
            tx_bytes: a.tx_bytes + b.tx_bytes,
            rx_dropped: a.rx_dropped + b.rx_dropped,
            tx_dropped: a.tx_dropped + b.tx_dropped,
            tx_ring_full: a.tx_ring_full + b.tx_ring_full,
            syscalls: a.syscalls + b.syscalls,
        }
    }
}
