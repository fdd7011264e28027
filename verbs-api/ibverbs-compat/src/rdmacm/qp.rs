//! rdma_cm's QP and SRQ helpers: `rdma_create_qp` and friends make the
//! ibverbs objects of an ID on its device, as librdmacm does.

use std::ffi::{c_int, c_void};
use std::ptr;

use ferroce_verbs::cm;
use ferroce_verbs::ConnectOptions;

use super::device::{ah_attr_of, CmDevice};
use super::id::{get, me_ps};
use super::{fail, CmId, Dial, DialKind, Pending};
use crate::ffi;
use crate::handles::{errno_of, fctx, fqp};

/// librdmacm's `ucma_create_cqs`: a completion channel and CQ for each
/// queue the attributes leave without one.
unsafe fn make_cqs(
    me: &CmId,
    verbs: *mut ffi::ibv_context,
    attr: &mut ffi::ibv_qp_init_attr,
) -> Result<bool, c_int> {
    let c = me.c();
    let mut made = false;
    // SAFETY: `st` is held by the caller; the context is live.
    unsafe {
        if attr.recv_cq.is_null() {
            let ch = crate::channel::ibv_create_comp_channel(verbs);
            let cq = crate::resources::ibv_create_cq(
                verbs,
                attr.cap.max_recv_wr.max(1) as c_int,
                c as *mut c_void,
                ch,
                0,
            );
            if ch.is_null() || cq.is_null() {
                return Err(libc::ENOMEM);
            }
            (*c).recv_cq_channel = ch;
            (*c).recv_cq = cq;
            attr.recv_cq = cq;
            made = true;
        }
        if attr.send_cq.is_null() {
            let ch = crate::channel::ibv_create_comp_channel(verbs);
            let cq = crate::resources::ibv_create_cq(
                verbs,
                attr.cap.max_send_wr.max(1) as c_int,
                c as *mut c_void,
                ch,
                0,
            );
            if ch.is_null() || cq.is_null() {
                return Err(libc::ENOMEM);
            }
            (*c).send_cq_channel = ch;
            (*c).send_cq = cq;
            attr.send_cq = cq;
            made = true;
        }
    }
    Ok(made)
}

/// Puts a new QP where rdma_cm keeps it: RC and UC at INIT, UD of the UDP
/// port space at RTS with rdma_cm's Q_Key (librdmacm's ucma_init_conn_qp /
/// ucma_init_ud_qp).
fn init_qp(me: &CmId, dev: &CmDevice, qp: *mut ffi::ibv_qp) -> Result<(), c_int> {
    // SAFETY: a QP of this library, just made.
    let fq = unsafe { fqp(qp) };
    // SAFETY: a context of this library.
    let f = unsafe { fctx(dev.verbs) };
    let r = match fq.qp.qp_type() {
        ferroce_verbs::QpType::Ud if me_ps(me) == ffi::RDMA_PS_UDP => {
            let st = me.state();
            let sgid_index = st.src.map_or(0, |s| {
                cm::source_gid_index(&f.ctx, 0, ferroce_verbs::context::gid_of(s.ip()))
            });
            cm::init_ud_qp(
                &f.ctx,
                &fq.qp,
                &ConnectOptions {
                    sgid_index,
                    ..ConnectOptions::default()
                },
            )
        }
        ferroce_verbs::QpType::Ud => Ok(()),
        // No remote access until a connection grants it (cma.c, cma_ib_init_qp_attr).
        _ => fq.qp.to_init(&ConnectOptions {
            access: ferroce_verbs::AccessFlags::NONE,
            ..ConnectOptions::default()
        }),
    };
    r.map_err(|e| errno_of(&e))
}

/// rdma_create_qp: a QP for the ID on its device (PD: `pd`, else the ID's,
/// else the device's), with CQs made for the queues `attr` leaves without.
///
/// # Safety
/// `id` is live; `pd` NULL or live; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    // SAFETY: as the caller guarantees.
    let Some(attr) = (unsafe { attr.as_mut() }) else {
        return fail(libc::EINVAL);
    };
    let mut st = me.state();
    let Some(dev) = st.dev else {
        return fail(libc::EINVAL);
    };
    let c = me.c();
    // SAFETY: `st` held: the C struct is ours to read and write.
    unsafe {
        if !(*c).qp.is_null() {
            return fail(libc::EINVAL);
        }
        let pd = if !pd.is_null() {
            pd
        } else if !(*c).pd.is_null() {
            (*c).pd
        } else {
            dev.default_pd()
        };
        match make_cqs(&me, dev.verbs, attr) {
            Ok(made) => st.made_cqs |= made,
            Err(e) => return fail(e),
        }
        let qp = crate::qp::ibv_create_qp(pd, attr);
        if qp.is_null() {
            return -1;
        }
        drop(st);
        if let Err(e) = init_qp(&me, dev, qp) {
            crate::qp::ibv_destroy_qp(qp);
            return fail(e);
        }
        let _st = me.state();
        (*c).qp = qp;
        (*c).pd = pd;
    }
    0
}

/// rdma_create_qp_ex: as [`rdma_create_qp`], with the attributes' PD.
///
/// # Safety
/// `id` is live; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::ibv_qp_init_attr_ex,
) -> c_int {
    // SAFETY: as the caller guarantees.
    let Some(a) = (unsafe { attr.as_mut() }) else {
        return fail(libc::EINVAL);
    };
    let mut basic = ffi::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    let pd = if a.comp_mask & ffi::IBV_QP_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        ptr::null_mut()
    };
    // SAFETY: as the caller guarantees.
    let r = unsafe { rdma_create_qp(id, pd, &mut basic) };
    a.send_cq = basic.send_cq;
    a.recv_cq = basic.recv_cq;
    a.cap = basic.cap;
    r
}

/// rdma_destroy_qp: the ID's QP, and the CQs rdma_create_qp made for it.
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut ffi::rdma_cm_id) {
    let Ok(me) = get(id) else {
        return;
    };
    let mut st = me.state();
    let c = me.c();
    // SAFETY: `st` held; the objects are this library's and the ID's.
    unsafe {
        if !(*c).qp.is_null() {
            crate::qp::ibv_destroy_qp((*c).qp);
            (*c).qp = ptr::null_mut();
        }
        if st.made_cqs {
            st.made_cqs = false;
            for (cq, ch) in [
                (&mut (*c).send_cq, &mut (*c).send_cq_channel),
                (&mut (*c).recv_cq, &mut (*c).recv_cq_channel),
            ] {
                if !cq.is_null() {
                    crate::resources::ibv_destroy_cq(*cq);
                    *cq = ptr::null_mut();
                }
                if !ch.is_null() {
                    crate::channel::ibv_destroy_comp_channel(*ch);
                    *ch = ptr::null_mut();
                }
            }
        }
    }
}

/// rdma_create_srq: an SRQ for the ID (PD as for rdma_create_qp).
///
/// # Safety
/// `id` is live; `pd` NULL or live; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_srq_init_attr,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let st = me.state();
    let Some(dev) = st.dev else {
        return fail(libc::EINVAL);
    };
    let c = me.c();
    // SAFETY: `st` held; objects of this library.
    unsafe {
        let pd = if !pd.is_null() {
            pd
        } else if !(*c).pd.is_null() {
            (*c).pd
        } else {
            dev.default_pd()
        };
        let srq = crate::resources::ibv_create_srq(pd, attr);
        if srq.is_null() {
            return -1;
        }
        (*c).srq = srq;
        (*c).pd = pd;
    }
    0
}

/// rdma_create_srq_ex: as [`rdma_create_srq`] (basic SRQs).
///
/// # Safety
/// `id` is live; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::ibv_srq_init_attr_ex,
) -> c_int {
    // SAFETY: as the caller guarantees.
    let Some(a) = (unsafe { attr.as_mut() }) else {
        return fail(libc::EINVAL);
    };
    let mut basic = ffi::ibv_srq_init_attr {
        srq_context: a.srq_context,
        attr: a.attr,
    };
    let pd = if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        ptr::null_mut()
    };
    // SAFETY: as the caller guarantees.
    let r = unsafe { rdma_create_srq(id, pd, &mut basic) };
    a.attr = basic.attr;
    r
}

/// rdma_destroy_srq.
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut ffi::rdma_cm_id) {
    let Ok(me) = get(id) else {
        return;
    };
    let _st = me.state();
    // SAFETY: `st` held; the ID's SRQ.
    unsafe {
        let c = me.c();
        if !(*c).srq.is_null() {
            crate::resources::ibv_destroy_srq((*c).srq);
            (*c).srq = ptr::null_mut();
        }
    }
}

/// rdma_init_qp_attr: the attributes that move a QP its program manages to
/// `qp_attr->qp_state` for this ID's connection, with their mask: INIT
/// (P_Key index, port, access; UD: rdma_cm's Q_Key), RTR and RTS (the
/// terms the agent applies to QPs it moves itself: path, MTU, the peer's
/// QPN, both PSNs, READ depths, time-outs). RTR and RTS need the
/// connection's request (passive side) or the peer's REP (active side,
/// after CONNECT_RESPONSE).
///
/// # Safety
/// `id` is live; `qp_attr` and `qp_attr_mask` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut ffi::rdma_cm_id,
    qp_attr: *mut ffi::ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    // SAFETY: as the caller guarantees.
    let (Some(attr), Some(mask)) = (unsafe { qp_attr.as_mut() }, unsafe {
        qp_attr_mask.as_mut()
    }) else {
        return fail(libc::EINVAL);
    };
    let st = me.state();
    let Some(dev) = st.dev else {
        return fail(libc::EINVAL);
    };
    let ud = me_ps(&me) == ffi::RDMA_PS_UDP;
    let state = attr.qp_state;
    let mut m = ffi::IBV_QP_STATE;
    match state {
        ffi::IBV_QPS_INIT => {
            attr.pkey_index = 0;
            attr.port_num = 1;
            m |= ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT;
            if ud {
                attr.qkey = cm::RDMA_UDP_QKEY;
                m |= ffi::IBV_QP_QKEY;
            } else {
                // The kernel's: nothing before a connection is on the way (cma.c,
                // cma_ib_init_qp_attr), then what the peer's initiator depth allows.
                let depth = match (&st.request, &st.reply, &st.dial) {
                    (Some(Pending::Rc(req)), _, _) => Some(req.offer.initiator_depth),
                    (_, Some(rep), _) => Some(rep.initiator_depth),
                    // REQ sent, no REP yet: the kernel's CM holds our own responder resources.
                    (
                        _,
                        _,
                        Some(Dial {
                            kind: DialKind::Rc { param, .. },
                            ..
                        }),
                    ) => Some(param.responder_resources),
                    _ => None,
                };
                attr.qp_access_flags = depth.map_or(0, |d| cm::connected_access(d).0);
                m |= ffi::IBV_QP_ACCESS_FLAGS;
            }
        }
        ffi::IBV_QPS_RTR | ffi::IBV_QPS_RTS if ud => {
            attr.sq_psn = 0;
            if state == ffi::IBV_QPS_RTS {
                m |= ffi::IBV_QP_SQ_PSN;
            }
        }
        ffi::IBV_QPS_RTR | ffi::IBV_QPS_RTS => {
            let a = dev.agent();
            let terms = match (&st.request, st.comm_id, &st.reply) {
                (Some(Pending::Rc(req)), _, _) => {
                    let param = cm::ConnParam {
                        traffic_class: st.tos,
                        ack_timeout: st
                            .ack_timeout
                            .unwrap_or(cm::ConnParam::default().ack_timeout),
                        ..cm::ConnParam::default()
                    };
                    Ok(a.accept_terms(req, &param))
                }
                (_, Some(cid), Some(rep)) => a.connect_terms(cid, rep),
                _ => return fail(libc::EINVAL),
            };
            let (opts, remote) = match terms {
                Ok(t) => t,
                Err(e) => return fail(errno_of(&e)),
            };
            if state == ffi::IBV_QPS_RTR {
                attr.ah_attr = ah_attr_of(&opts, remote.gid);
                attr.path_mtu = crate::devices::mtu_enum(opts.path_mtu);
                attr.dest_qp_num = remote.qpn;
                attr.rq_psn = remote.psn;
                attr.max_dest_rd_atomic = opts.max_dest_rd_atomic;
                attr.min_rnr_timer = opts.min_rnr_timer;
                m |= ffi::IBV_QP_AV
                    | ffi::IBV_QP_PATH_MTU
                    | ffi::IBV_QP_DEST_QPN
                    | ffi::IBV_QP_RQ_PSN
                    | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                    | ffi::IBV_QP_MIN_RNR_TIMER;
            } else {
                attr.sq_psn = opts.local_psn;
                attr.timeout = opts.timeout;
                attr.retry_cnt = opts.retry_cnt;
                attr.rnr_retry = opts.rnr_retry;
                attr.max_rd_atomic = opts.max_rd_atomic;
                m |= ffi::IBV_QP_SQ_PSN
                    | ffi::IBV_QP_TIMEOUT
                    | ffi::IBV_QP_RETRY_CNT
                    | ffi::IBV_QP_RNR_RETRY
                    | ffi::IBV_QP_MAX_QP_RD_ATOMIC;
            }
        }
        _ => return fail(libc::EINVAL),
    }
    *mask = m as c_int;
    0
}
