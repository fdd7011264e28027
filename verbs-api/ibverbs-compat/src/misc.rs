//! The small verbs: status and type strings, rate conversions, fork
//! support, asynchronous events.

use std::ffi::{c_char, c_int, c_void, CStr};

use ferroce_stack::transport::WcStatus;

use crate::ffi;

macro_rules! cstr_table {
    ($v:expr, [$($n:expr => $s:literal),* $(,)?], $default:literal) => {
        match $v {
            $($n => $s.as_ptr(),)*
            _ => $default.as_ptr(),
        }
    };
}

/// The status strings of rdma-core (libibverbs/enum_strs.c), from ferroce's table.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: ffi::ibv_wc_status) -> *const c_char {
    const ALL: [WcStatus; 16] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::FatalErr,
        WcStatus::GeneralErr,
    ];
    // NUL-terminated copies of ferroce's strings, made once.
    static STRS: std::sync::OnceLock<Vec<(u32, std::ffi::CString)>> = std::sync::OnceLock::new();
    let t = STRS.get_or_init(|| {
        ALL.iter()
            .map(|s| {
                (
                    *s as u32,
                    std::ffi::CString::new(ferroce_verbs::wc::status_str(*s)).unwrap_or_default(),
                )
            })
            .collect()
    });
    t.iter()
        .find(|(n, _)| *n == status)
        .map_or(c"unknown".as_ptr(), |(_, s)| s.as_ptr())
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: ffi::ibv_node_type) -> *const c_char {
    cstr_table!(t, [1 => c"InfiniBand channel adapter", 2 => c"InfiniBand switch",
        3 => c"InfiniBand router", 4 => c"iWARP NIC", 5 => c"usNIC", 6 => c"usNIC UDP",
        7 => c"unspecified"], c"unknown")
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: ffi::ibv_port_state) -> *const c_char {
    cstr_table!(s, [0 => c"PORT_NOP", 1 => c"PORT_DOWN", 2 => c"PORT_INIT", 3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE", 5 => c"PORT_ACTIVE_DEFER"], c"unknown")
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: ffi::ibv_event_type) -> *const c_char {
    cstr_table!(e, [0 => c"CQ error", 1 => c"local work queue catastrophic error",
        2 => c"invalid request local work queue error", 3 => c"local access violation work queue error",
        4 => c"communication established", 5 => c"send queue drained", 6 => c"path migrated",
        7 => c"path migration request error", 8 => c"local catastrophic error", 9 => c"port active",
        10 => c"port error", 11 => c"LID change", 12 => c"P_Key change", 13 => c"SM change",
        14 => c"SRQ catastrophic error", 15 => c"SRQ limit reached", 16 => c"last WQE reached",
        17 => c"client reregistration", 18 => c"GID table change", 19 => c"WQ fatal"], c"unknown")
}

/// IBV_RATE_* codes and their Gb/s (enum ibv_rate in verbs.h).
const RATES: [(c_int, c_int); 21] = [
    (2, 2500),
    (3, 10000),
    (4, 30000),
    (5, 5000),
    (6, 20000),
    (7, 40000),
    (8, 60000),
    (9, 80000),
    (10, 120000),
    (11, 14062),
    (12, 56250),
    (13, 112500),
    (14, 168750),
    (15, 25781),
    (16, 103125),
    (17, 206250),
    (18, 309375),
    (19, 50000),
    (20, 400000),
    (21, 600000),
    (22, 800000),
];

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mbps).map_or(0, |r| r.0)
}

/// Multiples of 2.5 Gb/s (the IB rates only).
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    match ibv_rate_to_mbps(rate) {
        m if m > 0 && m % 2500 == 0 && rate <= 10 => m / 2500,
        _ => -1,
    }
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    if mult <= 0 {
        return 0;
    }
    RATES
        .iter()
        .find(|r| r.0 <= 10 && r.1 == mult.saturating_mul(2500))
        .map_or(0, |r| r.0)
}

/// Memory is never pinned by a kernel driver here, so fork needs nothing.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
/// IBV_FORK_UNNEEDED (enum ibv_fork_status): fork is safe without ibv_fork_init.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// The next asynchronous event of the device (CQ overrun, SRQ limit, last
/// WQE, SQ drained), as ferroce's core reports them, or of its port (PORT_ERR
/// when the interface goes down or loses its carrier, PORT_ACTIVE when it is
/// back, as rxe's netdev notifier raises them). Blocks until one comes
/// (looking every few milliseconds) unless the context's async_fd was made
/// non-blocking; the fd polls readable while events wait. When the device's
/// engine has stopped for good (its interface went away),
/// IBV_EVENT_DEVICE_FATAL follows the events still queued, once, and then
/// EIO, as rdma-core's uverbs give them when a device is removed.
///
/// # Safety
/// Live context, writable event.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ffi::ibv_context,
    event: *mut ffi::ibv_async_event,
) -> c_int {
    use ferroce_stack::transport::AsyncEvent;
    if ctx.is_null() || event.is_null() {
        crate::handles::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: live context (caller).
    let f = unsafe { crate::handles::fctx(ctx) };
    // SAFETY: live context (caller).
    let fd = unsafe { (*ctx).async_fd };
    // SAFETY: our fd.
    let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    // Readable again if anything still waits once this event is taken (the
    // engine's hook fires only when events come to wait after none did).
    let rearm = || {
        if f.ctx.events_waiting() || f.ctx.failure().is_some() {
            crate::handles::signal(fd);
        }
    };
    loop {
        // Cleared before looking: an event that comes meanwhile makes it
        // readable again (the engine's hook, or `rearm`).
        crate::handles::unsignal(fd);
        while let Some(ev) = f.ctx.poll_async_event() {
            let objs = f.objects();
            let cq = |h| {
                objs.cqs.iter().copied().find(|&p| {
                    // SAFETY: registered CQs are live.
                    unsafe { &*(p as *const crate::handles::FCq) }.cq.handle() == h
                })
            };
            let srq = |h| {
                objs.srqs.iter().copied().find(|&p| {
                    // SAFETY: registered SRQs are live.
                    unsafe { &*(p as *const crate::handles::FSrq) }.srq.handle() == h
                })
            };
            let qp = |n| {
                objs.qps.iter().copied().find(|&p| {
                    // SAFETY: registered QPs are live.
                    unsafe { &*(p as *const crate::handles::FQp) }.qp.qpn() == n
                })
            };
            let (ty, element) = match ev {
                AsyncEvent::CqError { cq: h } => (
                    ffi::IBV_EVENT_CQ_ERR,
                    cq(h).map(|p| ffi::ibv_async_event__bindgen_ty_1 { cq: p as *mut _ }),
                ),
                AsyncEvent::SrqLimitReached { srq: h } => (
                    ffi::IBV_EVENT_SRQ_LIMIT_REACHED,
                    srq(h).map(|p| ffi::ibv_async_event__bindgen_ty_1 { srq: p as *mut _ }),
                ),
                AsyncEvent::QpLastWqeReached { qpn, .. } => (
                    ffi::IBV_EVENT_QP_LAST_WQE_REACHED,
                    qp(qpn).map(|p| ffi::ibv_async_event__bindgen_ty_1 { qp: p as *mut _ }),
                ),
                AsyncEvent::SqDrained { qpn } => (
                    ffi::IBV_EVENT_SQ_DRAINED,
                    qp(qpn).map(|p| ffi::ibv_async_event__bindgen_ty_1 { qp: p as *mut _ }),
                ),
            };
            // An event of an object destroyed meanwhile is dropped.
            if let Some(element) = element {
                // SAFETY: writable (caller).
                unsafe {
                    *event = ffi::ibv_async_event {
                        element,
                        event_type: ty,
                    }
                };
                rearm();
                return 0;
            }
        }
        if let Some(pe) = f.ctx.poll_port_event() {
            // SAFETY: writable (caller).
            unsafe {
                *event = ffi::ibv_async_event {
                    element: ffi::ibv_async_event__bindgen_ty_1 { port_num: 1 },
                    event_type: match pe {
                        ferroce_verbs::PortEvent::Active => ffi::IBV_EVENT_PORT_ACTIVE,
                        ferroce_verbs::PortEvent::Error => ffi::IBV_EVENT_PORT_ERR,
                    },
                }
            };
            rearm();
            return 0;
        }
        if f.ctx.failure().is_some() {
            // The fd stays readable for good.
            crate::handles::signal(fd);
            if f.fatal_reported
                .swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                crate::handles::set_errno(libc::EIO);
                return -1;
            }
            // SAFETY: writable (caller).
            unsafe {
                *event = ffi::ibv_async_event {
                    element: ffi::ibv_async_event__bindgen_ty_1 { port_num: 0 },
                    event_type: ffi::IBV_EVENT_DEVICE_FATAL,
                }
            };
            return 0;
        }
        if nonblock {
            crate::handles::set_errno(libc::EAGAIN);
            return -1;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[no_mangle]
pub extern "C" fn ibv_ack_async_event(_event: *mut ffi::ibv_async_event) {}

/// No RDMA data is reordered on the wire by ferroce's RC: report in-order (IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG).
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ffi::ibv_qp,
    _op: ffi::ibv_wr_opcode,
    _flags: u32,
) -> c_int {
    1
}

/// rdma-core's provider registration: ferroce is the only provider here,
/// so the drivers of other libraries linked into a program are ignored.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// A provider's debug log line (libmlx5/libefa call it): to stderr when
/// VERBS_LOG_LEVEL asks for it, as rdma-core does.
///
/// # Safety
/// NUL-terminated format (only the format string is printed).
#[no_mangle]
pub unsafe extern "C" fn __verbs_log(_ctx: *mut c_void, _level: u32, fmt: *const c_char) {
    if fmt.is_null() || std::env::var_os("VERBS_LOG_LEVEL").is_none() {
        return;
    }
    // SAFETY: NUL-terminated (caller).
    eprint!("{}", unsafe { CStr::from_ptr(fmt) }.to_string_lossy());
}
