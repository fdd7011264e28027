//! `ferroce pingpong`: ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong,
//! same flags, same out-of-band exchange, same output lines, so either end
//! can be the stock tool.

use std::time::{Duration, Instant};

use ferroce_verbs::exchange::{self, pingpong, ExchangeConfig, PingpongDest};
use ferroce_verbs::{
    AccessFlags, Backend, ConnectOptions, Context, EngineMode, QpType, RecvWr, RemoteQp, SendOp,
    SendWr, UdDest, WcStatus,
};

use crate::common;

/// Work-request ids, as rc_pingpong uses them (and its pending bit mask).
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// The UD receive buffer starts with room for the 40-byte GRH (ud_pingpong).
const GRH: u32 = 40;
/// ud_pingpong's Q_Key.
const QKEY: u32 = 0x1111_1111;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Device (interface name, or ferroce_<ifname>); default: the first usable.
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// IB port (RoCE devices have port 1 only).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Message size.
    #[arg(short = 's', long, default_value_t = 4096)]
    pub size: u32,
    /// Path MTU (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// Receives posted at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u64,
    /// Service level (carried for compatibility; RoCE v2 maps it to nothing here).
    #[arg(short = 'l', long, default_value_t = 0)]
    pub sl: u8,
    /// Sleep on completion events instead of busy polling.
    #[arg(short = 'e', long)]
    pub events: bool,
    /// Local GID index (default: the IPv4-mapped GID, rxe's index 1).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<usize>,
    /// Drive the engine from this thread (spinning) instead of an engine thread.
    #[arg(long)]
    pub busy_poll: bool,
    /// Validate received buffers (the stock tools' --chk).
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
    /// Unreliable connected (ibv_uc_pingpong).
    #[arg(long, conflicts_with = "ud")]
    pub uc: bool,
    /// Unreliable datagram (ibv_ud_pingpong).
    #[arg(long, conflicts_with = "srq")]
    pub ud: bool,
    /// RC QPs sharing one receive queue (ibv_srq_pingpong).
    #[arg(long, conflicts_with = "uc")]
    pub srq: bool,
    /// Number of QPs with --srq.
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    pub num_qp: u32,
    /// Packet engine: auto, afxdp, afpacket or udp.
    #[arg(long, default_value = "auto")]
    pub backend: Backend,
    /// Server to connect to; without it, wait for a client.
    pub servername: Option<String>,
}

fn page_pattern(buf: &mut [u8]) {
    // rc_pingpong --chk: the first byte of every page is set to a known value
    // (0) in a buffer otherwise filled with 0x7b, and checked on receipt.
    for i in (0..buf.len()).step_by(4096) {
        buf[i] = 0;
    }
}

/// A failed completion ends the run, as in the stock tools.
fn check_status(wc: &ferroce_verbs::WorkCompletion) -> Result<(), String> {
    if wc.status == WcStatus::Success {
        return Ok(());
    }
    Err(format!(
        "Failed status {} ({}) for wr_id {}",
        ferroce_verbs::wc::status_str(wc.status),
        wc.status as u32,
        wc.wr_id
    ))
}

/// The stock tools' two result lines (bytes both ways, time per iteration).
fn print_results(size: u32, iters: u64, start: Instant) {
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = u64::from(size) * iters * 2;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        iters,
        usec / 1e6,
        usec / iters as f64
    );
}

pub fn run(a: Args) -> i32 {
    match run_inner(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn run_inner(a: Args) -> Result<i32, String> {
    if !common::IB_MTUS.contains(&a.mtu) {
        return Err(format!(
            "invalid MTU {} (256, 512, 1024, 2048 or 4096)",
            a.mtu
        ));
    }
    if a.srq {
        return run_srq(a);
    }
    let qp_type = if a.ud {
        QpType::Ud
    } else if a.uc {
        QpType::Uc
    } else {
        QpType::Rc
    };
    // The engine thread (woken by the backend's fd) measured several times
    // faster than spinning the caller's thread on these 2-core machines, so
    // both modes use it; -e only changes how this loop waits.
    let mode = if a.busy_poll {
        EngineMode::Polling
    } else {
        EngineMode::Thread
    };
    let ctx: Context = common::open_device(a.ib_dev.as_deref(), a.backend, mode, None)?;
    let mtu = if qp_type == QpType::Ud {
        ctx.query_port().active_mtu
    } else {
        a.mtu
    };
    if qp_type == QpType::Ud && a.size > mtu {
        return Err(format!("Requested size larger than port MTU ({mtu})"));
    }
    let grh = if qp_type == QpType::Ud { GRH } else { 0 };
    let buf_len = (a.size + grh) as usize;
    let pd = ctx.alloc_pd();
    let mut init = vec![0x7bu8; buf_len];
    if a.chk {
        page_pattern(&mut init[grh as usize..]);
    }
    let mr = pd
        .reg_mr(buf_len, AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    mr.write(0, &init).map_err(|e| e.to_string())?;
    let cq = ctx
        .create_cq(a.rx_depth + 1)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let qp = pd
        .create_qp()
        .qp_type(qp_type)
        .max_send_wr(1)
        .max_recv_wr(a.rx_depth)
        .build(&cq, &cq)
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    let gid_index = a.gid_idx.unwrap_or_else(|| common::default_gid_index(&ctx));
    let my_gid = ctx
        .query_gid(gid_index)
        .map_err(|e| format!("can't read sgid of index {gid_index}: {e}"))?;
    let my_psn = (ferroce_verbs::device::seed_from_os() as u32) & 0x00ff_ffff;
    let opts = ConnectOptions {
        path_mtu: mtu,
        sgid_index: gid_index,
        local_psn: my_psn,
        access: AccessFlags::NONE,
        qkey: QKEY,
        ..Default::default()
    };
    qp.to_init(&opts)
        .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;

    let recv_sge = [mr.sge(0, a.size + grh)];
    let post_recv = |n: u32| -> u32 {
        let mut i = 0;
        while i < n {
            if qp
                .post_recv(&[RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &recv_sge,
                }])
                .is_err()
            {
                break;
            }
            i += 1;
        }
        i
    };
    let mut routs = post_recv(a.rx_depth);
    if routs < a.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let my = PingpongDest {
        lid: 0,
        qpn: qp.qpn(),
        psn: my_psn,
        gid: common::gid_bytes(my_gid),
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        my.lid, my.qpn, my.psn, my_gid
    );
    let xcfg = ExchangeConfig::default();
    let connect = |rem: &PingpongDest| -> Result<(), String> {
        let remote = RemoteQp {
            qpn: rem.qpn,
            psn: rem.psn,
            gid: common::gid_from(rem.gid),
        };
        qp.connect(&ctx, &remote, &opts)
            .map_err(|e| format!("Couldn't connect to remote QP: {e}"))
    };
    let rem = match &a.servername {
        Some(server) => {
            let r = pingpong::client_exchange((server.as_str(), a.port), &my, &xcfg)
                .map_err(|e| format!("Couldn't read/write remote address: {e}"))?;
            connect(&r)?;
            r
        }
        None => {
            let listener = exchange::listen(a.port)
                .map_err(|e| format!("Couldn't listen to port {}: {e}", a.port))?;
            pingpong::server_exchange(&listener, &my, &xcfg, connect).map_err(|e| format!("{e}"))?
        }
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid,
        rem.qpn,
        rem.psn,
        common::gid_from(rem.gid)
    );
    let ud_dest = if qp_type == QpType::Ud {
        Some(UdDest {
            path: ctx
                .resolve_path(gid_index, common::gid_from(rem.gid))
                .map_err(|e| format!("Couldn't create AH: {e}"))?,
            remote_qpn: rem.qpn,
            remote_qkey: QKEY,
        })
    } else {
        None
    };
    let send_sge = [mr.sge(u64::from(grh), a.size)];
    let post_send = || -> Result<(), String> {
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send, &send_sge);
        wr.flags.signaled = true;
        wr.ud = ud_dest;
        qp.post_send(&[wr])
            .map_err(|e| format!("Couldn't post send: {e}"))
    };

    // rc_pingpong's loop: a send goes out when both the previous send and
    // the previous receive have completed.
    let mut pending = RECV_WRID;
    if a.servername.is_some() {
        post_send()?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = Vec::with_capacity(2);
    let mut last = Instant::now();
    while rcnt < a.iters || scnt < a.iters {
        wcs.clear();
        let n = cq
            .poll(2, &mut wcs)
            .map_err(|e| format!("poll CQ failed: {e}"))?;
        if n == 0 {
            if last.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "no completion for 20 s (sent {scnt}, received {rcnt} of {})",
                    a.iters
                ));
            }
            // Spinning on the CQ would fight the engine thread for the
            // device lock; sleep on it instead (it wakes on a completion).
            if mode == EngineMode::Thread {
                let _ = cq.wait(Duration::from_millis(100));
            }
            continue;
        }
        last = Instant::now();
        for wc in &wcs {
            check_status(wc)?;
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recv(a.rx_depth - routs);
                        if routs < a.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if scnt < a.iters && pending == 0 {
                post_send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    print_results(a.size, a.iters, start);
    if a.chk {
        let data = mr.to_vec().map_err(|e| e.to_string())?;
        let mut bad = 0;
        for (page, i) in (grh as usize..data.len()).step_by(4096).enumerate() {
            if data[i] != 0 {
                println!("invalid data in page {page}");
                bad += 1;
            }
        }
        if bad > 0 {
            return Ok(1);
        }
    }
    Ok(0)
}

/// ibv_srq_pingpong: `num_qp` RC QPs share one SRQ and one CQ; every QP
/// ping-pongs on its own, `iters` sends in total; 256 address messages each
/// way, the unused ones zero.
fn run_srq(a: Args) -> Result<i32, String> {
    if a.num_qp > a.rx_depth {
        return Err(format!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            a.rx_depth, a.num_qp
        ));
    }
    if a.num_qp as usize > pingpong::SRQ_MAX_QP {
        return Err(format!("at most {} QPs", pingpong::SRQ_MAX_QP));
    }
    let mode = if a.busy_poll {
        EngineMode::Polling
    } else {
        EngineMode::Thread
    };
    let ctx: Context = common::open_device(a.ib_dev.as_deref(), a.backend, mode, None)?;
    let pd = ctx.alloc_pd();
    let mr = pd
        .reg_mr(a.size as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    let mut init = vec![0x7bu8; a.size as usize];
    if a.chk {
        page_pattern(&mut init);
    }
    mr.write(0, &init).map_err(|e| e.to_string())?;
    let cq = ctx
        .create_cq(a.rx_depth + a.num_qp)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let srq = pd
        .create_srq(a.rx_depth, 1)
        .map_err(|e| format!("Couldn't create SRQ: {e}"))?;
    let gid_index = a.gid_idx.unwrap_or_else(|| common::default_gid_index(&ctx));
    let my_gid = ctx
        .query_gid(gid_index)
        .map_err(|e| format!("Could not get local gid for gid index {gid_index}: {e}"))?;
    let mut qps = Vec::new();
    let mut mine = Vec::new();
    for i in 0..a.num_qp {
        let qp = pd
            .create_qp()
            .max_send_wr(1)
            .max_recv_wr(a.rx_depth)
            .srq(&srq)
            .build(&cq, &cq)
            .map_err(|e| format!("Couldn't create QP[{i}]: {e}"))?;
        let psn = (ferroce_verbs::device::seed_from_os() as u32 ^ (i * 0x9e37)) & 0x00ff_ffff;
        let opts = ConnectOptions {
            path_mtu: a.mtu,
            sgid_index: gid_index,
            local_psn: psn,
            access: AccessFlags::NONE,
            ..Default::default()
        };
        qp.to_init(&opts)
            .map_err(|e| format!("Failed to modify QP[{i}] to INIT: {e}"))?;
        let d = PingpongDest {
            lid: 0,
            qpn: qp.qpn(),
            psn,
            gid: common::gid_bytes(my_gid),
        };
        println!(
            "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            d.lid, d.qpn, d.psn, my_gid
        );
        qps.push((qp, opts));
        mine.push(d);
    }
    let recv_sge = [mr.sge(0, a.size)];
    let post_recv = |n: u32| -> u32 {
        let mut i = 0;
        while i < n
            && srq
                .post_recv(&[RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &recv_sge,
                }])
                .is_ok()
        {
            i += 1;
        }
        i
    };
    let mut routs = post_recv(a.rx_depth);
    if routs < a.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let padded = pingpong::srq_padded(&mine).map_err(|e| e.to_string())?;
    let xcfg = ExchangeConfig::default();
    let connect_all = |rem: &[PingpongDest]| -> Result<(), String> {
        for ((qp, opts), r) in qps.iter().zip(rem) {
            let remote = RemoteQp {
                qpn: r.qpn,
                psn: r.psn,
                gid: common::gid_from(r.gid),
            };
            qp.connect(&ctx, &remote, opts)
                .map_err(|e| format!("Couldn't connect to remote QP: {e}"))?;
        }
        Ok(())
    };
    let rem = match &a.servername {
        Some(server) => {
            let r = pingpong::client_exchange_multi((server.as_str(), a.port), &padded, &xcfg)
                .map_err(|e| format!("Couldn't read/write remote address: {e}"))?;
            connect_all(&r)?;
            r
        }
        None => {
            let listener = exchange::listen(a.port)
                .map_err(|e| format!("Couldn't listen to port {}: {e}", a.port))?;
            pingpong::server_exchange_multi(&listener, &padded, &xcfg, |r| connect_all(r))
                .map_err(|e| format!("{e}"))?
        }
    };
    for r in rem.iter().take(a.num_qp as usize) {
        println!(
            "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            r.lid,
            r.qpn,
            r.psn,
            common::gid_from(r.gid)
        );
    }
    let send_sge = [mr.sge(0, a.size)];
    let post_send = |i: usize| -> Result<(), String> {
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send, &send_sge);
        wr.flags.signaled = true;
        qps[i]
            .0
            .post_send(&[wr])
            .map_err(|e| format!("Couldn't post send: {e}"))
    };
    let mut pending = vec![RECV_WRID; qps.len()];
    if a.servername.is_some() {
        for (i, p) in pending.iter_mut().enumerate() {
            post_send(i)?;
            *p = SEND_WRID | RECV_WRID;
        }
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = Vec::new();
    let mut last = Instant::now();
    while rcnt < a.iters || scnt < a.iters {
        wcs.clear();
        let n = cq
            .poll((a.rx_depth + a.num_qp) as usize, &mut wcs)
            .map_err(|e| format!("poll CQ failed: {e}"))?;
        if n == 0 {
            if last.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "no completion for 20 s (sent {scnt}, received {rcnt})"
                ));
            }
            if mode == EngineMode::Thread {
                let _ = cq.wait(Duration::from_millis(100));
            }
            continue;
        }
        last = Instant::now();
        for wc in &wcs {
            check_status(wc)?;
            let Some(qi) = qps.iter().position(|(q, _)| q.qpn() == wc.qp_num) else {
                return Err(format!("Couldn't find QPN {:06x}", wc.qp_num));
            };
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= a.num_qp {
                        routs += post_recv(a.rx_depth - routs);
                        if routs < a.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending[qi] &= !wc.wr_id;
            if scnt < a.iters && pending[qi] == 0 {
                post_send(qi)?;
                pending[qi] = RECV_WRID | SEND_WRID;
            }
        }
    }
    print_results(a.size, a.iters, start);
    Ok(0)
}
