//! Devices: which interfaces are offered (configured by environment), opening
//! and closing them, and the query verbs.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::Ipv6Addr;
use std::ptr;
use std::sync::OnceLock;

use ferroce_verbs::device::{interfaces, Backend, DeviceConfig};
use ferroce_verbs::{Context, OpenOptions, WeakContext};

use crate::ffi;
use crate::handles::{fctx, leak, set_errno, FContext, FDevice};

/// Environment: the interface(s) to offer, comma-separated (`veth0`, or
/// `ferroce_veth0` as the device is named).
pub const ENV_DEVICE: &str = "FERROCE_DEVICE";
/// Environment: the packet backend (afxdp, afpacket, udp, auto).
pub const ENV_BACKEND: &str = "FERROCE_BACKEND";

/// The devices, found once per process like rdma-core's sysfs scan.
struct Devices(Vec<*mut FDevice>);
// SAFETY: the devices are created once, never changed and never freed.
unsafe impl Send for Devices {}
// SAFETY: as above; readers only read.
unsafe impl Sync for Devices {}

static DEVICES: OnceLock<Devices> = OnceLock::new();

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}

/// The modified EUI-64 of a MAC as a node GUID, in network byte order (rxe does the same).
fn guid_of(mac: [u8; 6]) -> u64 {
    ferroce_verbs::device::node_guid(mac).to_be()
}

fn backend() -> Backend {
    match std::env::var(ENV_BACKEND) {
        Ok(s) if !s.is_empty() => s.parse().unwrap_or_else(|e: String| {
            eprintln!("ferroce libibverbs: {ENV_BACKEND}: {e}; using auto");
            Backend::Auto
        }),
        _ => Backend::Auto,
    }
}

fn find_devices() -> Vec<*mut FDevice> {
    let all = match interfaces() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ferroce libibverbs: cannot list network interfaces: {e}");
            return Vec::new();
        }
    };
    let wanted: Vec<String> = match std::env::var(ENV_DEVICE) {
        Ok(s) if !s.trim().is_empty() => s
            .split(',')
            .map(|n| n.trim().trim_start_matches("ferroce_").to_string())
            .filter(|n| !n.is_empty())
            .collect(),
        // Like `ferroce`'s default: interfaces that are up, not loopback,
        // with an IPv4 address; loopback if there is none.
        _ => {
            let mut v: Vec<String> = all
                .iter()
                .filter(|i| i.up && i.name != "lo" && i.addrs.iter().any(|a| a.ip.is_ipv4()))
                .map(|i| i.name.clone())
                .collect();
            if v.is_empty() && all.iter().any(|i| i.name == "lo") {
                v.push("lo".to_string());
            }
            v
        }
    };
    let mut out = Vec::new();
    for name in wanted {
        let Some(iface) = all.iter().find(|i| i.name == name) else {
            eprintln!("ferroce libibverbs: {ENV_DEVICE}: no interface named {name:?}");
            continue;
        };
        let mut ibv = ffi::ibv_device {
            node_type: ffi::IBV_NODE_CA,
            transport_type: ffi::IBV_TRANSPORT_IB,
            ..Default::default()
        };
        copy_cstr(&mut ibv.name, &format!("ferroce_{name}"));
        copy_cstr(&mut ibv.dev_name, &format!("uverbs_ferroce{}", out.len()));
        copy_cstr(&mut ibv.dev_path, &format!("/sys/class/net/{name}"));
        copy_cstr(&mut ibv.ibdev_path, &format!("/sys/class/net/{name}"));
        out.push(leak(FDevice {
            ibv,
            ifname: name,
            index: out.len() as i32,
            guid: guid_of(iface.mac),
        }));
    }
    if out.is_empty() {
        eprintln!(
            "ferroce libibverbs: no usable network interface (set {ENV_DEVICE}=<interface>, \
             e.g. {ENV_DEVICE}=eth0, and {ENV_BACKEND}=afxdp|afpacket|udp|auto)"
        );
    }
    out
}

pub(crate) fn devices() -> &'static [*mut FDevice] {
    &DEVICES.get_or_init(|| Devices(find_devices())).0
}

/// # Safety
/// `num` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ffi::ibv_device {
    let devs = devices();
    // SAFETY: calloc of n+1 pointers; the list is NULL-terminated and freed
    // by ibv_free_device_list.
    let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ffi::ibv_device>()) }
        as *mut *mut ffi::ibv_device;
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    for (i, d) in devs.iter().enumerate() {
        // SAFETY: i < n+1 slots allocated above; FDevice starts with its ibv_device.
        unsafe { *list.add(i) = *d as *mut ffi::ibv_device };
    }
    if !num.is_null() {
        // SAFETY: the caller passed a writable int.
        unsafe { *num = devs.len() as c_int };
    }
    list
}

/// # Safety
/// `list` came from ibv_get_device_list.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ffi::ibv_device) {
    // SAFETY: allocated with calloc in ibv_get_device_list.
    unsafe { libc::free(list as *mut c_void) };
}

unsafe fn fdev<'a>(d: *mut ffi::ibv_device) -> &'a FDevice {
    // SAFETY: devices handed out are FDevices, which start with their ibv_device.
    unsafe { &*(d as *const FDevice) }
}

/// # Safety
/// `dev` is a device of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ffi::ibv_device) -> *const c_char {
    // SAFETY: the caller passes a live device.
    unsafe { (*dev).name.as_ptr() }
}

/// # Safety
/// `dev` is a device of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ffi::ibv_device) -> u64 {
    // SAFETY: the caller passes a live device.
    unsafe { fdev(dev).guid }
}

/// # Safety
/// `dev` is a device of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ffi::ibv_device) -> c_int {
    // SAFETY: the caller passes a live device.
    unsafe { fdev(dev).index }
}

/// The devices open in this process, by network namespace and interface.
#[allow(clippy::type_complexity)]
static OPEN: std::sync::Mutex<Vec<((u64, String), WeakContext)>> =
    std::sync::Mutex::new(Vec::new());

/// The ferroce device of interface `ifname` (in the calling thread's
/// network namespace): the one already open in this process, else a new
/// one. Contexts of one device share it, as two ibv_open_device calls on one
/// RNIC share its QPN space; librdmacm's own context and the program's on
/// the same interface are one device then.
fn shared_context(ifname: &str) -> Result<Context, ()> {
    let key = (ferroce_nic::netns::current_net_ino(), ifname.to_string());
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    open.retain(|(_, w)| w.upgrade().is_some());
    if let Some(c) = open
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(c);
    }
    let be = backend();
    match Context::open(&DeviceConfig::new(ifname, be), OpenOptions::default()) {
        Ok(c) => {
            static AT_EXIT: std::sync::Once = std::sync::Once::new();
            AT_EXIT.call_once(|| {
                OPENER.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
                // SAFETY: registers a plain function; atexit has no other
                // requirement.
                unsafe { libc::atexit(leave_shared_at_exit) };
            });
            open.push((key, c.downgrade()));
            Ok(c)
        }
        Err(e) => {
            eprintln!(
                "ferroce libibverbs: cannot open {ifname} (backend {}): {e}",
                be.name()
            );
            Err(())
        }
    }
}

/// The process that registered [`leave_shared_at_exit`].
static OPENER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// At exit, the devices still open (programs that never close theirs,
/// librdmacm's, which it never closes) leave the tables they share with
/// other processes under `/dev/shm`, as closing them would: no file is left
/// behind, and the other members are steered right at once.
extern "C" fn leave_shared_at_exit() {
    // A forked child that exits must not take its parent's places.
    if OPENER.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    let open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    for c in open.iter().filter_map(|(_, w)| w.upgrade()) {
        c.leave_shared();
    }
}

/// # Safety
/// `dev` is a device of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ffi::ibv_device) -> *mut ffi::ibv_context {
    if dev.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the caller passes a device of ibv_get_device_list.
    let d = unsafe { fdev(dev) };
    let ctx = match shared_context(&d.ifname) {
        Ok(c) => c,
        Err(()) => {
            set_errno(libc::ENODEV);
            return ptr::null_mut();
        }
    };
    let ifname = std::ffi::CString::new(d.ifname.clone()).unwrap_or_default();
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(ifname.as_ptr()) };
    let mut vctx = ffi::verbs_context {
        sz: std::mem::size_of::<ffi::verbs_context>(),
        query_port: Some(query_port_ex),
        query_device_ex: Some(query_device_ex),
        create_qp_ex: Some(crate::qp::create_qp_ex),
        create_cq_ex: Some(crate::resources::create_cq_ex),
        ..Default::default()
    };
    let c = &mut vctx.context;
    c.device = dev;
    c.cmd_fd = -1;
    // SAFETY: plain syscall. An eventfd readable while async events wait,
    // as rdma-core's async fd: made so by the engine when some come, and
    // for good when it stops (IBV_EVENT_DEVICE_FATAL); ibv_get_async_event
    // clears it as it hands out the last.
    c.async_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    let fd = c.async_fd;
    let fatal_hook = (fd >= 0).then(|| crate::handles::signal_on_failure(&ctx, fd));
    let event_hook = (fd >= 0).then(|| ctx.on_event(move || crate::handles::signal(fd)));
    c.num_comp_vectors = 1;
    c.abi_compat = usize::MAX as *mut c_void; // __VERBS_ABI_IS_EXTENDED
    crate::datapath::fill_ops(&mut c.ops);
    let f = leak(FContext {
        vctx,
        ctx,
        dev: d,
        ifindex,
        objects: std::sync::Mutex::new(Default::default()),
        fatal_reported: Default::default(),
        fatal_hook,
        event_hook,
    });
    // SAFETY: just allocated.
    unsafe { ptr::addr_of_mut!((*f).vctx.context) }
}

/// # Safety
/// `ctx` came from ibv_open_device and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ffi::ibv_context) -> c_int {
    if ctx.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes a live context.
    let f = unsafe { fctx(ctx) } as *const FContext as *mut FContext;
    // SAFETY: allocated by leak() in ibv_open_device; nothing uses it now.
    let b = unsafe { Box::from_raw(f) };
    // The fd may not be written once closed (its number is reused).
    if let Some(id) = b.fatal_hook {
        b.ctx.remove_failure_hook(id);
    }
    if let Some(id) = b.event_hook {
        b.ctx.remove_event_hook(id);
    }
    if b.vctx.context.async_fd >= 0 {
        // SAFETY: our own fd.
        unsafe { libc::close(b.vctx.context.async_fd) };
    }
    drop(b);
    0
}

fn fill_device_attr(f: &FContext, a: &mut ffi::ibv_device_attr) {
    let d = f.ctx.query_device();
    // SAFETY: dev points at a static FDevice.
    let dev = unsafe { &*f.dev };
    *a = ffi::ibv_device_attr::default();
    copy_cstr(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a.node_guid = dev.guid;
    a.sys_image_guid = dev.guid;
    a.max_mr_size = d.max_mr_size;
    a.page_size_cap = 0xffff_f000; // 4 KiB and up, as rxe
                                   // rxe's vendor id (RXE_VENDOR_ID 0xFFFFFF): tools treat the device as a soft RoCE.
    a.vendor_id = 0xff_ffff;
    a.max_qp = d.max_qp as c_int;
    a.max_qp_wr = d.max_qp_wr as c_int;
    a.max_sge = d.max_sge as c_int;
    a.max_sge_rd = d.max_sge as c_int;
    a.max_cq = d.max_cq as c_int;
    a.max_cqe = d.max_cqe as c_int;
    a.max_mr = 1 << 16;
    a.max_pd = d.max_pd as c_int;
    a.max_qp_rd_atom = c_int::from(d.max_qp_rd_atom);
    a.max_res_rd_atom = c_int::from(d.max_qp_rd_atom) * 1024;
    a.max_qp_init_rd_atom = c_int::from(d.max_qp_init_rd_atom);
    a.atomic_cap = ffi::IBV_ATOMIC_HCA;
    a.max_ah = 1 << 16;
    a.max_srq = d.max_srq as c_int;
    a.max_mcast_grp = d.max_mcast_grp as c_int;
    a.max_mcast_qp_attach = d.max_mcast_qp_attach as c_int;
    a.max_total_mcast_qp_attach = d.max_total_mcast_qp_attach as c_int;
    a.max_srq_wr = d.max_qp_wr as c_int;
    a.max_srq_sge = d.max_sge as c_int;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
}

/// # Safety
/// Live context, writable attr.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_device_attr,
) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: checked non-null; the caller passes live objects.
    unsafe { fill_device_attr(fctx(ctx), &mut *attr) };
    0
}

unsafe extern "C" fn query_device_ex(
    ctx: *mut ffi::ibv_context,
    _input: *const ffi::ibv_query_device_ex_input,
    attr: *mut ffi::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    let mut full = ffi::ibv_device_attr_ex::default();
    // SAFETY: live context (caller).
    fill_device_attr(unsafe { fctx(ctx) }, &mut full.orig_attr);
    full.phys_port_cnt_ex = 1;
    let n = attr_size.min(std::mem::size_of::<ffi::ibv_device_attr_ex>());
    // SAFETY: the caller's struct has attr_size bytes; we copy at most that.
    unsafe { ptr::copy_nonoverlapping(&full as *const _ as *const u8, attr as *mut u8, n) };
    0
}

pub(crate) fn mtu_enum(bytes: u32) -> ffi::ibv_mtu {
    match bytes {
        0..=256 => ffi::IBV_MTU_256,
        257..=512 => ffi::IBV_MTU_512,
        513..=1024 => ffi::IBV_MTU_1024,
        1025..=2048 => ffi::IBV_MTU_2048,
        _ => ffi::IBV_MTU_4096,
    }
}

fn port_attr(f: &FContext) -> ffi::ibv_port_attr {
    let p = f.ctx.query_port();
    // rxe's port follows its netdev: ACTIVE while it is up and running,
    // else DOWN; phys_state LinkUp, else Polling (up, no carrier) or
    // Disabled (IBTA 14.2.5.6 PortPhysicalState: 5, 2, 3).
    let (state, phys_state) = match (p.active, p.admin_up) {
        (true, _) => (ffi::IBV_PORT_ACTIVE, 5),
        (false, true) => (ffi::IBV_PORT_DOWN, 2),
        (false, false) => (ffi::IBV_PORT_DOWN, 3),
    };
    ffi::ibv_port_attr {
        state,
        max_mtu: mtu_enum(p.max_mtu),
        active_mtu: mtu_enum(p.active_mtu),
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: ffi::IBV_PORT_CM_SUP,
        max_msg_sz: f.ctx.query_device().max_msg_size.min(u64::from(u32::MAX)) as u32,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 1,  // 1X
        active_speed: 32, // EDR, as rxe reports for a 10G+ link
        phys_state,
        link_layer: ffi::IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// # Safety
/// Live context; `attr` is a writable `_compat_ibv_port_attr` (the fields
/// of ibv_port_attr before `flags`).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ffi::ibv_context,
    port: u8,
    attr: *mut ffi::_compat_ibv_port_attr,
) -> c_int {
    if ctx.is_null() || attr.is_null() || port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: live context.
    let a = port_attr(unsafe { fctx(ctx) });
    let n = std::mem::offset_of!(ffi::ibv_port_attr, flags);
    // SAFETY: the compat struct is the prefix of ibv_port_attr up to `flags`.
    unsafe { ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
    0
}

unsafe extern "C" fn query_port_ex(
    ctx: *mut ffi::ibv_context,
    port: u8,
    attr: *mut ffi::ibv_port_attr,
    len: usize,
) -> c_int {
    if ctx.is_null() || attr.is_null() || port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: live context.
    let a = port_attr(unsafe { fctx(ctx) });
    let n = len.min(std::mem::size_of::<ffi::ibv_port_attr>());
    // SAFETY: the caller's struct has `len` bytes.
    unsafe { ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
    0
}

fn gid_at(f: &FContext, index: c_int) -> Option<Ipv6Addr> {
    usize::try_from(index)
        .ok()
        .and_then(|i| f.ctx.query_gid(i).ok())
}

/// # Safety
/// Live context, writable gid.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ffi::ibv_gid,
) -> c_int {
    if ctx.is_null() || gid.is_null() || port != 1 {
        return -1;
    }
    // SAFETY: live context.
    match gid_at(unsafe { fctx(ctx) }, index) {
        Some(g) => {
            // SAFETY: writable gid (caller).
            unsafe { (*gid).raw = g.octets() };
            0
        }
        None => {
            set_errno(libc::EINVAL);
            -1
        }
    }
}

fn gid_entry(f: &FContext, index: u32, g: Ipv6Addr) -> ffi::ibv_gid_entry {
    ffi::ibv_gid_entry {
        gid: ffi::ibv_gid { raw: g.octets() },
        gid_index: index,
        port_num: 1,
        gid_type: ffi::IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: f.ifindex,
    }
}

/// # Safety
/// Live context; `entry` has `entry_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ffi::ibv_context,
    port: u32,
    index: u32,
    entry: *mut ffi::ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    if ctx.is_null() || entry.is_null() || port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: live context.
    let f = unsafe { fctx(ctx) };
    let Some(g) = gid_at(f, index as c_int) else {
        return libc::ENODATA;
    };
    let e = gid_entry(f, index, g);
    let n = entry_size.min(std::mem::size_of::<ffi::ibv_gid_entry>());
    // SAFETY: the caller's entry has entry_size bytes.
    unsafe { ptr::copy_nonoverlapping(&e as *const _ as *const u8, entry as *mut u8, n) };
    0
}

/// # Safety
/// Live context; `entries` has room for `max` entries of `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ffi::ibv_context,
    entries: *mut ffi::ibv_gid_entry,
    max: usize,
    _flags: u32,
    entry_size: usize,
) -> isize {
    if ctx.is_null() || entries.is_null() || entry_size == 0 {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: live context.
    let f = unsafe { fctx(ctx) };
    let gids = f.ctx.gids();
    if gids.len() > max {
        return -(libc::EINVAL as isize);
    }
    let n = entry_size.min(std::mem::size_of::<ffi::ibv_gid_entry>());
    for (i, g) in gids.iter().enumerate() {
        let e = gid_entry(f, i as u32, *g);
        // SAFETY: i < max entries of entry_size bytes each.
        unsafe {
            ptr::copy_nonoverlapping(
                &e as *const _ as *const u8,
                (entries as *mut u8).add(i * entry_size),
                n,
            )
        };
    }
    gids.len() as isize
}

/// rdma-core's private `ibv_query_gid_type`: every entry is RoCE v2
/// (enum ibv_gid_type_sysfs: IB/RoCE v1 = 0, RoCE v2 = 1).
///
/// # Safety
/// Live context, writable type.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    if ctx.is_null() || ty.is_null() || port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: live context.
    if gid_at(unsafe { fctx(ctx) }, index as c_int).is_none() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: writable (caller).
    unsafe { *ty = 1 };
    0
}

/// # Safety
/// Writable pkey.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    _ctx: *mut ffi::ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if pkey.is_null() || port != 1 || index != 0 {
        return -1;
    }
    // SAFETY: writable (caller). The default P_Key 0xFFFF (big-endian, same bytes).
    unsafe { *pkey = 0xffff };
    0
}

#[no_mangle]
pub extern "C" fn ibv_get_pkey_index(_ctx: *mut ffi::ibv_context, port: u8, pkey: u16) -> c_int {
    if port == 1 && pkey == 0xffff {
        0
    } else {
        set_errno(libc::ENOENT);
        -1
    }
}

/// Read `dir/file` into `buf` (NUL-terminated, trailing newline dropped);
/// returns its length or -1.
///
/// # Safety
/// NUL-terminated strings; `buf` has `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    // SAFETY: NUL-terminated (caller).
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
    let Ok(mut s) = std::fs::read(&path) else {
        return -1;
    };
    if s.last() == Some(&b'\n') {
        s.pop();
    }
    let n = s.len().min(size - 1);
    // SAFETY: n < size bytes plus the NUL fit in buf.
    unsafe {
        ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    n as c_int
}

/// # Safety
/// `path` has `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_the_modified_eui64_in_network_order() {
        let g = guid_of([0x02, 0xfe, 0, 0, 0, 0x01]);
        assert_eq!(
            g.to_ne_bytes(),
            [0x00, 0xfe, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x01]
        );
    }

    #[test]
    fn mtu_enum_rounds_down_to_an_ib_mtu() {
        assert_eq!(mtu_enum(256), ffi::IBV_MTU_256);
        assert_eq!(mtu_enum(1024), ffi::IBV_MTU_1024);
        assert_eq!(mtu_enum(1500), ffi::IBV_MTU_2048);
        assert_eq!(mtu_enum(4096), ffi::IBV_MTU_4096);
    }
}
