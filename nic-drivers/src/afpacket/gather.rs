//! Gathered transmit for the AF_PACKET backend ([`crate::PacketIo::transmit_gather`]).
//!
//! Frames go out by `sendmmsg` on a packet socket without a TX ring: each
//! frame's headers and tail (pad, ICRC) from an arena the transport writes
//! them into, its payload from where the transport keeps it (a memory
//! region). The kernel's copy into the socket buffer is then the only copy of
//! the payload. Through the TX ring it was copied twice: into the ring by us,
//! and again by the kernel at veth (perf: `skb_copy_ubufs`), which will not
//! let the ring's pages cross into the peer's namespace.
//!
//! Runs of one flow still travel as UDP GSO super-frames (crate::gso), when
//! the socket takes virtio-net headers: the first frame's headers behind the
//! run's virtio-net header, then every frame's UDP payload (head, payload,
//! tail), all one message of iovecs.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::frame::ETH_HLEN;
use crate::gso::{self, Run, VNET_HDR_LEN};
use crate::ipv4_id::IdRecovery;
use crate::{sys, NicError, PayloadRef, Stats, TxSource};

/// A super-frame's limit (the TX ring's slot size: 64 KiB).
const MAX_SUPER_FRAME: usize = 64 << 10;
/// The arena holds the frames of one batch (their heads and tails; a frame
/// the transport did not split is whole in it).
const ARENA: usize = 512 << 10;
/// Send buffer: as the TX ring's (every frame in flight is charged to it).
const SNDBUF: usize = 8 << 20;
/// How long a full send buffer may go without taking anything before the
/// message at its head is dropped (the transport retransmits it).
const TX_STALL: Duration = Duration::from_millis(50);

/// A frame in the arena: starting at `at`, `skip` bytes of it not sent (the
/// headers of a frame that joined a run), `head` bytes before its payload
/// (which lies in the source), then `tail` bytes.
#[derive(Debug, Clone, Copy)]
struct Piece {
    at: usize,
    skip: usize,
    head: usize,
    payload: Option<PayloadRef>,
    tail: usize,
}

/// One message: frames `first..first + frames` (one segment each), a GSO
/// run when `run` is set; `wire` bytes on the wire.
#[derive(Debug, Clone)]
struct Msg {
    run: Option<Run>,
    first: usize,
    frames: usize,
    wire: usize,
}

/// The gathered-transmit socket and its batch.
#[derive(Debug)]
pub(super) struct GatherTx {
    fd: OwnedFd,
    /// Each message starts with a virtio-net header (runs go as GSO frames).
    vnet: bool,
    max_frame: usize,
    mtu: usize,
    icrc_valid: bool,
    arena: Vec<u8>,
    pieces: Vec<Piece>,
    msgs: Vec<Msg>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Per queued message: its iovecs (None: dropped), then per header sent:
    /// (segments, wire bytes).
    spans: Vec<Option<(usize, usize)>>,
    sent: Vec<(usize, usize)>,
    ids: IdRecovery,
}

// SAFETY: the iovecs and message headers point into this struct's own arena
// (or at a source's payloads) only during `send`, which holds `&mut self`;
// between calls they are dead values. Moving it to another thread is sound.
unsafe impl Send for GatherTx {}

impl GatherTx {
    /// A packet socket bound to `ifindex` (protocol 0: it receives nothing),
    /// with virtio-net headers when `vnet` (GSO) and the qdisc bypassed when
    /// `qdisc_bypass`. `vnet` is false in the result if the kernel refused.
    pub(super) fn open(
        ifindex: u32,
        (max_frame, mtu): (usize, usize),
        vnet: bool,
        qdisc_bypass: bool,
        icrc_valid: bool,
    ) -> Result<Self, NicError> {
        let fd = super::packet_socket()?;
        let raw = fd.as_raw_fd();
        let one: libc::c_int = 1;
        if qdisc_bypass {
            sys::setsockopt(
                raw,
                super::SOL_PACKET,
                super::PACKET_QDISC_BYPASS,
                &one,
                "PACKET_QDISC_BYPASS",
            )?;
        }
        let vnet = vnet
            && sys::setsockopt(
                raw,
                super::SOL_PACKET,
                super::PACKET_VNET_HDR,
                &one,
                "PACKET_VNET_HDR (gather)",
            )
            .is_ok();
        sys::set_socket_buffer(
            raw,
            sys::SO_SNDBUFFORCE,
            libc::SO_SNDBUF,
            SNDBUF,
            "SO_SNDBUF",
        );
        super::bind_packet(raw, ifindex, 0)?;
        Ok(GatherTx {
            fd,
            vnet,
            max_frame,
            mtu,
            icrc_valid,
            arena: vec![0u8; ARENA.max(2 * (VNET_HDR_LEN + max_frame))],
            pieces: Vec::new(),
            msgs: Vec::new(),
            iov: Vec::new(),
            hdrs: Vec::new(),
            spans: Vec::new(),
            sent: Vec::new(),
            ids: IdRecovery::default(),
        })
    }

    /// Takes up to `max` frames from `src` and sends them; returns how many
    /// were taken (sent, or dropped and counted in `stats`).
    pub(super) fn send(
        &mut self,
        max: usize,
        src: &mut dyn TxSource,
        stats: &mut Stats,
    ) -> Result<usize, NicError> {
        let slot = VNET_HDR_LEN + self.max_frame;
        let mut taken = 0;
        let mut pos = 0;
        self.pieces.clear();
        self.msgs.clear();
        let mut open: Option<Msg> = None;
        while taken < max {
            if pos + slot > self.arena.len() {
                self.close(&mut open);
                self.flush(src, stats)?;
                pos = 0;
            }
            // Room for a message's virtio-net header in front of every frame.
            let at = pos + VNET_HDR_LEN;
            let Some(f) = src.fill(&mut self.arena[at..at + self.max_frame]) else {
                break;
            };
            taken += 1;
            let (tail, payload_len) = match f.payload {
                Some(p) => (f.tail, p.len),
                None => (0, 0),
            };
            let total = f.head + payload_len + tail;
            let fits = f.head + tail <= self.max_frame
                && total <= self.max_frame
                && self
                    .arena
                    .get(at..at + f.head)
                    .is_some_and(|h| crate::frame::fits_mtu(h, total, self.mtu));
            if !fits {
                stats.tx_dropped += 1;
                continue;
            }
            let piece = Piece {
                at,
                skip: 0,
                head: f.head,
                payload: f.payload,
                tail,
            };
            if self.join(&mut open, piece, total) {
                pos = at + f.head + tail;
                continue;
            }
            self.close(&mut open);
            self.pieces.push(piece);
            let run = if self.vnet {
                Run::start_split(&self.arena[at..at + f.head], total)
            } else {
                None
            };
            open = Some(Msg {
                run,
                first: self.pieces.len() - 1,
                frames: 1,
                wire: total,
            });
            if open.as_ref().is_some_and(|m| m.run.is_none()) {
                self.close(&mut open);
            }
            pos = at + f.head + tail;
        }
        self.close(&mut open);
        self.flush(src, stats)?;
        Ok(taken)
    }

    /// Adds `p` (a `total`-byte frame) to the open run if it may join,
    /// giving it the IPv4 ID the kernel will give its segment.
    fn join(&mut self, open: &mut Option<Msg>, mut p: Piece, total: usize) -> bool {
        let Some(m) = open.as_mut() else {
            return false;
        };
        let Some(r) = m.run.as_mut() else {
            return false;
        };
        let Some(h) = self.arena.get(p.at..p.at + p.head) else {
            return false;
        };
        if !r.admits_split(h, total, MAX_SUPER_FRAME) {
            return false;
        }
        if let Some(id) = r.next_id() {
            let ok = match p.payload {
                None => self
                    .arena
                    .get_mut(p.at + ETH_HLEN..p.at + total)
                    .is_some_and(|l3| self.ids.give_id(l3, id, self.icrc_valid)),
                // A split frame is the transport core's: its ICRC is right.
                Some(_) => self
                    .arena
                    .get_mut(p.at + ETH_HLEN..p.at + p.head + p.tail)
                    .is_some_and(|l3| {
                        self.ids
                            .give_id_split(l3, p.head - ETH_HLEN, total - ETH_HLEN, id)
                    }),
            };
            if !ok {
                return false;
            }
        }
        let hl = r.header_len();
        r.push(total - hl);
        p.skip = hl;
        m.frames += 1;
        m.wire += total;
        let closed = r.is_closed();
        self.pieces.push(p);
        if closed {
            self.close(open);
        }
        true
    }

    /// Finishes the open message (its virtio-net header and, for a run, its
    /// first frame's headers) and queues it.
    fn close(&mut self, open: &mut Option<Msg>) {
        let Some(m) = open.take() else {
            return;
        };
        let Some(first) = self.pieces.get(m.first).copied() else {
            return;
        };
        if self.vnet {
            let Some(span) = self
                .arena
                .get_mut(first.at - VNET_HDR_LEN..first.at + first.head)
            else {
                return;
            };
            let (vnet, frame) = span.split_at_mut(VNET_HDR_LEN);
            match &m.run {
                Some(r) => r.finish(vnet, frame),
                None => vnet.copy_from_slice(&gso::PLAIN),
            }
        }
        self.msgs.push(m);
    }

    /// Sends the queued messages: their iovecs first (all of them, so the
    /// vector does not move under the headers that point into it), then the
    /// headers. A message with a payload the source no longer has is dropped
    /// whole (the transport retransmits it).
    fn flush(&mut self, src: &dyn TxSource, stats: &mut Stats) -> Result<(), NicError> {
        self.iov.clear();
        self.hdrs.clear();
        let base = self.arena.as_mut_ptr();
        let hdr_len = if self.vnet { VNET_HDR_LEN } else { 0 };
        self.spans.clear();
        self.sent.clear();
        for m in &self.msgs {
            let start = self.iov.len();
            let mut ok = true;
            for (k, p) in self.pieces.iter().skip(m.first).take(m.frames).enumerate() {
                let from = if k == 0 {
                    p.at - hdr_len
                } else {
                    p.at + p.skip
                };
                ok &= sys::push_gathered(
                    &mut self.iov,
                    start,
                    (base.wrapping_add(from), p.at + p.head - from),
                    p.payload.as_ref(),
                    src,
                    (base.wrapping_add(p.at + p.head), p.tail),
                );
            }
            if ok {
                self.spans.push(Some((start, self.iov.len() - start)));
            } else {
                self.iov.truncate(start);
                stats.tx_dropped += m.frames as u64;
                self.spans.push(None);
            }
        }
        for (m, span) in self.msgs.iter().zip(&self.spans) {
            let Some((start, n)) = *span else {
                continue;
            };
            // SAFETY: msghdr is plain old data; all-zero is a valid empty one.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            // No address: the socket is bound to the interface.
            h.msg_hdr.msg_iov = self.iov[start..].as_mut_ptr();
            h.msg_hdr.msg_iovlen = n as _;
            self.hdrs.push(h);
            self.sent.push((m.frames, m.wire));
        }
        self.msgs.clear();
        self.pieces.clear();
        self.send_all(stats)
    }

    /// `sendmmsg` until every header is sent or given up.
    fn send_all(&mut self, stats: &mut Stats) -> Result<(), NicError> {
        let n = self.hdrs.len();
        let mut done = 0;
        let mut stalled: Option<Instant> = None;
        while done < n {
            // SAFETY: hdrs[done..n] point at iovecs in `self.iov`, which point into the
            // arena and at payloads the source keeps unchanged until `send` returns.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    self.hdrs.as_mut_ptr().add(done),
                    (n - done) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            stats.syscalls += 1;
            if r > 0 {
                stalled = None;
                for &(segs, wire) in self.sent.iter().skip(done).take(r as usize) {
                    stats.tx_frames += segs as u64;
                    stats.tx_bytes += wire as u64;
                    stats.tx_gso += u64::from(segs > 1);
                }
                done += r as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            let segs = self.sent.get(done).map_or(1, |s| s.0) as u64;
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    // Wait while the buffer drains: a message given up is
                    // lost until the transport's retransmission time-out.
                    let since = *stalled.get_or_insert_with(|| {
                        stats.tx_ring_full += 1;
                        Instant::now()
                    });
                    let left = TX_STALL.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        tracing::debug!("afpacket sendmmsg: send buffer full for {TX_STALL:?}");
                        stats.tx_dropped += segs;
                        done += 1;
                    } else {
                        sys::poll_fd(self.fd.as_raw_fd(), libc::POLLOUT, Some(left))?;
                    }
                }
                _ => {
                    // The interface went down, a frame it refused, ...: this message is lost.
                    tracing::debug!("afpacket sendmmsg: {e}");
                    stats.tx_dropped += segs;
                    done += 1;
                }
            }
        }
        Ok(())
    }
}
