//! The work-request builder API of ibv_qp_ex (`ibv_wr_start`,
//! `ibv_wr_rdma_write`, `ibv_wr_set_sge`, ..., `ibv_wr_complete`), which
//! perftest uses by default. Requests are collected between start and
//! complete and posted as one batch.
//!
//! Between `wr_start` and `wr_complete`/`wr_abort` the QP's builder is owned
//! by the calling thread (a flag taken in `wr_start`, as rdma-core providers
//! take their send-queue lock there).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use ferroce_stack::transport::{QpType, SendOp, SendWr, Sge, UdDest};

use crate::datapath::BATCH;
use crate::ffi;
use crate::handles::{errno_of, fah};

#[derive(Debug, Clone, Copy)]
struct Pending {
    wr_id: u64,
    op: SendOp,
    flags: u32,
    sges: (usize, usize),
    inline: Option<(usize, usize)>,
    ud: Option<UdDest>,
}

#[derive(Debug, Default)]
struct State {
    wrs: Vec<Pending>,
    sges: Vec<Sge>,
    inline: Vec<u8>,
    /// The first error of this batch (a bad argument), reported by wr_complete.
    error: c_int,
}

/// The per-QP builder (buffers keep their capacity, so no allocation once warm).
#[derive(Debug, Default)]
pub struct WrBuilder {
    busy: AtomicBool,
    state: UnsafeCell<State>,
}

pub fn fill_ops(q: &mut ffi::ibv_qp_ex) {
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
}

/// The QP object and its builder state for the thread inside start..complete.
///
/// # Safety
/// A live QP of this library whose builder this thread holds (wr_start).
#[allow(clippy::mut_from_ref)]
unsafe fn parts<'a>(q: *mut ffi::ibv_qp_ex) -> (&'a crate::handles::FQp, &'a mut State) {
    // SAFETY: the ibv_qp_ex heads the FQp; live (contract).
    let f = unsafe { &*(q as *const crate::handles::FQp) };
    // SAFETY: only the thread that took `busy` in wr_start gets here.
    let s = unsafe { &mut *f.builder.state.get() };
    (f, s)
}

unsafe extern "C" fn wr_start(q: *mut ffi::ibv_qp_ex) {
    // SAFETY: live QP (contract).
    let f = unsafe { &*(q as *const crate::handles::FQp) };
    while f
        .builder
        .busy
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    // SAFETY: taken just now.
    let (_, s) = unsafe { parts(q) };
    s.wrs.clear();
    s.sges.clear();
    s.inline.clear();
    s.error = 0;
}

fn release(f: &crate::handles::FQp) {
    f.builder.busy.store(false, Ordering::Release);
}

unsafe extern "C" fn wr_abort(q: *mut ffi::ibv_qp_ex) {
    // SAFETY: held since wr_start (contract).
    let (f, s) = unsafe { parts(q) };
    s.wrs.clear();
    release(f);
}

unsafe extern "C" fn wr_complete(q: *mut ffi::ibv_qp_ex) -> c_int {
    // SAFETY: held since wr_start (contract).
    let (f, s) = unsafe { parts(q) };
    let mut rc = s.error;
    if rc == 0 {
        for chunk in s.wrs.chunks(BATCH) {
            let mut wrs = [SendWr::new(0, SendOp::Send, &[]); BATCH];
            for (d, p) in wrs.iter_mut().zip(chunk) {
                let (a, k) = p.sges;
                let inline = p.inline.map_or(&[][..], |(a, k)| &s.inline[a..a + k]);
                *d = SendWr {
                    wr_id: p.wr_id,
                    op: p.op,
                    sg_list: &s.sges[a..a + k],
                    inline_data: inline,
                    flags: ferroce_stack::transport::SendFlags {
                        fence: p.flags & ffi::IBV_SEND_FENCE != 0,
                        signaled: p.flags & ffi::IBV_SEND_SIGNALED != 0,
                        solicited: p.flags & ffi::IBV_SEND_SOLICITED != 0,
                        inline: p.inline.is_some(),
                    },
                    ud: p.ud,
                };
            }
            if let (_, Err(e)) = f.qp.post_send_partial(&wrs[..chunk.len()]) {
                rc = match e {
                    ferroce_verbs::Error::Verbs(
                        ferroce_stack::transport::VerbsError::QueueFull,
                    ) => libc::ENOMEM,
                    other => errno_of(&other),
                };
                break;
            }
        }
    }
    s.wrs.clear();
    release(f);
    rc
}

/// Start a new WR with the QP's current wr_id and wr_flags.
unsafe fn push(q: *mut ffi::ibv_qp_ex, op: SendOp) {
    // SAFETY: held since wr_start (contract).
    let (f, s) = unsafe { parts(q) };
    let start = s.sges.len();
    s.wrs.push(Pending {
        wr_id: f.ibv.wr_id,
        op,
        flags: f.ibv.wr_flags,
        sges: (start, 0),
        inline: None,
        ud: None,
    });
}

unsafe extern "C" fn wr_send(q: *mut ffi::ibv_qp_ex) {
    // SAFETY: contract of the builder API.
    unsafe { push(q, SendOp::Send) }
}
unsafe extern "C" fn wr_send_imm(q: *mut ffi::ibv_qp_ex, imm: u32) {
    let imm = u32::from_be(imm);
    // SAFETY: contract of the builder API.
    unsafe { push(q, SendOp::SendWithImm { imm }) }
}
unsafe extern "C" fn wr_send_inv(q: *mut ffi::ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: contract of the builder API.
    unsafe { push(q, SendOp::SendWithInv { invalidate_rkey }) }
}
unsafe extern "C" fn wr_rdma_write(q: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: contract of the builder API.
    unsafe { push(q, SendOp::RdmaWrite { remote_addr, rkey }) }
}
unsafe extern "C" fn wr_rdma_write_imm(
    q: *mut ffi::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: u32,
) {
    let imm = u32::from_be(imm);
    // SAFETY: contract of the builder API.
    unsafe {
        push(
            q,
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
        )
    }
}
unsafe extern "C" fn wr_rdma_read(q: *mut ffi::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: contract of the builder API.
    unsafe { push(q, SendOp::RdmaRead { remote_addr, rkey }) }
}
unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ffi::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: contract of the builder API.
    unsafe {
        push(
            q,
            SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            },
        )
    }
}
unsafe extern "C" fn wr_atomic_fetch_add(
    q: *mut ffi::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: contract of the builder API.
    unsafe {
        push(
            q,
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            },
        )
    }
}

unsafe extern "C" fn wr_set_sge(q: *mut ffi::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: held since wr_start (contract).
    let (_, s) = unsafe { parts(q) };
    let start = s.sges.len();
    s.sges.push(Sge { addr, length, lkey });
    match s.wrs.last_mut() {
        Some(w) => w.sges = (start, 1),
        None => s.error = libc::EINVAL,
    }
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ffi::ibv_qp_ex, n: usize, list: *const ffi::ibv_sge) {
    // SAFETY: held since wr_start (contract).
    let (_, s) = unsafe { parts(q) };
    let start = s.sges.len();
    if n > 0 && !list.is_null() {
        // SAFETY: n readable entries (contract).
        let l = unsafe { std::slice::from_raw_parts(list, n) };
        s.sges.extend(l.iter().map(|g| Sge {
            addr: g.addr,
            length: g.length,
            lkey: g.lkey,
        }));
    }
    match s.wrs.last_mut() {
        Some(w) => w.sges = (start, s.sges.len() - start),
        None => s.error = libc::EINVAL,
    }
}

unsafe fn add_inline(q: *mut ffi::ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    // SAFETY: held since wr_start (contract).
    let (_, s) = unsafe { parts(q) };
    let start = s.inline.len();
    for &(p, n) in bufs {
        if n > 0 && !p.is_null() {
            // SAFETY: the application's buffer, readable now (inline data
            // is copied when it is set).
            s.inline
                .extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
        }
    }
    match s.wrs.last_mut() {
        Some(w) => w.inline = Some((start, s.inline.len() - start)),
        None => s.error = libc::EINVAL,
    }
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ffi::ibv_qp_ex, addr: *mut c_void, len: usize) {
    // SAFETY: contract of the builder API.
    unsafe { add_inline(q, &[(addr as *const u8, len)]) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ffi::ibv_qp_ex,
    n: usize,
    list: *const ffi::ibv_data_buf,
) {
    let l: &[ffi::ibv_data_buf] = if n == 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: n readable entries (contract).
        unsafe { std::slice::from_raw_parts(list, n) }
    };
    let bufs: Vec<(*const u8, usize)> = l.iter().map(|b| (b.addr as *const u8, b.length)).collect();
    // SAFETY: contract of the builder API.
    unsafe { add_inline(q, &bufs) }
}

unsafe extern "C" fn wr_set_ud_addr(
    q: *mut ffi::ibv_qp_ex,
    ah: *mut ffi::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: held since wr_start (contract).
    let (f, s) = unsafe { parts(q) };
    if ah.is_null() || f.qp_type != QpType::Ud {
        s.error = libc::EINVAL;
        return;
    }
    // SAFETY: a live AH of this library (contract).
    let path = unsafe { fah(ah) }.path;
    match s.wrs.last_mut() {
        Some(w) => {
            w.ud = Some(UdDest {
                path,
                remote_qpn,
                remote_qkey,
            })
        }
        None => s.error = libc::EINVAL,
    }
}
