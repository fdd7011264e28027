//! `ferroce rdma-server` / `ferroce rdma-client`: librdmacm's `rdma_server`
//! and `rdma_client` examples, connected by the connection manager over QP1
//! (ferroce_verbs::cm) instead of a TCP exchange, so either can face the
//! stock tool: the client sends 16 bytes, the server answers with 16, both
//! disconnect (same flags, same two output lines).

use std::time::Duration;

use clap::Parser;
use ferroce_verbs::cm::{CmAgent, ConnParam};
use ferroce_verbs::{AccessFlags, QpType, RecvWr, SendOp, SendWr};

use crate::common;

/// librdmacm's examples' port.
const DEFAULT_PORT: &str = "7471";
/// The examples' message size.
const MSG: u32 = 16;

#[derive(Parser, Debug)]
pub struct Args {
    /// Server address (rdma_server: the address to listen on; any by default).
    #[arg(short = 's')]
    pub server: Option<String>,
    /// Port in rdma_cm's TCP port space.
    #[arg(short = 'p', default_value = DEFAULT_PORT)]
    pub port: String,
    #[command(flatten)]
    pub device: common::CmToolDevice,
}

/// `rdma_client` (`server` true: `rdma_server`); the exit status is the
/// examples' `ret`.
pub fn run(a: Args, server: bool) -> i32 {
    let name = if server { "rdma_server" } else { "rdma_client" };
    println!("{name}: start");
    let ret = match session(&a, server) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{name}: {e}");
            1
        }
    };
    println!("{name}: end {ret}");
    ret
}

fn session(a: &Args, server: bool) -> Result<(), String> {
    let timeout = a.device.timeout();
    let port: u16 = a
        .port
        .parse()
        .map_err(|_| format!("port {:?} is not a number", a.port))?;
    let (ctx, gid_index) = a.device.open(None)?;
    let pd = ctx.alloc_pd();
    let mut cm = CmAgent::new(&ctx, &pd, gid_index).map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(4).map_err(|e| e.to_string())?;
    // The examples' QP: one send and one receive of one SGE, every send signaled.
    let qp = pd
        .create_qp()
        .qp_type(QpType::Rc)
        .max_send_wr(1)
        .max_recv_wr(1)
        .max_inline_data(MSG)
        .sq_sig_all(true)
        .build(&cq, &cq)
        .map_err(|e| e.to_string())?;
    // recv_msg at 0, send_msg (zeros, as the examples' globals) at 16.
    let mr = pd
        .reg_mr(2 * MSG as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let post_recv = || {
        let sge = [mr.sge(0, MSG)];
        qp.post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &sge,
        }])
        .map_err(|e| format!("rdma_post_recv: {e}"))
    };
    let send = || -> Result<(), String> {
        let sge = [mr.sge(u64::from(MSG), MSG)];
        qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)])
            .map_err(|e| format!("rdma_post_send: {e}"))?;
        completion(&cq, timeout, "rdma_get_send_comp")
    };
    let conn = if server {
        let req = cm
            .get_request(port, timeout)
            .map_err(|e| format!("rdma_get_request: {e}"))?;
        qp.to_init(&Default::default()).map_err(|e| e.to_string())?;
        post_recv()?;
        let conn = cm
            .accept(&req, &qp, &ConnParam::default())
            .map_err(|e| format!("rdma_accept: {e}"))?;
        completion(&cq, timeout, "rdma_get_recv_comp")?;
        send()?;
        conn
    } else {
        let host = a
            .server
            .as_deref()
            .ok_or("rdma_client needs -s server_address")?;
        let dst = common::resolve(host, port).map_err(|e| format!("rdma_getaddrinfo: {e}"))?;
        qp.to_init(&Default::default()).map_err(|e| e.to_string())?;
        post_recv()?;
        let conn = cm
            .connect(&qp, dst, &ConnParam::default())
            .map_err(|e| format!("rdma_connect: {e}"))?;
        send()?;
        completion(&cq, timeout, "rdma_get_recv_comp")?;
        conn
    };
    cm.disconnect(&conn, &qp)
        .map_err(|e| format!("rdma_disconnect: {e}"))
}

/// One successful completion within `timeout`.
fn completion(
    cq: &ferroce_verbs::CompletionQueue,
    timeout: Duration,
    what: &str,
) -> Result<(), String> {
    let wcs = cq.poll_n(1, timeout).map_err(|e| format!("{what}: {e}"))?;
    match wcs.first() {
        Some(wc) if wc.status == ferroce_verbs::WcStatus::Success => Ok(()),
        Some(wc) => Err(format!("{what}: completion with status {:?}", wc.status)),
        None => Err(format!("{what}: no completion")),
    }
}
