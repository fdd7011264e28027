//! Completion channels (ibv_comp_channel). An event is a CQ that was armed
//! by `ibv_req_notify_cq` and holds a completion; `ibv_get_cq_event` takes
//! one (disarming it), waiting on the device's progress if there is none.
//!
//! The channel's fd is an eventfd (semaphore mode) so programs may
//! `poll(2)`/`epoll` it as they do rdma-core's: a notifier thread, started
//! at the first arming, counts one on it when an armed CQ gets a completion.
//! A count whose CQ was drained meanwhile makes a spurious wake-up (the
//! program's `ibv_get_cq_event` then waits, or says EAGAIN if non-blocking).

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::ffi;
use crate::handles::{fchannel, leak, set_errno, FCq};

/// How long the notifier sleeps with no CQ armed (arming wakes it at once).
const WATCH_SLICE: Duration = Duration::from_millis(20);
/// How long it waits on the armed CQs before looking at the list again (a
/// CQ armed meanwhile is watched from then on).
const ARMED_SLICE: Duration = Duration::from_millis(2);

/// ibv_comp_channel.
#[repr(C)]
pub struct FChannel {
    pub ibv: ffi::ibv_comp_channel,
    /// CQs created on this channel (addresses of FCq).
    cqs: Mutex<Vec<usize>>,
    /// Non-zero while the notifier looks at or waits on the CQs: a CQ being
    /// destroyed waits until it lets go (at most one watch slice).
    watching: AtomicUsize,
    /// Destroys waiting for `watching` to clear.
    removing: AtomicUsize,
    stop: AtomicBool,
    notifier: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for FChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FChannel")
            .field("fd", &self.ibv.fd)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FChannel {
    pub fn add_cq(&self, cq: usize) {
        lock(&self.cqs).push(cq);
    }

    /// Forget a CQ being destroyed; returns once the notifier no longer uses it.
    pub fn remove_cq(&self, cq: usize) {
        self.removing.fetch_add(1, Ordering::AcqRel);
        lock(&self.cqs).retain(|&x| x != cq);
        while self.watching.load(Ordering::Acquire) != 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.removing.fetch_sub(1, Ordering::AcqRel);
    }

    /// Start the notifier if it is not running (at the first arming).
    pub fn ensure_notifier(&'static self) {
        let mut n = lock(&self.notifier);
        if let Some(t) = n.as_ref() {
            // A CQ was armed: the notifier rescans now rather than after its slice.
            t.thread().unpark();
            return;
        }
        let me = self as *const FChannel as usize;
        *n = std::thread::Builder::new()
            .name("ferroce-cq-events".into())
            // SAFETY: the channel outlives the thread: destroy joins it first.
            .spawn(move || unsafe { &*(me as *const FChannel) }.notify_loop())
            .ok();
    }

    fn count_one(&self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.ibv.fd, &one as *const u64 as *const c_void, 8) };
    }

    /// Take one count if there is one (never blocks).
    fn uncount_one(&self) {
        if readable(self.ibv.fd, 0) {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes from our eventfd (it is readable).
            unsafe { libc::read(self.ibv.fd, &mut v as *mut u64 as *mut c_void, 8) };
        }
    }

    /// The first armed CQ holding a completion, disarmed; and the armed,
    /// empty ones (to wait on).
    fn take_event(&self) -> (Option<usize>, Vec<usize>) {
        let mut waiting = Vec::new();
        for &p in lock(&self.cqs).iter() {
            // SAFETY: CQs on the list are live.
            let q = unsafe { &*(p as *const FCq) };
            if !q.armed.load(Ordering::Acquire) {
                continue;
            }
            if !q.cq.is_empty() && q.armed.swap(false, Ordering::AcqRel) {
                return (Some(p), waiting);
            }
            waiting.push(p);
        }
        (None, waiting)
    }

    fn notify_loop(&self) {
        while !self.stop.load(Ordering::Acquire) {
            if self.removing.load(Ordering::Acquire) != 0 {
                // Let a destroy see `watching` clear.
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            self.watching.store(1, Ordering::Release);
            let mut watch: Vec<&FCq> = Vec::new();
            for &p in lock(&self.cqs).iter() {
                // SAFETY: CQs on the list are live (remove_cq waits for us).
                let q = unsafe { &*(p as *const FCq) };
                if !q.armed.load(Ordering::Acquire) || q.hinted.load(Ordering::Acquire) {
                    continue;
                }
                if !q.cq.is_empty() {
                    q.hinted.store(true, Ordering::Release);
                    self.count_one();
                } else {
                    watch.push(q);
                }
            }
            if watch.is_empty() {
                self.watching.store(0, Ordering::Release);
                std::thread::park_timeout(WATCH_SLICE);
            } else {
                let cqs: Vec<&ferroce_verbs::CompletionQueue> =
                    watch.iter().map(|q| &q.cq).collect();
                if let Err(ferroce_verbs::Error::EngineStopped(_)) =
                    ferroce_verbs::CompletionQueue::wait_any(&cqs, ARMED_SLICE)
                {
                    std::thread::sleep(WATCH_SLICE);
                }
            }
            self.watching.store(0, Ordering::Release);
        }
    }
}

fn readable(fd: c_int, ms: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLIN != 0 }
}

/// # Safety
/// Live context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    ctx: *mut ffi::ibv_context,
) -> *mut ffi::ibv_comp_channel {
    // SAFETY: plain syscall; semaphore mode: one read takes one event.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return ptr::null_mut();
    }
    leak(FChannel {
        ibv: ffi::ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        },
        cqs: Mutex::new(Vec::new()),
        watching: AtomicUsize::new(0),
        removing: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        notifier: Mutex::new(None),
    }) as *mut ffi::ibv_comp_channel
}

/// # Safety
/// A channel of this library with no CQ left, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ffi::ibv_comp_channel) -> c_int {
    if ch.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live channel (caller).
    let c = unsafe { fchannel(ch) };
    if !lock(&c.cqs).is_empty() {
        return libc::EBUSY;
    }
    c.stop.store(true, Ordering::Release);
    if let Some(t) = lock(&c.notifier).take() {
        t.thread().unpark();
        let _ = t.join();
    }
    // SAFETY: allocated by leak(); the notifier has ended.
    let b = unsafe { Box::from_raw(ch as *mut FChannel) };
    // SAFETY: our own fd.
    unsafe { libc::close(b.ibv.fd) };
    0
}

/// Take the next event (see the module doc), blocking unless the
/// application made the channel's fd non-blocking.
///
/// # Safety
/// A live channel; writable out-pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ffi::ibv_comp_channel,
    cq_out: *mut *mut ffi::ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: live channel (caller).
    let c = unsafe { fchannel(ch) };
    // SAFETY: our fd.
    let nonblock = unsafe { libc::fcntl(c.ibv.fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    loop {
        let (event, waiting) = c.take_event();
        if let Some(p) = event {
            c.uncount_one();
            // SAFETY: listed CQs are live; writable (caller).
            unsafe {
                *cq_out = p as *mut ffi::ibv_cq;
                if !ctx_out.is_null() {
                    *ctx_out = (*(p as *const FCq)).ibv.cq_context;
                }
            }
            return 0;
        }
        if nonblock {
            set_errno(libc::EAGAIN);
            return -1;
        }
        if waiting.is_empty() {
            // Nothing armed: wait for an arming's count (or look again soon).
            if readable(c.ibv.fd, WATCH_SLICE.as_millis() as c_int) {
                c.uncount_one();
            }
            continue;
        }
        // SAFETY: armed CQs on the list are live (the application does not
        // destroy a CQ it is waiting for).
        let cqs: Vec<&ferroce_verbs::CompletionQueue> = waiting
            .iter()
            .map(|&p| unsafe { &(*(p as *const FCq)).cq })
            .collect();
        if let Err(ferroce_verbs::Error::EngineStopped(why)) =
            ferroce_verbs::CompletionQueue::wait_any(&cqs, WATCH_SLICE)
        {
            eprintln!("ferroce libibverbs: {why}");
            set_errno(libc::EIO);
            return -1;
        }
    }
}
