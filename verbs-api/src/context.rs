//! A device context (ibv_context): one opened device with its engine, its GID
//! table and its attributes.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ferroce_nic::{NicError, PacketIo};
use ferroce_stack::transport::{mcast, Config, Core, Path};

use crate::device::{self, DeviceConfig, Interface};
use crate::engine::{Engine, EngineMode, Inner};
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;

/// Device attributes (the fields of ibv_device_attr ferroce fills in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr_size: u64,
    pub max_pd: u32,
    pub max_qp_rd_atom: u8,
    pub max_qp_init_rd_atom: u8,
    pub max_srq: u32,
    pub max_inline_data: u32,
    pub max_msg_size: u64,
    /// Multicast groups, QPs per group, attachments in all (rxe's limits).
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
}

/// Port attributes (ibv_port_attr, RoCE: link layer Ethernet, always port 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// IB path MTU in bytes the link allows (rxe: largest ≤ Ethernet MTU − 80).
    pub active_mtu: u32,
    pub max_mtu: u32,
    /// Ethernet MTU the port carries: the interface's, or less where the
    /// packet engine carries less (AF_XDP before Linux 6.6: one 4 KiB chunk).
    pub eth_mtu: u32,
    pub gid_tbl_len: u32,
    /// The port is ACTIVE: its interface is up and running (has a carrier),
    /// as an rxe port follows its netdev. Otherwise DOWN.
    pub active: bool,
    /// The interface is administratively up (IFF_UP): a port that is not
    /// active then waits for a carrier (rxe's phys_state POLLING, else DISABLED).
    pub admin_up: bool,
}

/// What the engine has counted (frames, retransmissions, drops by reason).
#[derive(Debug, Clone)]
pub struct DeviceStats {
    pub core: ferroce_stack::transport::Stats,
    pub io: ferroce_nic::Stats,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub engine: Arc<Engine>,
    pub name: String,
    pub backend: &'static str,
    pub mac: [u8; 6],
    pub eth_mtu: u32,
    /// The largest path MTU the packet engine can carry.
    pub max_mtu: u32,
    pub gids: Vec<Ipv6Addr>,
    pub ifname: Option<String>,
    pub netns: Option<String>,
    /// UDP backend: the port the kernel socket sends from. The ICRC covers
    /// the UDP source port, so frames must be built with this one.
    pub udp_sport: Option<u16>,
    /// UDP backend: the address its socket is bound to; it sends from that
    /// address only, so only that GID can be a source.
    pub udp_local: Option<SocketAddr>,
    /// Raw backend: the UDP sockets peers on this host reach it through
    /// (`ferroce_nic::local_peers`); frames to them are built for these.
    pub local_peers: Vec<SocketAddr>,
    pub attr: DeviceAttr,
    next_iova: AtomicU64,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.engine.stop.store(true, Ordering::Release);
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            t.thread().unpark();
            let _ = t.join();
        }
        self.engine.lock().publish_closed();
    }
}

impl Shared {
    /// A fresh, page-aligned I/O virtual address range for a new memory region.
    pub fn alloc_iova(&self, len: u64) -> u64 {
        let span = len.div_ceil(4096).max(1) * 4096 + 4096;
        self.next_iova.fetch_add(span, Ordering::Relaxed)
    }

    /// Surface an engine failure as an error.
    pub fn check_engine(&self) -> Result<()> {
        match self.engine.failed() {
            Some(why) => Err(Error::EngineStopped(why)),
            None => Ok(()),
        }
    }
}

/// An open device. Cheap to clone; the engine stops when the last clone and
/// every object made from it are dropped.
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) shared: Arc<Shared>,
}

/// A reference to an open device that does not keep it open (see
/// [`Context::downgrade`]).
#[derive(Debug, Clone)]
pub struct WeakContext(std::sync::Weak<Shared>);

impl WeakContext {
    /// The device, if something still holds it open.
    pub fn upgrade(&self) -> Option<Context> {
        self.0.upgrade().map(|shared| Context { shared })
    }
}

/// Settings for [`Context::open`] beyond the device itself.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    pub mode: EngineMode,
    pub core: Config,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            mode: EngineMode::Thread,
            core: Config::default(),
        }
    }
}

impl Context {
    /// A reference that does not keep the device open: a registry of open
    /// devices (the drop-in libibverbs shares one per interface) holds these.
    pub fn downgrade(&self) -> WeakContext {
        WeakContext(Arc::downgrade(&self.shared))
    }

    /// Open a device on an interface of the calling thread's network namespace.
    pub fn open(cfg: &DeviceConfig, opts: OpenOptions) -> Result<Context> {
        let opened = device::open_io(cfg)?;
        let gids = match opened.udp_local {
            // A UDP socket's frames come from the one address it is bound to.
            Some(SocketAddr::V4(a)) if !a.ip().is_unspecified() => {
                vec![
                    device::link_local_gid(opened.iface.mac),
                    a.ip().to_ipv6_mapped(),
                ]
            }
            Some(SocketAddr::V6(a)) if !a.ip().is_unspecified() => {
                vec![device::link_local_gid(opened.iface.mac), *a.ip()]
            }
            _ => device::gid_table(&opened.iface),
        };
        let name = format!("ferroce_{}_{}", opened.backend.name(), opened.iface.name);
        let mut ctx = Self::build(
            opened.io,
            name,
            opened.backend.name(),
            Some(&opened.iface),
            gids,
            cfg.seed,
            opts,
        )?;
        if let Some(s) = Arc::get_mut(&mut ctx.shared) {
            s.netns = cfg.netns.clone();
            s.udp_sport = opened.udp_local.map(|a| a.port());
            s.udp_local = opened.udp_local;
            s.local_peers = opened.local_peers;
        }
        Ok(ctx)
    }

    /// Open a device over any backend (the in-memory switch in tests, say),
    /// with the GID table given.
    pub fn with_io(
        io: Box<dyn PacketIo>,
        name: &str,
        gids: Vec<Ipv6Addr>,
        seed: u64,
        opts: OpenOptions,
    ) -> Result<Context> {
        let kind = io.kind();
        Self::build(io, name.to_string(), kind, None, gids, seed, opts)
    }

    fn build(
        mut io: Box<dyn PacketIo>,
        name: String,
        backend: &'static str,
        iface: Option<&Interface>,
        gids: Vec<Ipv6Addr>,
        seed: u64,
        opts: OpenOptions,
    ) -> Result<Context> {
        if opts.mode == EngineMode::Polling && kernel_busy_poll() {
            // The polling thread's receives then poll the driver too (SO_BUSY_POLL and
            // friends); without CAP_NET_ADMIN the kernel may refuse, which only costs that.
            if let Err(e) = io.set_busy_poll(true) {
                tracing::debug!("kernel busy polling not enabled: {e}");
            }
        }
        let mac = io.mac();
        // The engine may carry less than the interface (AF_XDP on a kernel
        // without multi-buffer sockets: one 4 KiB chunk per frame).
        let engine_mtu = io.max_frame_len().saturating_sub(14) as u32;
        let eth_mtu = match iface {
            Some(i) => i.mtu.min(engine_mtu),
            None => engine_mtu,
        };
        let mut c = opts.core;
        // UD QPs take the port's MTU (rxe does the same).
        c.port_mtu = device::ib_mtu_for(eth_mtu);
        let max_mtu = device::ib_mtu_for(engine_mtu);
        c.max_mtu = max_mtu;
        // A port shared with other processes' devices: our QPNs carry the
        // prefix datagrams are steered by.
        if let Some(p) = io.qpn_prefix() {
            c.set_qpn_prefix(p);
        }
        // The kernel loops a UDP socket's multicast sends back to the host's
        // members itself (IP_MULTICAST_LOOP); raw frames come back to nobody.
        c.mcast_loopback = io.kind() != "udp";
        let attr = DeviceAttr {
            max_qp: c.max_qp,
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_cq: c.max_cq,
            max_cqe: c.max_cqe,
            max_mr_size: 1 << 40,
            max_pd: 1 << 16,
            max_qp_rd_atom: ferroce_stack::transport::qp::MAX_RD_ATOMIC,
            max_qp_init_rd_atom: ferroce_stack::transport::qp::MAX_RD_ATOMIC,
            max_srq: c.max_srq,
            max_inline_data: c.max_inline_data,
            max_msg_size: c.max_msg_size,
            max_mcast_grp: mcast::MAX_MCAST_GRP,
            max_mcast_qp_attach: mcast::MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach: mcast::MAX_TOTAL_MCAST_QP_ATTACH,
        };
        let mut inner = Inner::new(Core::new(c, seed), io);
        if let Some(link) = iface.and_then(|i| ferroce_nic::ifaces::LinkWatch::new(&i.name).ok()) {
            inner.watch_link(link);
        }
        inner.publisher = crate::counters::Publisher::new(&name, backend);
        inner.defer_tx_after_recv = opts.mode == EngineMode::Polling;
        let engine = Arc::new(Engine::new(inner, opts.mode));
        let thread = match opts.mode {
            EngineMode::Thread => {
                let e = Arc::clone(&engine);
                Some(
                    std::thread::Builder::new()
                        .name(format!("ferroce-engine-{backend}"))
                        .spawn(move || e.run())
                        .map_err(|e| Error::Io("spawning the engine thread", e))?,
                )
            }
            EngineMode::Polling => {
                let e = Arc::clone(&engine);
                Some(
                    std::thread::Builder::new()
                        .name(format!("ferroce-keeper-{backend}"))
                        .spawn(move || e.keep())
                        .map_err(|e| Error::Io("spawning the keeper thread", e))?,
                )
            }
        };
        Ok(Context {
            shared: Arc::new(Shared {
                engine,
                name,
                backend,
                mac,
                eth_mtu,
                max_mtu,
                gids,
                ifname: iface.map(|i| i.name.clone()),
                netns: None,
                udp_sport: None,
                udp_local: None,
                local_peers: Vec::new(),
                attr,
                // Page-aligned, far from zero, like a user-space heap address.
                next_iova: AtomicU64::new(0x5500_0000_0000 + (seed & 0xff_ffff) * 0x10_0000),
                thread: std::sync::Mutex::new(thread),
            }),
        })
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }
    pub fn backend(&self) -> &'static str {
        self.shared.backend
    }
    pub fn mac(&self) -> [u8; 6] {
        self.shared.mac
    }

    pub fn query_device(&self) -> DeviceAttr {
        self.shared.attr
    }

    pub fn query_port(&self) -> PortAttr {
        let mtu = device::ib_mtu_for(self.shared.eth_mtu);
        let port = self.shared.engine.lock().port;
        PortAttr {
            active_mtu: mtu,
            max_mtu: self.shared.max_mtu,
            eth_mtu: self.shared.eth_mtu,
            gid_tbl_len: self.shared.gids.len() as u32,
            active: port.active(),
            admin_up: port.up,
        }
    }

    pub fn query_gid(&self, index: usize) -> Result<Ipv6Addr> {
        self.shared.gids.get(index).copied().ok_or(Error::GidIndex {
            index,
            len: self.shared.gids.len(),
        })
    }

    /// The top byte every QPN of this device carries when it shares its
    /// port with other processes' devices (`ferroce_nic::port_share`,
    /// `raw_share`); the first device on a port has 0.
    pub fn qpn_prefix(&self) -> Option<u8> {
        self.shared.engine.lock().core.config().qpn_prefix
    }

    pub fn gids(&self) -> &[Ipv6Addr] {
        &self.shared.gids
    }

    /// Takes the device out of the tables it shares with other processes
    /// under `/dev/shm` (a shared UDP port, raw devices' QPN prefixes), as
    /// closing it does: for a process about to exit with the device open.
    /// The device keeps working for this process alone.
    pub fn leave_shared(&self) {
        self.shared.engine.lock().io.leave_shared();
    }

    pub fn stats(&self) -> DeviceStats {
        let inner = self.shared.engine.lock();
        DeviceStats {
            core: inner.core.stats().clone(),
            io: inner.io.stats(),
        }
    }

    /// The counters by name, as rxe shows them in
    /// `/sys/class/infiniband/<dev>/ports/1/hw_counters`: rxe's fifteen first
    /// (sent_pkts, rcvd_pkts, duplicate_request, ...) in rxe's order, then
    /// ferroce's totals and every drop reason.
    pub fn hw_counters(&self) -> Vec<(&'static str, u64)> {
        self.shared.engine.lock().core.stats().named()
    }

    /// The file other processes read these counters from (`None` when
    /// publishing is off or no directory was writable).
    pub fn stats_path(&self) -> Option<std::path::PathBuf> {
        let inner = self.shared.engine.lock();
        inner.publisher.as_ref().map(|p| p.path().to_path_buf())
    }

    pub fn alloc_pd(&self) -> ProtectionDomain {
        let pd = self.shared.engine.lock().core.alloc_pd();
        ProtectionDomain::new(Arc::clone(&self.shared), pd)
    }

    /// The path to `dgid` from the local GID `sgid_index` (ibv_ah_attr with
    /// a GRH, resolved): MACs from the kernel's neighbour table on raw
    /// backends, flooding on the in-memory switch.
    pub fn resolve_path(&self, sgid_index: usize, dgid: Ipv6Addr) -> Result<Path> {
        let sgid = self.query_gid(sgid_index)?;
        let dst_ip: IpAddr = match dgid.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(dgid),
        };
        let mut udp_sport = self.shared.udp_sport;
        // A group's MAC follows from its address (ib_resolve_eth_dmac).
        let group_mac = ferroce_nic::mcast::multicast_mac(dst_ip);
        let dst_mac = match (group_mac, self.shared.backend, &self.shared.ifname) {
            (Some(mac), _, _) => mac,
            (None, "afxdp" | "afpacket", Some(ifname)) => {
                let ifname = ifname.clone();
                let lookup =
                    move || ferroce_nic::neigh::resolve(dst_ip, &ifname, Duration::from_secs(3));
                let r = match &self.shared.netns {
                    Some(ns) => ferroce_nic::netns::enter_and_run(ns, lookup)?,
                    None => lookup(),
                };
                // An address of this host: through the device's UDP socket on the
                // source GID, which sends from its own address and port (the ICRC
                // covers both).
                let sock = self
                    .shared
                    .local_peers
                    .iter()
                    .find(|s| gid_of(s.ip()) == sgid);
                match (r, sock) {
                    (Err(NicError::LocalPeer(_)), Some(sock)) => {
                        udp_sport = Some(sock.port());
                        self.shared.mac
                    }
                    (r, _) => r.map_err(|e| Error::Unreachable {
                        ip: dst_ip,
                        reason: e.to_string(),
                    })?,
                }
            }
            (None, "udp", _) => {
                self.udp_can_send(sgid_index, sgid, dst_ip)?;
                ferroce_nic::frame::mac_for_ip(dst_ip)
            }
            _ => [0xff; 6],
        };
        Ok(Path {
            src_mac: self.shared.mac,
            dst_mac,
            sgid,
            dgid,
            udp_sport,
            ..Path::default()
        })
    }

    /// A UDP socket sends from the one address it is bound to, and only to
    /// addresses of that family: a QP or AH on another of the table's GIDs
    /// (index 0, the link-local one, kept so that index 1 is the IPv4 GID as
    /// on rxe) had every frame dropped and retried for ever (retry_cnt 7).
    fn udp_can_send(&self, index: usize, sgid: Ipv6Addr, dst: IpAddr) -> Result<()> {
        let Some(local) = self.shared.udp_local.filter(|a| !a.ip().is_unspecified()) else {
            return Ok(());
        };
        let own = gid_of(local.ip());
        let reason = if sgid != own {
            let hint = match self.shared.gids.iter().position(|g| *g == own) {
                Some(i) => format!("GID index {i}"),
                None => format!("GID {own}"),
            };
            format!(
                "the UDP backend sends from {} only: use {hint}, or a raw backend \
                 (FERROCE_BACKEND=afpacket, --backend afpacket) for IPv6",
                local.ip()
            )
        } else if local.is_ipv4() != dst.is_ipv4() {
            format!(
                "the UDP backend's socket on {} cannot reach {dst}: the destination GID \
                 must be of the same family",
                local.ip()
            )
        } else {
            return Ok(());
        };
        Err(Error::GidUnusable {
            index,
            gid: sgid,
            reason,
        })
    }

    /// Calls `hook` (from the thread that finds out) when the device's
    /// packet engine stops for good — its interface went away, say — after
    /// which every call fails with [`Error::EngineStopped`]; at once if it
    /// has stopped already. What rdma-core reports as IBV_EVENT_DEVICE_FATAL.
    /// Returns a number for [`Context::remove_failure_hook`].
    pub fn on_failure(&self, hook: impl Fn() + Send + Sync + 'static) -> u64 {
        self.shared.engine.on_failure(Box::new(hook))
    }

    /// Forgets a hook of [`Context::on_failure`]: it is not called after this
    /// returns.
    pub fn remove_failure_hook(&self, id: u64) {
        self.shared.engine.remove_failure_hook(id)
    }

    /// Whether the device's packet engine has stopped for good (see
    /// [`Context::on_failure`]), and why.
    pub fn failure(&self) -> Option<String> {
        self.shared.engine.failed()
    }

    /// The next asynchronous event of the device (ibv_get_async_event), if any.
    pub fn poll_async_event(&self) -> Option<ferroce_stack::transport::AsyncEvent> {
        self.shared.engine.lock().poll_async_event()
    }

    /// The next change of the port's state (IBV_EVENT_PORT_ACTIVE /
    /// IBV_EVENT_PORT_ERR), if any. The engine looks at the interface every
    /// 100 ms; [`Context::query_port`] gives the state it last saw.
    pub fn poll_port_event(&self) -> Option<crate::PortEvent> {
        self.shared.engine.lock().poll_port_event()
    }

    /// Whether events wait for [`Context::poll_async_event`] or
    /// [`Context::poll_port_event`].
    pub fn events_waiting(&self) -> bool {
        self.shared.engine.lock().events_waiting()
    }

    /// Calls `hook` when asynchronous events (those of
    /// [`Context::poll_async_event`] and [`Context::poll_port_event`]) come
    /// to wait after all were taken: to make an fd readable, say. It runs on
    /// the engine's thread with the device locked, so it must not call into
    /// the device. Returns its number for [`Context::remove_event_hook`].
    pub fn on_event(&self, hook: impl Fn() + Send + Sync + 'static) -> u64 {
        self.shared.engine.on_event(Box::new(hook))
    }

    /// Forgets a hook of [`Context::on_event`]: it is not called after this
    /// returns.
    pub fn remove_event_hook(&self, id: u64) {
        self.shared.engine.remove_event_hook(id)
    }

    /// Run one engine step from this thread (polling mode; harmless otherwise).
    pub fn progress(&self) -> usize {
        self.shared.engine.step_now()
    }
}

/// The GID of an IP address as it appears in a GID table (IPv4 mapped).
pub fn gid_of(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// Whether a polling-mode device asks its backend to busy-poll in the kernel
/// too (`FERROCE_KERNEL_BUSY_POLL=1`). Off by default: over veth it slowed
/// AF_XDP's 8 B round trip (5.1-5.2 µs half round trip against 4.4) and left
/// UDP's as it was; it is there for NICs whose NAPI polling may pay off.
fn kernel_busy_poll() -> bool {
    std::env::var("FERROCE_KERNEL_BUSY_POLL").is_ok_and(|v| v == "1")
}
