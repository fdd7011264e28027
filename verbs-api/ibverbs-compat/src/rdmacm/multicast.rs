//! rdma_cm's multicast joins over RoCE v2: local (no MAD), the QP attached
//! to the group's MGID unless send-only, the device joined to the IP group.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;

use ferroce_verbs::multicast::{self, JoinKind};

use super::addr::{self, from_c};
use super::channel::Event;
use super::fail;
use super::id::{bind, complete, done, get, me_ps};
use crate::ffi;
use crate::handles::{errno_of, fqp};

/// rdma_join_multicast_ex: joins the ID's UD QP to a group (attached
/// unless send-only; the device joins the IP group); MULTICAST_JOIN follows
/// with the group's address handle, QPN 0xFFFFFF and rdma_cm's Q_Key, and
/// `context` as its private data, as librdmacm reports it.
///
/// # Safety
/// `id` is live; `attr` readable with a readable address.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    // SAFETY: as the caller guarantees.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    if a.comp_mask & ffi::RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 {
        return fail(libc::EINVAL);
    }
    let kind = if a.comp_mask & ffi::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS != 0 {
        match a.join_flags {
            ffi::RDMA_MC_JOIN_FLAG_FULLMEMBER => JoinKind::FullMember,
            ffi::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => JoinKind::SendOnlyFullMember,
            _ => return fail(libc::EINVAL),
        }
    } else {
        JoinKind::FullMember
    };
    // SAFETY: as the caller guarantees.
    let Some(group) = (unsafe { from_c(a.addr as *const libc::sockaddr) }) else {
        return fail(libc::EINVAL);
    };
    if me_ps(&me) != ffi::RDMA_PS_UDP {
        return fail(libc::EINVAL);
    }
    let (dev, joined) = {
        let mut st = me.state();
        if st.dev.is_none() {
            // Not bound: the group's route picks the device (librdmacm resolves it).
            drop(st);
            let src = match addr::route_source(group.ip()) {
                Ok(s) => s,
                Err(_) => return fail(libc::ENODEV),
            };
            if let Err(e) = bind(&me, SocketAddr::new(src, 0)) {
                return fail(e);
            }
            st = me.state();
        }
        let Some(dev) = st.dev else {
            return fail(libc::ENODEV);
        };
        // SAFETY: the ID's QP, if any, is live.
        let qp = unsafe { (*me.c()).qp };
        if qp.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a QP of this library.
        let fq = unsafe { fqp(qp) };
        match multicast::join(&fq.qp, group.ip(), kind) {
            Ok(j) => {
                st.groups.push(j);
                (dev, j)
            }
            Err(e) => return fail(errno_of(&e)),
        }
    };
    let ud = ffi::rdma_ud_param {
        ah_attr: dev.ah_attr(&me, joined.mgid, joined.hop_limit),
        qp_num: joined.qpn,
        qkey: joined.qkey,
        ..Default::default()
    };
    let mut ev =
        Event::new(&me, me.handle(), ffi::RDMA_CM_EVENT_MULTICAST_JOIN, 0).with_ud(ud, &[]);
    // librdmacm hands the join's context back as the private data pointer.
    ev.c.param.ud.private_data = context;
    ev.c.param.ud.private_data_len = 0;
    me.report(ev);
    done(complete(&me))
}

/// rdma_join_multicast: a full-member join of `addr`.
///
/// # Safety
/// `id` is live; `addr` readable.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut ffi::rdma_cm_id,
    addr: *mut ffi::sockaddr,
    context: *mut c_void,
) -> c_int {
    let mut attr = ffi::rdma_cm_join_mc_attr_ex {
        comp_mask: ffi::RDMA_CM_JOIN_MC_ATTR_ADDRESS,
        join_flags: 0,
        addr,
    };
    // SAFETY: as the caller guarantees.
    unsafe { rdma_join_multicast_ex(id, &mut attr, context) }
}

/// rdma_leave_multicast: detaches the ID's QP from the group.
///
/// # Safety
/// `id` is live; `addr` readable.
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    id: *mut ffi::rdma_cm_id,
    addr: *mut ffi::sockaddr,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    // SAFETY: as the caller guarantees.
    let Some(group) = (unsafe { from_c(addr as *const libc::sockaddr) }) else {
        return fail(libc::EINVAL);
    };
    let mut st = me.state();
    let Some(i) = st.groups.iter().position(|j| j.group == group.ip()) else {
        return fail(libc::EADDRNOTAVAIL);
    };
    let joined = st.groups.remove(i);
    // SAFETY: the ID's QP, if any, is live.
    let qp = unsafe { (*me.c()).qp };
    if qp.is_null() {
        return 0;
    }
    // SAFETY: a QP of this library.
    match multicast::leave(&unsafe { fqp(qp) }.qp, &joined) {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}
