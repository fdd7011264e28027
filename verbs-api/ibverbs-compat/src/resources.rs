//! Protection domains, memory regions over the application's memory,
//! completion queues and channels, shared receive queues, address handles.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use ferroce_stack::transport::{AccessFlags, MemoryRegion as CoreRegion, OutOfBounds, Path};

use crate::ffi;
use crate::handles::{
    errno_of, fah, fchannel, fcq, fctx, fpd, fsrq, leak, set_errno, FAh, FCq, FMr, FPd, FSrq,
};

/// Application memory registered as a region: the core copies straight
/// between it and frames (no staging buffer).
#[derive(Debug)]
struct AppMemory {
    ptr: *mut u8,
    len: u64,
}

// SAFETY: the memory belongs to the application, which keeps it mapped until
// ibv_dereg_mr (the ibverbs contract); the core touches it under its lock.
unsafe impl Send for AppMemory {}

impl AppMemory {
    fn check(&self, offset: u64, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds { offset, len }),
        }
    }
    fn atomic(&self, offset: u64) -> Result<&AtomicU64, OutOfBounds> {
        self.check(offset, 8)?;
        // SAFETY: in bounds (checked); the address is used only if aligned.
        let p = unsafe { self.ptr.add(offset as usize) };
        if !(p as usize).is_multiple_of(8) {
            return Err(OutOfBounds { offset, len: 8 });
        }
        // SAFETY: aligned, in bounds, and live (see the Send impl); other
        // threads of the application may touch it, hence the atomic.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }
}

/// `len` bytes from `src` to `dst` in the pieces `copy_piece` allows (glibc's
/// `rep movsb` is very slow for some distances between the two; see
/// `ferroce_stack::transport::copy_bytes`).
///
/// # Safety
/// Both ranges must be valid for `len` bytes and must not overlap.
unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    let piece = ferroce_stack::transport::copy_piece(dst, src, len).max(1);
    let mut done = 0;
    while done < len {
        let n = piece.min(len - done);
        // SAFETY: within the ranges the caller vouched for.
        unsafe { ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
        done += n;
    }
}

impl CoreRegion for AppMemory {
    fn len(&self) -> u64 {
        self.len
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        self.check(offset, dst.len())?;
        // SAFETY: in bounds; the application keeps the memory mapped.
        unsafe { copy_raw(dst.as_mut_ptr(), self.ptr.add(offset as usize), dst.len()) };
        Ok(())
    }
    fn write(&mut self, offset: u64, src: &[u8]) -> Result<(), OutOfBounds> {
        self.check(offset, src.len())?;
        // SAFETY: in bounds; the application keeps the memory mapped.
        unsafe { copy_raw(self.ptr.add(offset as usize), src.as_ptr(), src.len()) };
        Ok(())
    }
    fn compare_swap(&mut self, offset: u64, compare: u64, swap: u64) -> Result<u64, OutOfBounds> {
        let a = self.atomic(offset)?;
        Ok(
            match a.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }
    fn fetch_add(&mut self, offset: u64, add: u64) -> Result<u64, OutOfBounds> {
        Ok(self.atomic(offset)?.fetch_add(add, Ordering::AcqRel))
    }
}

/// # Safety
/// Live context.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ffi::ibv_context) -> *mut ffi::ibv_pd {
    if ctx.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: live context (caller).
    let f = unsafe { fctx(ctx) };
    let pd = f.ctx.alloc_pd();
    let p = leak(FPd {
        ibv: ffi::ibv_pd {
            context: ctx,
            handle: 0,
        },
        pd,
        children: AtomicUsize::new(0),
    });
    p as *mut ffi::ibv_pd
}

/// # Safety
/// A PD of this library, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ffi::ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live PD (caller).
    if unsafe { fpd(pd) }.children.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: allocated by leak() in ibv_alloc_pd; no object refers to it.
    drop(unsafe { Box::from_raw(pd as *mut FPd) });
    0
}

/// # Safety
/// A PD of this library; `addr..addr+len` stays mapped until ibv_dereg_mr.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ffi::ibv_mr {
    if pd.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: live PD (caller); it outlives the region (children count).
    let p: &'static FPd = unsafe { fpd(pd) };
    let region = Box::new(AppMemory {
        ptr: addr as *mut u8,
        len: len as u64,
    });
    // IBV_ACCESS_LOCAL_WRITE .. REMOTE_ATOMIC are the low four bits; the
    // others (relaxed ordering, on-demand paging...) change nothing here.
    let mr = match p.pd.reg_mr_at(region, iova, AccessFlags(access & 0xf)) {
        Ok(m) => m,
        Err(e) => {
            set_errno(errno_of(&e));
            return ptr::null_mut();
        }
    };
    p.hold();
    let m = leak(FMr {
        ibv: ffi::ibv_mr {
            context: p.ibv.context,
            pd,
            addr,
            length: len,
            handle: 0,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        },
        mr: Some(mr),
        pd: p,
    });
    m as *mut ffi::ibv_mr
}

/// # Safety
/// As ibv_reg_mr_iova2 with iova = addr.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, len, addr as u64, access as u32) }
}

/// # Safety
/// As ibv_reg_mr_iova2.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, len, iova, access as u32) }
}

/// # Safety
/// An MR of this library, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ffi::ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by leak() in ibv_reg_mr_iova2 (caller: live, unused after).
    let mut m = unsafe { Box::from_raw(mr as *mut FMr) };
    let r = match m.mr.take().map(|r| r.deregister()) {
        Some(Err(e)) => errno_of(&e),
        _ => 0,
    };
    // SAFETY: the PD outlives its regions (children count).
    unsafe { (*m.pd).release() };
    r
}

fn new_cq(
    ctx: *mut ffi::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
) -> *mut FCq {
    if ctx.is_null() || cqe < 1 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: live context (caller).
    let f = unsafe { fctx(ctx) };
    let cq = match f.ctx.create_cq(cqe as u32) {
        Ok(c) => c,
        Err(e) => {
            set_errno(errno_of(&e));
            return ptr::null_mut();
        }
    };
    let mut ibv = ffi::ibv_cq_ex {
        context: ctx,
        channel,
        cq_context,
        cqe,
        ..Default::default()
    };
    crate::datapath::fill_cq_ex_ops(&mut ibv);
    let c = leak(FCq {
        ibv,
        cq,
        armed: AtomicBool::new(false),
        armed_at: std::sync::atomic::AtomicU64::new(0),
        events_acked: AtomicU32::new(0),
        users: AtomicUsize::new(0),
        empty_polls: AtomicU32::new(0),
        current: std::cell::UnsafeCell::new(ffi::ibv_wc::default()),
    });
    if !channel.is_null() {
        // SAFETY: a live channel (caller).
        unsafe { fchannel(channel) }.add_cq(c as usize);
    }
    f.objects().cqs.push(c as usize);
    c
}

/// # Safety
/// Live context; `channel` NULL or a channel of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ffi::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ffi::ibv_cq {
    new_cq(ctx, cqe, cq_context, channel) as *mut ffi::ibv_cq
}

/// verbs_context::create_cq_ex (ibv_create_cq_ex is inline and calls it):
/// the standard completion fields; no timestamps, flow tags or parent domains.
///
/// # Safety
/// Live context and attributes.
pub unsafe extern "C" fn create_cq_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_cq_init_attr_ex,
) -> *mut ffi::ibv_cq_ex {
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: readable (caller).
    let a = unsafe { &*attr };
    if a.wc_flags & !u64::from(ffi::IBV_WC_STANDARD_FLAGS) != 0
        || a.comp_mask & !ffi::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
    {
        set_errno(libc::EOPNOTSUPP);
        return ptr::null_mut();
    }
    let Ok(cqe) = c_int::try_from(a.cqe) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    new_cq(ctx, cqe, a.cq_context, a.channel) as *mut ffi::ibv_cq_ex
}

/// # Safety
/// A CQ of this library, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ffi::ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live CQ (caller).
    let c = unsafe { fcq(cq) };
    if c.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    if !c.ibv.channel.is_null() {
        // SAFETY: the channel outlives its CQs (rdma-core refuses to destroy it before).
        unsafe { fchannel(c.ibv.channel) }.remove_cq(cq as usize);
    }
    // SAFETY: the CQ's context outlives it.
    unsafe { fctx(c.ibv.context) }
        .objects()
        .cqs
        .retain(|&x| x != cq as usize);
    // SAFETY: allocated by leak() in ibv_create_cq.
    drop(unsafe { Box::from_raw(cq as *mut FCq) });
    0
}

/// # Safety
/// A live CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(_cq: *mut ffi::ibv_cq, _cqe: c_int) -> c_int {
    libc::EOPNOTSUPP
}

/// # Safety
/// A live CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ffi::ibv_cq, n: u32) {
    if !cq.is_null() {
        // SAFETY: live CQ (caller).
        unsafe { fcq(cq) }
            .events_acked
            .fetch_add(n, Ordering::AcqRel);
    }
}

/// # Safety
/// Live PD and attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ffi::ibv_pd,
    init: *mut ffi::ibv_srq_init_attr,
) -> *mut ffi::ibv_srq {
    if pd.is_null() || init.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: live PD (caller); it outlives the SRQ (children count).
    let p: &'static FPd = unsafe { fpd(pd) };
    // SAFETY: readable (caller).
    let a = unsafe { (*init).attr };
    let srq = match p.pd.create_srq(a.max_wr, a.max_sge.max(1)) {
        Ok(s) => s,
        Err(e) => {
            set_errno(errno_of(&e));
            return ptr::null_mut();
        }
    };
    if a.srq_limit > 0 {
        if let Err(e) = srq.set_limit(a.srq_limit) {
            set_errno(errno_of(&e));
            return ptr::null_mut();
        }
    }
    p.hold();
    let s = leak(FSrq {
        ibv: ffi::ibv_srq {
            context: p.ibv.context,
            // SAFETY: readable (caller).
            srq_context: unsafe { (*init).srq_context },
            pd,
            ..Default::default()
        },
        srq,
        pd: p,
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        limit: AtomicU32::new(a.srq_limit),
    });
    // SAFETY: the PD's context is live.
    unsafe { fctx(p.ibv.context) }
        .objects()
        .srqs
        .push(s as usize);
    s as *mut ffi::ibv_srq
}

/// # Safety
/// Live SRQ and attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ffi::ibv_srq,
    attr: *mut ffi::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live (caller).
    let (s, a) = unsafe { (fsrq(srq), *attr) };
    if mask & ffi::IBV_SRQ_MAX_WR as c_int != 0 {
        return libc::EOPNOTSUPP; // the SRQ cannot be resized
    }
    if mask & ffi::IBV_SRQ_LIMIT as c_int != 0 {
        if let Err(e) = s.srq.set_limit(a.srq_limit) {
            return errno_of(&e);
        }
        s.limit.store(a.srq_limit, Ordering::Release);
    }
    0
}

/// # Safety
/// Live SRQ, writable attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(
    srq: *mut ffi::ibv_srq,
    attr: *mut ffi::ibv_srq_attr,
) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live (caller).
    let s = unsafe { fsrq(srq) };
    // SAFETY: writable (caller).
    unsafe {
        *attr = ffi::ibv_srq_attr {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.limit.load(Ordering::Acquire),
        }
    };
    0
}

/// # Safety
/// An SRQ of this library with no QP left on it, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ffi::ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: allocated by leak() in ibv_create_srq.
    let s = unsafe { Box::from_raw(srq as *mut FSrq) };
    // SAFETY: the SRQ's context outlives it.
    unsafe { fctx(s.ibv.context) }
        .objects()
        .srqs
        .retain(|&x| x != srq as usize);
    let pd = s.pd;
    drop(s);
    // SAFETY: the PD outlives its SRQs.
    unsafe { (*pd).release() };
    0
}

/// The path an ibv_ah_attr with a GRH names (RoCE has no LID routing).
///
/// # Safety
/// `ctx` is a live context of this library.
pub unsafe fn path_of(ctx: *mut ffi::ibv_context, a: &ffi::ibv_ah_attr) -> Result<Path, c_int> {
    if a.is_global == 0 {
        // RoCE needs the GRH: the GID is the IP address.
        return Err(libc::EINVAL);
    }
    // SAFETY: live context (every handle records its own).
    let f = unsafe { fctx(ctx) };
    // SAFETY: raw view of the GID union.
    let dgid = std::net::Ipv6Addr::from(unsafe { a.grh.dgid.raw });
    let mut p = f
        .ctx
        .resolve_path(usize::from(a.grh.sgid_index), dgid)
        .map_err(|e| {
            eprintln!("ferroce libibverbs: {e}");
            errno_of(&e)
        })?;
    p.traffic_class = a.grh.traffic_class;
    // `a.grh.hop_limit` is not used: Linux replaces a unicast RoCE address's
    // hop limit with its route's (ib_resolve_unicast_gid_dmac), so rxe sends
    // TTL 64 for ibv_rc_pingpong, which asks for 1 (seen on the wire); the
    // path keeps ferroce's default, 64, the route's here.
    p.flow_label = a.grh.flow_label;
    Ok(p)
}

/// # Safety
/// Live PD and attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_ah_attr,
) -> *mut ffi::ibv_ah {
    if pd.is_null() || attr.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: live (caller).
    let (p, a) = unsafe { (fpd(pd), *attr) };
    // SAFETY: every PD records its live context.
    let path = match unsafe { path_of(p.ibv.context, &a) } {
        Ok(x) => x,
        Err(e) => {
            set_errno(e);
            return ptr::null_mut();
        }
    };
    p.hold();
    leak(FAh {
        ibv: ffi::ibv_ah {
            context: p.ibv.context,
            pd,
            handle: 0,
        },
        path,
        attr: a,
        pd: p,
    }) as *mut ffi::ibv_ah
}

/// # Safety
/// An AH of this library, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ffi::ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live AH (caller).
    let pd = unsafe { fah(ah) }.pd;
    // SAFETY: allocated by leak() in ibv_create_ah.
    drop(unsafe { Box::from_raw(ah as *mut FAh) });
    // SAFETY: the PD outlives its AHs.
    unsafe { (*pd).release() };
    0
}

/// The address of the sender of a UD receive, from the GRH area at the head
/// of the receive buffer: an IPv6 header, or twenty zero bytes and an IPv4
/// header (RoCE v2 over IPv4, as rxe fills it).
///
/// # Safety
/// Live context; `wc` readable; `grh` has 40 readable bytes if the WC has IBV_WC_GRH.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ffi::ibv_context,
    port: u8,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    ah: *mut ffi::ibv_ah_attr,
) -> c_int {
    if ctx.is_null() || wc.is_null() || ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: readable (caller).
    let w = unsafe { *wc };
    let mut a = ffi::ibv_ah_attr {
        dlid: w.slid,
        sl: w.sl,
        src_path_bits: w.dlid_path_bits,
        port_num: port,
        ..Default::default()
    };
    if w.wc_flags & ffi::IBV_WC_GRH != 0 {
        if grh.is_null() {
            return libc::EINVAL;
        }
        let mut g = [0u8; ferroce_verbs::wc::GRH_LEN];
        // SAFETY: the GRH area is 40 bytes (caller).
        unsafe { ptr::copy_nonoverlapping(grh as *const u8, g.as_mut_ptr(), g.len()) };
        let from = ferroce_verbs::wc::GrhInfo::parse(&g);
        // SAFETY: live context (caller).
        let f = unsafe { fctx(ctx) };
        let sgid_index = f
            .ctx
            .gids()
            .iter()
            .position(|x| *x == from.dst)
            .unwrap_or(0);
        a.is_global = 1;
        a.grh = ffi::ibv_global_route {
            dgid: ffi::ibv_gid {
                raw: from.src.octets(),
            },
            flow_label: 0,
            sgid_index: sgid_index as u8,
            hop_limit: from.hop_limit.max(1),
            traffic_class: from.traffic_class,
        };
    }
    // SAFETY: writable (caller).
    unsafe { *ah = a };
    0
}

/// # Safety
/// As ibv_init_ah_from_wc and ibv_create_ah.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ffi::ibv_pd,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    port: u8,
) -> *mut ffi::ibv_ah {
    if pd.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let mut a = ffi::ibv_ah_attr::default();
    // SAFETY: forwarded contract; live PD.
    let r = unsafe { ibv_init_ah_from_wc(fpd(pd).ibv.context, port, wc, grh, &mut a) };
    if r != 0 {
        set_errno(r);
        return ptr::null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe { ibv_create_ah(pd, &mut a) }
}
