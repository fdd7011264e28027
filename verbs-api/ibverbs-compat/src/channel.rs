//! Completion channels (ibv_comp_channel). An armed CQ (`ibv_req_notify_cq`)
//! that gets a completion makes one event and is disarmed; the event waits
//! in the channel until `ibv_get_cq_event` takes it, even if the program
//! polled the CQ empty meanwhile, as rdma-core's do (UCX re-arms a CQ only
//! after it got the event, and stalled when a drained CQ's event vanished).
//!
//! The channel's fd is an eventfd (semaphore mode) so programs may
//! `poll(2)`/`epoll` it as they do rdma-core's: a notifier thread, started
//! at the first arming, makes the events and counts one on the fd for each;
//! taking an event takes its count, so the fd is readable exactly while
//! events wait.

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

/// Events queued on any channel of this process and not taken yet.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// An event waits on some channel: the program has work of its own waiting
/// (`poll_cq` then does not wait for the engine, see `datapath::poll_cq`).
pub fn events_waiting() -> bool {
    QUEUED.load(Ordering::Relaxed) > 0
}

/// ibv_comp_channel.
#[repr(C)]
pub struct FChannel {
    pub ibv: ffi::ibv_comp_channel,
    /// CQs created on this channel (addresses of FCq).
    cqs: Mutex<Vec<usize>>,
    /// Events not taken yet (addresses of FCq), oldest first; each has one
    /// count on the fd, written and read under this lock.
    events: Mutex<std::collections::VecDeque<usize>>,
    /// Non-zero while the notifier looks at or waits on the CQs: a CQ being
    /// destroyed waits until it lets go (at most one watch slice).
    watching: AtomicUsize,
    /// Destroys waiting for `watching` to clear.
    removing: AtomicUsize,
    stop: AtomicBool,
    notifier: Mutex<Option<JoinHandle<()>>>,
    /// The engine-failure hook that makes the fd readable for good (the
    /// device died: ibv_get_cq_event fails with EIO, as rdma-core's channel
    /// of a removed device does); removed before the fd closes.
    fatal_hook: Option<u64>,
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

    /// Forget a CQ being destroyed, and its events not taken; returns once
    /// the notifier no longer uses it.
    pub fn remove_cq(&self, cq: usize) {
        self.removing.fetch_add(1, Ordering::AcqRel);
        lock(&self.cqs).retain(|&x| x != cq);
        {
            let mut ev = lock(&self.events);
            let before = ev.len();
            ev.retain(|&x| x != cq);
            for _ in ev.len()..before {
                self.uncount_one();
            }
        }
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

    /// Count one queued event, on the fd and in [`events_waiting`].
    fn count_one(&self) {
        QUEUED.fetch_add(1, Ordering::Relaxed);
        let one = 1u64;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.ibv.fd, &one as *const u64 as *const c_void, 8) };
    }

    /// Take one count (there is one for each queued event).
    fn uncount_one(&self) {
        QUEUED.fetch_sub(1, Ordering::Relaxed);
        if readable(self.ibv.fd, 0) {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes from our eventfd (it is readable).
            unsafe { libc::read(self.ibv.fd, &mut v as *mut u64 as *mut c_void, 8) };
        }
    }

    /// Queue an event for `cq` if it is armed (disarming it).
    fn make_event(&self, cq: usize, q: &FCq) -> bool {
        let mut ev = lock(&self.events);
        if !q.armed.swap(false, Ordering::AcqRel) {
            return false;
        }
        ev.push_back(cq);
        self.count_one();
        true
    }

    /// The oldest event; else an armed CQ that got a completion since its
    /// arming (the notifier has not seen it yet), disarmed; and the armed
    /// ones without (to wait on).
    fn take_event(&self) -> (Option<usize>, Vec<usize>) {
        {
            let mut ev = lock(&self.events);
            if let Some(p) = ev.pop_front() {
                self.uncount_one();
                return (Some(p), Vec::new());
            }
        }
        let mut waiting = Vec::new();
        for &p in lock(&self.cqs).iter() {
            // SAFETY: CQs on the list are live.
            let q = unsafe { &*(p as *const FCq) };
            if !q.armed.load(Ordering::Acquire) {
                continue;
            }
            if q.fired() && q.armed.swap(false, Ordering::AcqRel) {
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
                if !q.armed.load(Ordering::Acquire) {
                    continue;
                }
                if !q.fired() || !self.make_event(p, q) {
                    watch.push(q);
                }
            }
            if watch.is_empty() {
                self.watching.store(0, Ordering::Release);
                std::thread::park_timeout(WATCH_SLICE);
            } else {
                let cqs: Vec<(&ferroce_verbs::CompletionQueue, u64)> = watch
                    .iter()
                    .map(|q| (&q.cq, q.armed_at.load(Ordering::Acquire)))
                    .collect();
                if let Err(ferroce_verbs::Error::EngineStopped(_)) =
                    ferroce_verbs::CompletionQueue::wait_any_added(&cqs, ARMED_SLICE)
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
    let fatal_hook = (!ctx.is_null()).then(|| {
        // SAFETY: a live context (caller).
        crate::handles::signal_on_failure(&unsafe { crate::handles::fctx(ctx) }.ctx, fd)
    });
    leak(FChannel {
        ibv: ffi::ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        },
        cqs: Mutex::new(Vec::new()),
        events: Mutex::new(std::collections::VecDeque::new()),
        watching: AtomicUsize::new(0),
        removing: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        notifier: Mutex::new(None),
        fatal_hook,
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
    if let (Some(id), false) = (b.fatal_hook, b.ibv.context.is_null()) {
        // SAFETY: the channel's context outlives it (destroyed first, as with rdma-core).
        unsafe { crate::handles::fctx(b.ibv.context) }
            .ctx
            .remove_failure_hook(id);
    }
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
            // SAFETY: listed CQs are live; writable (caller).
            unsafe {
                *cq_out = p as *mut ffi::ibv_cq;
                if !ctx_out.is_null() {
                    *ctx_out = (*(p as *const FCq)).ibv.cq_context;
                }
            }
            return 0;
        }
        // A dead device: EIO, as rdma-core's channel gives once the device
        // is removed (its fd stays readable, so a poll loop sees it).
        // SAFETY: the channel's context outlives it.
        if !c.ibv.context.is_null()
            && unsafe { crate::handles::fctx(c.ibv.context) }
                .ctx
                .failure()
                .is_some()
        {
            set_errno(libc::EIO);
            return -1;
        }
        if nonblock {
            set_errno(libc::EAGAIN);
            return -1;
        }
        if waiting.is_empty() {
            // Nothing armed: wait for an event's count (or look again soon).
            let _ = readable(c.ibv.fd, WATCH_SLICE.as_millis() as c_int);
            continue;
        }
        // SAFETY: armed CQs on the list are live (the application does not
        // destroy a CQ it is waiting for).
        let cqs: Vec<(&ferroce_verbs::CompletionQueue, u64)> = waiting
            .iter()
            .map(|&p| {
                let q = unsafe { &*(p as *const FCq) };
                (&q.cq, q.armed_at.load(Ordering::Acquire))
            })
            .collect();
        if let Err(ferroce_verbs::Error::EngineStopped(why)) =
            ferroce_verbs::CompletionQueue::wait_any_added(&cqs, WATCH_SLICE)
        {
            eprintln!("ferroce libibverbs: {why}");
            set_errno(libc::EIO);
            return -1;
        }
    }
}
