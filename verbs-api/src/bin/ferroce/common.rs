//! What the tools share: picking and opening a device from `-d` / `--backend`.

use std::path::Path;

use ferroce_verbs::device::interfaces;
use ferroce_verbs::{Backend, Context, DeviceConfig, EngineMode, OpenOptions};

/// The IB path MTUs (ibv_mtu 1 to 5), the only values `-m` takes.
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// Open `dev` (an interface name, or `ferroce_<ifname>` as `devices` prints
/// it), or the first usable interface, as ibverbs tools take the first device.
/// The UDP backend binds the interface's first IPv4 address (device::open_io's
/// default); `pcap` records every frame.
pub fn open_device(
    dev: Option<&str>,
    backend: Backend,
    mode: EngineMode,
    pcap: Option<&Path>,
) -> Result<Context, String> {
    let ifname = match dev {
        Some(d) => d.strip_prefix("ferroce_").unwrap_or(d).to_string(),
        None => default_interface()?,
    };
    let mut cfg = DeviceConfig::new(&ifname, backend);
    cfg.pcap = pcap.map(Path::to_path_buf);
    Context::open(
        &cfg,
        OpenOptions {
            mode,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}

/// The first interface that is up, is not loopback and has an IPv4 address;
/// loopback if there is none.
pub fn default_interface() -> Result<String, String> {
    let all = interfaces().map_err(|e| e.to_string())?;
    all.iter()
        .find(|i| i.up && i.name != "lo" && i.addrs.iter().any(|a| a.ip.is_ipv4()))
        .or_else(|| all.iter().find(|i| i.name == "lo"))
        .map(|i| i.name.clone())
        .ok_or_else(|| "no network interface found".to_string())
}

/// The GID index tools use when `-g` / `-x` is not given: the first
/// IPv4-mapped GID (rxe's index 1), else 0.
pub fn default_gid_index(ctx: &Context) -> usize {
    ctx.gids()
        .iter()
        .position(|g| g.to_ipv4_mapped().is_some())
        .unwrap_or(0)
}

/// perftest's GID: `-x` if given, else its get_best_gid_index's pick on a
/// table of RoCE v2 GIDs: the first IPv4-mapped one, or with `--ipv6` the
/// first that is not (the link-local one, on rxe's table).
pub fn perftest_gid_index(ctx: &Context, x: Option<usize>, ipv6: bool) -> usize {
    match x {
        Some(i) => i,
        None if ipv6 => ctx
            .gids()
            .iter()
            .position(|g| g.to_ipv4_mapped().is_none())
            .unwrap_or(0),
        None => default_gid_index(ctx),
    }
}

/// An IPv6 GID as 16 bytes, and back.
pub fn gid_bytes(g: std::net::Ipv6Addr) -> [u8; 16] {
    g.octets()
}
pub fn gid_from(b: [u8; 16]) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from(b)
}

/// `host` (an address or a name) and `port` as a socket address: the first
/// the resolver gives, as getaddrinfo's callers in librdmacm's examples take.
pub fn resolve(host: &str, port: u16) -> Result<std::net::SocketAddr, String> {
    use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| format!("no address for {host}"))
}

/// strtoul(…, 0)'s forms: decimal, 0x hex, 0 octal.
pub fn parse_c_number(s: &str) -> Result<u32, String> {
    let r = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u32::from_str_radix(h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        u32::from_str_radix(&s[1..], 8)
    } else {
        s.parse()
    };
    r.map_err(|_| format!("{s:?} is not a number"))
}

/// The librdmacm examples' GID: `-x`, else the GID of the `-b` (bind)
/// address, else the IPv4-mapped one.
pub fn gid_index_for(
    ctx: &Context,
    index: Option<usize>,
    bind: Option<&str>,
) -> Result<usize, String> {
    if let Some(i) = index {
        return Ok(i);
    }
    let Some(b) = bind else {
        return Ok(default_gid_index(ctx));
    };
    let ip: std::net::IpAddr = b
        .parse()
        .map_err(|_| format!("rdma_bind_addr: {b:?} is not an address"))?;
    let want = ferroce_verbs::context::gid_of(ip);
    ctx.gids()
        .iter()
        .position(|g| *g == want)
        .ok_or_else(|| format!("rdma_bind_addr: {b} is not an address of this device"))
}

/// The flags the librdmacm example clones (rdma-server / rdma-client,
/// udaddy, ucmatose) add to the stock tools': ferroce's device, engine and
/// GID, and a time-out (the stock tools wait without end; a lost UD
/// message is never resent).
#[derive(clap::Args, Debug)]
pub struct CmToolDevice {
    /// Device (interface, or ferroce_<ifname>).
    #[arg(short = 'd', long = "ib-dev")]
    pub dev: Option<String>,
    /// Packet engine: auto, afxdp, afpacket or udp.
    #[arg(long, default_value = "auto")]
    pub backend: Backend,
    /// GID index (default: the `-b` address's where the tool takes `-b`,
    /// else the IPv4-mapped one).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<usize>,
    /// Give up after this long without the peer or a message (seconds).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

impl CmToolDevice {
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout)
    }

    /// The device (its engine on a thread of its own) and the GID index:
    /// `-x`, else `bind`'s, else the IPv4-mapped one.
    pub fn open(&self, bind: Option<&str>) -> Result<(Context, usize), String> {
        let ctx = open_device(self.dev.as_deref(), self.backend, EngineMode::Thread, None)?;
        let gid_index = gid_index_for(&ctx, self.gid_index, bind)?;
        Ok((ctx, gid_index))
    }
}
