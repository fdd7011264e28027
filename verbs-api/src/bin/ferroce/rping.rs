//! `ferroce rping`: librdmacm's `rping`, on an rdma_cm connection
//! (ferroce_verbs::cm). Each ping: the client advertises its source
//! buffer (address, rkey, size: 16 bytes, big-endian), the server RDMA
//! READs it and says go ahead, the client advertises its sink, the server
//! RDMA WRITEs what it read there and says go ahead; `-V` compares the two
//! buffers. Same flags, same output lines, same wire, so either side can be
//! the stock tool.

use std::time::{Duration, Instant};

use clap::Parser;
use ferroce_verbs::cm::{CmAgent, ConnParam, Connection};
use ferroce_verbs::{
    AccessFlags, Backend, CompletionQueue, EngineMode, MemoryRegion, QpType, QueuePair, RecvWr,
    SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::common;

/// rping's defaults and limits (`RPING_BUFSIZE`, its minimum message).
const DEFAULT_PORT: u16 = 7174;
const MAX_SIZE: u32 = 64 * 1024 - 1;
const MIN_SIZE: u32 = 26;
/// The advertisement: be64 address, be32 rkey, be32 size.
const INFO: u32 = 16;
/// Where things sit in the one memory region: receive buffer, send buffer,
/// then the RDMA buffer (sink) and the client's source buffer.
const RECV_AT: u64 = 0;
const SEND_AT: u64 = 16;
const RDMA_AT: u64 = 64;

#[derive(Parser, Debug)]
pub struct Args {
    /// Server side.
    #[arg(short = 's', conflicts_with = "client")]
    pub server: bool,
    /// Client side.
    #[arg(short = 'c')]
    pub client: bool,
    /// Address (the server's, for a client; to listen on, for a server).
    #[arg(short = 'a')]
    pub addr: Option<String>,
    /// Port in rdma_cm's TCP port space.
    #[arg(short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Ping data size.
    #[arg(short = 'S', default_value_t = 64)]
    pub size: u32,
    /// Ping count (0: until stopped).
    #[arg(short = 'C', default_value_t = 0)]
    pub count: u64,
    /// Display ping data.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Validate ping data.
    #[arg(short = 'V')]
    pub validate: bool,
    /// Debug output (accepted; ferroce logs through RUST_LOG).
    #[arg(short = 'd')]
    pub debug: bool,
    /// Device (interface, or ferroce_<ifname>).
    #[arg(long = "ib-dev")]
    pub dev: Option<String>,
    /// Packet engine: auto, afxdp, afpacket or udp.
    #[arg(long, default_value = "auto")]
    pub backend: Backend,
    /// Give up after this long without the peer (seconds).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

pub fn run(a: Args) -> i32 {
    if a.server == a.client {
        eprintln!("rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]");
        eprintln!("rping -c [-vVd] [-S size] [-C count] -a addr [-p port]");
        return 22;
    }
    if !(MIN_SIZE..=MAX_SIZE).contains(&a.size) {
        eprintln!(
            "Invalid size {} (valid range is {MIN_SIZE} to {})",
            a.size,
            MAX_SIZE + 1
        );
        return 22;
    }
    match session(&a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rping {}: {e}", if a.server { "server" } else { "client" });
            1
        }
    }
}

/// A peer's buffer: rping's `struct rping_rdma_info`.
#[derive(Debug, Clone, Copy)]
struct Advert {
    addr: u64,
    rkey: u32,
    len: u32,
}

/// What a completion was, to someone waiting for one kind.
enum Taken {
    /// Not the awaited kind (a send's completion on the way).
    Other,
    /// The awaited completion (not a receive).
    Done,
    /// The awaited receive: an advertisement.
    Advert(Advert),
}

/// The endpoint's objects.
struct Ep<'a> {
    cq: &'a CompletionQueue,
    qp: &'a QueuePair<'a>,
    mr: &'a MemoryRegion<'a>,
    timeout: Duration,
}

impl Ep<'_> {
    fn post_recv(&self) -> Result<(), String> {
        let sge = [self.mr.sge(RECV_AT, INFO)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &sge,
            }])
            .map_err(|e| format!("post recv error: {e}"))
    }

    /// Advertise `len` bytes at `at` in our region.
    fn send_info(&self, at: u64, len: u32) -> Result<(), String> {
        let mut info = [0u8; INFO as usize];
        info[..8].copy_from_slice(&(self.mr.addr() + at).to_be_bytes());
        info[8..12].copy_from_slice(&self.mr.rkey().to_be_bytes());
        info[12..].copy_from_slice(&len.to_be_bytes());
        self.send(&info)
    }

    fn send(&self, msg: &[u8]) -> Result<(), String> {
        self.mr.write(SEND_AT, msg).map_err(|e| e.to_string())?;
        let sge = [self.mr.sge(SEND_AT, INFO)];
        let mut wr = SendWr::new(1, SendOp::Send, &sge);
        wr.flags.signaled = true;
        self.qp
            .post_send(&[wr])
            .map_err(|e| format!("post send error {e}"))
    }

    /// The next completion of `opcode` (send completions on the way are
    /// taken); a received advertisement is returned and a receive posted
    /// again, as rping's CQ handler does.
    fn wait_for(&self, opcode: WcOpcode) -> Result<Option<Advert>, String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wcs = self
                .cq
                .poll_n(1, left)
                .map_err(|e| format!("waiting for {opcode:?}: {e}"))?;
            for wc in wcs {
                match self.take(&wc, opcode)? {
                    Taken::Other => {}
                    Taken::Done => return Ok(None),
                    Taken::Advert(a) => return Ok(Some(a)),
                }
            }
        }
    }

    fn take(&self, wc: &WorkCompletion, opcode: WcOpcode) -> Result<Taken, String> {
        if wc.status != WcStatus::Success {
            return Err(format!("cq completion failed status {:?}", wc.status));
        }
        if wc.opcode != opcode {
            return if wc.opcode == WcOpcode::Send {
                Ok(Taken::Other)
            } else {
                Err(format!("unexpected {:?} completion", wc.opcode))
            };
        }
        if opcode != WcOpcode::Recv {
            return Ok(Taken::Done);
        }
        if wc.byte_len != INFO {
            return Err(format!("Received bogus data, size {}", wc.byte_len));
        }
        let mut info = [0u8; INFO as usize];
        self.mr
            .read(RECV_AT, &mut info)
            .map_err(|e| e.to_string())?;
        self.post_recv()?;
        let [a0, a1, a2, a3, a4, a5, a6, a7, k0, k1, k2, k3, l0, l1, l2, l3] = info;
        Ok(Taken::Advert(Advert {
            addr: u64::from_be_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            rkey: u32::from_be_bytes([k0, k1, k2, k3]),
            len: u32::from_be_bytes([l0, l1, l2, l3]),
        }))
    }

    fn rdma(&self, op: SendOp, at: u64, len: u32) -> Result<(), String> {
        let sge = [self.mr.sge(at, len)];
        let mut wr = SendWr::new(2, op, &sge);
        wr.flags.signaled = true;
        self.qp
            .post_send(&[wr])
            .map_err(|e| format!("post send error {e}"))
    }
}

fn session(a: &Args) -> Result<(), String> {
    let timeout = Duration::from_secs(a.timeout);
    let ctx = common::open_device(a.dev.as_deref(), a.backend, EngineMode::Thread, None)?;
    let gid_index = common::default_gid_index(&ctx);
    let pd = ctx.alloc_pd();
    let mut cm = CmAgent::new(&ctx, &pd, gid_index).map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(32).map_err(|e| e.to_string())?;
    // rping's QP: 16 sends, 2 receives, one SGE each.
    let qp = pd
        .create_qp()
        .qp_type(QpType::Rc)
        .max_send_wr(16)
        .max_recv_wr(2)
        .build(&cq, &cq)
        .map_err(|e| e.to_string())?;
    let size = u64::from(a.size);
    let source_at = RDMA_AT + size;
    let mr = pd
        .reg_mr(
            (source_at + size) as usize,
            AccessFlags(
                AccessFlags::LOCAL_WRITE.0
                    | AccessFlags::REMOTE_READ.0
                    | AccessFlags::REMOTE_WRITE.0,
            ),
        )
        .map_err(|e| e.to_string())?;
    let ep = Ep {
        cq: &cq,
        qp: &qp,
        mr: &mr,
        timeout,
    };
    qp.to_init(&Default::default()).map_err(|e| e.to_string())?;
    ep.post_recv()?;
    // rping_init_conn_param.
    let param = ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        ..ConnParam::default()
    };
    if a.server {
        let req = cm
            .get_request(a.port, timeout)
            .map_err(|e| format!("waiting for a connection request: {e}"))?;
        let conn = cm
            .accept(&req, &qp, &param)
            .map_err(|e| format!("rdma_accept: {e}"))?;
        let r = serve(a, &ep, &mut cm, &conn);
        let _ = cm.disconnect(&conn, &qp);
        r
    } else {
        let host = a.addr.as_deref().ok_or("a client needs -a addr")?;
        let dst = common::resolve(host, a.port)
            .map_err(|e| format!("getaddrinfo failed ({e}) - invalid hostname or IP address"))?;
        let conn = cm
            .connect(&qp, dst, &param)
            .map_err(|e| format!("rdma_connect: {e}"))?;
        let r = ping(a, &ep, source_at);
        cm.disconnect(&conn, &qp)
            .map_err(|e| format!("rdma_disconnect: {e}"))?;
        eprintln!("client DISCONNECT EVENT...");
        r
    }
}

/// The client's pings.
fn ping(a: &Args, ep: &Ep<'_>, source_at: u64) -> Result<(), String> {
    let size = a.size as usize;
    let mut start = b'A';
    let mut n = 0u64;
    while a.count == 0 || n < a.count {
        // rping's pattern: the message, then letters from `start` on
        // cycling through A..z, NUL-terminated.
        let mut src = format!("rdma-ping-{n}: ").into_bytes();
        src.truncate(size);
        let mut c = start;
        while src.len() < size {
            src.push(c);
            c = if c >= b'z' { b'A' } else { c + 1 };
        }
        src[size - 1] = 0;
        start = if start >= b'z' { b'A' } else { start + 1 };
        ep.mr.write(source_at, &src).map_err(|e| e.to_string())?;
        ep.send_info(source_at, a.size)?;
        ep.wait_for(WcOpcode::Recv)?;
        ep.send_info(RDMA_AT, a.size)?;
        ep.wait_for(WcOpcode::Recv)?;
        let mut sink = vec![0u8; size];
        ep.mr.read(RDMA_AT, &mut sink).map_err(|e| e.to_string())?;
        if a.validate && sink != src {
            return Err("data mismatch!".into());
        }
        if a.verbose {
            println!("ping data: {}", c_str(&sink));
        }
        n += 1;
    }
    Ok(())
}

/// The server's side of each ping, until the client disconnects.
fn serve(a: &Args, ep: &Ep<'_>, cm: &mut CmAgent<'_>, conn: &Connection) -> Result<(), String> {
    loop {
        // The client's source, or its disconnect.
        let Some(src) = next_advert(ep, cm, conn)? else {
            eprintln!("server DISCONNECT EVENT...");
            return Ok(());
        };
        let read = SendOp::RdmaRead {
            remote_addr: src.addr,
            rkey: src.rkey,
        };
        ep.rdma(read, RDMA_AT, src.len.min(a.size))?;
        ep.wait_for(WcOpcode::RdmaRead)?;
        let mut data = vec![0u8; a.size as usize];
        ep.mr.read(RDMA_AT, &mut data).map_err(|e| e.to_string())?;
        if a.verbose {
            println!("server ping data: {}", c_str(&data));
        }
        ep.send(&[0u8; INFO as usize])?;
        let Some(sink) = next_advert(ep, cm, conn)? else {
            eprintln!("server DISCONNECT EVENT...");
            return Ok(());
        };
        // rping writes back strlen + 1 bytes.
        let echo = (c_str(&data).len() + 1).min(a.size as usize) as u32;
        let write = SendOp::RdmaWrite {
            remote_addr: sink.addr,
            rkey: sink.rkey,
        };
        ep.rdma(write, RDMA_AT, echo)?;
        ep.wait_for(WcOpcode::RdmaWrite)?;
        ep.send(&[0u8; INFO as usize])?;
    }
}

/// The next advertisement, or `None` once the peer has disconnected.
fn next_advert(
    ep: &Ep<'_>,
    cm: &mut CmAgent<'_>,
    conn: &Connection,
) -> Result<Option<Advert>, String> {
    let deadline = Instant::now() + ep.timeout;
    loop {
        let mut wcs = Vec::new();
        ep.cq.poll(4, &mut wcs).map_err(|e| e.to_string())?;
        for wc in &wcs {
            // Flushed work requests after the peer's DREQ end the session.
            if wc.status == WcStatus::WrFlushErr {
                return Ok(None);
            }
            if let Taken::Advert(a) = ep.take(wc, WcOpcode::Recv)? {
                return Ok(Some(a));
            }
        }
        if cm
            .wait_disconnect(conn, ep.qp, Duration::from_millis(5))
            .map_err(|e| e.to_string())?
        {
            return Ok(None);
        }
        if Instant::now() >= deadline {
            return Err("no ping from the client".into());
        }
        let _ = ep.cq.wait(Duration::from_millis(5));
    }
}

/// The bytes up to the first NUL, as text.
fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}
