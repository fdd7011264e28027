//! librdmacm's synchronous API: `rdma_create_ep` makes an ID without a
//! channel (each call waits for its event), bound or resolved from an
//! `rdma_getaddrinfo` result; `rdma_get_request` takes a listener's next
//! request as such an ID.

use std::ffi::c_int;
use std::ptr;

use super::channel::{self, Channel};
use super::id::{
    get, make_sync, rdma_bind_addr, rdma_create_id, rdma_destroy_id, rdma_resolve_addr,
    rdma_resolve_route,
};
use super::qp::{rdma_create_qp, rdma_destroy_qp, rdma_destroy_srq};
use super::{fail, id_arc};
use crate::ffi;

/// rdma_get_request: the next connection request of a synchronous
/// listener, as a synchronous ID with the listener's QP attributes (from
/// rdma_create_ep) already applied.
///
/// # Safety
/// `listen` is live; `id` writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut ffi::rdma_cm_id,
    id: *mut *mut ffi::rdma_cm_id,
) -> c_int {
    let l = match get(listen) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let ch = match &l.state().own_channel {
        Some(ch) => &**ch as *const Channel,
        None => return fail(libc::EINVAL),
    };
    // SAFETY: the listener's own channel lives as long as it.
    let ev = match unsafe { &*ch }.pop() {
        Ok(ev) => ev,
        Err(e) => return fail(e),
    };
    if ev.c.event != ffi::RDMA_CM_EVENT_CONNECT_REQUEST {
        // SAFETY: a boxed event of this library.
        unsafe { channel::rdma_ack_cm_event(Box::into_raw(ev) as *mut ffi::rdma_cm_event) };
        return fail(libc::EINVAL);
    }
    let new = ev.c.id;
    // The request's new ID, live until the program destroys it.
    let Some(child) = id_arc(new) else {
        return fail(libc::EINVAL);
    };
    if let Err(e) = make_sync(&child) {
        return fail(e);
    }
    let (qp_init, pd) = {
        let st = l.state();
        // SAFETY: `st` held: the listener's PD field.
        (st.qp_init, unsafe { (*l.c()).pd })
    };
    if let Some(mut attr) = qp_init {
        // SAFETY: the new ID; the listener's PD (or NULL: the device's).
        if unsafe { rdma_create_qp(new, pd, &mut attr) } != 0 {
            return -1;
        }
    }
    // SAFETY: the caller's out pointer; the event stays with the new ID
    // until its next call acknowledges it.
    unsafe {
        (*new).event = Box::into_raw(ev) as *mut ffi::rdma_cm_event;
        *id = new;
    }
    0
}

/// rdma_create_ep: a synchronous ID for `res` — bound and ready to listen
/// (RAI_PASSIVE), or resolved towards its destination — with a QP when
/// `qp_init_attr` is given (a passive ID keeps it for rdma_get_request).
///
/// # Safety
/// `id` writable; `res` readable; `pd` NULL or live; `qp_init_attr` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut ffi::rdma_cm_id,
    res: *mut ffi::rdma_addrinfo,
    pd: *mut ffi::ibv_pd,
    qp_init_attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: as the caller guarantees.
    let Some(r) = (unsafe { res.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    let ps = if r.ai_port_space != 0 {
        r.ai_port_space as ffi::rdma_port_space
    } else {
        ffi::RDMA_PS_TCP
    };
    let mut new: *mut ffi::rdma_cm_id = ptr::null_mut();
    // SAFETY: our own out pointer.
    if unsafe { rdma_create_id(ptr::null_mut(), &mut new, ptr::null_mut(), ps) } != 0 {
        return -1;
    }
    let passive = r.ai_flags & ffi::RAI_PASSIVE as c_int != 0;
    // SAFETY: the new ID; the addresses of `res`.
    let rc = unsafe {
        if passive {
            rdma_bind_addr(new, r.ai_src_addr)
        } else {
            match rdma_resolve_addr(new, r.ai_src_addr, r.ai_dst_addr, 2000) {
                0 => rdma_resolve_route(new, 2000),
                e => e,
            }
        }
    };
    if rc != 0 {
        // SAFETY: the new ID, not handed out.
        unsafe { rdma_destroy_id(new) };
        return -1;
    }
    let Some(me) = id_arc(new) else {
        return fail(libc::EINVAL);
    };
    if !pd.is_null() {
        let _st = me.state();
        // SAFETY: `st` held.
        unsafe { (*me.c()).pd = pd };
    }
    // SAFETY: as the caller guarantees.
    if let Some(attr) = unsafe { qp_init_attr.as_mut() } {
        // librdmacm takes the QP type from the address info.
        if r.ai_qp_type != 0 {
            attr.qp_type = r.ai_qp_type as ffi::ibv_qp_type;
        }
        if passive {
            me.state().qp_init = Some(*attr);
        } else if
        // SAFETY: the new ID; the caller's attributes.
        unsafe { rdma_create_qp(new, pd, attr) } != 0 {
            // SAFETY: the new ID, not handed out.
            unsafe { rdma_destroy_id(new) };
            return -1;
        }
    }
    // SAFETY: the caller's out pointer.
    unsafe { *id = new };
    0
}

/// rdma_destroy_ep: the ID's QP (and CQs made for it), then the ID.
///
/// # Safety
/// `id` is live and not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut ffi::rdma_cm_id) {
    // SAFETY: as the caller guarantees.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    }
}
