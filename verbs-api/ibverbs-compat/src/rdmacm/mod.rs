//! librdmacm's ABI (rdma-core 44's `librdmacm.so.1`) over ferroce's
//! connection manager, so unmodified rdma_cm programs (rping, ucmatose,
//! udaddy, mckey, rdma_server / rdma_client, perftest `-R`, your own) run
//! over ferroce. The library is this one: `librdmacm.so.1` is a link to
//! `libibverbs.so.1` (see `ferroce-libibverbs`), so the IDs' devices,
//! PDs and QPs are the ibverbs objects of this library.
//!
//! Where librdmacm talks to the kernel's rdma_cm through
//! `/dev/infiniband/rdma_cm`, this library runs one [`CmAgent`] per device
//! (QP1 of that ferroce device) and a thread that turns its events into
//! rdma_cm events on the IDs' channels. An ID made without a channel is
//! synchronous, as in librdmacm: each call waits for its own event.
//!
//! [`CmAgent`]: ferroce_verbs::cm::CmAgent

// The C structs bindgen makes have no Debug (unions, raw pointers).
#![allow(missing_debug_implementations)]

use std::cell::UnsafeCell;
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};

use ferroce_stack::wire::mad::Rep;
use ferroce_verbs::cm::{Connection, Request, UdRequest};
use ferroce_verbs::multicast::Joined;

use crate::ffi;

pub mod addr;
pub mod channel;
pub mod device;
pub mod ep;
pub mod id;
pub mod multicast;
pub mod qp;
pub mod unsupported;

use channel::{Channel, Event};
use device::CmDevice;

/// A connection request handed to the program and not answered yet.
#[derive(Debug)]
pub enum Pending {
    Rc(Request),
    Ud(UdRequest),
}

/// What an ID knows beyond its C struct.
#[derive(Default)]
pub struct IdState {
    pub dev: Option<&'static CmDevice>,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    /// rdma_set_option's TOS.
    pub tos: u8,
    /// rdma_set_option's ACK time-out exponent.
    pub ack_timeout: Option<u8>,
    /// The connection (or SIDR request) the agent knows it by.
    pub comm_id: Option<u32>,
    /// Devices and ports listened on.
    pub listening: Vec<(&'static CmDevice, u16)>,
    /// The request this ID was made for (a listener's child).
    pub request: Option<Pending>,
    pub conn: Option<Connection>,
    /// A REP for an ID without a QP, until rdma_establish.
    pub reply: Option<Box<Rep>>,
    /// rdma_create_ep's QP attributes of a passive ID, for rdma_get_request.
    pub qp_init: Option<ffi::ibv_qp_init_attr>,
    /// A synchronous ID's own channel.
    pub own_channel: Option<Box<Channel>>,
    /// rdma_resolve_route's path record (`route.path_rec` points at it).
    pub path: Option<Box<ffi::ibv_sa_path_rec>>,
    /// Multicast groups joined.
    pub groups: Vec<Joined>,
    /// CQs, channels and PD rdma_create_qp made (destroyed with the QP).
    pub made_cqs: bool,
    /// rdma_destroy_id has begun: no more events.
    pub destroyed: bool,
    /// How rdma_connect began, to begin again while the peer has no
    /// listener yet (see [`device::NO_LISTENER_GRACE`]).
    pub dial: Option<Dial>,
}

/// An rdma_connect's request, kept to be sent again.
pub struct Dial {
    /// When the first one went.
    pub first: std::time::Instant,
    /// Requests sent again so far.
    pub again: u32,
    pub kind: DialKind,
}

pub enum DialKind {
    /// A REQ from QP `qpn`.
    Rc {
        qpn: u32,
        dst: SocketAddr,
        param: ferroce_verbs::cm::ConnParam,
    },
    /// A SIDR_REQ.
    Ud {
        dst: SocketAddr,
        private_data: Vec<u8>,
        traffic_class: u8,
    },
}

impl DialKind {
    /// Sends the request; returns its comm ID (request ID for UD).
    pub fn dial(&self, a: &mut ferroce_verbs::cm::CmAgent<'_>) -> ferroce_verbs::Result<u32> {
        match self {
            DialKind::Rc { qpn, dst, param } => a.start_connect(*qpn, *dst, param),
            DialKind::Ud {
                dst,
                private_data,
                traffic_class,
            } => a.start_resolve_ud(*dst, private_data, *traffic_class),
        }
    }
}

/// rdma_cm_id and what stands behind it.
#[repr(C)]
pub struct CmId {
    pub c: UnsafeCell<ffi::rdma_cm_id>,
    pub st: Mutex<IdState>,
    /// Events reported and not acknowledged: destroy and migrate wait for 0.
    unacked: Mutex<u32>,
    acked: Condvar,
}

// SAFETY: the C struct is written only with `st` held (or before the ID is
// shared); what the program reads of it, it reads as librdmacm's.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    pub fn new(c: ffi::rdma_cm_id) -> Arc<CmId> {
        Arc::new(CmId {
            c: UnsafeCell::new(c),
            st: Mutex::new(IdState::default()),
            unacked: Mutex::new(0),
            acked: Condvar::new(),
        })
    }

    pub fn state(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The C struct, for reading and (with `st` held) writing.
    pub fn c(&self) -> *mut ffi::rdma_cm_id {
        self.c.get()
    }

    /// The handle the program holds.
    pub fn handle(self: &Arc<Self>) -> *mut ffi::rdma_cm_id {
        self.c()
    }

    fn event_reported(&self) {
        *self.unacked.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn event_acked(&self) {
        let mut n = self.unacked.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        self.acked.notify_all();
    }

    /// Waits until every event reported for this ID is acknowledged
    /// (librdmacm's rdma_destroy_id and rdma_migrate_id wait the same way).
    pub fn wait_acked(&self) {
        let mut n = self.unacked.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            n = self.acked.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Queues `ev` on the ID's channel (unless the ID is being destroyed:
    /// the service thread may have picked it just before).
    pub fn report(&self, ev: Box<Event>) {
        if self.state().destroyed {
            return;
        }
        // SAFETY: the channel pointer is the ID's own or the program's live
        // channel (destroyed only after its IDs).
        let ch = unsafe { (*self.c()).channel };
        if !ch.is_null() {
            // SAFETY: as above.
            unsafe { channel::channel(ch) }.push(ev);
        }
    }

    /// The device's context and the ID's addresses written into the C
    /// struct (what rdma_bind_addr / rdma_resolve_addr fill in).
    pub fn publish(&self, st: &IdState) {
        let c = self.c();
        // SAFETY: `st` is held by the caller, so no one else writes the struct.
        unsafe {
            if let Some(dev) = st.dev {
                (*c).verbs = dev.verbs;
                (*c).port_num = 1;
            }
            let a = &mut (*c).route.addr;
            if let Some(src) = st.src {
                a.__bindgen_anon_1.src_storage = std::mem::transmute::<
                    libc::sockaddr_storage,
                    ffi::sockaddr_storage,
                >(addr::to_storage(src));
                a.addr.ibaddr.sgid = gid_c(src.ip());
            }
            if let Some(dst) = st.dst {
                a.__bindgen_anon_2.dst_storage = std::mem::transmute::<
                    libc::sockaddr_storage,
                    ffi::sockaddr_storage,
                >(addr::to_storage(dst));
                a.addr.ibaddr.dgid = gid_c(dst.ip());
            }
            a.addr.ibaddr.pkey = 0xffffu16.to_be();
        }
    }
}

/// An IP address as the GID rdma_cm gives it (IPv4-mapped for IPv4).
pub fn gid_c(ip: IpAddr) -> ffi::ibv_gid {
    ffi::ibv_gid {
        raw: ferroce_verbs::context::gid_of(ip).octets(),
    }
}

/// Addresses of the objects a program holds (created and not destroyed):
/// a call on anything else fails with EINVAL instead of touching freed
/// memory. perftest `-R`'s client, when its connection is rejected,
/// retries on the IDs and channel it has just destroyed, and destroys that
/// channel a second time when it gives up.
pub struct LiveSet(LazyLock<Mutex<HashSet<usize>>>);

impl LiveSet {
    pub const fn new() -> Self {
        Self(LazyLock::new(Default::default))
    }

    pub fn lock(&self) -> MutexGuard<'_, HashSet<usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for LiveSet {
    fn default() -> Self {
        Self::new()
    }
}

/// The ID handles the program holds.
static IDS: LiveSet = LiveSet::new();

/// Gives the program a handle to `id` (its reference, dropped by
/// [`take_handle`]).
pub fn hand_out(id: Arc<CmId>) -> *mut ffi::rdma_cm_id {
    let p = Arc::into_raw(id) as *mut ffi::rdma_cm_id;
    IDS.lock().insert(p as usize);
    p
}

/// The program's reference behind `id`, taken back (rdma_destroy_id);
/// None if `id` is no live handle.
pub fn take_handle(id: *mut ffi::rdma_cm_id) -> Option<Arc<CmId>> {
    if !IDS.lock().remove(&(id as usize)) {
        return None;
    }
    // SAFETY: a pointer from `hand_out`, whose reference it carries.
    Some(unsafe { Arc::from_raw(id as *const CmId) })
}

/// Another reference to the ID behind a handle; None if `id` is no live
/// handle of this library.
pub fn id_arc(id: *mut ffi::rdma_cm_id) -> Option<Arc<CmId>> {
    let live = IDS.lock();
    if !live.contains(&(id as usize)) {
        return None;
    }
    let p = id as *const CmId;
    // SAFETY: a live handle is an Arc<CmId> pointer (the C struct is the
    // first, transparent field) whose program reference keeps the count
    // above 0; the set's lock keeps it from being destroyed meanwhile.
    unsafe {
        Arc::increment_strong_count(p);
        Some(Arc::from_raw(p))
    }
}

/// Fails a call librdmacm-style: errno set, -1 returned.
pub fn fail(errno: libc::c_int) -> libc::c_int {
    crate::handles::set_errno(errno);
    -1
}
