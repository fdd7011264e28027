//! `ferroce mckey`: librdmacm's `mckey` example, UD multicast. Each side
//! makes `-c` UD QPs and joins each to the group `-m` (rdma_cm's join over
//! RoCE: the IPv4-mapped MGID, an IGMP join on the link, the QP attached);
//! the sender (`-s`) then sends `-C` messages of `-S` bytes from each QP to
//! the group (SEND WITH IMMEDIATE carrying its QPN, to the multicast QPN
//! with rdma_cm's Q_Key), the receiver waits for as many on each. Same flags
//! and output lines as the stock tool, so either side can face it.

use std::net::IpAddr;
use std::time::Duration;

use clap::Parser;
use ferroce_verbs::cm::source_gid_index;
use ferroce_verbs::multicast::{self, JoinKind, Joined};
use ferroce_verbs::{ConnectOptions, Context, ProtectionDomain};

use crate::common;
use crate::ud_node::{Step, UdNode, GRH};

/// rdma_cm's port-space numbers (`-p`): UDP, and IPoIB, which ferroce lacks.
const PS_UDP: u32 = 0x0111;
const PS_IPOIB: u32 = 0x0002;
/// mckey sleeps this long after joining, before any data moves ("to give
/// the SM time to configure the switches"); the receiver relies on it to
/// be ready when the sender starts.
const SETTLE: Duration = Duration::from_secs(3);

#[derive(Parser, Debug)]
pub struct Args {
    /// Multicast address (IP or host name) to join.
    #[arg(short = 'm')]
    pub mcast: Option<String>,
    /// Unmapped multicast address (an AF_IB GID; needs -b). RoCE has no
    /// AF_IB addresses, so ferroce refuses it.
    #[arg(short = 'M')]
    pub unmapped: Option<String>,
    /// Send (the default is to receive).
    #[arg(short = 's')]
    pub sender: bool,
    /// Source address: its GID is the one used.
    #[arg(short = 'b')]
    pub bind: Option<String>,
    /// Connections: UD QPs, each joined to the group.
    #[arg(short = 'c', default_value_t = 1)]
    pub connections: u32,
    /// Messages each QP sends, or waits for.
    #[arg(short = 'C', default_value_t = 10)]
    pub count: u32,
    /// Message size in bytes (at most the port's MTU).
    #[arg(short = 'S', default_value_t = 100)]
    pub size: u32,
    /// Port space: 0x111 for UDP (the default); 0x2 (IPoIB) is not in ferroce.
    #[arg(short = 'p', value_parser = common::parse_c_number)]
    pub port_space: Option<u32>,
    /// Join as a send-only full member (no attach, no IGMP join).
    #[arg(short = 'o')]
    pub send_only: bool,
    /// Join without multicast loopback (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB:
    /// the sender's own QP does not hear its messages). Accepted, and
    /// without effect on what a run does: as with rxe, this host's attached
    /// QPs hear what it sends to the group, but mckey's sender posts no
    /// receives, so its own QP drops its looped-back messages anyway.
    #[arg(short = 'l')]
    pub no_loopback: bool,
    #[command(flatten)]
    pub device: common::CmToolDevice,
}

/// `mckey`; the exit status is the example's `ret` (0 or 1).
pub fn run(a: Args) -> i32 {
    if a.unmapped.is_some() && a.bind.is_none() {
        println!("unmapped multicast address requires binding to source address");
        return 1;
    }
    println!(
        "mckey: starting {}",
        if a.sender { "client" } else { "server" }
    );
    let ret = match session(&a) {
        Ok(()) => 0,
        Err(e) => {
            println!("mckey: {e}");
            1
        }
    };
    println!("test complete");
    println!("return status {ret}");
    ret
}

/// One connection: its endpoint (QP, CQ, the one buffer of GRH + message)
/// and its join.
struct Node<'pd> {
    ud: UdNode<'pd>,
    joined: Option<Joined>,
}

fn session(a: &Args) -> Result<(), String> {
    match a.port_space {
        None | Some(PS_UDP) => {}
        Some(PS_IPOIB) => {
            return Err("the IPoIB port space is not available in ferroce (use 0x111)".into())
        }
        Some(ps) => return Err(format!("unknown port space {ps:#x}")),
    }
    if a.unmapped.is_some() {
        return Err("-M takes an AF_IB address, which RoCE has not (use -m)".into());
    }
    let group = resolve_group(a.mcast.as_deref())?;
    let timeout = a.device.timeout();
    let (ctx, gid_index) = a.device.open(a.bind.as_deref())?;
    // mckey sends nothing when the message size is 0.
    let count = if a.size == 0 { 0 } else { a.count };
    println!("mckey: joining");
    let kind = if a.send_only {
        JoinKind::SendOnlyFullMember
    } else {
        JoinKind::FullMember
    };
    let pd = ctx.alloc_pd();
    let opts = ConnectOptions {
        path_mtu: ctx.query_port().active_mtu,
        sgid_index: gid_index,
        hop_limit: multicast::JOIN_HOP_LIMIT,
        ..ConnectOptions::default()
    };
    let mut nodes = Vec::new();
    let result = (|| {
        for _ in 0..a.connections {
            let mut node = Node::new(&ctx, &pd, a, count, &opts)?;
            let joined = multicast::join(&node.ud.qp, group, kind)
                .map_err(|e| format!("failure joining: {e}"))?;
            println!(
                "mckey: joined dgid: {} mlid 0x{:x} sl {}",
                joined.mgid, joined.mlid, joined.sl
            );
            node.joined = Some(joined);
            nodes.push(node);
        }
        std::thread::sleep(SETTLE);
        if count == 0 {
            return Ok(());
        }
        if a.sender {
            println!("initiating data transfers");
            for n in &nodes {
                n.send(&ctx, &opts, a.size, count, timeout)?;
            }
        } else {
            println!("receiving data transfers");
            for n in &nodes {
                n.receive(a.size, count, timeout)?;
            }
        }
        println!("data transfers complete");
        Ok(())
    })();
    // mckey leaves every group it joined, whatever happened after the joins.
    for n in &nodes {
        if let Some(j) = &n.joined {
            multicast::leave(&n.ud.qp, j).map_err(|e| format!("failure leaving: {e}"))?;
        }
    }
    result
}

/// The group `-m` names (getaddrinfo's first answer).
fn resolve_group(m: Option<&str>) -> Result<IpAddr, String> {
    let bad = |why: &str| format!("getaddrinfo failed ({why}) - invalid hostname or IP address");
    let m = m.ok_or_else(|| bad("no -m address"))?;
    common::resolve(m, 0).map(|s| s.ip()).map_err(|e| bad(&e))
}

impl<'pd> Node<'pd> {
    /// mckey's addr_handler: the MTU check, then the endpoint, with count
    /// receives posted on a receiver.
    fn new(
        ctx: &Context,
        pd: &'pd ProtectionDomain,
        a: &Args,
        count: u32,
        opts: &ConnectOptions,
    ) -> Result<Node<'pd>, String> {
        let mtu = ctx.query_port().active_mtu;
        if count > 0 && a.size > mtu {
            return Err(format!(
                "message_size {} is larger than active mtu {mtu}",
                a.size
            ));
        }
        let ud = UdNode::new(ctx, pd, opts, count, a.size, !a.sender && count > 0).map_err(
            |(step, e)| match step {
                Step::Cq => format!("unable to create CQ: {e}"),
                Step::Qp => format!("unable to create QP: {e}"),
                Step::Mr => format!("failed to reg MR: {e}"),
                Step::PostRecv => format!("failed to post receives: {e}"),
            },
        )?;
        Ok(Node { ud, joined: None })
    }

    /// count SEND WITH IMMEDIATE (this QP's number) of size bytes to the
    /// group. mckey posts them unsignaled and never polls; here the last is
    /// signaled and waited for, so none is still queued when the QP goes.
    fn send(
        &self,
        ctx: &Context,
        opts: &ConnectOptions,
        size: u32,
        count: u32,
        timeout: Duration,
    ) -> Result<(), String> {
        let j = self.joined.as_ref().ok_or("not joined")?;
        // The source address rdma_cm's route gave, of the group's family.
        let opts = ConnectOptions {
            sgid_index: source_gid_index(ctx, opts.sgid_index, j.mgid),
            ..*opts
        };
        let mut path = opts
            .path_to(ctx, j.mgid)
            .map_err(|e| format!("failure creating address handle: {e}"))?;
        path.traffic_class = j.traffic_class;
        path.hop_limit = j.hop_limit;
        self.ud
            .post_sends(path, (j.qpn, j.qkey), size, count, |i| i + 1 == count)
            .map_err(|e| format!("failed to post sends: {e}"))?;
        self.ud
            .sent(1, timeout)
            .map_err(|e| format!("failed polling CQ: {e}"))
    }

    /// Waits for `count` messages of `size` bytes (mckey counts completions
    /// only; a failed or cut one is an error here).
    fn receive(&self, size: u32, count: u32, timeout: Duration) -> Result<(), String> {
        self.ud
            .receive(count, Some(size + GRH), timeout)
            .map(drop)
            .map_err(|e| format!("failed polling CQ: {e}"))
    }
}
