//! rdma_cm event channels. An eventfd in semaphore mode counts the queued
//! events, so `rdma_get_cm_event` blocks on the channel's fd as librdmacm
//! blocks on its kernel file, and a program may poll the fd or make it
//! non-blocking (then an empty channel reads EAGAIN).

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::{Arc, Mutex};

use super::{CmId, LiveSet};
use crate::ffi;
use crate::handles::set_errno;

/// An event handed to the program: the C struct first, then what its
/// pointers point at.
#[repr(C)]
pub struct Event {
    pub c: ffi::rdma_cm_event,
    /// The ID whose count of unacknowledged events this one is in.
    owner: Arc<CmId>,
    /// What `c.param.*.private_data` points at.
    private: Box<[u8]>,
}

// SAFETY: an event is owned by one channel queue or one program thread at a
// time; its raw pointers name IDs that outlive it (destroy waits for acks).
unsafe impl Send for Event {}

impl Event {
    /// An event of `kind` for `id`, counted against `owner` until acknowledged.
    pub fn new(
        owner: &Arc<CmId>,
        id: *mut ffi::rdma_cm_id,
        kind: u32,
        status: c_int,
    ) -> Box<Event> {
        Box::new(Event {
            c: ffi::rdma_cm_event {
                id,
                listen_id: ptr::null_mut(),
                event: kind,
                status,
                // SAFETY: all-zero bytes are a valid parameter union.
                param: unsafe { std::mem::zeroed() },
            },
            owner: Arc::clone(owner),
            private: Box::new([]),
        })
    }

    /// The connection parameters, with `private` as their private data.
    pub fn with_conn(
        mut self: Box<Self>,
        mut conn: ffi::rdma_conn_param,
        private: &[u8],
    ) -> Box<Self> {
        self.private = private.into();
        conn.private_data = self.private.as_ptr() as *const c_void;
        conn.private_data_len = private.len().min(255) as u8;
        self.c.param.conn = conn;
        self
    }

    /// The UD parameters, with `private` as their private data.
    pub fn with_ud(mut self: Box<Self>, mut ud: ffi::rdma_ud_param, private: &[u8]) -> Box<Self> {
        self.private = private.into();
        ud.private_data = self.private.as_ptr() as *const c_void;
        ud.private_data_len = private.len().min(255) as u8;
        self.c.param.ud = ud;
        self
    }
}

/// rdma_event_channel.
#[repr(C)]
pub struct Channel {
    pub c: ffi::rdma_event_channel,
    queue: Mutex<VecDeque<Box<Event>>>,
}

impl Channel {
    /// A channel whose fd counts its events.
    pub fn new() -> Option<Box<Channel>> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        (fd >= 0).then(|| {
            Box::new(Channel {
                c: ffi::rdma_event_channel { fd },
                queue: Mutex::new(VecDeque::new()),
            })
        })
    }

    /// Queues `ev` and makes the fd readable once more.
    pub fn push(&self, ev: Box<Event>) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(ev);
        let one: u64 = 1;
        // SAFETY: our eventfd; 8 bytes from a u64.
        unsafe { libc::write(self.c.fd, ptr::addr_of!(one) as *const c_void, 8) };
    }

    /// The next event, waiting for one unless the fd is non-blocking.
    pub fn pop(&self) -> Result<Box<Event>, c_int> {
        loop {
            let mut n: u64 = 0;
            // SAFETY: our eventfd; 8 bytes into a u64.
            let r = unsafe { libc::read(self.c.fd, ptr::addr_of_mut!(n) as *mut c_void, 8) };
            if r == 8 {
                break;
            }
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if e != libc::EINTR {
                return Err(e);
            }
        }
        let ev = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .ok_or(libc::EAGAIN)?;
        // Counted once the program has it (as the kernel counts events
        // reported to librdmacm); queued ones go with their ID.
        ev.owner.event_reported();
        Ok(ev)
    }

    /// How many events wait to be taken.
    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Drops the queued events counted against `id` (it is going away),
    /// keeping the fd's count right.
    pub fn purge(&self, id: *const CmId) -> usize {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let before = q.len();
        q.retain(|e| !ptr::eq(Arc::as_ptr(&e.owner), id));
        let gone = before - q.len();
        for _ in 0..gone {
            let mut n: u64 = 0;
            // SAFETY: our eventfd; each dropped event had counted one.
            unsafe { libc::read(self.c.fd, ptr::addr_of_mut!(n) as *mut c_void, 8) };
        }
        gone
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: our eventfd, closed once.
        unsafe { libc::close(self.c.fd) };
    }
}

/// The channel behind a handle.
///
/// # Safety
/// `ch` came from [`rdma_create_event_channel`] and is not destroyed.
pub unsafe fn channel<'a>(ch: *mut ffi::rdma_event_channel) -> &'a Channel {
    // SAFETY: the C struct is the first field of the #[repr(C)] Channel.
    unsafe { &*(ch as *const Channel) }
}

/// The channels the program made and has not destroyed.
static CHANNELS: LiveSet = LiveSet::new();

/// rdma_create_event_channel.
#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut ffi::rdma_event_channel {
    match Channel::new() {
        Some(c) => {
            let p = Box::into_raw(c) as *mut ffi::rdma_event_channel;
            CHANNELS.lock().insert(p as usize);
            p
        }
        None => {
            set_errno(libc::EMFILE);
            ptr::null_mut()
        }
    }
}

/// rdma_destroy_event_channel (its IDs must be destroyed first, as with librdmacm).
///
/// # Safety
/// `ch` came from rdma_create_event_channel and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut ffi::rdma_event_channel) {
    // A channel destroyed already (or never made here) is left alone.
    if CHANNELS.lock().remove(&(ch as usize)) {
        // SAFETY: allocated by rdma_create_event_channel, destroyed once.
        drop(unsafe { Box::from_raw(ch as *mut Channel) });
    }
}

/// rdma_get_cm_event: the next event of `ch`, waiting for one unless its fd
/// was made non-blocking (then EAGAIN).
///
/// # Safety
/// `ch` is a live channel; `event` writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    ch: *mut ffi::rdma_event_channel,
    event: *mut *mut ffi::rdma_cm_event,
) -> c_int {
    if event.is_null() || !CHANNELS.lock().contains(&(ch as usize)) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a live channel (destroying it while waiting on it is the
    // program's error, as with librdmacm).
    match unsafe { channel(ch) }.pop() {
        Ok(ev) => {
            // SAFETY: the caller's out pointer; the event is the program's until acked.
            unsafe { *event = Box::into_raw(ev) as *mut ffi::rdma_cm_event };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// rdma_ack_cm_event: frees `event`; an ID's destroy waits for its events' acks.
///
/// # Safety
/// `event` came from rdma_get_cm_event and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut ffi::rdma_cm_event) -> c_int {
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: handed out by rdma_get_cm_event (a boxed Event).
    let ev = unsafe { Box::from_raw(event as *mut Event) };
    ev.owner.event_acked();
    0
}

/// rdma_event_str: librdmacm's names.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    let s: &'static [u8] = match event {
        ffi::RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        ffi::RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        ffi::RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        ffi::RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        ffi::RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        ffi::RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        ffi::RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        ffi::RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        ffi::RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        ffi::RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        ffi::RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        ffi::RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        ffi::RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        ffi::RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        ffi::RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr() as *const c_char
}
