//! `ferroce udaddy`: librdmacm's `udaddy` example, UD QPs found through the
//! connection manager's service ID resolution (SIDR_REQ / SIDR_REP over QP1,
//! rdma_cm's UDP port space, port 7174) instead of a TCP exchange, so either
//! side can face the stock tool. The client sends `-C` messages of `-S` bytes
//! (SEND WITH IMMEDIATE carrying its QPN: SIDR tells the server nothing about
//! the client's QP), the server answers each to the QPN it read there; same
//! flags, same output lines. Nothing is torn down on the wire: UD has no
//! connection.

use std::time::Duration;

use clap::Parser;
use ferroce_stack::wire::mad::sidr_status;
use ferroce_verbs::cm::{source_gid_index, CmAgent, UdPeer, RDMA_UDP_QKEY};
use ferroce_verbs::wc::{GrhInfo, GRH_LEN};
use ferroce_verbs::{ConnectOptions, Context, ProtectionDomain};

use crate::common;
use crate::ud_node::{Step, UdNode};

/// udaddy's port, in rdma_cm's UDP port space.
const PORT: u16 = 7174;
/// rdma_cm's port-space numbers (`-p`): UDP, and IPoIB, which ferroce lacks.
const PS_UDP: u32 = 0x0111;
const PS_IPOIB: u32 = 0x0002;

#[derive(Parser, Debug)]
pub struct Args {
    /// Server address: run as the client (the server otherwise).
    #[arg(short = 's')]
    pub server: Option<String>,
    /// Source address: its GID is the one used.
    #[arg(short = 'b')]
    pub bind: Option<String>,
    /// Connections (UD QPs), each with its own exchange.
    #[arg(short = 'c', default_value_t = 1)]
    pub connections: u32,
    /// Messages each way per connection.
    #[arg(short = 'C', default_value_t = 10)]
    pub count: u32,
    /// Message size in bytes (at most the path MTU).
    #[arg(short = 'S', default_value_t = 100)]
    pub size: u32,
    /// Type of service (the traffic class of the client's messages).
    #[arg(short = 't', value_parser = common::parse_c_number)]
    pub tos: Option<u32>,
    /// Port space number (udaddy's `-p`): only rdma_cm's UDP one, 0x0111.
    #[arg(short = 'p', value_parser = common::parse_c_number)]
    pub port_space: Option<u32>,
    /// Port space by name: udp (ipoib is not available in ferroce).
    #[arg(short = 'P')]
    pub port_space_name: Option<String>,
    /// Address format: ip or name (gid needs AF_IB, which RoCE has not).
    #[arg(short = 'f')]
    pub format: Option<String>,
    #[command(flatten)]
    pub device: common::CmToolDevice,
}

/// `udaddy`; the exit status is the example's `ret` (0 or 1).
pub fn run(a: Args) -> i32 {
    let server = a.server.is_none();
    println!(
        "udaddy: starting {}",
        if server { "server" } else { "client" }
    );
    let ret = match session(&a) {
        Ok(()) => {
            println!("test complete");
            0
        }
        Err(e) => {
            println!("udaddy: {e}");
            1
        }
    };
    println!("return status {ret}");
    ret
}

/// One connection: its endpoint (QP, CQ, the one buffer of GRH + message)
/// and whom it talks to.
struct Node<'pd> {
    ud: UdNode<'pd>,
    /// Where replies (client: messages) go.
    peer: Option<UdPeer>,
    /// A server's: the traffic class its client's messages came with (udaddy
    /// answers through ibv_create_ah_from_wc, which keeps it).
    reply_tclass: Option<u8>,
}

fn session(a: &Args) -> Result<(), String> {
    match (a.port_space, a.port_space_name.as_deref()) {
        (Some(PS_UDP), _) | (None, None | Some("udp")) => {}
        (Some(PS_IPOIB), _) | (None, Some("ipoib")) => {
            return Err("the IPoIB port space is not available in ferroce (use udp)".into())
        }
        (Some(ps), _) => return Err(format!("unknown port space {ps:#x}")),
        (None, Some(_)) => eprintln!("Warning: unknown port space format"),
    }
    match a.format.as_deref() {
        None | Some("ip") | Some("name") => {}
        Some("gid") => return Err("-f gid needs AF_IB, which RoCE has not".into()),
        Some(_) => eprintln!("Warning: unknown address format"),
    }
    let timeout = a.device.timeout();
    let (ctx, gid_index) = a.device.open(a.bind.as_deref())?;
    let mtu = ctx.query_port().active_mtu;
    if a.size > mtu {
        return Err(format!(
            "message_size {} is larger than active mtu {mtu}",
            a.size
        ));
    }
    let pd = ctx.alloc_pd();
    let mut cm = CmAgent::new(&ctx, &pd, gid_index).map_err(|e| e.to_string())?;
    let opts = ConnectOptions {
        path_mtu: mtu,
        sgid_index: gid_index,
        qkey: RDMA_UDP_QKEY,
        traffic_class: a.tos.map_or(0, |t| t as u8),
        ..ConnectOptions::default()
    };
    let mut nodes = Vec::new();
    match &a.server {
        Some(host) => {
            println!("udaddy: connecting");
            let dst = common::resolve(host, PORT).map_err(|e| format!("rdma_getaddrinfo: {e}"))?;
            for _ in 0..a.connections {
                let mut node = Node::new(&ctx, &pd, a, &opts)?;
                let peer = cm
                    .resolve_ud(dst, &[], opts.traffic_class)
                    .map_err(|e| match e {
                        ferroce_verbs::Error::SidrRefused { status } => format!(
                            "event: RDMA_CM_EVENT_UNREACHABLE, error: SIDR status {status} ({})",
                            sidr_status::name(status)
                        ),
                        e => format!("rdma_connect: {e}"),
                    })?;
                node.peer = Some(peer);
                nodes.push(node);
            }
            if a.count > 0 && a.size > 0 {
                println!("initiating data transfers");
                for n in &nodes {
                    n.post_sends(&ctx, &opts, a, false)?;
                }
                println!("receiving data transfers");
                for n in &nodes {
                    n.receive(a.count, timeout)?;
                }
                println!("data transfers complete");
            }
        }
        None => {
            cm.listen_ud(PORT);
            for _ in 0..a.connections {
                let req = cm
                    .get_ud_request(PORT, timeout)
                    .map_err(|e| format!("rdma_get_request: {e}"))?;
                let node = Node::new(&ctx, &pd, a, &opts)?;
                cm.accept_ud(&req, &node.ud.qp, &[])
                    .map_err(|e| format!("failing connection request: {e}"))?;
                // Whom to answer only the first message says (below).
                nodes.push(node);
            }
            if a.count > 0 && a.size > 0 {
                println!("receiving data transfers");
                for n in &mut nodes {
                    // udaddy answers the QPN the first message's immediate
                    // names, at the address and traffic class of its GRH.
                    let qpn = n.receive(a.count, timeout)?;
                    let mut g = [0u8; GRH_LEN];
                    n.ud.mr.read(0, &mut g).map_err(|e| e.to_string())?;
                    let from = GrhInfo::parse(&g);
                    n.reply_tclass = Some(from.traffic_class);
                    n.peer = Some(UdPeer {
                        peer_gid: from.src,
                        qpn,
                        qkey: RDMA_UDP_QKEY,
                        private_data: Vec::new(),
                    });
                }
                println!("sending replies");
                for n in &nodes {
                    n.post_sends(&ctx, &opts, a, true)?;
                    n.sent(a.count, timeout)?;
                }
                println!("data transfers complete");
            }
        }
    }
    Ok(())
}

impl<'pd> Node<'pd> {
    /// udaddy's init_node and post_recvs: the endpoint, count receives
    /// posted on it (when messages have a size).
    fn new(
        ctx: &Context,
        pd: &'pd ProtectionDomain,
        a: &Args,
        opts: &ConnectOptions,
    ) -> Result<Node<'pd>, String> {
        let ud = UdNode::new(ctx, pd, opts, a.count, a.size, a.size > 0).map_err(|(step, e)| {
            let call = match step {
                Step::Cq => "ibv_create_cq",
                Step::Qp => "rdma_create_qp",
                Step::Mr => "ibv_reg_mr",
                Step::PostRecv => "ibv_post_recv",
            };
            format!("{call}: {e}")
        })?;
        Ok(Node {
            ud,
            peer: None,
            reply_tclass: None,
        })
    }

    /// count SEND WITH IMMEDIATE (this QP's number) of size bytes to the
    /// peer; signaled only when `signaled` (the server's, whose completions
    /// it counts).
    fn post_sends(
        &self,
        ctx: &Context,
        opts: &ConnectOptions,
        a: &Args,
        signaled: bool,
    ) -> Result<(), String> {
        let peer = self.peer.as_ref().ok_or("no peer to send to")?;
        // The source address rdma_cm's route gave, of the peer's family.
        let opts = ConnectOptions {
            sgid_index: source_gid_index(ctx, opts.sgid_index, peer.peer_gid),
            ..*opts
        };
        let mut path = opts
            .path_to(ctx, peer.peer_gid)
            .map_err(|e| format!("ibv_create_ah: {e}"))?;
        if let Some(tc) = self.reply_tclass {
            path.traffic_class = tc;
        }
        self.ud
            .post_sends(path, (peer.qpn, peer.qkey), a.size, a.count, |_| signaled)
            .map_err(|e| format!("failed to post sends: {e}"))
    }

    /// Waits for `count` received messages; returns the QPN the first one's
    /// immediate data names.
    fn receive(&self, count: u32, timeout: Duration) -> Result<u32, String> {
        let wcs = self
            .ud
            .receive(count, None, timeout)
            .map_err(|e| format!("receiving data transfers: {e}"))?;
        wcs.iter()
            .find_map(|wc| wc.imm_data)
            .ok_or_else(|| "the messages carried no immediate data (the sender's QPN)".into())
    }

    /// Waits for the `count` send completions of the replies.
    fn sent(&self, count: u32, timeout: Duration) -> Result<(), String> {
        self.ud
            .sent(count, timeout)
            .map_err(|e| format!("sending replies: {e}"))
    }
}
