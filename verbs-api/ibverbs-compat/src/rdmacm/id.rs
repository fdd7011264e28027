//! The rdma_cm ID calls: creating and destroying IDs, addressing,
//! listening, connecting, accepting, rejecting, disconnecting, options.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferroce_verbs::cm::{self, ConnParam, REJ_CONSUMER_DEFINED};
use ferroce_verbs::multicast;
use ferroce_verbs::ConnectOptions;

use super::addr::{self, from_c};
use super::channel::{self, Channel, Event};
use super::device::{self, CmDevice};
use super::{fail, hand_out, id_arc, take_handle, CmId, Dial, DialKind, IdState, Pending};
use crate::ffi;
use crate::handles::{errno_of, fctx, fqp};

/// The ephemeral ports rdma_cm hands out (the kernel's local port range).
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

fn ephemeral_port() -> u16 {
    let n = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
    // 32768..61000 as ip_local_port_range's default, from a per-process start.
    32768
        + ((std::process::id() as u16)
            .wrapping_mul(7919)
            .wrapping_add(n))
            % 28232
}

/// The ID behind a handle, or EINVAL.
pub(super) fn get(id: *mut ffi::rdma_cm_id) -> Result<Arc<CmId>, c_int> {
    // NULL is never a live handle.
    id_arc(id).ok_or(libc::EINVAL)
}

pub(super) fn done(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// A new ID with `channel` (NULL: synchronous, with a channel of its own).
fn new_id(
    channel: *mut ffi::rdma_event_channel,
    context: *mut c_void,
    ps: ffi::rdma_port_space,
    qp_type: ffi::ibv_qp_type,
) -> Result<Arc<CmId>, c_int> {
    let c = ffi::rdma_cm_id {
        channel,
        context,
        ps,
        qp_type,
        // SAFETY: all-zero bytes are a valid route (no addresses yet).
        route: unsafe { std::mem::zeroed() },
        ..Default::default()
    };
    let id = CmId::new(c);
    if channel.is_null() {
        make_sync(&id)?;
    }
    Ok(id)
}

/// Gives `id` a channel of its own: its calls then wait for their events.
pub(super) fn make_sync(id: &Arc<CmId>) -> Result<(), c_int> {
    let ch = Channel::new().ok_or(libc::EMFILE)?;
    let mut st = id.state();
    // SAFETY: `st` held; the channel lives in the state as long as the ID.
    unsafe { (*id.c()).channel = ptr::addr_of!(ch.c) as *mut ffi::rdma_event_channel };
    st.own_channel = Some(ch);
    Ok(())
}

/// A listener's child for a connection request: the listener's channel,
/// context and port space, the request's addresses.
pub fn child_of(
    listener: &Arc<CmId>,
    dev: &'static CmDevice,
    local_ip: IpAddr,
    port: u16,
    peer: SocketAddr,
) -> Arc<CmId> {
    // SAFETY: the listener is live (it owns the requests made for it).
    let l = unsafe { &*listener.c() };
    let c = ffi::rdma_cm_id {
        channel: l.channel,
        context: l.context,
        ps: l.ps,
        qp_type: l.qp_type,
        // SAFETY: all-zero bytes are a valid route.
        route: unsafe { std::mem::zeroed() },
        ..Default::default()
    };
    let id = CmId::new(c);
    {
        dev.track(&id);
        let mut st = id.state();
        st.dev = Some(dev);
        st.src = Some(SocketAddr::new(local_ip, port));
        st.dst = Some(peer);
        st.tos = listener.state().tos;
        id.publish(&st);
    }
    // The program's reference, dropped by rdma_destroy_id.
    hand_out(Arc::clone(&id));
    id
}

/// A synchronous ID's wait for the event its call caused (librdmacm's
/// `ucma_complete`): the previous event is acknowledged, the new one kept
/// in `id->event`; a failed event fails the call.
pub(super) fn complete(id: &Arc<CmId>) -> Result<(), c_int> {
    let ch = {
        let st = id.state();
        match &st.own_channel {
            Some(ch) => &**ch as *const Channel,
            None => return Ok(()),
        }
    };
    // SAFETY: the ID's own event (or NULL); acknowledged once.
    unsafe {
        let prev = (*id.c()).event;
        if !prev.is_null() {
            (*id.c()).event = ptr::null_mut();
            channel::rdma_ack_cm_event(prev);
        }
    }
    // SAFETY: the ID's own channel lives as long as the ID.
    let ev = unsafe { &*ch }.pop()?;
    let (kind, status) = (ev.c.event, ev.c.status);
    // SAFETY: kept for the program until the next call acknowledges it.
    unsafe { (*id.c()).event = Box::into_raw(ev) as *mut ffi::rdma_cm_event };
    match status {
        0 => Ok(()),
        _ if kind == ffi::RDMA_CM_EVENT_REJECTED => Err(libc::ECONNREFUSED),
        s if s < 0 => Err(-s),
        s => Err(s),
    }
}

/// rdma_create_id.
///
/// # Safety
/// `channel` is NULL or live; `id` writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut ffi::rdma_event_channel,
    id: *mut *mut ffi::rdma_cm_id,
    context: *mut c_void,
    ps: ffi::rdma_port_space,
) -> c_int {
    let qp_type = match ps {
        ffi::RDMA_PS_TCP => ffi::IBV_QPT_RC,
        ffi::RDMA_PS_UDP | ffi::RDMA_PS_IPOIB => ffi::IBV_QPT_UD,
        _ => return fail(libc::EINVAL),
    };
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    match new_id(channel, context, ps, qp_type) {
        Ok(new) => {
            // SAFETY: the caller's out pointer.
            unsafe { *id = hand_out(new) };
            0
        }
        Err(e) => fail(e),
    }
}

/// rdma_destroy_id: waits for the ID's events to be acknowledged, stops
/// listening, sends a connected ID's DREQ (as the kernel does for an ID
/// closed while connected), and frees it.
///
/// # Safety
/// `id` is live and not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut ffi::rdma_cm_id) -> c_int {
    let Ok(me) = get(id) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: a synchronous ID's last event is its own to acknowledge.
    unsafe {
        let prev = (*me.c()).event;
        if !prev.is_null() && me.state().own_channel.is_some() {
            (*me.c()).event = ptr::null_mut();
            channel::rdma_ack_cm_event(prev);
        }
    }
    // No more events; those not taken yet go with the ID; those taken must
    // be acknowledged.
    me.state().destroyed = true;
    // SAFETY: the ID's channel is live (its own, or the program's, which
    // outlives its IDs).
    let ch = unsafe { (*me.c()).channel };
    if !ch.is_null() {
        // SAFETY: as above.
        unsafe { channel::channel(ch) }.purge(Arc::as_ptr(&me));
    }
    me.wait_acked();
    let pump = {
        let mut st = me.state();
        let udp = me_ps(&me) == ffi::RDMA_PS_UDP;
        for (dev, port) in st.listening.drain(..) {
            dev.remove_listener(port, udp);
            dev.agent().unlisten(port, udp);
        }
        if let (Some(dev), Some(cid)) = (st.dev, st.comm_id) {
            let mut a = dev.agent();
            if st.conn.is_some() {
                let _ = a.start_disconnect(cid);
            }
            a.forget(cid);
            drop(a);
            dev.disown(cid);
        }
        if let Some(Pending::Rc(r)) = st.request.take() {
            // A request never answered is refused, as the kernel's rdma_cm
            // does when the new ID is destroyed.
            if let Some(dev) = st.dev {
                let _ = dev.agent().reject(&r, REJ_CONSUMER_DEFINED);
            }
        }
        st.dev
    };
    if let Some(dev) = pump {
        dev.pump();
    }
    // The program's reference, given in rdma_create_id / child_of (a
    // destroy racing this one on the same ID finds it gone).
    drop(take_handle(id));
    0
}

pub(super) fn me_ps(id: &CmId) -> ffi::rdma_port_space {
    // SAFETY: `ps` is set at creation and never changes.
    unsafe { (*id.c()).ps }
}

/// rdma_bind_addr: the ID's source address, and with it its device (none
/// yet for a wildcard address: it listens on every device). Port 0 takes
/// an ephemeral port.
///
/// # Safety
/// `id` is live; `addr` a readable socket address.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(
    id: *mut ffi::rdma_cm_id,
    addr: *mut ffi::sockaddr,
) -> c_int {
    let r = get(id).and_then(|me| {
        // SAFETY: as the caller guarantees.
        let a = unsafe { from_c(addr as *const libc::sockaddr) }.ok_or(libc::EAFNOSUPPORT)?;
        bind(&me, a)
    });
    done(r)
}

pub(super) fn bind(me: &Arc<CmId>, mut a: SocketAddr) -> Result<(), c_int> {
    let udp = me_ps(me) == ffi::RDMA_PS_UDP;
    let dev = if a.ip().is_unspecified() {
        None
    } else {
        Some(device::for_ip(a.ip()).map_err(|_| libc::EADDRNOTAVAIL)?)
    };
    if a.port() == 0 {
        a.set_port(ephemeral_port());
    } else {
        let devs = dev.map_or_else(device::all, |d| vec![d]);
        if devs.iter().any(|d| d.port_taken(a.port(), udp)) {
            return Err(libc::EADDRINUSE);
        }
    }
    if let Some(d) = dev {
        d.track(me);
    }
    let mut st = me.state();
    st.dev = dev;
    st.src = Some(a);
    me.publish(&st);
    Ok(())
}

/// rdma_resolve_addr: the device and source address towards `dst` (the
/// routing table's when no source is given or bound); ADDR_RESOLVED follows.
///
/// # Safety
/// `id` is live; `src` NULL or readable; `dst` readable.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut ffi::rdma_cm_id,
    src: *mut ffi::sockaddr,
    dst: *mut ffi::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    // SAFETY: as the caller guarantees.
    let (src, dst) = unsafe {
        (
            from_c(src as *const libc::sockaddr),
            from_c(dst as *const libc::sockaddr),
        )
    };
    let Some(dst) = dst else {
        return fail(libc::EINVAL);
    };
    let r = (|| {
        let bound = me.state().src;
        let src_ip = match src.or(bound) {
            Some(s) if !s.ip().is_unspecified() => s.ip(),
            _ => addr::route_source(dst.ip())
                .map_err(|e| e.raw_os_error().unwrap_or(libc::ENETUNREACH))?,
        };
        let dev = device::for_ip(src_ip)?;
        let port = src
            .or(bound)
            .map(|s| s.port())
            .filter(|p| *p != 0)
            .unwrap_or_else(ephemeral_port);
        dev.track(&me);
        let mut st = me.state();
        st.dev = Some(dev);
        st.src = Some(SocketAddr::new(src_ip, port));
        st.dst = Some(dst);
        me.publish(&st);
        Ok(())
    })();
    match r {
        Ok(()) => {
            me.report(Event::new(
                &me,
                me.handle(),
                ffi::RDMA_CM_EVENT_ADDR_RESOLVED,
                0,
            ));
            done(complete(&me))
        }
        // No device for the source: librdmacm's call fails (ENODEV).
        Err(e) => fail(e),
    }
}

/// rdma_resolve_route: the path to the destination (its neighbour must
/// resolve); ROUTE_RESOLVED or ROUTE_ERROR follows.
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut ffi::rdma_cm_id, _timeout_ms: c_int) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let status = {
        let mut st = me.state();
        let (Some(dev), Some(dst)) = (st.dev, st.dst) else {
            return fail(libc::EINVAL);
        };
        let dgid = ferroce_verbs::context::gid_of(dst.ip());
        // SAFETY: a context of this library.
        let f = unsafe { fctx(dev.verbs) };
        let sgid_index = cm::source_gid_index(&f.ctx, 0, dgid);
        let opts = ConnectOptions {
            sgid_index,
            traffic_class: st.tos,
            ..ConnectOptions::default()
        };
        match opts.path_to(&f.ctx, dgid) {
            Ok(_) => {
                let sgid = f.ctx.query_gid(sgid_index).unwrap_or(Ipv6Addr::UNSPECIFIED);
                let path = Box::new(ffi::ibv_sa_path_rec {
                    dgid: ffi::ibv_gid { raw: dgid.octets() },
                    sgid: ffi::ibv_gid { raw: sgid.octets() },
                    hop_limit: multicast::JOIN_HOP_LIMIT,
                    traffic_class: st.tos,
                    reversible: 1,
                    numb_path: 1,
                    pkey: 0xffffu16.to_be(),
                    mtu: crate::devices::mtu_enum(f.ctx.query_port().active_mtu) as u8,
                    ..Default::default()
                });
                // SAFETY: `st` held; the record lives in the state.
                unsafe {
                    (*me.c()).route.path_rec = &*path as *const _ as *mut _;
                    (*me.c()).route.num_paths = 1;
                }
                st.path = Some(path);
                0
            }
            Err(e) => -errno_of(&e),
        }
    };
    let kind = if status == 0 {
        ffi::RDMA_CM_EVENT_ROUTE_RESOLVED
    } else {
        ffi::RDMA_CM_EVENT_ROUTE_ERROR
    };
    me.report(Event::new(&me, me.handle(), kind, status));
    done(complete(&me))
}

/// rdma_listen: connection requests for the bound port (on the bound
/// device, or every device for a wildcard address) become CONNECT_REQUEST
/// events with a new ID each.
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut ffi::rdma_cm_id, _backlog: c_int) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let udp = me_ps(&me) == ffi::RDMA_PS_UDP;
    if me.state().src.is_none() {
        if let Err(e) = bind(&me, SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)) {
            return fail(e);
        }
    }
    let mut st = me.state();
    let Some(src) = st.src else {
        return fail(libc::EINVAL);
    };
    let devs = st.dev.map_or_else(device::all, |d| vec![d]);
    if devs.is_empty() {
        return fail(libc::ENODEV);
    }
    for dev in devs {
        if !dev.add_listener(src.port(), udp, &me) {
            return fail(libc::EADDRINUSE);
        }
        let mut a = dev.agent();
        if let Err(e) = a.can_listen() {
            drop(a);
            dev.remove_listener(src.port(), udp);
            eprintln!("ferroce librdmacm: {e}");
            return fail(libc::EADDRINUSE);
        }
        if udp {
            a.listen_ud(src.port());
        } else {
            a.listen(src.port());
        }
        st.listening.push((dev, src.port()));
    }
    0
}

/// The connection parameters a program passed (NULL: librdmacm's defaults).
unsafe fn conn_param(p: *const ffi::rdma_conn_param, st: &IdState) -> (ConnParam, u32) {
    let mut out = ConnParam {
        traffic_class: st.tos,
        ..ConnParam::default()
    };
    if let Some(t) = st.ack_timeout {
        out.ack_timeout = t;
    }
    // SAFETY: the caller passes NULL or a readable struct.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return (out, 0);
    };
    if !p.private_data.is_null() && p.private_data_len > 0 {
        // SAFETY: the program's private data of the length it gives.
        out.private_data = unsafe {
            std::slice::from_raw_parts(p.private_data as *const u8, usize::from(p.private_data_len))
        }
        .to_vec();
    }
    let max = ferroce_stack::transport::qp::MAX_RD_ATOMIC;
    out.responder_resources = p.responder_resources.min(max);
    out.initiator_depth = p.initiator_depth.min(max);
    out.retry_count = p.retry_count.min(7);
    out.rnr_retry_count = p.rnr_retry_count.min(7);
    (out, p.qp_num)
}

/// rdma_connect: a REQ (RC) or SIDR_REQ (UD) to the resolved destination;
/// ESTABLISHED (with the QP at RTS), CONNECT_RESPONSE (no QP), REJECTED or
/// UNREACHABLE follows.
///
/// # Safety
/// `id` is live; `param` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut ffi::rdma_cm_id,
    param: *mut ffi::rdma_conn_param,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let dev = {
        let st = me.state();
        let (Some(dev), Some(dst)) = (st.dev, st.dst) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: as the caller guarantees.
        let (p, qp_num) = unsafe { conn_param(param, &st) };
        // SAFETY: the ID's QP, if any, is live.
        let qp = unsafe { (*me.c()).qp };
        let kind = if me_ps(&me) == ffi::RDMA_PS_UDP {
            DialKind::Ud {
                dst,
                private_data: p.private_data,
                traffic_class: p.traffic_class,
            }
        } else {
            let qpn = if qp.is_null() {
                qp_num
            } else {
                // SAFETY: a QP of this library.
                unsafe { fqp(qp) }.qp.qpn()
            };
            DialKind::Rc { qpn, dst, param: p }
        };
        let mut a = dev.agent();
        match kind.dial(&mut a) {
            Ok(cid) => {
                dev.own(cid, &me);
                drop(a);
                drop(st);
                let mut st = me.state();
                st.comm_id = Some(cid);
                st.dial = Some(Dial {
                    first: Instant::now(),
                    again: 0,
                    kind,
                });
                dev
            }
            Err(e) => return fail(errno_of(&e)),
        }
    };
    dev.pump();
    done(complete(&me))
}

/// rdma_establish: for an ID without a QP, after CONNECT_RESPONSE (the
/// program has moved its QP to RTS): the RTU.
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut ffi::rdma_cm_id) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let mut st = me.state();
    let (Some(dev), Some(cid), Some(rep)) = (st.dev, st.comm_id, st.reply.take()) else {
        return fail(libc::EINVAL);
    };
    let r = dev.agent().establish(cid, &rep);
    match r {
        Ok(conn) => {
            st.conn = Some(conn);
            0
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// rdma_accept: answers the request this ID was made for: RC with a REP
/// (the QP to RTS first; ESTABLISHED follows on the RTU), UD with a SIDR_REP.
///
/// # Safety
/// `id` is live; `param` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut ffi::rdma_cm_id,
    param: *mut ffi::rdma_conn_param,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let mut st = me.state();
    let Some(dev) = st.dev else {
        return fail(libc::EINVAL);
    };
    // SAFETY: as the caller guarantees.
    let (p, qp_num) = unsafe { conn_param(param, &st) };
    // SAFETY: as the caller guarantees.
    let srq = unsafe { param.as_ref() }.is_some_and(|p| p.srq != 0);
    // SAFETY: the ID's QP, if any, is live.
    let qp = unsafe { (*me.c()).qp };
    // SAFETY: a QP of this library.
    let fq = (!qp.is_null()).then(|| unsafe { fqp(qp) });
    if fq.is_none() && qp_num == 0 {
        // Without a QP of rdma_create_qp, the parameters name the QP.
        return fail(libc::EINVAL);
    }
    let r = match st.request.take() {
        Some(Pending::Rc(req)) => {
            let mut a = dev.agent();
            // A QP its program moved (with rdma_init_qp_attr's terms) is at RTS.
            let accepted = match fq {
                Some(fq) => a.start_accept(&req, &fq.qp, &p),
                None => a.send_rep(&req, qp_num, srq, &p),
            };
            match accepted {
                Ok(conn) => {
                    dev.own(conn.local_comm_id, &me);
                    drop(a);
                    st.comm_id = Some(conn.local_comm_id);
                    st.conn = Some(conn);
                    Ok(true)
                }
                Err(e) => {
                    st.request = Some(Pending::Rc(req));
                    Err(errno_of(&e))
                }
            }
        }
        Some(Pending::Ud(req)) => {
            let r = match fq {
                Some(fq) => dev.agent().accept_ud(&req, &fq.qp, &p.private_data),
                None => dev
                    .agent()
                    .accept_ud_qpn(&req, qp_num, cm::RDMA_UDP_QKEY, &p.private_data),
            };
            r.map(|()| false).map_err(|e| errno_of(&e))
        }
        None => Err(libc::EINVAL),
    };
    drop(st);
    match r {
        Ok(waits) => {
            dev.pump();
            if waits {
                done(complete(&me))
            } else {
                0
            }
        }
        Err(e) => fail(e),
    }
}

/// rdma_reject: refuses the request this ID was made for (REJ, consumer
/// defined, with the private data; SIDR_REP "rejected" for UD).
///
/// # Safety
/// `id` is live; `private_data` NULL or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut ffi::rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let private: &[u8] = if private_data.is_null() {
        &[]
    } else {
        // SAFETY: as the caller guarantees.
        unsafe { std::slice::from_raw_parts(private_data as *const u8, usize::from(len)) }
    };
    let mut st = me.state();
    let Some(dev) = st.dev else {
        return fail(libc::EINVAL);
    };
    let r = match st.request.take() {
        Some(Pending::Rc(req)) => dev.agent().reject_with(&req, REJ_CONSUMER_DEFINED, private),
        // IB_SIDR_REJECT.
        Some(Pending::Ud(req)) => dev.agent().reject_ud(&req, 2),
        None => return fail(libc::EINVAL),
    };
    match r {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}

/// rdma_disconnect: the QP to ERR (its work requests flushed), then a DREQ;
/// DISCONNECTED follows on the DREP (or after a few unanswered DREQs).
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut ffi::rdma_cm_id) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    // SAFETY: the ID's QP, if any, is live.
    let qp = unsafe { (*me.c()).qp };
    if !qp.is_null() {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_ERR,
            ..Default::default()
        };
        // SAFETY: a QP of this library; a state-only modify.
        unsafe { crate::qp::ibv_modify_qp(qp, &mut attr, ffi::IBV_QP_STATE as c_int) };
    }
    let (dev, waits) = {
        let st = me.state();
        // Only a connection is disconnected (not a UD ID, not one never set up).
        let (Some(dev), Some(cid), Some(_)) = (st.dev, st.comm_id, &st.conn) else {
            return fail(libc::EINVAL);
        };
        let r = dev.agent().start_disconnect(cid);
        match r {
            Ok(sent) => (dev, sent),
            Err(e) => return fail(errno_of(&e)),
        }
    };
    dev.pump();
    // A synchronous ID waits for its DISCONNECTED: the DREP's, or the
    // peer's own DREQ's, already queued when it came first.
    let queued = me
        .state()
        .own_channel
        .as_ref()
        .is_some_and(|c| c.queued() > 0);
    if waits || queued {
        done(complete(&me))
    } else {
        0
    }
}

/// rdma_notify: nothing to do (ferroce's agent needs no nudge from a QP's
/// first receive).
#[no_mangle]
pub extern "C" fn rdma_notify(_id: *mut ffi::rdma_cm_id, _event: c_int) -> c_int {
    0
}

/// rdma_set_option: TOS and ACK time-out are kept for the connection;
/// REUSEADDR and AFONLY are accepted; path records are not taken.
///
/// # Safety
/// `id` is live; `optval` points to `optlen` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut ffi::rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    if optval.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: as the caller guarantees.
    let byte = |len: usize| (len >= 1).then(|| unsafe { *(optval as *const u8) });
    match (level as u32, optname as u32) {
        (ffi::RDMA_OPTION_ID, ffi::RDMA_OPTION_ID_TOS) => match byte(optlen) {
            Some(t) => {
                me.state().tos = t;
                0
            }
            None => fail(libc::EINVAL),
        },
        (ffi::RDMA_OPTION_ID, ffi::RDMA_OPTION_ID_ACK_TIMEOUT) => match byte(optlen) {
            Some(t) => {
                me.state().ack_timeout = Some(t.min(31));
                0
            }
            None => fail(libc::EINVAL),
        },
        (ffi::RDMA_OPTION_ID, ffi::RDMA_OPTION_ID_REUSEADDR | ffi::RDMA_OPTION_ID_AFONLY) => 0,
        _ => fail(libc::ENOSYS),
    }
}

/// rdma_migrate_id: moves the ID to `channel` (NULL: synchronous) once
/// its events are acknowledged.
///
/// # Safety
/// `id` is live; `channel` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut ffi::rdma_cm_id,
    channel: *mut ffi::rdma_event_channel,
) -> c_int {
    let me = match get(id) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    me.wait_acked();
    if channel.is_null() {
        return done(make_sync(&me));
    }
    let mut st = me.state();
    // SAFETY: `st` held.
    unsafe { (*me.c()).channel = channel };
    st.own_channel = None;
    0
}

fn port_of(a: Option<SocketAddr>) -> u16 {
    // Network byte order, as librdmacm returns it.
    a.map_or(0, |a| a.port().to_be())
}

/// rdma_get_src_port (network byte order).
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut ffi::rdma_cm_id) -> u16 {
    get(id).map_or(0, |m| port_of(m.state().src))
}

/// rdma_get_dst_port (network byte order).
///
/// # Safety
/// `id` is live.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut ffi::rdma_cm_id) -> u16 {
    get(id).map_or(0, |m| port_of(m.state().dst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdmacm::channel::{
        rdma_create_event_channel, rdma_destroy_event_channel, rdma_get_cm_event,
    };

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// perftest `-R`'s client, rejected, retries on the IDs and the channel
    /// it destroyed: each call fails with EINVAL, nothing crashes.
    #[test]
    fn calls_on_destroyed_ids_and_channels_fail_with_einval() {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut id = ptr::null_mut();
        // SAFETY: a live channel; `id` writable.
        let rc = unsafe { rdma_create_id(ch, &mut id, ptr::null_mut(), ffi::RDMA_PS_TCP) };
        assert_eq!(rc, 0);
        // SAFETY: a live ID, destroyed once.
        assert_eq!(unsafe { rdma_destroy_id(id) }, 0);

        let dst = addr::to_storage("127.0.0.1:18515".parse().unwrap());
        // SAFETY: the ID is destroyed: the call must see that, not use it.
        let rc =
            unsafe { rdma_resolve_addr(id, ptr::null_mut(), &dst as *const _ as *mut _, 2000) };
        assert_eq!((rc, errno()), (-1, libc::EINVAL));
        // SAFETY: as above.
        assert_eq!(
            (unsafe { rdma_destroy_id(id) }, errno()),
            (-1, libc::EINVAL)
        );
        // SAFETY: as above.
        assert_eq!(unsafe { rdma_get_src_port(id) }, 0);

        // SAFETY: live, then destroyed: the second destroy is a no-op.
        unsafe {
            rdma_destroy_event_channel(ch);
            rdma_destroy_event_channel(ch);
        }
        let mut ev = ptr::null_mut();
        // SAFETY: a destroyed channel: refused before use.
        let rc = unsafe { rdma_get_cm_event(ch, &mut ev) };
        assert_eq!((rc, errno()), (-1, libc::EINVAL));
    }
}
