//! `ferroce ucmatose`: librdmacm's `cmatose` example (Debian's `ucmatose`),
//! RC connections set up by the connection manager over QP1 (REQ / REP /
//! RTU in rdma_cm's TCP port space, port 7471) instead of a TCP exchange,
//! so either side can face the stock tool. Per connection the server sends
//! `-C` messages of `-S` bytes, the client receives them and sends as many
//! back, then the server disconnects (DREQ) and the client answers (DREP);
//! same flags, same output lines.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use ferroce_verbs::cm::{CmAgent, ConnParam, Connection};
use ferroce_verbs::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpType, QueuePair,
    RecvWr, SendOp, SendWr, WcStatus,
};

use crate::common;

#[derive(Parser, Debug)]
pub struct Args {
    /// Server address: run as the client (the server otherwise).
    #[arg(short = 's')]
    pub server: Option<String>,
    /// Source address: its GID is the one used.
    #[arg(short = 'b')]
    pub bind: Option<String>,
    /// Connections, each with its own QP.
    #[arg(short = 'c', default_value_t = 1)]
    pub connections: u32,
    /// Messages each way per connection.
    #[arg(short = 'C', default_value_t = 10)]
    pub count: u32,
    /// Message size in bytes.
    #[arg(short = 'S', default_value_t = 100)]
    pub size: u32,
    /// Type of service of the client's connections (carried in the REQ, so
    /// the server's packets take it too).
    #[arg(short = 't', value_parser = common::parse_c_number)]
    pub tos: Option<u32>,
    /// Port in rdma_cm's TCP port space.
    #[arg(short = 'p', default_value_t = 7471)]
    pub port: u16,
    /// Local ACK time-out exponent (4.096 µs × 2^n) of the QPs.
    #[arg(short = 'a', value_parser = common::parse_c_number)]
    pub ack_timeout: Option<u32>,
    /// Port space: tcp (ib, the native InfiniBand one, RoCE has not).
    #[arg(short = 'P')]
    pub port_space: Option<String>,
    /// Address format: ip, ipv6 or name (gid needs AF_IB, which RoCE has not).
    #[arg(short = 'f')]
    pub format: Option<String>,
    /// Move the IDs to a new event channel before disconnecting (librdmacm
    /// bookkeeping: nothing on the wire; the line is printed).
    #[arg(short = 'm')]
    pub migrate: bool,
    #[command(flatten)]
    pub device: common::CmToolDevice,
}

/// `ucmatose`; the exit status is the example's `ret` (0 or 1).
pub fn run(a: Args) -> i32 {
    let server = a.server.is_none();
    println!(
        "cmatose: starting {}",
        if server { "server" } else { "client" }
    );
    let ret = match session(&a) {
        Ok(()) => 0,
        Err(e) => {
            println!("cmatose: {e}");
            1
        }
    };
    println!("test complete");
    println!("return status {ret}");
    ret
}

/// One connection: its QP, send and receive CQs, and the one buffer every
/// message of it uses (as cmatose).
struct Node<'pd> {
    qp: QueuePair<'pd>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    mr: MemoryRegion<'pd>,
    conn: Option<Connection>,
}

fn session(a: &Args) -> Result<(), String> {
    match a.port_space.as_deref() {
        None | Some("tcp") => {}
        Some("ib") => return Err("the IB port space needs AF_IB, which RoCE has not".into()),
        Some(_) => eprintln!("Warning: unknown port space format"),
    }
    match a.format.as_deref() {
        None | Some("name") => {}
        Some(f) if f.len() >= 2 && f[..2].eq_ignore_ascii_case("ip") => {}
        Some("gid") => return Err("-f gid needs AF_IB, which RoCE has not".into()),
        Some(_) => eprintln!("Warning: unknown address format"),
    }
    let timeout = a.device.timeout();
    let (ctx, gid_index) = a.device.open(a.bind.as_deref())?;
    let pd = ctx.alloc_pd();
    let mut cm = CmAgent::new(&ctx, &pd, gid_index).map_err(|e| e.to_string())?;
    let ack_timeout = a.ack_timeout.map(|t| t.min(31) as u8);
    let data = a.count > 0 && a.size > 0;
    let mut nodes = Vec::new();
    match &a.server {
        Some(host) => {
            println!("cmatose: connecting");
            let dst =
                common::resolve(host, a.port).map_err(|e| format!("getaddrinfo error: {e}"))?;
            // cmatose's rdma_conn_param: one READ each way, 5 retries, no
            // RNR retry (its receives are posted before it connects).
            let param = ConnParam {
                responder_resources: 1,
                initiator_depth: 1,
                retry_count: 5,
                rnr_retry_count: 0,
                traffic_class: a.tos.map_or(0, |t| t as u8),
                ack_timeout: ack_timeout.unwrap_or(ConnParam::default().ack_timeout),
                ..ConnParam::default()
            };
            for _ in 0..a.connections {
                let mut n = Node::new(&ctx, &pd, a)?;
                let conn = cm
                    .connect(&n.qp, dst, &param)
                    .map_err(|e| connect_error(&e, dst))?;
                n.conn = Some(conn);
                nodes.push(n);
            }
            if data {
                println!("receiving data transfers");
                for n in &nodes {
                    completions(&n.recv_cq, a.count, timeout, "receiving data transfers")?;
                }
                println!("sending replies");
                for n in &nodes {
                    n.post_sends(a)?;
                }
                for n in &nodes {
                    completions(&n.send_cq, a.count, timeout, "sending replies")?;
                }
                println!("data transfers complete");
            }
            if a.migrate {
                println!("migrating to new event channel");
            }
            // The server disconnects; its DREQ gets our DREP.
            for n in &nodes {
                if let Some(c) = &n.conn {
                    if !cm
                        .wait_disconnect(c, &n.qp, timeout)
                        .map_err(|e| e.to_string())?
                    {
                        return Err(format!("no disconnect from the server in {timeout:?}"));
                    }
                }
            }
        }
        None => {
            cm.listen(a.port);
            // rdma_accept with no parameters: as many READs as the REQ
            // asks, 7 RNR retries.
            let param = ConnParam {
                ack_timeout: ack_timeout.unwrap_or(ConnParam::default().ack_timeout),
                ..ConnParam::default()
            };
            for _ in 0..a.connections {
                let req = cm
                    .get_request(a.port, timeout)
                    .map_err(|e| format!("rdma_get_request: {e}"))?;
                let mut n = Node::new(&ctx, &pd, a)?;
                let conn = cm
                    .accept(&req, &n.qp, &param)
                    .map_err(|e| format!("failing connection request: {e}"))?;
                n.conn = Some(conn);
                nodes.push(n);
            }
            if data {
                println!("initiating data transfers");
                for n in &nodes {
                    n.post_sends(a)?;
                }
                println!("completing sends");
                for n in &nodes {
                    completions(&n.send_cq, a.count, timeout, "completing sends")?;
                }
                println!("receiving data transfers");
                for n in &nodes {
                    completions(&n.recv_cq, a.count, timeout, "receiving data transfers")?;
                }
                println!("data transfers complete");
            }
            if a.migrate {
                println!("migrating to new event channel");
            }
            println!("cmatose: disconnecting");
            for n in &nodes {
                if let Some(c) = &n.conn {
                    cm.disconnect(c, &n.qp)
                        .map_err(|e| format!("rdma_disconnect: {e}"))?;
                }
            }
            println!("disconnected");
        }
    }
    Ok(())
}

/// cmatose's line for a connection error event.
fn connect_error(e: &ferroce_verbs::Error, dst: SocketAddr) -> String {
    match e {
        ferroce_verbs::Error::Rejected { reason } => format!(
            "event: RDMA_CM_EVENT_REJECTED, error: {reason} ({})",
            ferroce_verbs::cm::reject_reason_name(*reason)
        ),
        e => format!("rdma_connect to {dst}: {e}"),
    }
}

impl<'pd> Node<'pd> {
    /// cmatose's init_node and post_recvs: send and receive CQs of count
    /// entries, an RC QP of count WRs each way, one buffer of `size` bytes,
    /// and count receives posted on it (in INIT, before the CM connects).
    fn new(ctx: &Context, pd: &'pd ProtectionDomain, a: &Args) -> Result<Node<'pd>, String> {
        let depth = a.count.max(1);
        let send_cq = ctx
            .create_cq(depth)
            .map_err(|e| format!("ibv_create_cq: {e}"))?;
        let recv_cq = ctx
            .create_cq(depth)
            .map_err(|e| format!("ibv_create_cq: {e}"))?;
        let qp = pd
            .create_qp()
            .qp_type(QpType::Rc)
            .max_send_wr(depth)
            .max_recv_wr(depth)
            .sq_sig_all(true)
            .build(&send_cq, &recv_cq)
            .map_err(|e| format!("rdma_create_qp: {e}"))?;
        qp.to_init(&Default::default()).map_err(|e| e.to_string())?;
        let mr = pd
            .reg_mr(a.size.max(1) as usize, AccessFlags::LOCAL_WRITE)
            .map_err(|e| format!("ibv_reg_mr: {e}"))?;
        if a.size > 0 {
            let sge = [mr.sge(0, a.size)];
            for i in 0..a.count {
                qp.post_recv(&[RecvWr {
                    wr_id: u64::from(i),
                    sg_list: &sge,
                }])
                .map_err(|e| format!("ibv_post_recv: {e}"))?;
            }
        }
        Ok(Node {
            qp,
            send_cq,
            recv_cq,
            mr,
            conn: None,
        })
    }

    /// count SENDs of size bytes from the buffer's start.
    fn post_sends(&self, a: &Args) -> Result<(), String> {
        let sge = [self.mr.sge(0, a.size)];
        for i in 0..a.count {
            self.qp
                .post_send(&[SendWr::new(u64::from(i), SendOp::Send, &sge)])
                .map_err(|e| format!("failed to post sends: {e}"))?;
        }
        Ok(())
    }
}

/// `n` successful completions on `cq` within `timeout`.
fn completions(cq: &CompletionQueue, n: u32, timeout: Duration, what: &str) -> Result<(), String> {
    let wcs = cq
        .poll_n(n as usize, timeout)
        .map_err(|e| format!("{what}: {e}"))?;
    match wcs.iter().find(|wc| wc.status != WcStatus::Success) {
        Some(wc) => Err(format!(
            "{what}: completion {:?} with status {:?}",
            wc.opcode, wc.status
        )),
        None => Ok(()),
    }
}
