//! io_uring multishot receive for a UDP socket.
//!
//! One armed `RECVMSG` request (multishot, Linux ≥ 6.0) keeps taking
//! datagrams into buffers the ring is given (a provided-buffer ring, Linux ≥
//! 5.19) as they arrive, each with its own completion. The datagram is then
//! already in user memory when the engine looks: a poll that finds nothing
//! reads the completion ring and makes no system call, where the plain path
//! makes one `recvmmsg` per poll (a spinning engine or rank makes tens per
//! message it waits for).
//!
//! Each buffer holds, in the kernel's layout for multishot recvmsg
//! (`struct io_uring_recvmsg_out`, then the name and control areas at the
//! sizes the request's `msghdr` gave, then the payload), one datagram (one
//! GRO-coalesced run with `UDP_GRO`). The name and control areas are in
//! front of the payload, so once they have been read the caller may write
//! the frame headers it synthesises there, as the plain path does in a
//! slot's headroom.
//!
//! The kernel takes each datagram in the thread that armed the request,
//! when that thread next enters the kernel (`IORING_SETUP_COOP_TASKRUN`):
//! a polling owner sees `IORING_SQ_TASKRUN` and enters; a sleeping one is
//! woken by the socket, which the device's poll fd holds beside the ring.
//! Should another thread keep polling instead, the request is armed again
//! from it ([`REARM_AFTER`]).

use std::alloc::Layout;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;

use io_uring::types::BufRingEntry;
use io_uring::{cqueue, opcode, types, IoUring};

use crate::NicError;

/// `struct io_uring_recvmsg_out`: namelen, controllen, payloadlen, flags.
const OUT_HDR: usize = 16;
const NAME_LEN: usize = std::mem::size_of::<libc::sockaddr_storage>();
/// user_data of a cancel; each arming of the receive takes the next of 1, 2, ...
const CANCEL: u64 = u64::MAX;
/// Polls in a row from a thread other than the one that armed the receive
/// after which it is armed again from the polling thread. The kernel runs
/// the receive (its task work) in the thread that armed it: if that thread
/// sleeps or computes while another one polls, datagrams wait for it. Not
/// at once: an engine thread and a thread hurrying it may take turns.
const REARM_AFTER: u32 = 64;
/// The one buffer group of the ring.
const BGID: u16 = 0;

/// One datagram taken from the socket.
pub(crate) struct Datagram<'a> {
    /// The whole buffer; the payload starts at `payload_at`.
    pub buf: &'a mut [u8],
    pub payload_at: usize,
    /// Payload bytes in `buf` after `payload_at`.
    pub len: usize,
    /// The sender's address (`msg_name`).
    pub name: libc::sockaddr_storage,
    /// A header whose control area is the datagram's control messages, for
    /// `CMSG_*` (it points into `buf`: read it before writing there).
    pub control: libc::msghdr,
    /// The datagram (or its control messages) did not fit.
    pub truncated: bool,
}

/// A socket's multishot receive: its ring, buffers and armed request.
pub(crate) struct MultishotRx {
    // Declared (and so dropped) before the buffers: see `Drop`.
    ring: IoUring,
    fd: RawFd,
    // The request's msghdr: only its name and control lengths matter.
    msg: Box<libc::msghdr>,
    bufs: Vec<u8>,
    buf_len: usize,
    control_len: usize,
    count: u16,
    // The provided-buffer ring (page aligned, `count` entries) and our tail.
    entries: NonNull<BufRingEntry>,
    entries_layout: Layout,
    tail: u16,
    armed: bool,
    // user_data of the current arming, and the thread that made it.
    arm_id: u64,
    owner: u64,
    foreign_polls: u32,
    /// System calls made (arming, flushing an overflow).
    pub enters: u64,
}

// SAFETY: `entries` points to memory this struct alone owns (the kernel
// reads it, never another thread of ours); moving the struct to another
// thread keeps it valid. The `msghdr` holds no pointer.
unsafe impl Send for MultishotRx {}

impl std::fmt::Debug for MultishotRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultishotRx")
            .field("count", &self.count)
            .field("buf_len", &self.buf_len)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

impl MultishotRx {
    /// A ring for socket `fd` with `count` buffers (a power of two, ≤ 32768)
    /// of `payload` bytes each after the name and `control_len` bytes of
    /// control messages. Fails where the kernel lacks io_uring (or refuses
    /// it: seccomp, `kernel.io_uring_disabled`) or provided-buffer rings;
    /// a kernel without multishot recvmsg fails the first [`Self::poll`].
    pub(crate) fn new(
        fd: RawFd,
        count: u16,
        payload: usize,
        control_len: usize,
    ) -> Result<Self, NicError> {
        if !count.is_power_of_two() || count > 32768 {
            return Err(NicError::Config(format!("{count} receive buffers")));
        }
        // Keeps each payload 16-byte aligned (the control area's size is a multiple of 8).
        let control_len = control_len.next_multiple_of(16);
        let payload_at = OUT_HDR + NAME_LEN + control_len;
        let buf_len = (payload_at + payload).next_multiple_of(64);
        // Ring entries carry a buffer's length as a u32.
        u32::try_from(buf_len)
            .map_err(|_| NicError::Config(format!("receive buffer of {buf_len} bytes")))?;
        let ring = IoUring::builder()
            // Room for every buffer's completion and the request's last one.
            .setup_cqsize(u32::from(count) * 2)
            // The receive runs in the thread that armed it, at its next entry
            // to the kernel (a polling thread sees IORING_SQ_TASKRUN and
            // enters), not at an interrupt sent to it. Measured over veth
            // between two pinned processes on this kind of VM, 8 B SEND
            // round trips, busy polling: 21-34 µs half round trip with the
            // interrupt, 10-11 µs without (recvmmsg: 9-11 µs).
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(8)
            .map_err(|e| NicError::io("io_uring_setup", e))?;
        let entries_layout = Layout::from_size_align(
            usize::from(count) * std::mem::size_of::<BufRingEntry>(),
            4096,
        )
        .map_err(|e| NicError::Config(format!("buffer ring: {e}")))?;
        // SAFETY: the layout has a non-zero size (count ≥ 1).
        let raw = unsafe { std::alloc::alloc_zeroed(entries_layout) };
        let Some(entries) = NonNull::new(raw.cast::<BufRingEntry>()) else {
            return Err(NicError::Config("buffer ring: out of memory".into()));
        };
        // SAFETY: all-zero is a valid msghdr (null pointers, zero lengths).
        let mut msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msg.msg_namelen = NAME_LEN as libc::socklen_t;
        msg.msg_controllen = control_len as _;
        let mut rx = MultishotRx {
            ring,
            fd,
            msg,
            bufs: vec![0u8; buf_len * usize::from(count)],
            buf_len,
            control_len,
            count,
            entries,
            entries_layout,
            tail: 0,
            armed: false,
            arm_id: 0,
            owner: 0,
            foreign_polls: 0,
            enters: 0,
        };
        // SAFETY: the entries live (page aligned, `count` of them) until `Drop`,
        // which unregisters the group before freeing them.
        unsafe {
            rx.ring.submitter().register_buf_ring_with_flags(
                rx.entries.as_ptr() as u64,
                count,
                BGID,
                0,
            )
        }
        .map_err(|e| NicError::io("io_uring register buffer ring", e))?;
        for bid in 0..count {
            rx.provide(bid);
        }
        rx.publish_tail();
        Ok(rx)
    }

    /// The ring's fd: readable while completions wait.
    pub(crate) fn ring_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Where a buffer's payload starts.
    fn payload_at(&self) -> usize {
        OUT_HDR + NAME_LEN + self.control_len
    }

    /// Puts buffer `bid` at the ring's tail (published by `publish_tail`).
    fn provide(&mut self, bid: u16) {
        put_entry(
            self.entries,
            self.count,
            self.tail,
            &mut self.bufs,
            self.buf_len,
            bid,
        );
        self.tail = self.tail.wrapping_add(1);
    }

    /// Hands the buffers provided since the last call to the kernel.
    fn publish_tail(&self) {
        // SAFETY: the first entry's `resv` field is the ring's tail, which the
        // kernel reads concurrently: a release store publishes the entries
        // written before it.
        unsafe {
            let tail = BufRingEntry::tail(self.entries.as_ptr()) as *mut u16;
            (*(tail as *const std::sync::atomic::AtomicU16))
                .store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }

    /// Arms the multishot receive from this thread (one system call).
    fn arm(&mut self, me: u64) -> Result<(), NicError> {
        let id = self.arm_id.wrapping_add(1).max(1);
        let e = opcode::RecvMsgMulti::new(types::Fd(self.fd), &*self.msg, BGID)
            .build()
            .user_data(id);
        // SAFETY: the msghdr is boxed and lives as long as the ring; the
        // kernel copies its lengths when it takes the request.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            return Err(NicError::Config("io_uring submission queue full".into()));
        }
        self.enters += 1;
        self.ring
            .submit()
            .map_err(|e| NicError::io("io_uring_enter", e))?;
        self.armed = true;
        self.arm_id = id;
        self.owner = me;
        self.foreign_polls = 0;
        Ok(())
    }

    /// Cancels the current arming (its datagrams already taken still come).
    fn disarm(&mut self) {
        let e = opcode::AsyncCancel::new(self.arm_id)
            .build()
            .user_data(CANCEL);
        // SAFETY: the cancel entry points to no memory.
        if unsafe { self.ring.submission().push(&e) }.is_ok() {
            self.enters += 1;
            let _ = self.ring.submit();
        }
        self.armed = false;
    }

    /// Hands each datagram received so far to `f` (at most `max`; the rest
    /// wait for the next call) and returns how many it was given. Arms the
    /// receive first if it is not armed (at the first call, after the kernel
    /// ended it: out of buffers, a signal). An error means this kernel cannot
    /// do it; the caller then falls back to `recvmmsg`.
    pub(crate) fn poll(
        &mut self,
        max: usize,
        mut f: impl FnMut(Datagram<'_>) -> usize,
    ) -> Result<usize, NicError> {
        let me = thread_id();
        if self.armed && self.owner != me {
            self.foreign_polls += 1;
            if self.foreign_polls >= REARM_AFTER {
                self.disarm();
            }
        } else {
            self.foreign_polls = 0;
        }
        if !self.armed {
            self.arm(me)?;
        }
        let needs_enter = {
            let sq = self.ring.submission();
            sq.cq_overflow() || sq.taskrun()
        };
        if needs_enter {
            // Completions the ring had no room for wait in the kernel, or
            // receives wait to run in this thread (IORING_SQ_TASKRUN).
            self.enters += 1;
            self.ring
                .submitter()
                .submit_and_wait(0)
                .map_err(|e| NicError::io("io_uring_enter", e))?;
        }
        let payload_at = self.payload_at();
        let buf_len = self.buf_len;
        let control_len = self.control_len;
        let mut frames = 0;
        let mut datagrams = 0;
        let mut returned = 0;
        let mut failure = None;
        let mut cq = self.ring.completion();
        while frames < max && datagrams < max {
            let Some(cqe) = cq.next() else {
                break;
            };
            let id = cqe.user_data();
            if id == CANCEL {
                continue;
            }
            let flags = cqe.flags();
            if !cqueue::more(flags) && id == self.arm_id {
                self.armed = false;
            }
            let res = cqe.result();
            if res < 0 {
                // EINVAL and the like: this kernel has no multishot recvmsg
                // (before 6.0). Anything else (out of buffers, interrupted,
                // cancelled, an ICMP error queued by an earlier send): armed
                // again at the next call.
                if let e @ (libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS) = -res {
                    failure = Some(std::io::Error::from_raw_os_error(e));
                }
                continue;
            }
            let Some(bid) = cqueue::buffer_select(flags).filter(|&b| b < self.count) else {
                continue;
            };
            let start = usize::from(bid) * buf_len;
            let used = (res as usize).min(buf_len);
            if let Some(buf) = self.bufs.get_mut(start..start + buf_len) {
                if let Some(d) = parse(buf, used, payload_at, control_len) {
                    frames += f(d);
                    datagrams += 1;
                }
            }
            // Back to the ring at once: the sink took what it wanted. (`self.tail`
            // moves on after the loop, when `cq` no longer borrows the ring.)
            let at = self.tail.wrapping_add(returned);
            put_entry(self.entries, self.count, at, &mut self.bufs, buf_len, bid);
            returned = returned.wrapping_add(1);
        }
        drop(cq);
        if returned > 0 {
            self.tail = self.tail.wrapping_add(returned);
            self.publish_tail();
        }
        match failure {
            Some(e) => Err(NicError::io("io_uring multishot recvmsg", e)),
            None => Ok(frames),
        }
    }
}

/// Writes the ring entry at position `at` (of `count`, a power of two) for
/// buffer `bid` of `bufs`. The kernel reads an entry only once the
/// published tail covers it, which it does not until `publish_tail`.
fn put_entry(
    entries: NonNull<BufRingEntry>,
    count: u16,
    at: u16,
    bufs: &mut [u8],
    buf_len: usize,
    bid: u16,
) {
    let idx = usize::from(at & (count - 1));
    let addr = bufs.as_mut_ptr() as u64 + u64::from(bid) * buf_len as u64;
    // SAFETY: idx < count, the number of entries `entries` holds; none of
    // them is being read by the kernel (see above).
    let e = unsafe { &mut *entries.as_ptr().add(idx) };
    e.set_addr(addr);
    // buf_len fits a u32: checked in `MultishotRx::new`.
    e.set_len(buf_len as u32);
    e.set_bid(bid);
}

/// A number for the calling thread, never 0, without a system call.
fn thread_id() -> u64 {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: Cell<u64> = const { Cell::new(0) });
    ID.with(|id| {
        if id.get() == 0 {
            id.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        id.get()
    })
}

/// Reads one completed buffer (`used` bytes written by the kernel).
fn parse(
    buf: &mut [u8],
    used: usize,
    payload_at: usize,
    control_len: usize,
) -> Option<Datagram<'_>> {
    let word = |i: usize| -> Option<u32> {
        let b = buf.get(i * 4..i * 4 + 4)?;
        Some(u32::from_ne_bytes(b.try_into().ok()?))
    };
    let (controllen, payloadlen, flags) = (word(1)?, word(2)?, word(3)?);
    if used < payload_at {
        return None;
    }
    let name_bytes = buf.get(OUT_HDR..OUT_HDR + NAME_LEN)?;
    // SAFETY: sockaddr_storage is plain old data of NAME_LEN bytes, read
    // unaligned from exactly that many bytes.
    let name: libc::sockaddr_storage =
        unsafe { std::ptr::read_unaligned(name_bytes.as_ptr().cast()) };
    let len = (payloadlen as usize).min(used - payload_at);
    let truncated = flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) as u32 != 0
        || (payloadlen as usize) > used - payload_at;
    // SAFETY: all-zero is a valid msghdr.
    let mut control: libc::msghdr = unsafe { std::mem::zeroed() };
    control.msg_control = buf.get_mut(OUT_HDR + NAME_LEN..)?.as_mut_ptr().cast();
    control.msg_controllen = (controllen as usize).min(control_len) as _;
    Some(Datagram {
        buf,
        payload_at,
        len,
        name,
        control,
        truncated,
    })
}

impl Drop for MultishotRx {
    fn drop(&mut self) {
        // Cancel the request and wait for its end, so the kernel writes into
        // no buffer of ours once they are freed; then the group goes.
        if self.armed {
            // Every arming, a cancelled one that has not ended yet too.
            let e = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(CANCEL);
            // SAFETY: the cancel entry points to no memory.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                let ts = types::Timespec::new().nsec(10_000_000);
                let args = types::SubmitArgs::new().timespec(&ts);
                let current = self.arm_id;
                // Bounded: a kernel that never ends it costs 0.5 s, not a hang.
                for _ in 0..50 {
                    let _ = self.ring.submitter().submit_with_args(1, &args);
                    let ended = self
                        .ring
                        .completion()
                        .any(|c| c.user_data() == current && !cqueue::more(c.flags()));
                    if ended {
                        break;
                    }
                }
            }
        }
        let _ = self.ring.submitter().unregister_buf_ring(BGID);
        // SAFETY: allocated in `new` with this layout; the kernel let go of
        // it when the group was unregistered (or keeps its own pin of the
        // pages until the ring is gone, never touching them after).
        unsafe { std::alloc::dealloc(self.entries.as_ptr().cast(), self.entries_layout) };
    }
}
