//! The Rust objects behind the C handles. Each starts with the C struct the
//! application sees (`#[repr(C)]`, first field), so the handle pointer and the
//! object pointer are the same address; the ferroce object sits behind it.
//!
//! The ferroce-verbs objects borrow their protection domain; here the
//! application owns the lifetimes (rdma-core refuses to free a PD that still
//! has objects, and so do we, by counting them), so the borrows are widened
//! to `'static` where the objects are made.

// The C structs bindgen makes have no Debug (unions, function pointers).
#![allow(missing_debug_implementations)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

pub use crate::channel::FChannel;

use ferroce_stack::transport::{Path, QpType};
use ferroce_verbs::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, SharedReceiveQueue,
};

use crate::ffi;
use crate::wr_api::WrBuilder;

/// One interface offered as a device (ibv_device).
#[repr(C)]
pub struct FDevice {
    pub ibv: ffi::ibv_device,
    pub ifname: String,
    pub index: i32,
    pub guid: u64,
}

/// An open device (verbs_context, whose last member is the ibv_context).
#[repr(C)]
pub struct FContext {
    pub vctx: ffi::verbs_context,
    pub ctx: Context,
    pub dev: *const FDevice,
    pub ifindex: u32,
    /// Live CQs, QPs and SRQs (addresses), to name them in async events.
    pub objects: Mutex<Objects>,
    /// IBV_EVENT_DEVICE_FATAL has been handed out (the device's packet
    /// engine stopped: its interface went away).
    pub fatal_reported: std::sync::atomic::AtomicBool,
    /// The engine-failure hook that writes the async fd (removed at close).
    pub fatal_hook: Option<u64>,
    /// The engine's event hook that writes the async fd (removed at close).
    pub event_hook: Option<u64>,
}

/// What asynchronous events may name.
#[derive(Debug, Default)]
pub struct Objects {
    pub cqs: Vec<usize>,
    pub qps: Vec<usize>,
    pub srqs: Vec<usize>,
}

impl FContext {
    pub fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// ibv_pd.
#[repr(C)]
pub struct FPd {
    pub ibv: ffi::ibv_pd,
    pub pd: ProtectionDomain,
    /// MRs, QPs, SRQs and AHs made in it: a PD with children is busy.
    pub children: AtomicUsize,
}

/// ibv_mr over the application's own memory.
#[repr(C)]
pub struct FMr {
    pub ibv: ffi::ibv_mr,
    pub mr: Option<MemoryRegion<'static>>,
    pub pd: *const FPd,
}

/// ibv_cq, inside the ibv_cq_ex of the extended polling API (its prefix).
#[repr(C)]
pub struct FCq {
    pub ibv: ffi::ibv_cq_ex,
    pub cq: CompletionQueue,
    /// ibv_req_notify_cq was called and no event has been made since.
    pub armed: AtomicBool,
    /// The CQ's count of completions ever added at that call: only a later
    /// one makes the event (ibv_req_notify_cq(3): "upon the addition of a
    /// new CQE").
    pub armed_at: AtomicU64,
    pub events_acked: AtomicU32,
    pub users: AtomicUsize,
    /// Empty `poll_cq` calls in a row (see datapath).
    pub empty_polls: AtomicU32,
    /// The completion being read between start_poll and end_poll (the
    /// extended API is single-threaded per CQ, as rdma-core documents).
    pub current: std::cell::UnsafeCell<ffi::ibv_wc>,
}

impl FCq {
    /// A completion was added since the CQ was armed.
    pub fn fired(&self) -> bool {
        self.cq.added() > self.armed_at.load(Ordering::Acquire)
    }
}

/// ibv_srq.
#[repr(C)]
pub struct FSrq {
    pub ibv: ffi::ibv_srq,
    pub srq: SharedReceiveQueue<'static>,
    pub pd: *const FPd,
    pub max_wr: u32,
    pub max_sge: u32,
    pub limit: AtomicU32,
}

/// ibv_ah: the resolved path of a UD destination.
#[repr(C)]
pub struct FAh {
    pub ibv: ffi::ibv_ah,
    pub path: Path,
    pub attr: ffi::ibv_ah_attr,
    pub pd: *const FPd,
}

/// ibv_qp, inside the ibv_qp_ex of the work-request builder API.
#[repr(C)]
pub struct FQp {
    pub ibv: ffi::ibv_qp_ex,
    pub qp: QueuePair<'static>,
    pub qp_type: QpType,
    pub pd: *const FPd,
    pub send_cq: *const FCq,
    pub recv_cq: *const FCq,
    pub srq: *const FSrq,
    pub sq_sig_all: bool,
    pub cap: ffi::ibv_qp_cap,
    /// The last attributes applied (ibv_query_qp reports ibverbs' own values).
    pub attr: Mutex<ffi::ibv_qp_attr>,
    pub builder: WrBuilder,
}

/// The object behind an ibv_context pointer.
///
/// # Safety
/// `ctx` must come from `ibv_open_device` of this library and not be closed.
pub unsafe fn fctx<'a>(ctx: *mut ffi::ibv_context) -> &'a FContext {
    let off =
        std::mem::offset_of!(FContext, vctx) + std::mem::offset_of!(ffi::verbs_context, context);
    // SAFETY: the context is the last member of the verbs_context that heads
    // an FContext (see `open_device`); the caller guarantees it is live.
    unsafe { &*((ctx as *mut u8).sub(off) as *const FContext) }
}

macro_rules! cast_fn {
    ($name:ident, $c:ty, $r:ty) => {
        /// The object behind a handle of this library.
        ///
        /// # Safety
        /// The pointer must come from this library's matching create call and
        /// not be destroyed yet.
        pub unsafe fn $name<'a>(p: *mut $c) -> &'a $r {
            // SAFETY: the C struct is the first field of the #[repr(C)]
            // object; the caller guarantees it is live.
            unsafe { &*(p as *const $r) }
        }
    };
}
cast_fn!(fpd, ffi::ibv_pd, FPd);
cast_fn!(fcq, ffi::ibv_cq, FCq);
cast_fn!(fsrq, ffi::ibv_srq, FSrq);
cast_fn!(fah, ffi::ibv_ah, FAh);
cast_fn!(fqp, ffi::ibv_qp, FQp);
cast_fn!(fchannel, ffi::ibv_comp_channel, FChannel);

impl FPd {
    pub fn hold(&self) {
        self.children.fetch_add(1, Ordering::AcqRel);
    }
    pub fn release(&self) {
        self.children.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Set errno (the verbs that return a pointer report failures there).
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The errno value for a ferroce error.
pub fn errno_of(e: &ferroce_verbs::Error) -> i32 {
    use ferroce_stack::transport::VerbsError;
    use ferroce_verbs::Error;
    match e {
        Error::Verbs(VerbsError::Busy(_)) => libc::EBUSY,
        Error::Verbs(VerbsError::Exhausted(_)) => libc::ENOMEM,
        Error::Verbs(VerbsError::QueueFull) => libc::ENOMEM,
        Error::Verbs(_) => libc::EINVAL,
        Error::Timeout(..) => libc::ETIMEDOUT,
        Error::EngineStopped(_) => libc::EIO,
        Error::Unreachable { .. } => libc::EHOSTUNREACH,
        Error::Io(_, io) => io.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EINVAL,
    }
}

/// Box an object and hand out its address as the C handle.
pub fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Makes eventfd `fd` readable for good once `ctx`'s device engine stops
/// (rdma-core's async and completion fds of a removed device poll readable);
/// returns the hook's number, to remove before `fd` closes (its number is
/// reused after).
pub fn signal_on_failure(ctx: &ferroce_verbs::Context, fd: std::ffi::c_int) -> u64 {
    ctx.on_failure(move || signal(fd))
}

/// Makes the eventfd `fd` readable.
pub fn signal(fd: std::ffi::c_int) {
    let one = 1u64;
    // SAFETY: an eventfd its owner keeps open while a hook may call this;
    // writes 8 bytes from a local.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Makes the eventfd `fd` unreadable again, without blocking (the fd may
/// be in blocking mode: it is the application's to set).
pub fn unsignal(fd: std::ffi::c_int) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd from a local, no wait.
    if unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLIN != 0 {
        let mut v = 0u64;
        // SAFETY: readable eventfd (only this library reads it): the read
        // returns at once; 8 bytes into a local.
        let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    }
}
