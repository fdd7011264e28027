//! Queue pairs: create (plain and extended), modify, query, destroy.

use std::ffi::c_int;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use ferroce_stack::transport::{AccessFlags, QpAttr, QpAttrMask, QpCap, QpState, QpType};

use crate::ffi;
use crate::handles::{errno_of, fcq, fctx, fpd, fqp, fsrq, leak, set_errno, FCq, FPd, FQp, FSrq};
use crate::resources::path_of;
use crate::wr_api::{self, WrBuilder};

/// The send operations the work-request builder API offers here.
const SEND_OPS: u64 = (ffi::IBV_QP_EX_WITH_RDMA_WRITE
    | ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | ffi::IBV_QP_EX_WITH_SEND
    | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM
    | ffi::IBV_QP_EX_WITH_RDMA_READ
    | ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | ffi::IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

fn qp_state(s: ffi::ibv_qp_state) -> Option<QpState> {
    QpState::ALL.get(s as usize).copied()
}

fn ibv_state(s: QpState) -> ffi::ibv_qp_state {
    QpState::ALL.iter().position(|x| *x == s).unwrap_or(0) as ffi::ibv_qp_state
}

/// # Safety
/// Live PD and attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ffi::ibv_pd,
    init: *mut ffi::ibv_qp_init_attr,
) -> *mut ffi::ibv_qp {
    if pd.is_null() || init.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: readable (caller).
    let i = unsafe { &mut *init };
    let mut ex = ffi::ibv_qp_init_attr_ex {
        qp_context: i.qp_context,
        send_cq: i.send_cq,
        recv_cq: i.recv_cq,
        srq: i.srq,
        cap: i.cap,
        qp_type: i.qp_type,
        sq_sig_all: i.sq_sig_all,
        comp_mask: ffi::IBV_QP_INIT_ATTR_PD,
        pd,
        ..Default::default()
    };
    // SAFETY: live PD.
    let ctx = unsafe { fpd(pd) }.ibv.context;
    // SAFETY: forwarded contract.
    let qp = unsafe { create_qp_ex(ctx, &mut ex) };
    if !qp.is_null() {
        i.cap = ex.cap;
    }
    qp
}

/// verbs_context::create_qp_ex (ibv_create_qp_ex is inline and calls it).
///
/// # Safety
/// Live context and attributes.
pub unsafe extern "C" fn create_qp_ex(
    ctx: *mut ffi::ibv_context,
    a: *mut ffi::ibv_qp_init_attr_ex,
) -> *mut ffi::ibv_qp {
    if ctx.is_null() || a.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: readable (caller).
    let a = unsafe { &mut *a };
    let known = ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & ffi::IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() || a.comp_mask & !known != 0 {
        set_errno(libc::EOPNOTSUPP);
        return ptr::null_mut();
    }
    if a.comp_mask & ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !SEND_OPS != 0
    {
        set_errno(libc::EOPNOTSUPP);
        return ptr::null_mut();
    }
    let qp_type = match a.qp_type {
        ffi::IBV_QPT_RC => QpType::Rc,
        ffi::IBV_QPT_UC => QpType::Uc,
        ffi::IBV_QPT_UD => QpType::Ud,
        _ => {
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
    };
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: live objects of this library (caller); the PD outlives the QP
    // (children count), so the widened borrows hold.
    let (p, scq, rcq): (&'static FPd, &FCq, &FCq) =
        unsafe { (fpd(a.pd), fcq(a.send_cq), fcq(a.recv_cq)) };
    let srq: Option<&'static FSrq> = if a.srq.is_null() {
        None
    } else {
        // SAFETY: live SRQ (caller).
        Some(unsafe { fsrq(a.srq) })
    };
    let cap = QpCap {
        max_send_wr: a.cap.max_send_wr.max(1),
        max_recv_wr: a.cap.max_recv_wr.max(1),
        max_send_sge: a.cap.max_send_sge.max(1),
        max_recv_sge: a.cap.max_recv_sge.max(1),
        max_inline_data: a.cap.max_inline_data,
    };
    let mut b =
        p.pd.create_qp()
            .qp_type(qp_type)
            .cap(cap)
            .sq_sig_all(a.sq_sig_all != 0);
    if let Some(s) = srq {
        b = b.srq(&s.srq);
    }
    let qp = match b.build(&scq.cq, &rcq.cq) {
        Ok(q) => q,
        Err(e) => {
            report_create_qp_error(&e);
            set_errno(errno_of(&e));
            return ptr::null_mut();
        }
    };
    let qpn = qp.qpn();
    p.hold();
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    let mut ibv = ffi::ibv_qp_ex {
        qp_base: ffi::ibv_qp {
            context: ctx,
            qp_context: a.qp_context,
            pd: a.pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: qpn,
            qp_num: qpn,
            state: ffi::IBV_QPS_RESET,
            qp_type: a.qp_type,
            ..Default::default()
        },
        ..Default::default()
    };
    wr_api::fill_ops(&mut ibv);
    // What the QP really has: what was asked, inline data up to the device's limit.
    let max_inline = fctx_max_inline(ctx).min(a.cap.max_inline_data.max(cap.max_inline_data));
    a.cap.max_inline_data = max_inline;
    let f = leak(FQp {
        ibv,
        qp,
        qp_type,
        pd: p,
        send_cq: scq,
        recv_cq: rcq,
        srq: srq.map_or(ptr::null(), |s| s as *const FSrq),
        sq_sig_all: a.sq_sig_all != 0,
        cap: a.cap,
        attr: Mutex::new(ffi::ibv_qp_attr {
            port_num: 1,
            cap: a.cap,
            ..Default::default()
        }),
        builder: WrBuilder::default(),
    });
    // SAFETY: live context (caller).
    unsafe { fctx(ctx) }.objects().qps.push(f as usize);
    f as *mut ffi::ibv_qp
}

fn fctx_max_inline(ctx: *mut ffi::ibv_context) -> u32 {
    // SAFETY: live context (every handle records its own).
    unsafe { fctx(ctx) }.ctx.query_device().max_inline_data
}

/// # Safety
/// A QP of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ffi::ibv_qp) -> *mut ffi::ibv_qp_ex {
    // The ibv_qp heads the ibv_qp_ex of every QP made here.
    qp as *mut ffi::ibv_qp_ex
}

/// # Safety
/// Live QP and attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live (caller).
    let (q, a) = unsafe { (fqp(qp), &*attr) };
    let mask = mask as u32;
    let has = |m: ffi::ibv_qp_attr_mask| mask & m != 0;
    let mut x = QpAttr {
        path_mtu: 128u32 << a.path_mtu.clamp(1, 5),
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: AccessFlags(a.qp_access_flags & 0xf),
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
        // Clamped to the device's limit, as perftest asks for its peer's
        // (rxe: 128): fewer READs/atomics in flight, never more.
        max_rd_atomic: a
            .max_rd_atomic
            .min(ferroce_stack::transport::qp::MAX_RD_ATOMIC),
        max_dest_rd_atomic: a
            .max_dest_rd_atomic
            .min(ferroce_stack::transport::qp::MAX_RD_ATOMIC),
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        ..QpAttr::default()
    };
    if has(ffi::IBV_QP_STATE) {
        match qp_state(a.qp_state) {
            Some(s) => x.qp_state = s,
            None => return libc::EINVAL,
        }
    }
    if has(ffi::IBV_QP_CUR_STATE) {
        match qp_state(a.cur_qp_state) {
            Some(s) => x.cur_qp_state = s,
            None => return libc::EINVAL,
        }
    }
    if has(ffi::IBV_QP_AV) {
        // SAFETY: every QP records its live context.
        match unsafe { path_of(q.ibv.qp_base.context, &a.ah_attr) } {
            Ok(p) => x.ah_attr = p,
            Err(e) => return e,
        }
    }
    if has(ffi::IBV_QP_CAP) {
        x.cap = QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        };
    }
    // Bits past DEST_QPN (rate limit...) have no meaning for ferroce.
    let m = QpAttrMask(mask & ((1 << 21) - 1));
    if let Err(e) = q.qp.modify(&x, m) {
        eprintln!("ferroce libibverbs: ibv_modify_qp: {e}");
        return errno_of(&e);
    }
    // Remember what was applied, for ibv_query_qp.
    let mut st = q.attr.lock().unwrap_or_else(|p| p.into_inner());
    macro_rules! keep {
        ($bit:expr, $($f:ident),+) => {
            if has($bit) { $(st.$f = a.$f;)+ }
        };
    }
    keep!(ffi::IBV_QP_STATE, qp_state);
    keep!(ffi::IBV_QP_ACCESS_FLAGS, qp_access_flags);
    keep!(ffi::IBV_QP_PKEY_INDEX, pkey_index);
    keep!(ffi::IBV_QP_PORT, port_num);
    keep!(ffi::IBV_QP_QKEY, qkey);
    keep!(ffi::IBV_QP_AV, ah_attr);
    keep!(ffi::IBV_QP_PATH_MTU, path_mtu);
    keep!(ffi::IBV_QP_TIMEOUT, timeout);
    keep!(ffi::IBV_QP_RETRY_CNT, retry_cnt);
    keep!(ffi::IBV_QP_RNR_RETRY, rnr_retry);
    keep!(ffi::IBV_QP_RQ_PSN, rq_psn);
    keep!(ffi::IBV_QP_MAX_QP_RD_ATOMIC, max_rd_atomic);
    keep!(ffi::IBV_QP_MIN_RNR_TIMER, min_rnr_timer);
    keep!(ffi::IBV_QP_SQ_PSN, sq_psn);
    keep!(ffi::IBV_QP_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
    keep!(ffi::IBV_QP_DEST_QPN, dest_qp_num);
    drop(st);
    if has(ffi::IBV_QP_STATE) {
        // SAFETY: the application sees the state field (rdma-core updates it too).
        unsafe { (*qp).state = a.qp_state };
    }
    0
}

/// # Safety
/// Live QP, writable attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    _mask: c_int,
    init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live (caller).
    let q = unsafe { fqp(qp) };
    let mut a = *q.attr.lock().unwrap_or_else(|p| p.into_inner());
    // The core's state may have moved on (to ERR, SQD drained...), and a
    // QP rdma_cm connected was moved without ibv_modify_qp: the core's
    // values stand (the address vector stays the one last given here).
    if let Ok(c) = q.qp.query() {
        a.qp_state = ibv_state(c.qp_state);
        a.cur_qp_state = a.qp_state;
        a.sq_draining = u8::from(c.sq_draining);
        a.qkey = c.qkey;
        a.rq_psn = c.rq_psn;
        a.sq_psn = c.sq_psn;
        a.dest_qp_num = c.dest_qp_num;
        a.qp_access_flags = c.qp_access_flags.0;
        a.path_mtu = crate::devices::mtu_enum(c.path_mtu);
        a.pkey_index = c.pkey_index;
        a.port_num = c.port_num;
        a.timeout = c.timeout;
        a.retry_cnt = c.retry_cnt;
        a.rnr_retry = c.rnr_retry;
        a.min_rnr_timer = c.min_rnr_timer;
        a.max_rd_atomic = c.max_rd_atomic;
        a.max_dest_rd_atomic = c.max_dest_rd_atomic;
    }
    a.cap = q.cap;
    // SAFETY: writable (caller).
    unsafe { *attr = a };
    if !init.is_null() {
        let b = &q.ibv.qp_base;
        // SAFETY: writable (caller).
        unsafe {
            *init = ffi::ibv_qp_init_attr {
                qp_context: b.qp_context,
                send_cq: b.send_cq,
                recv_cq: b.recv_cq,
                srq: b.srq,
                cap: q.cap,
                qp_type: b.qp_type,
                sq_sig_all: c_int::from(q.sq_sig_all),
            }
        };
    }
    0
}

/// # Safety
/// A QP of this library, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ffi::ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live (caller).
    if !unsafe { fqp(qp) }.qp.mcast_groups().is_empty() {
        // uverbs / rxe_qp_chk_destroy: detach from every group first.
        return libc::EBUSY;
    }
    // SAFETY: allocated by leak() in create_qp_ex.
    let q = unsafe { Box::from_raw(qp as *mut FQp) };
    // SAFETY: the QP's context outlives it.
    unsafe { fctx(q.ibv.qp_base.context) }
        .objects()
        .qps
        .retain(|&x| x != qp as usize);
    let (pd, scq, rcq) = (q.pd, q.send_cq, q.recv_cq);
    drop(q);
    // SAFETY: PD and CQs outlive their QPs (counted).
    unsafe {
        (*scq).users.fetch_sub(1, Ordering::AcqRel);
        (*rcq).users.fetch_sub(1, Ordering::AcqRel);
        (*pd).release();
    }
    0
}

/// ibv_attach_mcast: the LID is unused on RoCE (is_valid_mcast_lid); a GID
/// that is not a multicast group or a QP that is not UD is EINVAL.
///
/// # Safety
/// `qp` is a live QP of this library, `gid` readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ffi::ibv_qp,
    gid: *const ffi::ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: as this function's.
    unsafe { mcast_call(qp, gid, |q, g| q.attach_mcast(g)) }
}

/// ibv_detach_mcast: EINVAL for a group the QP is not attached to.
///
/// # Safety
/// As [`ibv_attach_mcast`].
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ffi::ibv_qp,
    gid: *const ffi::ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: as this function's.
    unsafe { mcast_call(qp, gid, |q, g| q.detach_mcast(g)) }
}

/// `op` on the QP and group behind the C handles, as an errno.
///
/// # Safety
/// `qp` is null or a live QP of this library, `gid` null or readable.
unsafe fn mcast_call(
    qp: *mut ffi::ibv_qp,
    gid: *const ffi::ibv_gid,
    op: impl FnOnce(&ferroce_verbs::QueuePair<'static>, std::net::Ipv6Addr) -> ferroce_verbs::Result<()>,
) -> c_int {
    if qp.is_null() || gid.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live and readable (caller).
    let (q, raw) = unsafe { (fqp(qp), (*gid).raw) };
    match op(&q.qp, std::net::Ipv6Addr::from(raw)) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

/// Say why ibv_create_qp failed, but a capability over the device's limit
/// only the first time: programs find `max_inline_data` by creating QPs
/// with less and less until one is made (UCX: eight tries per QP, each an
/// EINVAL rdma-core's providers return without a word).
fn report_create_qp_error(e: &ferroce_verbs::Error) {
    static LIMIT_SHOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let over_limit = matches!(
        e,
        ferroce_verbs::Error::Verbs(ferroce_stack::transport::VerbsError::OutOfRange { .. })
    );
    if !over_limit {
        eprintln!("ferroce libibverbs: ibv_create_qp: {e}");
    } else if !LIMIT_SHOWN.swap(true, Ordering::Relaxed) {
        eprintln!(
            "ferroce libibverbs: ibv_create_qp: {e} (EINVAL; later requests over a limit are not shown)"
        );
    }
}
