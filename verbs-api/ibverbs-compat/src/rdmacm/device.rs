//! One ferroce device as rdma_cm sees it: its context (shared by every ID
//! on it, as librdmacm shares one ibv_context per device), its CM agent on
//! QP1, and the thread that turns the agent's events into rdma_cm events.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::net::IpAddr;
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use ferroce_stack::wire::mad::sidr_status;
use ferroce_verbs::cm::{CmAgent, CmEvent, Connection, PeerOffer, UdPeer, REJ_INVALID_SERVICE_ID};
use ferroce_verbs::{ConnectOptions, ProtectionDomain};

use super::channel::Event;
use super::{CmId, Pending};
use crate::ffi;
use crate::handles::{fctx, fqp, set_errno, FContext, FDevice};

/// How long the service thread sleeps at most between looks at the agent.
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// How long after rdma_connect a refusal for want of a listener (REJ
/// "invalid service ID", SIDR_REP "service ID not supported") makes the
/// request go again instead of failing the connect. The kernel reports the
/// first one; but perftest `-R`'s server creates its test QPs' listener
/// only when its last hand-shake message is acknowledged, and its client
/// sends the REQ right after that acknowledgement, so a client much quicker
/// than the server (ferroce's, against a server in a slow VM or on a busy
/// host) would be refused every time, where a kernel client, slower to get
/// there (memory registration, QP creation), is not.
pub const NO_LISTENER_GRACE: Duration = Duration::from_millis(500);
/// The first wait before a refused request goes again; each next one doubles.
const REDIAL_FIRST: Duration = Duration::from_millis(5);

/// A device with its connection manager.
pub struct CmDevice {
    pub ifname: String,
    /// The network namespace the device was opened in (its inode): a
    /// thread in another one has a device of its own on the same name, as
    /// its ibverbs contexts do.
    netns: u64,
    /// The ibv_context every ID on the device reports (`id->verbs`).
    pub verbs: *mut ffi::ibv_context,
    pub agent: Mutex<CmAgent<'static>>,
    /// Which ID each connection (or SIDR request) belongs to.
    owners: Mutex<HashMap<u32, Arc<CmId>>>,
    /// Listening IDs by (port, UDP port space).
    listeners: Mutex<HashMap<(u16, bool), Arc<CmId>>>,
    /// Held while events are handed out, so one ID's come in order.
    dispatching: Mutex<()>,
    /// The PD of QPs made without one (librdmacm's per-device PD).
    default_pd: OnceLock<usize>,
    /// Refused requests to send again, and when.
    redials: Mutex<Vec<(Instant, Arc<CmId>)>>,
    /// IDs bound or resolved to this device: told when it goes away.
    bound: Mutex<Vec<Weak<CmId>>>,
}

// SAFETY: `verbs` names a context that is never closed; everything else is
// behind locks.
unsafe impl Send for CmDevice {}
// SAFETY: as above.
unsafe impl Sync for CmDevice {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static OPEN: Mutex<Vec<&'static CmDevice>> = Mutex::new(Vec::new());

/// The device on interface `fdev`, opened (with its agent and thread) on first use.
fn open(fdev: *mut FDevice) -> Result<&'static CmDevice, c_int> {
    // SAFETY: devices of the list live for the process.
    let ifname = unsafe { (*fdev).ifname.clone() };
    let netns = ferroce_nic::netns::current_net_ino();
    let mut open = lock(&OPEN);
    if let Some(d) = open.iter().find(|d| d.ifname == ifname && d.netns == netns) {
        return Ok(d);
    }
    // SAFETY: a device of this library's list.
    let verbs = unsafe { crate::devices::ibv_open_device(fdev as *mut ffi::ibv_device) };
    if verbs.is_null() {
        return Err(libc::ENODEV);
    }
    // SAFETY: just opened; never closed (librdmacm keeps its devices open too).
    let f: &'static FContext = unsafe { fctx(verbs) };
    let pd: &'static ProtectionDomain = Box::leak(Box::new(f.ctx.alloc_pd()));
    let sgid = f
        .ctx
        .gids()
        .iter()
        .position(|g| g.to_ipv4_mapped().is_some())
        .unwrap_or(0);
    let agent = CmAgent::new(&f.ctx, pd, sgid).map_err(|e| {
        eprintln!("ferroce librdmacm: {ifname}: {e}");
        crate::handles::errno_of(&e)
    })?;
    let dev: &'static CmDevice = Box::leak(Box::new(CmDevice {
        ifname,
        netns,
        verbs,
        agent: Mutex::new(agent),
        owners: Mutex::new(HashMap::new()),
        listeners: Mutex::new(HashMap::new()),
        dispatching: Mutex::new(()),
        default_pd: OnceLock::new(),
        redials: Mutex::new(Vec::new()),
        bound: Mutex::new(Vec::new()),
    }));
    let spawned = std::thread::Builder::new()
        .name(format!("ferroce-cm-{}", dev.ifname))
        .spawn(move || dev.serve());
    if let Err(e) = spawned {
        eprintln!("ferroce librdmacm: {}: no CM thread: {e}", dev.ifname);
        return Err(libc::EAGAIN);
    }
    open.push(dev);
    Ok(dev)
}

/// The device holding `ip` (one of its interface's addresses).
pub fn for_ip(ip: IpAddr) -> Result<&'static CmDevice, c_int> {
    let gid = ferroce_verbs::context::gid_of(ip);
    // The interfaces' addresses now, not the GID tables of the devices
    // already open (made when they opened): an address added since counts.
    let ifaces = ferroce_verbs::device::interfaces().map_err(|_| libc::ENODEV)?;
    for &d in crate::devices::devices() {
        // SAFETY: devices of the list live for the process.
        let name = unsafe { &(*d).ifname };
        let has = ifaces.iter().any(|i| {
            &i.name == name
                && i.addrs
                    .iter()
                    .any(|a| ferroce_verbs::context::gid_of(a.ip) == gid)
        });
        if has {
            return open(d);
        }
    }
    Err(libc::ENODEV)
}

/// Every device of the list (a wildcard bind listens on all).
pub fn all() -> Vec<&'static CmDevice> {
    crate::devices::devices()
        .iter()
        .filter_map(|&d| open(d).ok())
        .collect()
}

/// The connection parameters of an event from what the peer offered.
fn conn_param(o: &PeerOffer, qpn: u32) -> ffi::rdma_conn_param {
    ffi::rdma_conn_param {
        responder_resources: o.responder_resources,
        initiator_depth: o.initiator_depth,
        flow_control: u8::from(o.flow_control),
        retry_count: o.retry_count,
        rnr_retry_count: o.rnr_retry_count,
        srq: u8::from(o.srq),
        qp_num: qpn,
        ..Default::default()
    }
}

impl CmDevice {
    /// The agent, locked.
    pub fn agent(&self) -> MutexGuard<'_, CmAgent<'static>> {
        lock(&self.agent)
    }

    /// `id` is bound to this device (rdma_bind_addr, rdma_resolve_addr, a
    /// request's ID): RDMA_CM_EVENT_DEVICE_REMOVAL reaches it if the device
    /// goes away.
    pub fn track(&self, id: &Arc<CmId>) {
        let mut b = lock(&self.bound);
        b.retain(|w| w.strong_count() > 0);
        b.push(Arc::downgrade(id));
    }

    /// Events of connection `comm_id` go to `id` (called with the agent
    /// held, so no event of it can be handed out before).
    pub fn own(&self, comm_id: u32, id: &Arc<CmId>) {
        lock(&self.owners).insert(comm_id, Arc::clone(id));
    }

    pub fn disown(&self, comm_id: u32) {
        lock(&self.owners).remove(&comm_id);
    }

    /// Requests for `port` go to `id`; false when another ID listens there.
    pub fn add_listener(&self, port: u16, ud: bool, id: &Arc<CmId>) -> bool {
        let mut l = lock(&self.listeners);
        if l.contains_key(&(port, ud)) {
            return false;
        }
        l.insert((port, ud), Arc::clone(id));
        true
    }

    pub fn remove_listener(&self, port: u16, ud: bool) {
        lock(&self.listeners).remove(&(port, ud));
    }

    /// Whether a listener holds `port` (rdma_bind_addr's EADDRINUSE).
    pub fn port_taken(&self, port: u16, ud: bool) -> bool {
        lock(&self.listeners).contains_key(&(port, ud))
    }

    /// The device's default PD (made on first use).
    pub fn default_pd(&self) -> *mut ffi::ibv_pd {
        *self.default_pd.get_or_init(|| {
            // SAFETY: our live context.
            unsafe { crate::resources::ibv_alloc_pd(self.verbs) as usize }
        }) as *mut ffi::ibv_pd
    }

    /// The service thread: sleeps on QP1's completion queue (or until the
    /// next resend is due) and hands out what happened.
    fn serve(&'static self) {
        let cq = self.agent().completion_queue();
        loop {
            self.pump();
            // SAFETY: a context of this library, never closed.
            if unsafe { fctx(self.verbs) }.ctx.failure().is_some() {
                self.removed();
                return;
            }
            let next = [
                self.agent().next_timer(),
                lock(&self.redials).iter().map(|(at, _)| *at).min(),
            ];
            let wait = next
                .into_iter()
                .flatten()
                .map(|t| t.saturating_duration_since(Instant::now()))
                .fold(IDLE_WAIT, Duration::min);
            if !wait.is_zero() {
                let _ = cq.wait(wait);
            }
        }
    }

    /// The device's engine stopped for good (its interface went away): as
    /// rdma_cm does for a removed device, every ID on it gets
    /// RDMA_CM_EVENT_DEVICE_REMOVAL (the program is to destroy it), and a
    /// later bind on the interface's name opens a new device.
    fn removed(&'static self) {
        lock(&OPEN).retain(|d| !std::ptr::eq(*d, self));
        let mut ids: Vec<Arc<CmId>> = lock(&self.bound)
            .drain(..)
            .filter_map(|w| w.upgrade())
            .collect();
        ids.extend(lock(&self.listeners).values().cloned());
        ids.extend(lock(&self.owners).values().cloned());
        let mut seen = std::collections::HashSet::new();
        let _order = lock(&self.dispatching);
        for id in ids {
            if seen.insert(Arc::as_ptr(&id) as usize) {
                id.report(Event::new(
                    &id,
                    id.handle(),
                    ffi::RDMA_CM_EVENT_DEVICE_REMOVAL,
                    0,
                ));
            }
        }
    }

    /// Runs the agent and hands its events to their IDs. Called by the
    /// service thread, and by calls that changed the agent (so what follows
    /// from them is handed out now, not at the thread's next wake).
    pub fn pump(&'static self) {
        let _order = lock(&self.dispatching);
        let events = {
            let mut a = self.agent();
            if let Err(e) = a.progress() {
                eprintln!("ferroce librdmacm: {}: {e}", self.ifname);
            }
            a.take_events()
        };
        for ev in events {
            self.dispatch(ev);
        }
        self.redial_due();
    }

    /// Whether the refusal of request `id` for want of a listener is to be
    /// answered by sending it again (then it is scheduled, and nothing is
    /// reported).
    fn redial_later(&self, id: u32) -> bool {
        let Some(owner) = self.owner(id) else {
            return false;
        };
        let wait = {
            let mut st = owner.state();
            let destroyed = st.destroyed;
            let Some(d) = st.dial.as_mut().filter(|_| !destroyed) else {
                return false;
            };
            if d.first.elapsed() >= NO_LISTENER_GRACE {
                return false;
            }
            let wait = REDIAL_FIRST * 2u32.saturating_pow(d.again.min(16));
            d.again += 1;
            st.comm_id = None;
            wait
        };
        self.disown(id);
        lock(&self.redials).push((Instant::now() + wait, owner));
        true
    }

    /// Sends again the refused requests whose wait is over.
    fn redial_due(&self) {
        let now = Instant::now();
        let due: Vec<Arc<CmId>> = {
            let mut r = lock(&self.redials);
            let (due, later) = r.drain(..).partition(|(at, _)| *at <= now);
            *r = later;
            due.into_iter().map(|(_, id)| id).collect()
        };
        for id in due {
            let mut st = id.state();
            if st.destroyed {
                continue;
            }
            let Some(d) = st.dial.as_ref() else {
                continue;
            };
            let sent = d.kind.dial(&mut self.agent());
            match sent {
                Ok(cid) => {
                    self.own(cid, &id);
                    st.comm_id = Some(cid);
                }
                Err(e) => {
                    drop(st);
                    let ev = Event::new(
                        &id,
                        id.handle(),
                        ffi::RDMA_CM_EVENT_UNREACHABLE,
                        -crate::handles::errno_of(&e),
                    );
                    id.report(ev);
                }
            }
        }
    }

    /// The ID listening on `port`, unless it is being destroyed (then the
    /// request is refused as if no one listened).
    fn listener(&self, port: u16, ud: bool) -> Option<Arc<CmId>> {
        let l = lock(&self.listeners).get(&(port, ud)).cloned()?;
        let gone = l.state().destroyed;
        (!gone).then_some(l)
    }

    fn owner(&self, comm_id: u32) -> Option<Arc<CmId>> {
        lock(&self.owners).get(&comm_id).cloned()
    }

    fn dispatch(&'static self, ev: CmEvent) {
        match ev {
            CmEvent::Request(r) => {
                let Some(listener) = self.listener(r.port, false) else {
                    let _ = self
                        .agent()
                        .reject(&r, ferroce_verbs::cm::REJ_INVALID_SERVICE_ID);
                    return;
                };
                let (private, param) = (r.private_data.clone(), conn_param(&r.offer, r.remote_qpn));
                let local = r.local_gid();
                let local_ip = local.to_ipv4_mapped().map_or(IpAddr::V6(local), IpAddr::V4);
                let child = super::id::child_of(&listener, self, local_ip, r.port, r.peer);
                child.state().request = Some(Pending::Rc(r));
                let ev = Event::new(
                    &listener,
                    child.handle(),
                    ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
                    0,
                )
                .with_conn(param, &private);
                listener.report(with_listener(ev, &listener));
            }
            CmEvent::UdRequest(r) => {
                let Some(listener) = self.listener(r.port, true) else {
                    let _ = self
                        .agent()
                        .reject_ud(&r, ferroce_stack::wire::mad::sidr_status::UNSUPPORTED);
                    return;
                };
                let private = r.private_data.clone();
                let local_ip = self
                    .agent()
                    .local_ip_towards(ferroce_verbs::context::gid_of(r.peer.ip()));
                let Ok(local_ip) = local_ip else {
                    return;
                };
                let child = super::id::child_of(&listener, self, local_ip, r.port, r.peer);
                child.state().request = Some(Pending::Ud(r));
                let ev = Event::new(
                    &listener,
                    child.handle(),
                    ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
                    0,
                )
                .with_ud(ffi::rdma_ud_param::default(), &private);
                listener.report(with_listener(ev, &listener));
            }
            CmEvent::Reply { id, rep } => {
                let Some(owner) = self.owner(id) else {
                    return;
                };
                let mut st = owner.state();
                // SAFETY: the ID's QP, if any, is live while the ID is.
                let qp = unsafe { (*owner.c()).qp };
                if qp.is_null() {
                    // The program moves its QP and calls rdma_establish.
                    let param = conn_param(&PeerOffer::of_rep(&rep), rep.local_qpn);
                    let private = rep.private_data.to_vec();
                    st.reply = Some(rep);
                    drop(st);
                    let ev = Event::new(
                        &owner,
                        owner.handle(),
                        ffi::RDMA_CM_EVENT_CONNECT_RESPONSE,
                        0,
                    )
                    .with_conn(param, &private);
                    owner.report(ev);
                    return;
                }
                // SAFETY: a QP of this library.
                let fq = unsafe { fqp(qp) };
                let done = self.agent().finish_connect(id, &fq.qp, &rep);
                match done {
                    Ok(conn) => {
                        let ev = established(&owner, &conn);
                        st.conn = Some(conn);
                        drop(st);
                        owner.report(ev);
                    }
                    Err(e) => {
                        eprintln!("ferroce librdmacm: connecting: {e}");
                        drop(st);
                        let ev = Event::new(
                            &owner,
                            owner.handle(),
                            ffi::RDMA_CM_EVENT_CONNECT_ERROR,
                            -libc::EINVAL,
                        );
                        owner.report(ev);
                    }
                }
            }
            CmEvent::Established { id } => self.to_owner(id, false, |o| {
                Event::new(o, o.handle(), ffi::RDMA_CM_EVENT_ESTABLISHED, 0)
            }),
            CmEvent::Rejected { id, reason, .. }
                if reason == REJ_INVALID_SERVICE_ID && self.redial_later(id) => {}
            CmEvent::UdRefused { id, status }
                if status == sidr_status::UNSUPPORTED && self.redial_later(id) => {}
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => self.to_owner(id, true, |o| {
                Event::new(
                    o,
                    o.handle(),
                    ffi::RDMA_CM_EVENT_REJECTED,
                    c_int::from(reason),
                )
                .with_conn(ffi::rdma_conn_param::default(), &private_data)
            }),
            CmEvent::TimedOut { id } => self.to_owner(id, true, |o| {
                Event::new(
                    o,
                    o.handle(),
                    ffi::RDMA_CM_EVENT_UNREACHABLE,
                    -libc::ETIMEDOUT,
                )
            }),
            CmEvent::UdResolved { id, peer } => self.to_owner(id, true, |o| {
                let ud = self.ud_param(o, &peer);
                Event::new(o, o.handle(), ffi::RDMA_CM_EVENT_ESTABLISHED, 0)
                    .with_ud(ud, &peer.private_data)
            }),
            CmEvent::UdRefused { id, status } => self.to_owner(id, true, |o| {
                Event::new(
                    o,
                    o.handle(),
                    ffi::RDMA_CM_EVENT_UNREACHABLE,
                    c_int::from(status),
                )
            }),
            CmEvent::Disconnected { id } => self.to_owner(id, false, |o| {
                Event::new(o, o.handle(), ffi::RDMA_CM_EVENT_DISCONNECTED, 0)
            }),
        }
    }

    /// Reports the event `make` builds to the ID connection `id` belongs
    /// to; `ends`: the agent is done with `id` (no more events of it).
    fn to_owner(&self, id: u32, ends: bool, make: impl FnOnce(&Arc<CmId>) -> Box<Event>) {
        let Some(owner) = self.owner(id) else {
            return;
        };
        if ends {
            self.disown(id);
        }
        owner.report(make(&owner));
    }

    /// An address handle's attributes towards `gid` from `id`'s source
    /// (as rdma_cm's route gives them: global, hop limit 64, the ID's TOS).
    pub fn ah_attr(&self, id: &CmId, gid: std::net::Ipv6Addr, hop_limit: u8) -> ffi::ibv_ah_attr {
        // SAFETY: a context of this library.
        let f = unsafe { fctx(self.verbs) };
        let opts = ConnectOptions {
            sgid_index: ferroce_verbs::cm::source_gid_index(&f.ctx, 0, gid),
            hop_limit,
            traffic_class: id.state().tos,
            flow_label: 0,
            ..ConnectOptions::default()
        };
        ah_attr_of(&opts, gid)
    }

    fn ud_param(&self, id: &CmId, peer: &UdPeer) -> ffi::rdma_ud_param {
        ffi::rdma_ud_param {
            ah_attr: self.ah_attr(id, peer.peer_gid, ferroce_verbs::multicast::JOIN_HOP_LIMIT),
            qp_num: peer.qpn,
            qkey: peer.qkey,
            ..Default::default()
        }
    }
}

/// The listen ID named in a connect request's event.
fn with_listener(mut ev: Box<Event>, listener: &Arc<CmId>) -> Box<Event> {
    ev.c.listen_id = listener.handle();
    ev
}

/// RDMA_CM_EVENT_ESTABLISHED of an active side, with the REP's terms.
pub fn established(owner: &Arc<CmId>, conn: &Connection) -> Box<Event> {
    Event::new(owner, owner.handle(), ffi::RDMA_CM_EVENT_ESTABLISHED, 0)
        .with_conn(conn_param(&conn.offer, conn.remote_qpn), &conn.private_data)
}

/// rdma_get_devices: the contexts of every device (opened once, shared).
///
/// # Safety
/// `num` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ffi::ibv_context {
    let devs = all();
    // SAFETY: calloc of n+1 pointers, NULL-terminated; freed by rdma_free_devices.
    let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ffi::ibv_context>()) }
        as *mut *mut ffi::ibv_context;
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    for (i, d) in devs.iter().enumerate() {
        // SAFETY: i < n+1.
        unsafe { *list.add(i) = d.verbs };
    }
    if !num.is_null() {
        // SAFETY: the caller's int.
        unsafe { *num = devs.len() as c_int };
    }
    list
}

/// rdma_free_devices.
///
/// # Safety
/// `list` came from rdma_get_devices.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ffi::ibv_context) {
    // SAFETY: allocated with calloc.
    unsafe { libc::free(list as *mut c_void) };
}

/// The address vector of a path with these options' GRH fields towards
/// `dgid` (global: RoCE v2).
pub fn ah_attr_of(opts: &ConnectOptions, dgid: std::net::Ipv6Addr) -> ffi::ibv_ah_attr {
    let mut ah = ffi::ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    ah.grh.dgid = ffi::ibv_gid { raw: dgid.octets() };
    ah.grh.sgid_index = opts.sgid_index as u8;
    ah.grh.hop_limit = opts.hop_limit;
    ah.grh.traffic_class = opts.traffic_class;
    ah.grh.flow_label = opts.flow_label;
    ah
}
