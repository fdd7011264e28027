//! Run a whole job as threads of one process: every rank gets its own
//! device on a chosen fabric, the ranks meet at a TCP rendezvous on
//! loopback, and each runs the same body with its world communicator.
//! Tests and `ferroce-coll-bench` use it; real jobs use [`Bootstrap`] and
//! [`Rendezvous`] directly (one process per rank).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferroce_verbs::{Backend, Context, DeviceConfig, EngineMode, OpenOptions};

use crate::bootstrap::{Bootstrap, Rendezvous};
use crate::communicator::Communicator;
use crate::error::{env_number, Error, Result};
use crate::transport::local::local_world;
use crate::transport::rdma::{RdmaConfig, RdmaEndpoint};
use crate::transport::split::SplitTransport;

/// Where the ranks' packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabric {
    /// No network: channels between threads (checks algorithms only).
    Local,
    /// ferroce over the in-memory N-port switch (no root needed).
    Mem,
    /// ferroce's UDP backend on loopback addresses 127.x.y.(rank+1) (no root).
    Udp,
    /// One network namespace per rank on a bridge, MTU 9000 (root).
    Netns,
}

impl Fabric {
    pub fn parse(s: &str) -> Option<Fabric> {
        Some(match s {
            "local" => Fabric::Local,
            "mem" => Fabric::Mem,
            "udp" => Fabric::Udp,
            "netns" => Fabric::Netns,
            _ => return None,
        })
    }
}

/// How each rank's device is opened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceOptions {
    /// Packet backend on the namespace fabric (mem and udp fix their own).
    pub backend: Backend,
    /// Who runs the device's engine.
    pub mode: EngineMode,
    /// Seeded loss, reordering, ... on every rank's receive path (the
    /// `tc netem` of a kernel without sch_netem); the seed is varied by rank.
    pub faults: Option<ferroce_nic::FaultConfig>,
    /// Responder ACK coalescing (the core's `ack_delay`): each QP may hold
    /// back its ACK this long so one ACK covers several messages. Small
    /// exchanges then cost two frames instead of four (data and ACK each
    /// way), which on 2 cores with 4 ranks is most of an 8-byte allreduce.
    /// Capped at an eighth of the QPs' local ACK time-out (see [`run_with`]).
    pub ack_delay: Option<Duration>,
    /// A held-back ACK goes out once it covers this many messages; capped
    /// at half the credit window so a sender never stalls on it.
    pub ack_coalesce: u32,
    /// A second device per rank, on this backend, for messages of at most
    /// [`small_max`](Self::small_max) bytes ([`SplitTransport`]); every rank
    /// of the job must be given the same. Only [`run_env`] honours it.
    pub small_backend: Option<Backend>,
    /// The largest message the `small_backend` device carries.
    pub small_max: usize,
}

impl Default for DeviceOptions {
    /// UDP on namespaces (the fastest path on veth here, see README), engine
    /// driven by the rank's own thread (no hand-off per completion).
    fn default() -> Self {
        DeviceOptions {
            backend: Backend::Udp,
            mode: EngineMode::Polling,
            faults: None,
            ack_delay: Some(Duration::from_micros(500)),
            ack_coalesce: 4,
            small_backend: None,
            small_max: SMALL_MAX,
        }
    }
}

impl DeviceOptions {
    /// Defaults, overridden by `FERROCE_BACKEND` (afxdp, afpacket, udp,
    /// auto), `FERROCE_ENGINE` (thread, poll), `FERROCE_ACK_DELAY_US` (0 =
    /// no coalescing), `FERROCE_ACK_COALESCE` (messages per ACK),
    /// `FERROCE_COLL_SMALL_BACKEND` (a second device for small messages;
    /// empty or `none`: no second device) and `FERROCE_COLL_SMALL_MAX`
    /// (bytes).
    pub fn from_env() -> Result<DeviceOptions> {
        let mut d = DeviceOptions::default();
        if let Ok(v) = std::env::var("FERROCE_BACKEND") {
            d.backend = v.parse().map_err(Error::Invalid)?;
        }
        if let Ok(v) = std::env::var("FERROCE_ENGINE") {
            d.mode = parse_mode(&v)?;
        }
        if let Some(us) = env_number::<u64>("FERROCE_ACK_DELAY_US")? {
            d.ack_delay = (us > 0).then(|| Duration::from_micros(us));
        }
        if let Some(n) = env_number("FERROCE_ACK_COALESCE")? {
            d.ack_coalesce = n;
        }
        match std::env::var("FERROCE_COLL_SMALL_BACKEND") {
            Ok(v) if !v.is_empty() && v != "none" => {
                d.small_backend = Some(v.parse().map_err(Error::Invalid)?);
            }
            _ => {}
        }
        if let Some(n) = env_number("FERROCE_COLL_SMALL_MAX")? {
            d.small_max = n;
        }
        Ok(d)
    }

    /// The ACK coalescing limits fitted to a transport's settings: the
    /// delay at most an eighth of the local ACK time-out (so a held-back
    /// ACK never makes the peer retransmit), the count at most half the
    /// credit window.
    pub fn fit(mut self, cfg: &RdmaConfig) -> DeviceOptions {
        if let (Some(d), Some(t)) = (
            self.ack_delay,
            ferroce_stack::transport::timers::local_ack_timeout(cfg.ack_timeout),
        ) {
            self.ack_delay = Some(d.min(t / 8));
        }
        self.ack_coalesce = self.ack_coalesce.clamp(1, (cfg.slots / 2).max(1) as u32);
        self
    }

    fn open_options(&self) -> OpenOptions {
        OpenOptions {
            mode: self.mode,
            core: ferroce_stack::transport::Config {
                ack_delay: self.ack_delay,
                ack_coalesce: self.ack_coalesce,
                ..Default::default()
            },
        }
    }
}

/// `thread` or `poll`.
pub fn parse_mode(s: &str) -> Result<EngineMode> {
    match s {
        "thread" => Ok(EngineMode::Thread),
        "poll" | "polling" => Ok(EngineMode::Polling),
        o => Err(Error::Invalid(format!("engine mode {o:?} (thread, poll)"))),
    }
}

/// Default [`DeviceOptions::small_max`]: over veth between 4 namespaces an
/// AF_XDP device beat the UDP backend on allreduce up to 8 KiB (1.7-2.0×
/// Open MPI's speed against 0.6-1.1×) and lost from 32 KiB on (0.8× against
/// 0.7× there, 0.4-0.6× against 0.9-1.0× from 512 KiB;
/// `scripts/coll-vs-mpi.sh`).
pub const SMALL_MAX: usize = 16 << 10;

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// Run `body` on `n` ranks over `fabric` with devices opened as
/// [`DeviceOptions::from_env`] says; results by rank.
pub fn run<R: Send>(
    fabric: Fabric,
    n: usize,
    cfg: RdmaConfig,
    body: impl Fn(&Communicator<'_>) -> Result<R> + Sync,
) -> Result<Vec<Result<R>>> {
    run_with(fabric, n, cfg, DeviceOptions::from_env()?, body)
}

/// [`run`] with explicit device options.
pub fn run_with<R: Send>(
    fabric: Fabric,
    n: usize,
    cfg: RdmaConfig,
    dev: DeviceOptions,
    body: impl Fn(&Communicator<'_>) -> Result<R> + Sync,
) -> Result<Vec<Result<R>>> {
    if n == 0 {
        return Err(Error::Invalid("a job needs at least one rank".into()));
    }
    if fabric == Fabric::Local {
        let ts = local_world(n, cfg.timeout);
        return Ok(std::thread::scope(|s| {
            let hs: Vec<_> = ts
                .into_iter()
                .map(|t| {
                    let body = &body;
                    s.spawn(move || body(&Communicator::new(t)?))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Invalid("rank panicked".into())))
                })
                .collect()
        }));
    }
    let ctxs = open_devices(fabric, n, dev.fit(&cfg))?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::RendezvousIo {
        what: "binding the test rendezvous".into(),
        source: e,
    })?;
    let master = listener
        .local_addr()
        .map_err(|e| Error::RendezvousIo {
            what: "rendezvous address".into(),
            source: e,
        })?
        .to_string();
    let mut listener = Some(listener);
    let (ctxs, _topo) = ctxs;
    Ok(std::thread::scope(|s| {
        let hs: Vec<_> = ctxs
            .into_iter()
            .enumerate()
            .map(|(rank, ctx)| {
                let body = &body;
                let master = master.clone();
                let l = if rank == 0 { listener.take() } else { None };
                s.spawn(move || -> Result<R> {
                    if crate::bind::binding_from_env()? {
                        crate::bind::bind_current_thread(rank)?;
                    }
                    let b = Bootstrap::new(rank, n, master)?.with_timeout(cfg.timeout);
                    let mut rv = match l {
                        Some(l) if n > 1 => Rendezvous::serve(&b, l)?,
                        _ => Rendezvous::connect(&b)?,
                    };
                    let ep = RdmaEndpoint::new(ctx);
                    let t = ep.connect(&mut rv, &cfg)?;
                    drop(rv);
                    let comm = Communicator::new(t)?;
                    let r = body(&comm);
                    report_stats(rank, &ep);
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Invalid("rank panicked".into())))
            })
            .collect()
    }))
}

/// One rank of a job launched from outside (mpirun, torchrun, srun, or
/// by hand): rank and size from the environment ([`Bootstrap::from_env`]),
/// the device on `FERROCE_IFACE` or else the first interface that is up,
/// not loopback, and has an IPv4 address, in this process's namespace.
/// `FERROCE_UDP_BIND` (`ip` or `ip:port`) picks the UDP backend's address
/// when the interface has several (ranks sharing one interface).
pub fn run_env<R>(
    cfg: RdmaConfig,
    dev: DeviceOptions,
    body: impl FnOnce(&Communicator<'_>) -> Result<R>,
) -> Result<R> {
    let b = Bootstrap::from_env()?.with_timeout(cfg.timeout);
    // Before the devices open: their threads inherit it.
    crate::bind::bind_from_env(b.rank)?;
    let ifname = match std::env::var("FERROCE_IFACE") {
        Ok(i) if !i.is_empty() => i,
        _ => ferroce_verbs::device::interfaces()?
            .into_iter()
            .find(|i| i.up && i.name != "lo" && i.addrs.iter().any(|a| a.ip.is_ipv4()))
            .map(|i| i.name)
            .ok_or_else(|| {
                Error::Env("no interface with an IPv4 address (set FERROCE_IFACE)".into())
            })?,
    };
    let open = |backend: Backend, seed: u64| -> Result<Context> {
        let mut dc = DeviceConfig::new(&ifname, backend);
        dc.udp_bind = udp_bind_from_env()?;
        dc.seed ^= seed;
        dc.faults = faults_for(dev, b.rank);
        Ok(Context::open(&dc, dev.fit(&cfg).open_options())?)
    };
    let ep = RdmaEndpoint::new(open(dev.backend, b.rank as u64)?);
    // A rank that cannot open the second device fails: the others would
    // wait for it at the second connection's rendezvous.
    let small_ep = match dev.small_backend {
        Some(backend) => Some(RdmaEndpoint::new(
            open(backend, (b.rank as u64) ^ 0x5a11).map_err(|e| {
                Error::Env(format!(
                    "FERROCE_COLL_SMALL_BACKEND={}: {e}",
                    backend.name()
                ))
            })?,
        )),
        None => None,
    };
    let mut rv = Rendezvous::connect(&b)?;
    let t = ep.connect(&mut rv, &cfg)?;
    let r = match &small_ep {
        Some(small_ep) => {
            let ts = small_ep.connect(&mut rv, &cfg)?;
            drop(rv);
            body(&Communicator::new(SplitTransport::new(
                ts,
                t,
                dev.small_max,
            )?)?)
        }
        None => {
            drop(rv);
            body(&Communicator::new(t)?)
        }
    };
    report_stats(b.rank, &ep);
    if let Some(small_ep) = &small_ep {
        report_stats(b.rank, small_ep);
    }
    r
}

/// [`run_env`] over rdma-core's libibverbs (feature `rdma-core`): the device
/// is `FERROCE_IBV_DEVICE` or the first one, the GID `FERROCE_IBV_GID` or the
/// RoCE v2 IPv4-mapped one ([`crate::IbvEndpoint::from_env`]). Ranks of one
/// job may mix this and [`run_env`] (ferroce): the rendezvous and the wire
/// protocol are the same.
#[cfg(feature = "rdma-core")]
pub fn run_env_ibverbs<R>(
    cfg: RdmaConfig,
    body: impl FnOnce(&Communicator<'_>) -> Result<R>,
) -> Result<R> {
    let b = Bootstrap::from_env()?.with_timeout(cfg.timeout);
    let ep = crate::IbvEndpoint::from_env()?;
    if std::env::var_os("FERROCE_COLL_STATS").is_some() {
        eprintln!(
            "# rank {}: rdma-core device {}, GID[{}] {}",
            b.rank,
            ep.name(),
            ep.gid_index(),
            ep.gid()
        );
    }
    let mut rv = Rendezvous::connect(&b)?;
    let t = ep.connect(&mut rv, &cfg)?;
    drop(rv);
    let comm = Communicator::new(t)?;
    body(&comm)
}

/// `FERROCE_UDP_BIND`: an address (port 4791) or a socket address.
fn udp_bind_from_env() -> Result<Option<SocketAddr>> {
    let Ok(v) = std::env::var("FERROCE_UDP_BIND") else {
        return Ok(None);
    };
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    v.parse::<IpAddr>()
        .map(|ip| Some(SocketAddr::new(ip, ferroce_nic::ROCE_V2_PORT)))
        .map_err(|_| Error::Env(format!("FERROCE_UDP_BIND={v:?} is not an address")))
}

/// With `FERROCE_COLL_STATS` set: the device counters of a rank on stderr
/// (retransmissions, time-outs and drops say whether a run was clean).
fn report_stats(rank: usize, ep: &RdmaEndpoint) {
    if std::env::var_os("FERROCE_COLL_STATS").is_none() {
        return;
    }
    let s = ep.context().stats();
    eprintln!(
        "# rank {rank}: {} frames out, {} in, {} retransmits, {} time-outs, {} out of sequence, \
         {} NAKs sent, drops {:?}; backend {:?}",
        s.core.tx_packets,
        s.core.rx_frames,
        s.core.retransmits,
        s.core.timeouts,
        s.core.out_of_sequence,
        s.core.naks_sent,
        s.core.drops,
        s.io
    );
}

fn faults_for(dev: DeviceOptions, rank: usize) -> Option<ferroce_nic::FaultConfig> {
    dev.faults.map(|f| ferroce_nic::FaultConfig {
        seed: f.seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ..f
    })
}

type Devices = (Vec<Context>, Option<ferroce_nic::netns::Topology>);

/// One device per rank on `fabric` (and the namespaces, kept alive by the caller).
pub fn open_devices(fabric: Fabric, n: usize, dev: DeviceOptions) -> Result<Devices> {
    let opts = dev.open_options();
    let id = NEXT_NET.fetch_add(1, Ordering::Relaxed);
    match fabric {
        Fabric::Local => Err(Error::Invalid("the local fabric has no devices".into())),
        Fabric::Mem => {
            let sw = ferroce_nic::mem::Switch::new(ferroce_nic::mem::SwitchConfig {
                ports: n,
                ..Default::default()
            })
            .map_err(ferroce_verbs::Error::from)?;
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let port = sw.port(i).map_err(ferroce_verbs::Error::from)?;
                let io: Box<dyn ferroce_nic::PacketIo> = match faults_for(dev, i) {
                    None => Box::new(port),
                    Some(f) => Box::new(
                        ferroce_nic::FaultIo::new(port, f).map_err(ferroce_verbs::Error::from)?,
                    ),
                };
                let gid =
                    Ipv4Addr::new(198, 18, (i >> 8) as u8, (i & 0xff) as u8 + 1).to_ipv6_mapped();
                v.push(Context::with_io(
                    io,
                    &format!("mem{i}"),
                    vec![gid],
                    u64::from(id) * 1000 + i as u64,
                    opts,
                )?);
            }
            Ok((v, None))
        }
        Fabric::Udp => {
            // A /24 of loopback per job: 127.<pid-derived>.<counter>.<rank+1>.
            let a = (std::process::id() % 200) as u8 + 20;
            let b = (id % 250) as u8 + 1;
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let mut cfg = DeviceConfig::new("lo", Backend::Udp);
                cfg.udp_bind = Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(127, a, b, i as u8 + 1)),
                    ferroce_nic::ROCE_V2_PORT,
                ));
                cfg.seed = u64::from(id) * 1000 + i as u64;
                cfg.faults = faults_for(dev, i);
                v.push(Context::open(&cfg, opts)?);
            }
            Ok((v, None))
        }
        Fabric::Netns => {
            use ferroce_nic::netns::{Topology, TopologyConfig};
            let topo = Topology::up(&TopologyConfig {
                hosts: n.max(2),
                bridge: true,
                ..Default::default()
            })
            .map_err(ferroce_verbs::Error::from)?;
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let mut cfg = DeviceConfig::new(&topo.host(i).ifname, dev.backend);
                cfg.netns = Some(topo.host(i).ns.clone());
                cfg.seed = u64::from(id) * 1000 + i as u64;
                cfg.faults = faults_for(dev, i);
                let ctx = topo
                    .run_in(i, move || Context::open(&cfg, opts))
                    .map_err(ferroce_verbs::Error::from)??;
                v.push(ctx);
            }
            Ok((v, Some(topo)))
        }
    }
}

/// A default time-out for tests: long enough for 2 shared cores.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(20);
