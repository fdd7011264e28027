//! `ferroce devices`: like `ibv_devices` + `ibv_devinfo` — the interfaces
//! ferroce can run on, which backends open there with this process's
//! privileges, the port's MTU and the GID table.

use ferroce_verbs::device::{gid_table, ib_mtu_for, interfaces, Interface};

fn backends(iface: &Interface) -> Vec<&'static str> {
    let mut b = Vec::new();
    let root = ferroce_nic::is_root();
    if root && iface.name != "lo" {
        b.push("afxdp");
        b.push("afpacket");
    }
    if iface.addrs.iter().any(|a| a.ip.is_ipv4()) {
        b.push("udp");
    }
    b
}

/// What `afxdp` can carry on the running kernel: multi-buffer AF_XDP sockets
/// (XDP_USE_SG) came in Linux 6.6; before, a frame must fit one 4 KiB chunk
/// and the port offers RoCE MTU 2048 at most (see nic-drivers' afxdp).
fn afxdp_note() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let release = release.trim();
    (ferroce_nic::parse_kernel_release(release)? < (6, 6)).then(|| {
        format!("afxdp carries RoCE MTU 2048 at most on this kernel ({release}; 4096 needs 6.6)")
    })
}

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub fn run(all: bool) -> i32 {
    let list = match interfaces() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ferroce devices: {e}");
            return 1;
        }
    };
    let afxdp_note = afxdp_note();
    let mut shown = 0;
    for iface in &list {
        let b = backends(iface);
        if !all && (b.is_empty() || !iface.up) {
            continue;
        }
        shown += 1;
        println!("hca_id:\tferroce_{}", iface.name);
        println!("\ttransport:\t\tRoCE v2 (InfiniBand over UDP/IP, port 4791)");
        println!(
            "\tbackends:\t\t{}",
            if b.is_empty() {
                "none".to_string()
            } else {
                b.join(", ")
            }
        );
        if b.contains(&"afxdp") {
            if let Some(note) = &afxdp_note {
                println!("\tnote:\t\t\t{note}");
            }
        }
        println!("\tnode_guid / mac:\t{}", mac(iface.mac));
        println!("\tport:\t1");
        println!(
            "\t\tstate:\t\t\t{}",
            if iface.up && iface.running {
                "PORT_ACTIVE (4)"
            } else {
                "PORT_DOWN (1)"
            }
        );
        println!("\t\tmax_mtu:\t\t4096 (5)");
        println!(
            "\t\tactive_mtu:\t\t{} (Ethernet MTU {})",
            ib_mtu_for(iface.mtu),
            iface.mtu
        );
        println!("\t\tlink_layer:\t\tEthernet");
        for (i, g) in gid_table(iface).iter().enumerate() {
            let kind = if g.to_ipv4_mapped().is_some() {
                "v2 (IPv4)"
            } else {
                "v2"
            };
            println!("\t\tGID[{i:>3}]:\t\t{g}, RoCE {kind}");
        }
        println!();
    }
    if shown == 0 {
        eprintln!(
            "ferroce devices: no usable interface (run as root for AF_XDP/AF_PACKET, or give an interface an IPv4 address for UDP)"
        );
        return 1;
    }
    0
}

/// `ferroce devices --stats`: the counters of every live ferroce device,
/// like reading /sys/class/infiniband/*/ports/1/hw_counters; when none runs,
/// this host's devices with zeroes.
pub fn stats(all: bool) -> i32 {
    let live = ferroce_verbs::counters::read_all();
    for s in &live {
        println!(
            "hca_id:\t{}\t(pid {}, backend {}, {}, updated {})",
            s.device, s.pid, s.backend, s.state, s.updated
        );
        print_counters(s.counters.iter().map(|(k, v)| (k.as_str(), *v)));
    }
    if !live.is_empty() {
        return 0;
    }
    let zero = ferroce_stack::transport::Stats::default().named();
    let list = interfaces().unwrap_or_default();
    let mut shown = 0;
    for iface in list
        .iter()
        .filter(|i| all || (i.up && !backends(i).is_empty()))
    {
        shown += 1;
        println!(
            "hca_id:\tferroce_{}\t(no running ferroce process)",
            iface.name
        );
        print_counters(zero.iter().copied());
    }
    if shown == 0 {
        println!("hca_id:\tferroce\t(no running ferroce process)");
        print_counters(zero.iter().copied());
    }
    0
}

fn print_counters<'a>(counters: impl Iterator<Item = (&'a str, u64)>) {
    println!("\tport:\t1\n\t\thw_counters:");
    for (name, v) in counters {
        println!("\t\t\t{name}: {v}");
    }
}
