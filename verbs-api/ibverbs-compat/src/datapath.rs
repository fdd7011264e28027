//! The fast path: the functions of the context's ops table that the inline
//! `ibv_post_send` / `ibv_post_recv` / `ibv_poll_cq` / `ibv_req_notify_cq` /
//! `ibv_post_srq_recv` of verbs.h call. Work requests are translated on the
//! stack (no allocation, no payload copy) and handed to ferroce-verbs, which
//! takes its device lock once per batch.

use std::ffi::{c_int, c_uint};
use std::ptr;
use std::sync::atomic::Ordering;

use ferroce_stack::transport::{
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcOpcode, WorkCompletion,
};

use crate::ffi;
use crate::handles::{errno_of, fah, fcq, fqp, fsrq};

/// Work requests handed to ferroce per call.
pub const BATCH: usize = 16;
/// Empty polls of a CQ in a row before `poll_cq` waits briefly for one.
const EMPTY_POLLS_BEFORE_WAIT: u32 = 32;
/// That wait: long enough to leave the CPU; it ends early on any frame
/// moved, so its length only counts when what the program waits for is not
/// a frame (UCX over UD alone, whose async thread handles the receives:
/// `tag_lat` median 225 µs with 200 here, 118-149 with 50, 2 rounds each;
/// `ib_send_lat` typical 33-34 against 35-37 µs, `ib_write_bw` 12.7-12.8
/// against 13.2-14.9 Gbit/s, the same CPU time: within noise).
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_micros(50);
/// Scatter/gather entries per batch.
const SGE_ROOM: usize = 64;

pub fn fill_ops(ops: &mut ffi::ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
}

/// The errno for a refused work request (ENOMEM for a full queue, as rdma-core providers).
fn post_errno(e: &ferroce_verbs::Error) -> c_int {
    match e {
        ferroce_verbs::Error::Verbs(ferroce_stack::transport::VerbsError::QueueFull) => {
            libc::ENOMEM
        }
        other => errno_of(other),
    }
}

fn send_flags(f: u32) -> SendFlags {
    SendFlags {
        fence: f & ffi::IBV_SEND_FENCE != 0,
        signaled: f & ffi::IBV_SEND_SIGNALED != 0,
        solicited: f & ffi::IBV_SEND_SOLICITED != 0,
        inline: f & ffi::IBV_SEND_INLINE != 0,
    }
}

fn op_of(w: &ffi::ibv_send_wr) -> Option<SendOp> {
    // SAFETY (for the union reads below): ibverbs names the union member
    // by the opcode; every member is plain integers.
    let rdma = unsafe { w.wr.rdma };
    let atomic = unsafe { w.wr.atomic };
    let imm = u32::from_be(unsafe { w.__bindgen_anon_1.imm_data });
    Some(match w.opcode {
        ffi::IBV_WR_SEND => SendOp::Send,
        ffi::IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        ffi::IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            invalidate_rkey: unsafe { w.__bindgen_anon_1.invalidate_rkey },
        },
        ffi::IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        ffi::IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        ffi::IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        ffi::IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpSwp {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        ffi::IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        _ => return None,
    })
}

/// The SGEs of a WR as ferroce's (same fields as ibv_sge).
///
/// # Safety
/// `list` has `n` readable entries.
unsafe fn sges_of(list: *const ffi::ibv_sge, n: c_int) -> impl Iterator<Item = Sge> {
    let n = usize::try_from(n).unwrap_or(0);
    let s: &[ffi::ibv_sge] = if n == 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: n readable entries (caller).
        unsafe { std::slice::from_raw_parts(list, n) }
    };
    s.iter().map(|g| Sge {
        addr: g.addr,
        length: g.length,
        lkey: g.lkey,
    })
}

/// The inline payload of a WR with at most one SGE, read in place.
///
/// # Safety
/// The SGE address is readable for its length (ibverbs contract).
unsafe fn inline_one<'a>(list: *const ffi::ibv_sge, n: c_int) -> &'a [u8] {
    if n < 1 || list.is_null() {
        return &[];
    }
    // SAFETY: one entry (caller).
    let one = unsafe { &*list };
    if one.length == 0 || one.addr == 0 {
        return &[];
    }
    // SAFETY: the application's buffer, valid during the call.
    unsafe { std::slice::from_raw_parts(one.addr as *const u8, one.length as usize) }
}

/// Gather the inline payload of a WR with several SGEs into `buf` (inline
/// data is copied at post time by definition).
///
/// # Safety
/// The SGE addresses are readable for their lengths (ibverbs contract).
unsafe fn inline_gather(list: *const ffi::ibv_sge, n: c_int, buf: &mut Vec<u8>) {
    let n = usize::try_from(n).unwrap_or(0);
    if n == 0 || list.is_null() {
        return;
    }
    // SAFETY: n entries (caller).
    for g in unsafe { std::slice::from_raw_parts(list, n) } {
        if g.length > 0 && g.addr != 0 {
            // SAFETY: as above.
            buf.extend_from_slice(unsafe {
                std::slice::from_raw_parts(g.addr as *const u8, g.length as usize)
            });
        }
    }
}

unsafe extern "C" fn post_send(
    qp: *mut ffi::ibv_qp,
    mut wr: *mut ffi::ibv_send_wr,
    bad: *mut *mut ffi::ibv_send_wr,
) -> c_int {
    // SAFETY: a live QP of this library (ibverbs contract).
    let q = unsafe { fqp(qp) };
    while !wr.is_null() {
        // Gathered multi-SGE inline data (a WR with it ends its batch).
        let mut gathered = Vec::new();
        let mut sges = [Sge::default(); SGE_ROOM];
        let mut spans = [(0usize, 0usize); BATCH];
        let mut heads = [ptr::null_mut::<ffi::ibv_send_wr>(); BATCH];
        let mut n = 0;
        let mut used = 0;
        // Pass 1: the SGEs of up to BATCH WRs into the stack array.
        let mut cur = wr;
        while !cur.is_null() && n < BATCH {
            // SAFETY: the application's WR list.
            let w = unsafe { &*cur };
            let k = usize::try_from(w.num_sge).unwrap_or(0);
            let inline = w.send_flags & ffi::IBV_SEND_INLINE != 0;
            if !inline && used + k > SGE_ROOM {
                if n == 0 {
                    // More SGEs than any QP takes.
                    // SAFETY: writable (contract).
                    unsafe { *bad = cur };
                    return libc::EINVAL;
                }
                break;
            }
            if !inline {
                // SAFETY: num_sge entries (contract).
                for (d, s) in sges[used..used + k]
                    .iter_mut()
                    .zip(unsafe { sges_of(w.sg_list, w.num_sge) })
                {
                    *d = s;
                }
                spans[n] = (used, k);
                used += k;
            }
            heads[n] = cur;
            n += 1;
            cur = w.next;
            if inline && k > 1 {
                // SAFETY: the application's buffers (contract).
                unsafe { inline_gather(w.sg_list, w.num_sge, &mut gathered) };
                break; // the gathered WR ends its batch (one buffer)
            }
        }
        // Pass 2: the WRs, borrowing the SGE array.
        let mut wrs = [SendWr::new(0, SendOp::Send, &[]); BATCH];
        for i in 0..n {
            // SAFETY: the application's WR.
            let w = unsafe { &*heads[i] };
            let Some(op) = op_of(w) else {
                let posted = if i > 0 {
                    q.qp.post_send_partial(&wrs[..i])
                } else {
                    (0, Ok(()))
                };
                // SAFETY: writable (contract).
                unsafe { *bad = heads[posted.0] };
                return match posted.1 {
                    Err(e) => post_errno(&e),
                    Ok(()) => libc::EINVAL,
                };
            };
            let flags = send_flags(w.send_flags);
            let ud = if q.qp_type == ferroce_stack::transport::QpType::Ud {
                // SAFETY: UD WRs carry the ud member (contract).
                let u = unsafe { w.wr.ud };
                if u.ah.is_null() {
                    // SAFETY: writable (contract).
                    unsafe { *bad = heads[i] };
                    return libc::EINVAL;
                }
                Some(UdDest {
                    // SAFETY: a live AH of this library.
                    path: unsafe { fah(u.ah) }.path,
                    remote_qpn: u.remote_qpn,
                    remote_qkey: u.remote_qkey,
                })
            } else {
                None
            };
            let (sg_list, inline_data): (&[Sge], &[u8]) = if flags.inline {
                // SAFETY: the application's inline buffers, valid during the call.
                if w.num_sge > 1 {
                    (&[], &gathered[..])
                } else {
                    // SAFETY: the application's inline buffer, valid during the call.
                    (&[], unsafe { inline_one(w.sg_list, w.num_sge) })
                }
            } else {
                let (a, k) = spans[i];
                (&sges[a..a + k], &[])
            };
            wrs[i] = SendWr {
                wr_id: w.wr_id,
                op,
                sg_list,
                inline_data,
                flags,
                ud,
            };
        }
        let (posted, r) = q.qp.post_send_partial(&wrs[..n]);
        if let Err(e) = r {
            // SAFETY: writable (contract).
            unsafe { *bad = heads[posted.min(n - 1)] };
            return post_errno(&e);
        }
        wr = cur;
    }
    0
}

/// Post a receive list through `post` in batches; `bad` gets the first refused.
///
/// # Safety
/// The application's WR list.
unsafe fn post_recv_list(
    mut wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
    post: impl Fn(&[RecvWr<'_>]) -> (usize, ferroce_verbs::Result<()>),
) -> c_int {
    while !wr.is_null() {
        let mut sges = [Sge::default(); SGE_ROOM];
        let mut spans = [(0usize, 0usize, 0u64); BATCH];
        let mut heads = [ptr::null_mut::<ffi::ibv_recv_wr>(); BATCH];
        let mut n = 0;
        let mut used = 0;
        let mut cur = wr;
        while !cur.is_null() && n < BATCH {
            // SAFETY: the application's WR list.
            let w = unsafe { &*cur };
            let k = usize::try_from(w.num_sge).unwrap_or(0);
            if used + k > SGE_ROOM {
                if n == 0 {
                    // SAFETY: writable (contract).
                    unsafe { *bad = cur };
                    return libc::EINVAL;
                }
                break;
            }
            // SAFETY: num_sge entries (contract).
            for (d, s) in sges[used..used + k]
                .iter_mut()
                .zip(unsafe { sges_of(w.sg_list, w.num_sge) })
            {
                *d = s;
            }
            spans[n] = (used, k, w.wr_id);
            heads[n] = cur;
            used += k;
            n += 1;
            cur = w.next;
        }
        let mut wrs = [RecvWr {
            wr_id: 0,
            sg_list: &[],
        }; BATCH];
        for (d, &(a, k, id)) in wrs.iter_mut().zip(spans.iter()).take(n) {
            *d = RecvWr {
                wr_id: id,
                sg_list: &sges[a..a + k],
            };
        }
        let (posted, r) = post(&wrs[..n]);
        if let Err(e) = r {
            // SAFETY: writable (contract).
            unsafe { *bad = heads[posted.min(n - 1)] };
            return post_errno(&e);
        }
        wr = cur;
    }
    0
}

unsafe extern "C" fn post_recv(
    qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: a live QP of this library (contract).
    let q = unsafe { fqp(qp) };
    // SAFETY: forwarded contract.
    unsafe { post_recv_list(wr, bad, |w| q.qp.post_recv_partial(w)) }
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ffi::ibv_srq,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: a live SRQ of this library (contract).
    let s = unsafe { fsrq(srq) };
    // SAFETY: forwarded contract.
    unsafe { post_recv_list(wr, bad, |w| s.srq.post_recv_partial(w)) }
}

/// `sl` of a UD receive over RoCE v2: there is no service level on Ethernet
/// (rxe reports 0), and `ibv_wc` has no field for the network header type,
/// so ConnectX (mlx5) providers report the RoCE packet type there: bit 3 set
/// for a UDP (RoCE v2) frame, bits 2:0 its L3 header, 2 IPv4 or 1 IPv6. UCX
/// before 1.18 reads the GRH area by it (openucx/ucx#6317, #10209), and with
/// 0 takes every IPv4 datagram's area for an IPv6 header and drops it.
const ROCE_V2_PKT: u8 = 0x8;
const ROCE_PKT_IPV4: u8 = 0x2;
const ROCE_PKT_IPV6: u8 = 0x1;

fn ud_sl(w: &WorkCompletion) -> u8 {
    match (w.grh, w.ipv4) {
        (false, _) => 0,
        (true, true) => ROCE_V2_PKT | ROCE_PKT_IPV4,
        (true, false) => ROCE_V2_PKT | ROCE_PKT_IPV6,
    }
}

/// ibv_wc from a ferroce completion.
pub fn to_ibv_wc(w: &WorkCompletion) -> ffi::ibv_wc {
    let mut flags = 0;
    let mut imm = ffi::ibv_wc__bindgen_ty_1 { imm_data: 0 };
    if let Some(i) = w.imm_data {
        flags |= ffi::IBV_WC_WITH_IMM;
        imm.imm_data = i.to_be();
    }
    if let Some(k) = w.invalidated_rkey {
        flags |= ffi::IBV_WC_WITH_INV;
        imm.invalidated_rkey = k;
    }
    if w.grh {
        flags |= ffi::IBV_WC_GRH;
    }
    ffi::ibv_wc {
        wr_id: w.wr_id,
        status: w.status as ffi::ibv_wc_status,
        opcode: match w.opcode {
            WcOpcode::Send => ffi::IBV_WC_SEND,
            WcOpcode::RdmaWrite => ffi::IBV_WC_RDMA_WRITE,
            WcOpcode::RdmaRead => ffi::IBV_WC_RDMA_READ,
            WcOpcode::CompSwap => ffi::IBV_WC_COMP_SWAP,
            WcOpcode::FetchAdd => ffi::IBV_WC_FETCH_ADD,
            WcOpcode::Recv => ffi::IBV_WC_RECV,
            WcOpcode::RecvRdmaWithImm => ffi::IBV_WC_RECV_RDMA_WITH_IMM,
        },
        vendor_err: 0,
        byte_len: w.byte_len,
        __bindgen_anon_1: imm,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: ud_sl(w),
        dlid_path_bits: 0,
    }
}

unsafe extern "C" fn poll_cq(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
    // SAFETY: a live CQ of this library (contract).
    let c = unsafe { fcq(cq) };
    let Ok(max) = usize::try_from(n) else {
        return -1;
    };
    let poll = || {
        c.cq.poll_each(max, |i, w| {
            // SAFETY: the caller's array has n > i entries.
            unsafe { wc.add(i).write(to_ibv_wc(w)) };
        })
    };
    let mut r = poll();
    if matches!(r, Ok(0)) && max > 0 {
        // Busy-polling applications (perftest) would otherwise only wait
        // for the engine thread: drive the engine from here when it is free,
        // else give the engine thread the CPU.
        if c.cq.try_progress() {
            r = poll();
        }
        if matches!(r, Ok(0)) {
            let empty = c.empty_polls.fetch_add(1, Ordering::Relaxed) + 1;
            // Not while a completion event waits on a channel: the program
            // has that to handle, and UCX over UD (its async thread missed
            // the event while the main thread held the lock, and the main
            // thread takes it after its progress call returns) spent two
            // idle waits a message there, 350 µs a tag_lat round trip.
            if empty >= EMPTY_POLLS_BEFORE_WAIT && !crate::channel::events_waiting() {
                // Still nothing after a run of empty polls: wait briefly on
                // the engine's progress so a spinning application leaves the
                // CPU to the engine. Woken by any frames moved, not only a
                // completion: the application may be polling memory a WRITE
                // lands in (UCX's put latency took 174 µs a message when
                // this waited for a completion).
                let _ = c.cq.wait_progress(IDLE_WAIT);
                r = poll();
            } else {
                std::thread::yield_now();
            }
        }
    }
    if matches!(r, Ok(k) if k > 0) {
        c.empty_polls.store(0, Ordering::Relaxed);
    }
    match r {
        Ok(k) => k as c_int,
        Err(e) => {
            eprintln!("ferroce libibverbs: poll_cq: {e}");
            -1
        }
    }
}

/// The extended polling API of ibv_cq_ex (`ibv_start_poll`, `ibv_next_poll`,
/// `ibv_wc_read_*`): one completion at a time through the same poll path.
pub fn fill_cq_ex_ops(c: &mut ffi::ibv_cq_ex) {
    c.start_poll = Some(cq_ex_start_poll);
    c.next_poll = Some(cq_ex_next_poll);
    c.end_poll = Some(cq_ex_end_poll);
    c.read_opcode = Some(cq_ex_read_opcode);
    c.read_vendor_err = Some(cq_ex_read_vendor_err);
    c.read_byte_len = Some(cq_ex_read_byte_len);
    c.read_imm_data = Some(cq_ex_read_imm_data);
    c.read_qp_num = Some(cq_ex_read_qp_num);
    c.read_src_qp = Some(cq_ex_read_src_qp);
    c.read_wc_flags = Some(cq_ex_read_wc_flags);
    c.read_slid = Some(cq_ex_read_zero_u32);
    c.read_sl = Some(cq_ex_read_sl);
    c.read_dlid_path_bits = Some(cq_ex_read_zero_u8);
}

/// The completion being read (between start_poll and end_poll).
///
/// # Safety
/// A live CQ of this library inside start_poll..end_poll on this thread.
unsafe fn current<'a>(cq: *mut ffi::ibv_cq_ex) -> &'a ffi::ibv_wc {
    // SAFETY: the ibv_cq_ex heads the FCq; only this thread reads it now.
    unsafe { &*(*(cq as *const crate::handles::FCq)).current.get() }
}

unsafe extern "C" fn cq_ex_next_poll(cq: *mut ffi::ibv_cq_ex) -> c_int {
    // SAFETY: the ibv_cq_ex heads the FCq (contract).
    let f = unsafe { &*(cq as *const crate::handles::FCq) };
    // SAFETY: the polling thread owns `current` (contract); the ibv_cq is the prefix.
    match unsafe { poll_cq(cq as *mut ffi::ibv_cq, 1, f.current.get()) } {
        1 => {
            // SAFETY: just written; the application reads status/wr_id from the struct.
            unsafe {
                let w = &*f.current.get();
                (*cq).status = w.status;
                (*cq).wr_id = w.wr_id;
            }
            0
        }
        0 => libc::ENOENT,
        _ => libc::EIO,
    }
}

unsafe extern "C" fn cq_ex_start_poll(
    cq: *mut ffi::ibv_cq_ex,
    _attr: *mut ffi::ibv_poll_cq_attr,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { cq_ex_next_poll(cq) }
}

unsafe extern "C" fn cq_ex_end_poll(_cq: *mut ffi::ibv_cq_ex) {}

unsafe extern "C" fn cq_ex_read_opcode(cq: *mut ffi::ibv_cq_ex) -> ffi::ibv_wc_opcode {
    // SAFETY: contract of the extended API.
    unsafe { current(cq) }.opcode
}
unsafe extern "C" fn cq_ex_read_vendor_err(_cq: *mut ffi::ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn cq_ex_read_byte_len(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: contract of the extended API.
    unsafe { current(cq) }.byte_len
}
unsafe extern "C" fn cq_ex_read_imm_data(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: contract of the extended API; the union is plain integers.
    unsafe { current(cq).__bindgen_anon_1.imm_data }
}
unsafe extern "C" fn cq_ex_read_qp_num(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: contract of the extended API.
    unsafe { current(cq) }.qp_num
}
unsafe extern "C" fn cq_ex_read_src_qp(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: contract of the extended API.
    unsafe { current(cq) }.src_qp
}
unsafe extern "C" fn cq_ex_read_wc_flags(cq: *mut ffi::ibv_cq_ex) -> c_uint {
    // SAFETY: contract of the extended API.
    unsafe { current(cq) }.wc_flags
}
unsafe extern "C" fn cq_ex_read_sl(cq: *mut ffi::ibv_cq_ex) -> u8 {
    // SAFETY: contract of the extended API.
    unsafe { current(cq) }.sl
}
/// RoCE has no LIDs or path bits.
unsafe extern "C" fn cq_ex_read_zero_u32(_cq: *mut ffi::ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn cq_ex_read_zero_u8(_cq: *mut ffi::ibv_cq_ex) -> u8 {
    0
}

unsafe extern "C" fn req_notify_cq(cq: *mut ffi::ibv_cq, _solicited_only: c_int) -> c_int {
    // Solicited-only arming fires on any completion: a spurious wake-up
    // the application handles by polling, never a missed one.
    // SAFETY: a live CQ of this library (contract).
    let c = unsafe { fcq(cq) };
    c.armed_at.store(c.cq.added(), Ordering::Release);
    c.armed.store(true, Ordering::Release);
    if !c.ibv.channel.is_null() {
        // SAFETY: the channel outlives its CQs.
        unsafe { crate::handles::fchannel(c.ibv.channel) }.ensure_notifier();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_stack::transport::WcStatus;

    #[test]
    fn immediate_data_keeps_its_wire_bytes() {
        let w = WorkCompletion {
            wr_id: 9,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 12,
            imm_data: Some(0x0102_0304),
            invalidated_rkey: None,
            qp_num: 17,
            src_qp: 0,
            grh: true,
            ipv4: false,
            solicited: false,
        };
        let c = to_ibv_wc(&w);
        assert_eq!(c.status, ffi::IBV_WC_REM_ACCESS_ERR);
        assert_eq!(c.opcode, ffi::IBV_WC_RECV_RDMA_WITH_IMM);
        // SAFETY: plain integers.
        let imm = unsafe { c.__bindgen_anon_1.imm_data };
        // __be32: the bytes in memory are the bytes on the wire (0x01020304 big-endian).
        assert_eq!(imm.to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(c.wc_flags, ffi::IBV_WC_WITH_IMM | ffi::IBV_WC_GRH);
        assert_eq!((c.wr_id, c.byte_len, c.qp_num), (9, 12, 17));
        // A UD receive's sl is its RoCE packet type, as mlx5 reports it.
        assert_eq!(c.sl, 0x9);
        assert_eq!(to_ibv_wc(&WorkCompletion { ipv4: true, ..w }).sl, 0xa);
        assert_eq!(to_ibv_wc(&WorkCompletion { grh: false, ..w }).sl, 0);
    }

    #[test]
    fn send_opcodes_map_to_ferroce_operations() {
        let mut w = ffi::ibv_send_wr {
            opcode: ffi::IBV_WR_RDMA_WRITE_WITH_IMM,
            ..Default::default()
        };
        w.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: 0x1000,
            rkey: 5,
        };
        w.__bindgen_anon_1.imm_data = u32::from_ne_bytes([1, 2, 3, 4]);
        assert_eq!(
            op_of(&w),
            Some(SendOp::RdmaWriteWithImm {
                remote_addr: 0x1000,
                rkey: 5,
                imm: 0x0102_0304
            })
        );
        w.opcode = ffi::IBV_WR_BIND_MW;
        assert_eq!(op_of(&w), None);
    }
}
