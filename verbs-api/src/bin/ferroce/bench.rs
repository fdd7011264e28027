//! `ferroce bench write|read|send|atomic [--lat]`: perftest's tests with its
//! main flags, its out-of-band exchange (so a stock perftest peer can be the
//! other end) and a perftest-shaped table; `--json` for machines. Every run
//! ends with a data check, and wrong data makes the exit status 1.

use std::sync::Mutex;
use std::time::Duration;

use ferroce_stack::wire::mad::sidr_status;
use ferroce_verbs::cm::{source_gid_index, UdPeer};
use ferroce_verbs::cm::{
    CmAgent, ConnParam, Connection as CmConnection, RDMA_UDP_QKEY, REJ_INVALID_SERVICE_ID,
};
use ferroce_verbs::device::ib_mtu_enum;
use ferroce_verbs::exchange::perftest::{self, BwReport, Negotiated, PerftestConn, PerftestParams};
use ferroce_verbs::exchange::rdma_cm::RdmaCmChannel;
use ferroce_verbs::exchange::{self, ExchangeConfig, PerftestDest, Role};
use ferroce_verbs::perf::{self, PerfOp, PerfParams, PerfResult, RemoteBuf};
use ferroce_verbs::wc::{GrhInfo, GRH_LEN};
use ferroce_verbs::{
    Backend, CompletionQueue, ConnectOptions, Context, EngineMode, MemoryRegion, QpType, QueuePair,
    RecvWr, RemoteQp, SendOp, SendWr, UdDest, WcStatus, WorkCompletion,
};

use crate::common;

/// Our version string: perftest compares versions numerically (atof), so
/// the suffix changes nothing for a stock peer and tells a ferroce peer that
/// the other end fills its buffers with the shared check pattern.
const VERSION: &str = "6.19 ferroce";
const PATTERN_SEED: u64 = 0x0f0e_0d0c;
/// perftest's latency loops start by measuring the CPU clock (get_cpu_mhz:
/// busy loops of 100, 110, … 2090 µs, 219 ms, then /proc/cpuinfo), on both
/// sides, after the last hand-shake; a stock server answers a ping only
/// after it. Seen on the wire against rxe: 220-225 ms.
const PERFTEST_CALIBRATION: Duration = Duration::from_millis(230);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    Write,
    Read,
    Send,
    Atomic,
}

/// perftest's `-c`: the transport of the test's QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[allow(clippy::upper_case_acronyms)]
pub enum Connection {
    #[value(name = "RC", alias = "rc")]
    RC,
    #[value(name = "UC", alias = "uc")]
    UC,
    #[value(name = "UD", alias = "ud")]
    UD,
}

/// perftest's `--output`: print only this figure, one line per size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputLevel {
    /// Average bandwidth (bandwidth tests), in the report's unit.
    #[value(name = "bandwidth")]
    Bandwidth,
    /// Average message rate in Mpps (bandwidth tests).
    #[value(name = "message_rate")]
    MessageRate,
    /// Typical (median) latency in µs (latency tests).
    #[value(name = "latency")]
    Latency,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[allow(non_camel_case_types)]
pub enum AtomicType {
    #[value(name = "FETCH_AND_ADD")]
    FETCH_AND_ADD,
    #[value(name = "CMP_AND_SWAP")]
    CMP_AND_SWAP,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The test: write, read, send or atomic.
    #[arg(value_enum, required_unless_present = "soak")]
    pub test: Option<Test>,
    /// Soak instead (issue 8): random work requests of every kind for this
    /// long (`90s`, `10m`) between two in-process devices over links with
    /// loss, duplication, reordering and corruption; every byte checked.
    #[arg(long, value_name = "DURATION", value_parser = ferroce_verbs::soak::parse_duration)]
    pub soak: Option<Duration>,
    /// With --soak: between two network-namespace hosts on a veth pair over
    /// --backend (needs root), instead of two in-process devices.
    #[arg(long, requires = "soak")]
    pub soak_netns: bool,
    /// Latency test instead of bandwidth.
    #[arg(long)]
    pub lat: bool,
    /// Message size (default 65536 for bandwidth, 2 for latency; atomics are 8).
    #[arg(short = 's', long)]
    pub size: Option<u32>,
    /// Iterations (default 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long)]
    pub iters: Option<u64>,
    /// Run all sizes from 2 bytes to 8 MiB.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Queue pairs.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Path MTU (default: the port's active MTU).
    #[arg(short = 'm', long)]
    pub mtu: Option<u32>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Run each size for this many seconds instead of -n iterations; the
    /// figure covers all but the first and last --margin seconds.
    #[arg(short = 'D', long)]
    pub duration: Option<u64>,
    /// Seconds at each end of a -D run left out of its figure (perftest's
    /// -f; by default a quarter of the duration, as perftest sets it).
    #[arg(short = 'f', long)]
    pub margin: Option<u64>,
    /// Report bandwidth in Gbit/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Don't fail on CPU-frequency warnings (accepted for perftest compatibility).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Port (perftest's `-i`): a ferroce device has one, port 1.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Inline size (perftest's `-I`): accepted and has no effect; ferroce
    /// copies every payload into its frame, there is no inline limit.
    #[arg(short = 'I', long = "inline_size")]
    pub inline_size: Option<u32>,
    /// Don't measure the peak bandwidth (perftest's `-N`): it prints as 0.
    /// perftest measures it only up to 20000 iterations and never in a `-D` run.
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// Outstanding RDMA READ / atomic requests per QP (perftest's `-o`; READ
    /// and atomic tests only): the initiator depth this side offers the peer.
    /// Above the device's limit it is cut to it, as perftest does; 0 or
    /// less, or none given: the device's limit.
    #[arg(short = 'o', long = "outs", allow_negative_numbers = true)]
    pub outs: Option<i64>,
    /// Wait for completions on the completion channel (perftest's `-e`):
    /// the engine thread runs the device and the test sleeps between
    /// completions, which is also what happens without `--busy-poll`.
    #[arg(short = 'e', long = "events", conflicts_with = "busy_poll")]
    pub events: bool,
    /// Connection type, as perftest's `-c`: RC, UC (WRITE and SEND only: no
    /// READ or atomics, no ACKs, a lost packet loses its message) or UD
    /// (SEND only, messages up to the MTU, each receive led by a 40-byte GRH).
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC")]
    pub connection: Connection,

    /// Connect with rdma_cm instead of the TCP exchange (perftest's `-R`):
    /// the exchange runs over an RC connection of its own that rdma_cm sets
    /// up on the port first, then rdma_cm connects the test QPs (UD: service
    /// ID resolution names the server's QPs); the peer must use -R too. RC
    /// and UD (librdmacm has no UC).
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Bidirectional bandwidth (perftest's `-b`): both sides run the test
    /// at once and each reports the sum of both directions (WRITE, READ,
    /// SEND, atomic). The peer must be run with it too.
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Outstanding work requests per QP in bandwidth tests.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,
    /// Receives a SEND bandwidth receiver keeps posted per QP (perftest's `-r`).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub rx_depth: u32,
    /// CQ moderation in bandwidth tests (perftest's `-Q`): a completion for
    /// every this many requests (at most the tx depth) and the last; a -D
    /// run asks for every one.
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cq_mod: u32,
    /// Work requests per post in bandwidth tests, at most (perftest's `-l`;
    /// its default is 1, one ibv_post_send each: here posts are batched).
    #[arg(short = 'l', long = "post_list", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub post_list: u32,
    /// Atomic operation.
    #[arg(
        short = 'A',
        long = "atomic_type",
        value_enum,
        default_value = "FETCH_AND_ADD"
    )]
    pub atomic_type: AtomicType,
    /// Device (interface, or ferroce_<ifname>).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// GID index (default: the IPv4-mapped one; with --ipv6 an IPv6 one).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<usize>,
    /// Use an IPv6 GID when -x is not given (perftest's --ipv6: the first
    /// GID that is not IPv4-mapped). The address given for -R stays IPv4
    /// in perftest 4.5; ferroce takes either.
    #[arg(long)]
    pub ipv6: bool,
    /// Traffic class of every packet of the test's QPs (perftest's
    /// `--tclass`): the IPv4 TOS or IPv6 traffic class, DSCP << 2 | ECN.
    #[arg(long = "tclass", default_value_t = 0)]
    pub tclass: u8,
    /// TOS of the rdma_cm test QPs (perftest's `-T`, with -R only): the
    /// connection manager carries it in the REQ, so the server's packets
    /// take it too.
    #[arg(short = 'T', long = "tos")]
    pub tos: Option<u8>,
    /// Hop limit (perftest's `-L`, which perftest 4.5 takes for raw Ethernet
    /// QPs only): the IPv4 TTL or IPv6 hop limit of every
    /// packet of the test's QPs [default: 64].
    #[arg(short = 'L', long = "hop_limit")]
    pub hop_limit: Option<u8>,
    /// Flow label (perftest's `--flow_label`, 20 bits): IPv6's flow label and
    /// what the UDP source port is folded from (0: both from the QPNs).
    #[arg(long = "flow_label", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=0xf_ffff))]
    pub flow_label: u32,
    /// Local ACK time-out (perftest's `-u`): 4.096 µs × 2^timeout before a
    /// request is sent again (0: never).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// Packet engine: auto, afxdp, afpacket or udp.
    #[arg(long, default_value = "auto")]
    pub backend: Backend,
    /// Drive the engine from the measuring thread, spinning on the CQ
    /// (never sleeping) instead of an engine thread: no hand-off between
    /// threads, one core busy.
    #[arg(long)]
    pub busy_poll: bool,
    /// One JSON object per result line instead of the table.
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
    /// Run until stopped (Ctrl-C), printing a result line every -D seconds
    /// (default 5): perftest's `--run_infinitely`, for WRITE, READ and
    /// atomic bandwidth. The serving side ends when the client is stopped.
    #[arg(long = "run_infinitely")]
    pub run_infinitely: bool,
    /// Latency tests: print every sample, sorted, before the result line
    /// (perftest's `-H`).
    #[arg(short = 'H', long = "report-histogram")]
    pub histogram: bool,
    /// Latency tests: print every sample in the order measured, then sorted
    /// as `-H` does (perftest's `-U`).
    #[arg(short = 'U', long = "report-unsorted")]
    pub unsorted: bool,
    /// Print only this figure of each size, nothing else (perftest's
    /// `--output`): bandwidth or message_rate for bandwidth tests, latency
    /// (the typical one) for latency tests.
    #[arg(long, value_enum)]
    pub output: Option<OutputLevel>,
    /// Fail (exit 1) unless the bandwidth reaches this, in the report's unit
    /// (perftest's `-w`; with -a, one size reaching it is enough, as there).
    #[arg(short = 'w', long = "limit_bw")]
    pub limit_bw: Option<f64>,
    /// Fail (exit 1) unless the message rate reaches this many Mpps
    /// (perftest's `-y`).
    #[arg(short = 'y', long = "limit_msgrate")]
    pub limit_msgrate: Option<f64>,
    /// Write every frame this process sends and receives to a pcap file.
    #[arg(long)]
    pub pcap: Option<std::path::PathBuf>,
    /// Server to connect to; without it, wait for a client.
    pub servername: Option<String>,
}

impl Args {
    fn test(&self) -> Test {
        self.test.unwrap_or(Test::Write)
    }
    fn op(&self) -> PerfOp {
        match (self.test(), self.atomic_type) {
            (Test::Write, _) => PerfOp::Write,
            (Test::Read, _) => PerfOp::Read,
            (Test::Send, _) => PerfOp::Send,
            (Test::Atomic, AtomicType::FETCH_AND_ADD) => PerfOp::FetchAdd,
            (Test::Atomic, AtomicType::CMP_AND_SWAP) => PerfOp::CompareSwap,
        }
    }
    fn sizes(&self) -> Vec<u32> {
        if self.test() == Test::Atomic {
            return vec![8];
        }
        if self.all {
            return (1..=23).map(|i| 1u32 << i).collect();
        }
        vec![self.size.unwrap_or(if self.lat { 2 } else { 65536 })]
    }
    /// The perftest table and its banners (not with --json or --output).
    fn table(&self) -> bool {
        !self.json && self.output.is_none()
    }
    fn iters(&self) -> u64 {
        self.iters.unwrap_or(if self.lat { 1000 } else { 5000 })
    }
    fn qp_type(&self) -> QpType {
        match self.connection {
            Connection::UC => QpType::Uc,
            Connection::UD => QpType::Ud,
            Connection::RC => QpType::Rc,
        }
    }
    fn title(&self) -> String {
        let t = match self.test() {
            Test::Write => "RDMA_Write",
            Test::Read => "RDMA_Read",
            Test::Send => "Send",
            Test::Atomic => "Atomic",
        };
        let kind = match (self.lat, self.bidirectional) {
            (true, _) => "Latency",
            (false, true) => "Bidirectional BW",
            (false, false) => "BW",
        };
        format!("{t} {kind} Test")
    }
}

/// The path MTU for `-m`, picked as perftest's `set_mtu` does: an MTU that
/// is not an IB MTU, or one above the port's active MTU, gives way to the
/// active MTU. Also returns the lines perftest prints then, as (goes to
/// stderr, text); they name the active MTU by its `ibv_mtu` value.
fn path_mtu(requested: Option<u32>, active: u32) -> (u32, Vec<(bool, String)>) {
    let Some(m) = requested else {
        return (active, Vec::new());
    };
    let active_enum = ib_mtu_enum(active);
    if !common::IB_MTUS.contains(&m) {
        return (
            active,
            vec![
                (true, format!(" Invalid MTU - {m} ")),
                (
                    true,
                    " Please choose mtu from {256,512,1024,2048,4096}".to_string(),
                ),
                (
                    true,
                    format!(" Will run with the port active mtu - {active_enum}"),
                ),
            ],
        );
    }
    if m > active {
        return (
            active,
            vec![
                (
                    false,
                    "Requested mtu is higher than active mtu ".to_string(),
                ),
                (false, format!("Changing to active mtu - {active_enum}")),
            ],
        );
    }
    (m, Vec::new())
}

fn mtu_bytes(e: u8) -> u32 {
    match e {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        _ => 4096,
    }
}

pub fn run(a: Args) -> i32 {
    if let Some(d) = a.soak {
        return soak(d, a.soak_netns.then_some(a.backend), a.json);
    }
    match run_inner(&a) {
        Ok(ok) => {
            if ok {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("ferroce bench: {e}");
            1
        }
    }
}

/// The local end of one QP.
struct End<'pd> {
    qp: QueuePair<'pd>,
    cq: CompletionQueue,
    /// The receive CQ when it is not `cq` (bidirectional SEND).
    rcq: Option<CompletionQueue>,
}

/// What every size's run uses: the QPs, the buffer (`per_qp` bytes a QP),
/// the peer's buffers, and whether the peer is ferroce.
#[derive(Clone, Copy)]
struct Setup<'s, 'pd> {
    ends: &'s [End<'pd>],
    mr: &'s MemoryRegion<'pd>,
    remotes: &'s [RemoteBuf],
    per_qp: u64,
    peer_is_ferroce: bool,
    /// The run's largest (last) message size.
    last_size: u32,
}

/// perftest's sizes for UD: messages fit in one packet, so `-a` stops at
/// the MTU and a larger `-s` is cut to it (with perftest's note).
fn ud_sizes(a: &Args, mtu: u32) -> Vec<u32> {
    let sizes = a.sizes();
    if a.all {
        return sizes.into_iter().filter(|s| *s <= mtu).collect();
    }
    if sizes.iter().any(|s| *s > mtu) {
        let note = format!(" Max msg size in UD is MTU {mtu}\n Changing to this MTU");
        if a.table() {
            println!("{note}");
        } else {
            eprintln!("{note}");
        }
    }
    sizes.into_iter().map(|s| s.min(mtu)).collect()
}

fn run_inner(a: &Args) -> Result<bool, String> {
    // perftest checks this with or without -D (its duration defaults to 5 s).
    if a.margin
        .is_some_and(|m| a.duration.unwrap_or(5) <= m.saturating_mul(2))
    {
        println!("{RESULT_LINE}");
        return Err("please check that DURATION > 2*MARGIN".into());
    }
    match (a.connection, a.test()) {
        (Connection::UD, Test::Write | Test::Read | Test::Atomic) => {
            return Err("-c UD has only SEND: use send".into())
        }
        (Connection::UC, Test::Read | Test::Atomic) => {
            return Err("-c UC has no RDMA READ or atomics: use write or send".into())
        }
        _ => {}
    }
    if a.tos.is_some() && !a.rdma_cm {
        // perftest's words.
        return Err("TOS only valid for rdma_cm based QP and RawEth QP".into());
    }
    if a.rdma_cm {
        match a.connection {
            // perftest's words.
            Connection::UC => return Err("UC is not supported in librdmacm".into()),
            Connection::UD | Connection::RC => {}
        }
    }
    if a.no_peak && a.lat {
        return Err("NoPeak only valid for BW tests".into());
    }
    if a.outs.is_some() && !matches!(a.test(), Test::Read | Test::Atomic) {
        // perftest's parser, word for word.
        return Err("Setting Outstanding reads only available on READ verb".into());
    }
    if a.ib_port != 1 {
        return Err(format!(
            "-i {}: a ferroce device has one port, port 1",
            a.ib_port
        ));
    }
    if a.bidirectional && a.lat {
        return Err("-b (bidirectional) is for bandwidth tests, not --lat".into());
    }
    match (a.output, a.lat) {
        (Some(OutputLevel::Latency), false) => {
            return Err("--output for bandwidth tests can be: bandwidth, message_rate".into())
        }
        (Some(OutputLevel::Bandwidth | OutputLevel::MessageRate), true) => {
            return Err("--output for latency tests can be: latency".into())
        }
        _ => {}
    }
    if a.run_infinitely {
        // perftest: "run_infinitely exists only in BW tests for now".
        let why = if a.lat {
            Some("is for bandwidth tests")
        } else if a.test() == Test::Send {
            Some("runs WRITE, READ or atomic here (a SEND receiver would need its count)")
        } else if a.bidirectional || a.all {
            Some("runs one size one way (no -b, no -a)")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("--run_infinitely {why}"));
        }
    }
    if !a.lat && (a.histogram || a.unsorted) {
        return Err("-H and -U (latency samples) are for latency tests".into());
    }
    if a.lat && (a.limit_bw.is_some() || a.limit_msgrate.is_some()) {
        return Err("-w and -y (limits) are for bandwidth tests".into());
    }
    let ctx = open(a)?;
    let port = ctx.query_port();
    let (mtu, warnings) = path_mtu(a.mtu, port.active_mtu);
    for (to_stderr, line) in warnings {
        // perftest prints the clamp on stdout; JSON output keeps stdout for results.
        if to_stderr || !a.table() {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    let ud = a.connection == Connection::UD;
    let sizes = if ud { ud_sizes(a, mtu) } else { a.sizes() };
    let max_size = *sizes.iter().max().unwrap_or(&65536);
    // A UD receive takes the GRH before the message.
    let grh = if ud { u64::from(perf::UD_GRH) } else { 0 };
    let per_qp = ((u64::from(max_size) + grh) * 2).max(8192);
    let pd = ctx.alloc_pd();
    let mr = pd
        .reg_mr(
            (per_qp * u64::from(a.qps)) as usize,
            ConnectOptions::default().access,
        )
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    // Buffers hold the check pattern before anything moves (a ferroce peer
    // READing from us, or checking what it wrote, relies on it), and before
    // the exchange ends: the peer may write as soon as it does.
    perf::fill_pattern(&mr, 0, mr.len(), PATTERN_SEED).map_err(|e| e.to_string())?;
    let write_lat = a.lat && a.test() == Test::Write;
    if write_lat {
        // The WRITE ping-pong polls its receive halves for 1, 2, ...: no stale match.
        for q in 0..u64::from(a.qps) {
            mr.write(q * per_qp + per_qp / 2, &vec![0; (per_qp / 2) as usize])
                .map_err(|e| e.to_string())?;
        }
    }
    let gid_index = common::perftest_gid_index(&ctx, a.gid_index, a.ipv6);
    let gid = ctx.query_gid(gid_index).map_err(|e| e.to_string())?;
    let defaults = ConnectOptions::default();
    let max_rd = ctx.query_device().max_qp_rd_atom;
    let (out_reads, cut) = out_reads(a.outs, max_rd);
    if cut {
        if a.table() {
            println!("{RESULT_LINE}");
        }
        eprintln!(" Number of outstanding reads is above max = {max_rd}");
        eprintln!(" Changing to that max value");
    }
    let opts = ConnectOptions {
        path_mtu: mtu,
        sgid_index: gid_index,
        max_rd_atomic: out_reads,
        max_dest_rd_atomic: out_reads,
        timeout: a.qp_timeout,
        traffic_class: a.tos.unwrap_or(a.tclass),
        hop_limit: a.hop_limit.unwrap_or(defaults.hop_limit),
        flow_label: a.flow_label,
        // rdma_cm gives its UD QPs its own Q_Key (perftest's 0x11111111 otherwise).
        qkey: if a.rdma_cm {
            RDMA_UDP_QKEY
        } else {
            defaults.qkey
        },
        ..defaults
    };
    let mut ends = Vec::new();
    for _ in 0..a.qps {
        let cq = ctx
            .create_cq(a.tx_depth * 2 + 1024)
            .map_err(|e| format!("Couldn't create CQ: {e}"))?;
        // A bidirectional SEND run sends and receives at once, each from its
        // own thread: each polls its own CQ (perftest's send_cq and recv_cq).
        let rcq = if a.bidirectional && a.test() == Test::Send {
            Some(
                ctx.create_cq(a.rx_depth + 1024)
                    .map_err(|e| format!("Couldn't create CQ: {e}"))?,
            )
        } else {
            None
        };
        let qp = pd
            .create_qp()
            .qp_type(a.qp_type())
            .max_send_wr(a.tx_depth.max(16))
            .max_recv_wr(a.rx_depth.max(1024))
            .build(&cq, rcq.as_ref().unwrap_or(&cq))
            .map_err(|e| format!("Couldn't create QP: {e}"))?;
        if a.rdma_cm && ud {
            ferroce_verbs::cm::init_ud_qp(&ctx, &qp, &opts).map_err(|e| e.to_string())?;
        } else {
            qp.to_init(&opts).map_err(|e| e.to_string())?;
        }
        ends.push(End { qp, cq, rcq });
    }
    let my_dests: Vec<PerftestDest> = ends
        .iter()
        .enumerate()
        .map(|(i, e)| PerftestDest {
            lid: 0,
            out_reads: u16::from(opts.max_rd_atomic),
            qpn: e.qp.qpn(),
            psn: (ferroce_verbs::device::seed_from_os() as u32 ^ (i as u32 * 0x1357)) & 0x00ff_ffff,
            rkey: mr.rkey(),
            // WRITE latency is a ping-pong into each other's receive half
            // (ib_write_lat advertises that half); the rest use the start.
            vaddr: mr.addr() + i as u64 * per_qp + if write_lat { per_qp / 2 } else { 0 },
            gid: gid.octets(),
            srqn: 0,
        })
        .collect();
    // perftest 4.5's tests differ in their key-message rounds (seen on the
    // wire between two stock peers): the latency tools add one before the
    // first pass; ib_send_bw one before traffic and no report exchange.
    let params = PerftestParams {
        version: VERSION.to_string(),
        mtu: ib_mtu_enum(mtu),
        extra_rounds_before: u8::from(a.lat && a.test() != Test::Atomic),
        extra_rounds_after: u8::from(!a.lat && a.test() == Test::Send),
        ..PerftestParams::default()
    };
    let xcfg = ExchangeConfig::default();
    // The peer's view of our PSN is what we chose; the connect callback
    // uses both sides' destinations.
    let negotiated_mtu = Mutex::new(mtu);
    let client = a.servername.is_some();
    // SEND receives of the first size, posted while connecting: before the
    // hand-shakes that let the peer start (perftest's order), so no message
    // meets an empty receive queue (an RNR retry over RC, a loss over UC).
    // Per QP, how many; taken by the first size's run.
    let preposted: Mutex<Option<Vec<u64>>> = Mutex::new(None);
    let first = PerfParams::new(a.op(), sizes.first().copied().unwrap_or(65536), a.iters());
    let connect = |n: &Negotiated, remote: &[PerftestDest]| -> Result<(), String> {
        let mtu = mtu_bytes(n.mtu).min(mtu);
        *negotiated_mtu.lock().unwrap_or_else(|p| p.into_inner()) = mtu;
        // With -R rdma_cm connected the QPs already (its REQ and REP).
        let pairs = if a.rdma_cm { 0 } else { ends.len() };
        for ((e, mine), theirs) in ends.iter().zip(&my_dests).zip(remote).take(pairs) {
            let o = ConnectOptions {
                path_mtu: mtu,
                local_psn: mine.psn,
                // perftest: the requester keeps as many READs out as the
                // responder said it takes (its OUT), at most the device's.
                max_rd_atomic: (theirs.out_reads.min(u16::from(max_rd)) as u8).max(1),
                ..opts
            };
            e.qp.connect(
                &ctx,
                &RemoteQp {
                    qpn: theirs.qpn,
                    psn: theirs.psn,
                    gid: std::net::Ipv6Addr::from(theirs.gid),
                },
                &o,
            )
            .map_err(|e| e.to_string())?;
        }
        if a.test() == Test::Send {
            let counts = prepost_send(a, &ends, &mr, &first)?;
            *preposted.lock().unwrap_or_else(|p| p.into_inner()) = Some(counts);
        }
        Ok(())
    };
    let prepare = |_: &Negotiated| -> Result<Vec<PerftestDest>, String> { Ok(my_dests.clone()) };
    if a.table() {
        print_header(a, &ctx, mtu, client, out_reads);
    }
    // -R: the CM agent, and the test QPs' connections to close at the end.
    let mut rdma_cm: Option<CmLinks<'_>> = None;
    // -R -c UD: per QP, the peer's UD QP as SIDR (or its announcement) named it.
    let mut ud_peers: Vec<Option<UdRemote>> = Vec::new();
    let mut session = if a.rdma_cm {
        let dst = a
            .servername
            .as_deref()
            .map(|s| common::resolve(s, a.port))
            .transpose()?;
        let mut cm = CmAgent::new(&ctx, &pd, gid_index).map_err(|e| format!("rdma_cm: {e}"))?;
        let mut channel =
            RdmaCmChannel::new(&ctx, &pd, gid_index).map_err(|e| format!("rdma_cm: {e}"))?;
        // As over TCP: a client tries for the I/O time-out, a server waits
        // for its client as long as the accept time-out says (by default
        // without end, as perftest's server does).
        let wait_client = match dst {
            Some(_) => xcfg.io_timeout,
            None => xcfg
                .accept_timeout
                .unwrap_or(Duration::from_secs(365 * 24 * 3600)),
        };
        // perftest's control connection: no READs either way.
        let c = cm_establish(
            &mut cm,
            channel.qp(),
            dst,
            a.port,
            &perftest_cm_param(0),
            wait_client,
        )?;
        channel.set_peer(c.peer_gid.to_canonical().to_string());
        let role = if client { Role::Client } else { Role::Server };
        let conn = PerftestConn::over_channel(Box::new(channel), role, gid_index as u32, &xcfg);
        // The test QPs: READ/atomic depth as -o says; perftest asks for none in the other
        // tests, so its peer's QP grants no READ (rdma_cm's rule). Between two ferroce
        // benches a WRITE client asks for one: its data check reads the written span back.
        let test_param = |n: &Negotiated| {
            let reads = match a.test() {
                Test::Read | Test::Atomic => out_reads,
                Test::Write if n.remote_version.contains("ferroce") => 1,
                _ => 0,
            };
            ConnParam {
                traffic_class: opts.traffic_class,
                ..perftest_cm_param(reads)
            }
        };
        let mut conns = Vec::new();
        // perftest: a UD client that will be answered (latency, -b) tells
        // the server its QPN in a SEND WITH IMMEDIATE once SIDR named the
        // server's QP; SIDR carries no QPN of the requester.
        let announce = a.lat || a.bidirectional;
        let cm_connect = |n: &Negotiated| -> Result<(), String> {
            let test = test_param(n);
            for (i, e) in ends.iter().enumerate() {
                if ud {
                    let at = i as u64 * per_qp;
                    let to = UdTarget {
                        dst,
                        port: a.port,
                        announce,
                        opts,
                    };
                    let peer = cm_resolve_ud(&mut cm, &ctx, e, &mr, at, &to, xcfg.io_timeout)?;
                    ud_peers.push(peer);
                } else {
                    conns.push(cm_establish(
                        &mut cm,
                        &e.qp,
                        dst,
                        a.port,
                        &test,
                        xcfg.io_timeout,
                    )?);
                }
            }
            Ok(())
        };
        let s = perftest::rdma_cm_session(conn, &params, prepare, cm_connect, connect)
            .map_err(|e| e.to_string())?;
        rdma_cm = Some(CmLinks {
            cm,
            control: c,
            conns,
        });
        if !client && a.table() {
            // perftest 4.5's server says this once the QPs are connected.
            println!(" Waiting for client rdma_cm QP to connect");
            println!(" Please run the same command with the IB/RoCE interface IP");
            println!("{RESULT_LINE}");
        }
        s
    } else {
        match &a.servername {
            Some(s) => perftest::client((s.as_str(), a.port), &params, &xcfg, prepare, connect),
            None => {
                let l = exchange::listen(a.port)
                    .map_err(|e| format!("Couldn't listen to port {}: {e}", a.port))?;
                perftest::server(&l, &params, &xcfg, prepare, connect)
            }
        }
        .map_err(|e| e.to_string())?
    };
    let peer_is_ferroce = session.negotiated.remote_version.contains("ferroce");
    // A ferroce peer registers per_qp bytes per QP; a stock perftest peer
    // only max(size, 4096) at the address it sends (reaching past it draws a
    // remote access error).
    let remote_len = if peer_is_ferroce {
        per_qp
    } else {
        u64::from(max_size).max(4096)
    };
    let remotes: Vec<RemoteBuf> = session
        .remote_dests
        .iter()
        .enumerate()
        .map(|(i, d)| -> Result<RemoteBuf, String> {
            let ud = if ud {
                // perftest's address handle: the peer's GID and QPN, its
                // Q_Key; with -R what SIDR or the client's announcement said.
                let (gid, qpn, qkey, tclass) = match ud_peers.get(i).and_then(Option::as_ref) {
                    Some(r) => (r.peer.peer_gid, r.peer.qpn, r.peer.qkey, r.traffic_class),
                    None => (std::net::Ipv6Addr::from(d.gid), d.qpn, opts.qkey, None),
                };
                // With -R, rdma_cm's route picks the source address (of the peer's family).
                let sgid_index = if ud_peers.get(i).is_some_and(Option::is_some) {
                    source_gid_index(&ctx, opts.sgid_index, gid)
                } else {
                    opts.sgid_index
                };
                let mut path = ConnectOptions { sgid_index, ..opts }
                    .path_to(&ctx, gid)
                    .map_err(|e| format!("Couldn't create AH: {e}"))?;
                if let Some(tc) = tclass {
                    path.traffic_class = tc;
                }
                Some(UdDest {
                    path,
                    remote_qpn: qpn,
                    remote_qkey: qkey,
                })
            } else {
                None
            };
            Ok(RemoteBuf {
                addr: d.vaddr,
                rkey: d.rkey,
                len: remote_len,
                ud,
            })
        })
        .collect::<Result<_, _>>()?;
    if a.table() {
        for (m, r) in session.my_dests.iter().zip(&session.remote_dests) {
            for line in dest_lines("local", a.test(), m)
                .into_iter()
                .chain(dest_lines("remote", a.test(), r))
            {
                println!("{line}");
            }
        }
        println!("{RESULT_LINE}");
        if a.lat && a.duration.is_some() {
            // perftest 4.5's RESULT_FMT_LAT_DUR.
            println!(" #bytes        #iterations       t_avg[usec]    tps average");
        } else if a.lat {
            println!(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ");
        } else if a.report_gbits {
            println!(
                " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
            );
        } else {
            println!(
                " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
            );
        }
    }
    let setup = Setup {
        ends: &ends,
        mr: &mr,
        remotes: &remotes,
        per_qp,
        peer_is_ferroce,
        last_size: sizes.last().copied().unwrap_or(0),
    };
    if a.run_infinitely {
        if let (false, Some(links)) = (client, rdma_cm.as_mut()) {
            // -R: no socket to see the client go; its CM's DREQ (sent when it
            // is stopped) says it is gone.
            while !links.wait_peer_gone(&ends, Duration::from_secs(3600))? {}
            return Ok(true);
        }
        return run_infinitely(a, setup, &mut session, client);
    }
    let op = a.op();
    let mut all_ok = true;
    let mut limits = Limits::new(a);
    let mut last_report = BwReport::default();
    let d0 = session.my_dests[0];
    let send_test = a.test() == Test::Send;
    for (k, &size) in sizes.iter().enumerate() {
        let mut pre = preposted.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut p = PerfParams::new(op, size, a.iters());
        p.tx_depth = a.tx_depth;
        p.cq_mod = a.cq_mod;
        p.post_list = a.post_list;
        p.peak = !a.no_peak;
        // Busy polling spins on the CQ between polls, as perftest does.
        p.spin = engine_mode(a) == EngineMode::Polling;
        p.duration = a.duration.map(Duration::from_secs);
        p.margin = Duration::from_secs(a.margin.unwrap_or(a.duration.unwrap_or(0) / 4));
        if p.duration.is_some() {
            p.iters = u64::MAX;
        }
        if send_test && k > 0 {
            // perftest's SEND tools, each size after the first (the first
            // was posted while connecting): the receiving side posts its
            // receives, then a hand-shake lets the sender go.
            pre = Some(prepost_send(a, &ends, &mr, &p)?);
            session.conn.sync(&d0).map_err(|e| e.to_string())?;
        }
        let pre = pre.as_deref();
        // Who opens a ping-pong: the client of ib_send_lat, the server of
        // ib_write_lat. A stock peer answers only once it has calibrated its
        // clock, which a stock opener does first too: no sample waits on it.
        let opens = match a.test() {
            Test::Send => client,
            Test::Write => !client,
            Test::Read | Test::Atomic => false,
        };
        if a.lat && opens && !peer_is_ferroce {
            std::thread::sleep(PERFTEST_CALIBRATION);
        }
        let (result, peer) = if a.bidirectional {
            // perftest's duplex order per size: a barrier, both sides run,
            // (with -a, a barrier after the run from perftest 4.6 on), then
            // the reports cross and each side prints the sum. ib_send_bw's
            // barrier is its SEND one (receives posted first, above), and it
            // has no second one.
            if !send_test {
                session.conn.sync(&d0).map_err(|e| e.to_string())?;
            }
            let r = if send_test {
                run_duplex_send(a, setup, &p, pre)?
            } else {
                run_requesters(setup, &p)?.map(|res| (res, Check::Verified))
            };
            if !send_test && a.all && session.negotiated.remote_version_num >= 4.6 {
                session.conn.sync(&d0).map_err(|e| e.to_string())?;
            }
            let mine = r
                .as_ref()
                .map(|(res, _)| bw_report(a, res))
                .unwrap_or_default();
            let theirs = session.xchg_bw_report(&mine).map_err(|e| e.to_string())?;
            // Both sides have finished: check what this one moved.
            let r = match r {
                Some((res, _)) if !send_test => {
                    let check = client_check(a, setup, &p, &res)?;
                    Some((res, check))
                }
                r => r,
            };
            (r, Some(theirs))
        } else if client {
            let r = run_client(a, setup, &p)?;
            (r, None)
        } else {
            (run_server(a, setup, &p, pre)?, None)
        };
        if send_test && !a.lat && a.all {
            // ib_send_bw -a: a hand-shake after each size too.
            session.conn.sync(&d0).map_err(|e| e.to_string())?;
        }
        let Some((res, check)) = result else { continue };
        match check {
            Check::Verified => {}
            Check::Mismatch(at) => {
                eprintln!("data check FAILED for size {size}: first wrong byte at offset {at}");
            }
            Check::Skipped(why) => {
                if a.table() {
                    eprintln!("data check skipped for size {size}: {why}");
                }
            }
        }
        all_ok &= check.ok();
        let (bw, mpps) = print_result(a, &res, peer.as_ref(), &check, peer_is_ferroce);
        limits.see(bw, mpps);
        last_report = bw_report(a, &res);
    }
    if write_lat {
        // ib_write_lat just closes its socket after the run (no closing
        // hand-shake, no "done"; seen on the wire). A duration run ends on
        // each side's own clock, and the peer's last WRITE needs our QP.
        match (a.duration.is_some(), rdma_cm.as_mut()) {
            (false, _) => {}
            (true, None) => {
                session
                    .conn
                    .linger(WRITE_LAT_LINGER)
                    .map_err(|e| e.to_string())?;
            }
            // -R: no socket to close. perftest disconnects its QPs once its
            // last WRITE completed, so its DREQ says it is done; another
            // ferroce (which does not wait for its own last WRITE either)
            // takes one more key message each way.
            (true, Some(_)) if peer_is_ferroce => {
                session.conn.sync(&d0).map_err(|e| e.to_string())?;
            }
            (true, Some(links)) => {
                links.wait_peer_gone(&ends, WRITE_LAT_LINGER)?;
            }
        }
        drop(session);
    } else if a.lat || a.test() == Test::Send || a.bidirectional {
        session.finish().map_err(|e| e.to_string())?;
    } else {
        let theirs = session.finish_bw(&last_report).map_err(|e| e.to_string())?;
        if !client {
            // The client's report, in the unit both were asked for (perftest
            // prints it as it came).
            let bw = theirs.bw_avg;
            limits.see(bw, theirs.msg_rate_avg);
            match a.output {
                Some(OutputLevel::Bandwidth) => println!("{bw:.6}"),
                Some(OutputLevel::MessageRate) => println!("{:.6}", theirs.msg_rate_avg),
                _ if a.table() => println!(
                    "{}",
                    bw_row(
                        theirs.size,
                        theirs.iters,
                        theirs.bw_peak,
                        bw,
                        theirs.msg_rate_avg
                    )
                ),
                _ => {}
            }
        }
    }
    if a.table() {
        println!("{RESULT_LINE}");
    }
    if let Some(links) = rdma_cm {
        links.disconnect_all(&ends)?;
    }
    if let Err(e) = limits.verdict() {
        eprintln!("{e}");
        return Ok(false);
    }
    Ok(all_ok)
}

/// perftest 4.5's `rdma_conn_param`: `reads` READs/atomics each way, retry
/// and RNR retry counts 7.
fn perftest_cm_param(reads: u8) -> ConnParam {
    ConnParam {
        responder_resources: reads,
        initiator_depth: reads,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// `-R`: the CM agent, the control connection, and the test QPs'
/// connections in the order of the QPs (none for UD).
struct CmLinks<'a> {
    cm: CmAgent<'a>,
    control: CmConnection,
    conns: Vec<CmConnection>,
}

impl CmLinks<'_> {
    /// Waits up to `limit` for the peer's DREQ on the first test QP (on the
    /// control connection for UD, whose QPs have none): with no socket to
    /// close, perftest's way of saying it is done. True if it came.
    fn wait_peer_gone(&mut self, ends: &[End<'_>], limit: Duration) -> Result<bool, String> {
        match (self.conns.first(), ends.first()) {
            (Some(c), Some(e)) => self.cm.wait_disconnect(c, &e.qp, limit),
            _ => self.cm.wait_disconnect_id(&self.control, limit),
        }
        .map_err(|e| format!("rdma_cm: {e}"))
    }

    /// perftest 4.5: both sides rdma_disconnect every test QP (the DREQs
    /// may cross; the agent answers the peer's while waiting for its own),
    /// then the control connection goes as the kernel ends it when
    /// perftest exits (a DREQ each way, seen on the wire).
    fn disconnect_all(mut self, ends: &[End<'_>]) -> Result<(), String> {
        for (c, e) in self.conns.iter().zip(ends) {
            self.cm
                .disconnect(c, &e.qp)
                .map_err(|e| format!("rdma_disconnect: {e}"))?;
        }
        self.cm
            .disconnect_id(&self.control)
            .map_err(|e| format!("rdma_disconnect: {e}"))
    }
}

/// Where `-R -c UD` finds its peer: the server (a client) or the port
/// served (a server), and whether the client announces its QPN.
#[derive(Debug, Clone, Copy)]
struct UdTarget {
    dst: Option<std::net::SocketAddr>,
    port: u16,
    announce: bool,
    /// The test QPs' options (GID index, traffic class, hop limit).
    opts: ConnectOptions,
}

/// `-R -c UD`: the peer's UD QP, and the traffic class to answer with (a
/// server's, from the client's announcement; None: the test's own).
#[derive(Debug)]
struct UdRemote {
    peer: UdPeer,
    traffic_class: Option<u8>,
}

/// wr_id of the UD announcement's send and receive (no test WR uses it).
const ANNOUNCE_WR_ID: u64 = u64::MAX - 1;

/// `-R -c UD`, one test QP. A client resolves the server's port to a UD QP
/// by SIDR (again while the server refuses the port: it listens only after
/// a hand-shake) and, with `announce`, sends it a 4-byte SEND WITH
/// IMMEDIATE carrying its own QPN from `mr` at `at`. A server takes the
/// next SIDR request and answers it with its QP; with `announce` it first
/// posts one receive (GRH + 4 bytes at `at`) for the client's announcement
/// and then takes the peer's QPN from it. perftest 4.5's
/// `rdma_cm_establish_ud_connection` and `rdma_cm_request_ud_connection_parameters`
/// do the same. A unidirectional server learns nothing (None: it never sends).
fn cm_resolve_ud(
    cm: &mut CmAgent<'_>,
    ctx: &Context,
    end: &End<'_>,
    mr: &MemoryRegion<'_>,
    at: u64,
    to: &UdTarget,
    timeout: Duration,
) -> Result<Option<UdRemote>, String> {
    let UdTarget {
        dst,
        port,
        announce,
        opts,
    } = *to;
    let deadline = std::time::Instant::now() + timeout;
    let Some(dst) = dst else {
        let req = cm
            .get_ud_request(port, timeout)
            .map_err(|e| format!("rdma_get_request: {e}"))?;
        let sge = [mr.sge(at, perf::UD_GRH + 4)];
        if announce {
            end.qp
                .post_recv(&[RecvWr {
                    wr_id: ANNOUNCE_WR_ID,
                    sg_list: &sge,
                }])
                .map_err(|e| format!("Couldn't post receive: {e}"))?;
        }
        cm.accept_ud(&req, &end.qp, &[])
            .map_err(|e| format!("rdma_accept: {e}"))?;
        if !announce {
            return Ok(None);
        }
        let rcq = end.rcq.as_ref().unwrap_or(&end.cq);
        let wc = announce_completion(rcq, deadline)?;
        let qpn = wc
            .imm_data
            .ok_or("the client's announcement carried no immediate data")?;
        let qkey = end.qp.query().map_err(|e| e.to_string())?.qkey;
        // perftest's ibv_create_ah_from_wc: the answer goes with the
        // announcement's traffic class.
        let mut g = [0u8; GRH_LEN];
        mr.read(at, &mut g).map_err(|e| e.to_string())?;
        let from = GrhInfo::parse(&g);
        return Ok(Some(UdRemote {
            peer: UdPeer {
                peer_gid: from.src,
                qpn,
                qkey,
                private_data: Vec::new(),
            },
            traffic_class: Some(from.traffic_class),
        }));
    };
    let peer = loop {
        match cm.resolve_ud(dst, &[], opts.traffic_class) {
            Ok(p) => break p,
            Err(ferroce_verbs::Error::SidrRefused { status })
                if status == sidr_status::UNSUPPORTED && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("rdma_connect to {dst}: {e}")),
        }
    };
    if announce {
        // rdma_cm's route gives a source address of the peer's family.
        let opts = ConnectOptions {
            sgid_index: source_gid_index(ctx, opts.sgid_index, peer.peer_gid),
            ..opts
        };
        let path = opts
            .path_to(ctx, peer.peer_gid)
            .map_err(|e| format!("Couldn't create AH: {e}"))?;
        let sge = [mr.sge(at, 4)];
        let mut wr = SendWr::new(
            ANNOUNCE_WR_ID,
            SendOp::SendWithImm { imm: end.qp.qpn() },
            &sge,
        );
        wr.flags.signaled = true;
        wr.ud = Some(UdDest {
            path,
            remote_qpn: peer.qpn,
            remote_qkey: peer.qkey,
        });
        end.qp
            .post_send(&[wr])
            .map_err(|e| format!("Couldn't post send: {e}"))?;
        announce_completion(&end.cq, deadline)?;
    }
    Ok(Some(UdRemote {
        peer,
        traffic_class: None,
    }))
}

/// The announcement's completion on `cq`, successful, before `deadline`.
fn announce_completion(
    cq: &CompletionQueue,
    deadline: std::time::Instant,
) -> Result<WorkCompletion, String> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let wc = cq
        .poll_n(1, left.max(Duration::from_millis(1)))
        .map_err(|e| format!("rdma_cm UD announcement: {e}"))?
        .pop()
        .ok_or("rdma_cm UD announcement: no completion")?;
    if wc.wr_id != ANNOUNCE_WR_ID || wc.status != WcStatus::Success {
        return Err(format!(
            "rdma_cm UD announcement: completion {:?} with status {:?}",
            wc.opcode, wc.status
        ));
    }
    Ok(wc)
}

/// Connects `qp` through rdma_cm: `rdma_connect` to `dst` for a client
/// (again while the server refuses the port: perftest's server listens for
/// its test QPs only after a hand-shake), `rdma_get_request` and
/// `rdma_accept` on `port` for a server.
fn cm_establish(
    cm: &mut CmAgent<'_>,
    qp: &QueuePair<'_>,
    dst: Option<std::net::SocketAddr>,
    port: u16,
    param: &ConnParam,
    timeout: Duration,
) -> Result<CmConnection, String> {
    let Some(dst) = dst else {
        let req = cm
            .get_request(port, timeout)
            .map_err(|e| format!("rdma_get_request: {e}"))?;
        return cm
            .accept(&req, qp, param)
            .map_err(|e| format!("rdma_accept: {e}"));
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match cm.connect(qp, dst, param) {
            Ok(c) => return Ok(c),
            Err(ferroce_verbs::Error::Rejected { reason })
                if reason == REJ_INVALID_SERVICE_ID && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("rdma_connect to {dst}: {e}")),
        }
    }
}

/// `--run_infinitely`: the client measures period after period (-D
/// seconds, default 5) and prints each; only a signal stops it. The server
/// serves until the client's control connection closes.
fn run_infinitely(
    a: &Args,
    setup: Setup<'_, '_>,
    session: &mut perftest::PerftestSession<'_>,
    client: bool,
) -> Result<bool, String> {
    if !client {
        session.conn.wait_closed().map_err(|e| e.to_string())?;
        return Ok(true);
    }
    let size = setup.last_size;
    let mut p = PerfParams::new(a.op(), size, u64::MAX);
    p.tx_depth = a.tx_depth;
    p.post_list = a.post_list;
    p.spin = engine_mode(a) == EngineMode::Polling;
    p.duration = Some(Duration::from_secs(a.duration.unwrap_or(5)));
    loop {
        let Some(res) = run_requesters(setup, &p)? else {
            return Ok(true);
        };
        let check = client_check(a, setup, &p, &res)?;
        if let Check::Mismatch(at) = check {
            eprintln!("data check FAILED for size {size}: first wrong byte at offset {at}");
            return Ok(false);
        }
        print_result(a, &res, None, &check, setup.peer_is_ferroce);
    }
}

/// perftest's limit verifier (`-w`, `-y`): each passes once any reported
/// size reaches it. (perftest 4.5 checks `-y` only when `-w` is given too;
/// here each stands alone.)
struct Limits {
    bw: Option<f64>,
    msg_rate: Option<f64>,
    bw_reached: bool,
    msg_rate_reached: bool,
}

impl Limits {
    fn new(a: &Args) -> Limits {
        Limits {
            bw: a.limit_bw,
            msg_rate: a.limit_msgrate,
            bw_reached: false,
            msg_rate_reached: false,
        }
    }

    /// One reported size: bandwidth in the report's unit, message rate in Mpps.
    fn see(&mut self, bw: f64, mpps: f64) {
        self.bw_reached |= self.bw.is_some_and(|l| bw >= l);
        self.msg_rate_reached |= self.msg_rate.is_some_and(|l| mpps >= l);
    }

    /// perftest's messages when a limit was not reached.
    fn verdict(&self) -> Result<(), &'static str> {
        if self.bw.is_some() && !self.bw_reached {
            return Err("Error: BW result is below bw limit");
        }
        if self.msg_rate.is_some() && !self.msg_rate_reached {
            return Err("Error: Msg rate  is below msg_rate limit");
        }
        Ok(())
    }
}

/// Our side of perftest's report exchange, in the report's unit (MiB/s or
/// Gbit/s, as perftest sends it).
fn bw_report(a: &Args, res: &PerfResult) -> BwReport {
    BwReport {
        size: u64::from(res.size),
        iters: res.iters,
        bw_peak: res.perftest_peak(a.report_gbits),
        bw_avg: res.perftest_bw(a.report_gbits),
        msg_rate_avg: res.mpps(),
        ..BwReport::default()
    }
}

/// A passive server (WRITE/READ/atomic) never polls its CQ, so only an
/// engine thread can answer for it; busy polling applies to the side that
/// loops on its CQ.
/// How long the end of an `ib_write_lat -D` run waits for the peer's end
/// (perftest's comes within one round trip of its clock running out).
const WRITE_LAT_LINGER: Duration = Duration::from_secs(10);

fn engine_mode(a: &Args) -> EngineMode {
    let actively_polls = a.servername.is_some() || a.test() == Test::Send || a.bidirectional;
    if a.busy_poll && actively_polls {
        EngineMode::Polling
    } else {
        EngineMode::Thread
    }
}

fn open(a: &Args) -> Result<Context, String> {
    common::open_device(
        a.ib_dev.as_deref(),
        a.backend,
        engine_mode(a),
        a.pcap.as_deref(),
    )
}

enum Check {
    Verified,
    Mismatch(u64),
    Skipped(&'static str),
}

impl Check {
    /// Nothing wrong was found (a skipped check passes).
    fn ok(&self) -> bool {
        !matches!(self, Check::Mismatch(_))
    }

    /// The `data_check` of a JSON line.
    fn describe(&self) -> String {
        match self {
            Check::Verified => "verified".to_string(),
            Check::Mismatch(at) => format!("wrong byte at offset {at}"),
            Check::Skipped(why) => format!("skipped: {why}"),
        }
    }
}

/// One side of a latency test on QP 0: both sides of a SEND or WRITE
/// ping-pong measure; READ and atomics are measured by the client alone
/// (the server's side serves them unseen).
fn ping_pong(
    setup: Setup<'_, '_>,
    p: &PerfParams,
    client: bool,
) -> Result<Option<(PerfResult, Check)>, String> {
    let Setup {
        ends,
        mr,
        remotes,
        per_qp,
        ..
    } = setup;
    let (e0, r0) = (&ends[0], &remotes[0]);
    let res = match p.op {
        // Its receives were posted before the hand-shake (prepost_send).
        PerfOp::Send => perf::send_lat_from(&e0.qp, &e0.cq, mr, p, client, r0.ud),
        PerfOp::Write => perf::write_lat(&e0.qp, &e0.cq, mr, r0, p, !client, per_qp / 2),
        _ if client => perf::op_lat(&e0.qp, &e0.cq, mr, r0, p),
        _ => return Ok(None),
    }
    .map_err(|e| e.to_string())?;
    Ok(Some((
        res,
        Check::Skipped("latency tests move no checkable data"),
    )))
}

/// The client measures; returns the result and the data check.
fn run_client(
    a: &Args,
    setup: Setup<'_, '_>,
    p: &PerfParams,
) -> Result<Option<(PerfResult, Check)>, String> {
    if a.lat {
        return ping_pong(setup, p, true);
    }
    let Some(res) = run_requesters(setup, p)? else {
        return Ok(None);
    };
    let check = client_check(a, setup, p, &res)?;
    Ok(Some((res, check)))
}

/// Every QP's requester at once (bandwidth); their results as one.
fn run_requesters(setup: Setup<'_, '_>, p: &PerfParams) -> Result<Option<PerfResult>, String> {
    let Setup {
        ends, mr, remotes, ..
    } = setup;
    // Each QP runs the test on its own slice of the buffer, concurrently.
    let results: Vec<Result<PerfResult, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .iter()
            .zip(remotes)
            .map(|(e, r)| {
                s.spawn(move || {
                    perf::bw_requester(&e.qp, &e.cq, mr, r, p).map_err(|x| x.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(combine(results))
}

/// The client's data check after a bandwidth run (see [`verify_client`]).
/// A bidirectional WRITE run checks only once the peer has finished too
/// (after the reports crossed): its WRITEs land in the buffer the read-back
/// uses.
fn client_check(
    a: &Args,
    setup: Setup<'_, '_>,
    p: &PerfParams,
    res: &PerfResult,
) -> Result<Check, String> {
    let Setup {
        ends,
        mr,
        remotes,
        per_qp,
        peer_is_ferroce,
        ..
    } = setup;
    // A stock ib_write_bw registers no remote READ: reading back would draw a NAK and put the QP
    // in error, ending an `-a` run after its first size.
    let check = if p.op == PerfOp::Write && a.connection == Connection::UC {
        Check::Skipped("UC has no RDMA READ to read the peer's buffer back")
    } else if p.op == PerfOp::Write && !peer_is_ferroce {
        Check::Skipped("the peer does not allow reading its buffer back")
    } else {
        verify_client(ends, mr, remotes, per_qp, p, res)?
    };
    Ok(check)
}

/// The QPs' results of one run as one: their iterations, the longest time,
/// their peaks added (the QPs ran side by side).
fn combine(results: Vec<PerfResult>) -> Option<PerfResult> {
    results.into_iter().reduce(|mut t, r| {
        t.iters += r.iters;
        t.elapsed = t.elapsed.max(r.elapsed);
        t.peak_bytes_per_sec = t
            .peak_bytes_per_sec
            .zip(r.peak_bytes_per_sec)
            .map(|(x, y)| x + y);
        t
    })
}

/// A SEND run's first receives, posted before the hand-shake that lets the
/// peer start: two per ping-pong side, a bandwidth run's on the receiving
/// side (both sides with `-b`). Per QP, how many.
fn prepost_send(
    a: &Args,
    ends: &[End<'_>],
    mr: &MemoryRegion<'_>,
    p: &PerfParams,
) -> Result<Vec<u64>, String> {
    let receives = a.servername.is_none() || a.bidirectional;
    ends.iter()
        .map(|e| {
            if a.lat {
                perf::send_lat_prepost(&e.qp, mr, p).map(|()| 2)
            } else if receives {
                perf::bw_prepost(&e.qp, mr, p, a.rx_depth)
            } else {
                Ok(0)
            }
            .map_err(|e| e.to_string())
        })
        .collect()
}

/// Bidirectional SEND bandwidth: per QP, one thread sends (polling the send
/// CQ) while another receives (polling the receive CQ, its first receives
/// already posted); the result is what this side sent, the check what it
/// received.
fn run_duplex_send(
    a: &Args,
    setup: Setup<'_, '_>,
    p: &PerfParams,
    preposted: Option<&[u64]>,
) -> Result<Option<(PerfResult, Check)>, String> {
    let Setup {
        ends, mr, remotes, ..
    } = setup;
    // Every QP's sender and receiver at once.
    let results: Vec<Result<(PerfResult, perf::Received), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .iter()
            .zip(remotes)
            .enumerate()
            .map(|(i, (e, r))| {
                let recv = s.spawn(move || receive_sends(e, mr, p, preposted, i, a.rx_depth));
                let send = s.spawn(move || {
                    perf::bw_requester(&e.qp, &e.cq, mr, r, p).map_err(|x| x.to_string())
                });
                (send, recv)
            })
            .collect();
        handles
            .into_iter()
            .map(|(send, recv)| {
                let panicked = || "worker panicked".to_string();
                let sent = send.join().map_err(|_| panicked())??;
                let got = recv.join().map_err(|_| panicked())??;
                Ok((sent, got))
            })
            .collect()
    });
    let (sent, got): (Vec<PerfResult>, Vec<perf::Received>) = results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    let got: u64 = got.iter().map(|r| r.messages).sum();
    let Some(res) = combine(sent) else {
        return Ok(None);
    };
    let check = received_check(a, setup, p, got)?;
    Ok(Some((res, check)))
}

/// The SEND messages QP `i` of `e` receives in one run (on its receive
/// CQ), its first receives posted by [`prepost_send`], or here without.
fn receive_sends(
    e: &End<'_>,
    mr: &MemoryRegion<'_>,
    p: &PerfParams,
    preposted: Option<&[u64]>,
    i: usize,
    rx_depth: u32,
) -> Result<perf::Received, String> {
    let cq = e.rcq.as_ref().unwrap_or(&e.cq);
    match preposted.and_then(|v| v.get(i)) {
        Some(&n) => perf::bw_receiver_from(&e.qp, cq, mr, p, n),
        None => perf::bw_receiver(&e.qp, cq, mr, p, rx_depth),
    }
    .map_err(|x| x.to_string())
}

/// After a SEND bandwidth run in which every QP received `got` messages in
/// all: a note if some were lost (UC; see `perf::bw_receiver_from`), an
/// error if an `-a` run cannot go on, and the check of what landed.
fn received_check(
    a: &Args,
    setup: Setup<'_, '_>,
    p: &PerfParams,
    got: u64,
) -> Result<Check, String> {
    let want = p.iters.saturating_mul(setup.ends.len() as u64);
    let kind = match a.connection {
        Connection::UD => "UD",
        _ => "UC",
    };
    // A duration run has no count to fall short of.
    if got < want && p.duration.is_none() {
        eprintln!(
            "received {got} of {want} messages: {kind} does not resend lost ones \
             (perftest's server ends the same way)"
        );
        if a.all && p.size < setup.last_size {
            // The lost messages' receives stay posted, sized for this message:
            // a larger one would meet them and fail with a length error.
            return Err(format!(
                "stopping -a after {} B: receives left posted for lost {kind} messages \
                 cannot take larger ones (run the sizes one by one with -s)",
                p.size
            ));
        }
    }
    // The received messages hold the sender's pattern (ferroce peers fill
    // it). A UD receive holds the GRH first: its message is the sender's
    // bytes from the same offset on (perf::bw_requester).
    let ok = if a.connection == Connection::UD {
        let at = u64::from(perf::UD_GRH);
        let mut got = vec![0u8; p.size.min(setup.per_qp.saturating_sub(at) as u32) as usize];
        setup.mr.read(at, &mut got).map_err(|x| x.to_string())?;
        (at..)
            .zip(&got)
            .all(|(i, b)| *b == perf::pattern_byte(PATTERN_SEED, i))
    } else {
        let span = u64::from(p.size).min(setup.per_qp);
        perf::check_pattern(setup.mr, 0, span, PATTERN_SEED)
            .map_err(|x| x.to_string())?
            .is_none()
    };
    Ok(if ok {
        Check::Verified
    } else {
        Check::Skipped("the sender's data is not ferroce's pattern")
    })
}

/// WRITE: read back what we wrote and compare. READ: what arrived must be
/// the peer's pattern (a ferroce peer fills it). Atomic and SEND: checked
/// on the other side or by the counter.
fn verify_client(
    ends: &[End<'_>],
    mr: &MemoryRegion<'_>,
    remotes: &[RemoteBuf],
    per_qp: u64,
    p: &PerfParams,
    res: &PerfResult,
) -> Result<Check, String> {
    let span = (u64::from(res.size) * res.iters.min(1 << 20))
        .min(per_qp / 2)
        .min(remotes[0].len);
    match p.op {
        PerfOp::Write => {
            // READ the written span of QP 0's remote buffer into the upper half of our slice.
            let e = &ends[0];
            let rp = PerfParams::new(PerfOp::Read, span.min(1 << 30) as u32, 1);
            let scratch = per_qp / 2;
            let sge = [mr.sge(scratch, span as u32)];
            let mut wr = ferroce_verbs::SendWr::new(
                u64::MAX,
                ferroce_verbs::SendOp::RdmaRead {
                    remote_addr: remotes[0].addr,
                    rkey: remotes[0].rkey,
                },
                &sge,
            );
            wr.flags.signaled = true;
            e.qp.post_send(&[wr]).map_err(|x| x.to_string())?;
            let wc = e.cq.poll_n(1, rp.timeout).map_err(|x| x.to_string())?;
            if wc.first().map(|w| w.status) != Some(ferroce_verbs::WcStatus::Success) {
                return Ok(Check::Skipped(
                    "the peer does not allow reading its buffer back",
                ));
            }
            let mut sent = vec![0u8; span as usize];
            let mut back = vec![0u8; span as usize];
            mr.read(0, &mut sent).map_err(|x| x.to_string())?;
            mr.read(scratch, &mut back).map_err(|x| x.to_string())?;
            Ok(match sent.iter().zip(&back).position(|(x, y)| x != y) {
                None => Check::Verified,
                Some(i) => Check::Mismatch(i as u64),
            })
        }
        PerfOp::Read => {
            match perf::check_pattern(mr, 0, span, PATTERN_SEED).map_err(|x| x.to_string())? {
                None => Ok(Check::Verified),
                Some(_) => Ok(Check::Skipped(
                    "the peer's buffer does not hold ferroce's pattern",
                )),
            }
        }
        _ => Ok(Check::Skipped("checked by the receiving side")),
    }
}

/// The server: passive for WRITE/READ/atomic; receives for SEND.
fn run_server(
    a: &Args,
    setup: Setup<'_, '_>,
    p: &PerfParams,
    preposted: Option<&[u64]>,
) -> Result<Option<(PerfResult, Check)>, String> {
    let Setup { ends, mr, .. } = setup;
    match (p.op, a.lat) {
        (_, true) => ping_pong(setup, p, false),
        (PerfOp::Send, false) => {
            let t = std::time::Instant::now();
            let mut got = 0;
            // A duration run's figure is its window (the longest of the QPs').
            let mut window: Option<Duration> = None;
            std::thread::scope(|s| -> Result<(), String> {
                let hs: Vec<_> = ends
                    .iter()
                    .enumerate()
                    .map(|(i, e)| {
                        s.spawn(move || receive_sends(e, mr, p, preposted, i, a.rx_depth))
                    })
                    .collect();
                for h in hs {
                    let r = h.join().unwrap_or_else(|_| Err("worker panicked".into()))?;
                    got += r.messages;
                    window = window.max(r.window);
                }
                Ok(())
            })?;
            let check = received_check(a, setup, p, got)?;
            let res = PerfResult {
                op: p.op,
                size: p.size,
                iters: got,
                elapsed: window.unwrap_or_else(|| t.elapsed()),
                lat_us: Vec::new(),
                peak_bytes_per_sec: None,
            };
            Ok(Some((res, check)))
        }
        _ => Ok(None),
    }
}

/// perftest 4.5's test banner (`ctx_print_test_info`, as its tools print it
/// on rxe), then ferroce's backend.
fn print_header(a: &Args, ctx: &Context, mtu: u32, client: bool, out_reads: u8) {
    let gid_index = common::perftest_gid_index(ctx, a.gid_index, a.ipv6);
    let shape = Banner {
        mtu,
        client,
        out_reads,
        gid_index,
    };
    for line in header_lines(a, ctx.name(), &shape) {
        println!("{line}");
    }
    println!(" Backend         : {}", ctx.backend());
    println!("{RESULT_LINE}");
}

/// perftest's separator line.
const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// What the banner shows beside the arguments.
struct Banner {
    mtu: u32,
    client: bool,
    out_reads: u8,
    gid_index: usize,
}

fn header_lines(a: &Args, device: &str, b: &Banner) -> Vec<String> {
    let Banner {
        mtu,
        client,
        out_reads,
        gid_index,
    } = *b;
    let mut v = vec![
        RESULT_LINE.to_string(),
        format!("                    {}", a.title()),
        format!(" Dual-port       : OFF\t\tDevice         : {device}"),
        format!(" Number of qps   : {}\t\tTransport type : IB", a.qps),
        format!(
            " Connection type : {:?}\t\tUsing SRQ      : OFF",
            a.connection
        ),
        // No PCIe below ferroce, and no ibv_wr_* API to choose.
        " PCIe relax order: OFF".to_string(),
        " ibv_wr* API     : OFF".to_string(),
    ];
    let read_like = matches!(a.test(), Test::Read | Test::Atomic);
    let iters = a.iters();
    if client || a.bidirectional {
        // perftest cuts the depth to the iterations; a latency test keeps one out.
        let depth = if a.lat {
            1
        } else if a.duration.is_some() {
            u64::from(a.tx_depth)
        } else {
            u64::from(a.tx_depth).min(iters)
        };
        v.push(format!(" TX depth        : {depth}"));
    }
    if a.test() == Test::Send && (!client || a.bidirectional) {
        let depth = if a.lat {
            2
        } else {
            u64::from(a.rx_depth).min(iters)
        };
        v.push(format!(" RX depth        : {depth}"));
    }
    if !a.lat {
        // What perf::bw_requester uses: every completion in a -D run.
        let cq_mod = if a.duration.is_some() {
            1
        } else {
            u64::from(a.cq_mod.clamp(1, a.tx_depth.max(1))).min(iters.max(1))
        };
        v.push(format!(" CQ Moderation   : {cq_mod}"));
    }
    v.push(format!(" Mtu             : {mtu}[B]"));
    v.push(" Link type       : Ethernet".to_string());
    v.push(format!(" GID index       : {gid_index}"));
    if read_like {
        v.push(format!(" Outstand reads  : {out_reads}"));
    } else {
        v.push(format!(
            " Max inline data : {}[B]",
            a.inline_size.unwrap_or(0)
        ));
    }
    if a.rdma_cm {
        v.push(" rdma_cm QPs\t : ON".to_string());
        v.push(" Data ex. method : rdma_cm".to_string());
    } else {
        v.push(" rdma_cm QPs\t : OFF".to_string());
        v.push(" Data ex. method : Ethernet".to_string());
    }
    v
}

/// One side's address as perftest prints it (`BASIC_ADDR_FMT`, then
/// `READ_FMT` for READ, `RDMA_FMT` for READ and WRITE; the GID bytes in
/// decimal, `PERF_GID_FMT`).
fn dest_lines(side: &str, test: Test, d: &PerftestDest) -> [String; 2] {
    let mut l = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_alt_hex(u64::from(d.lid), 4),
        c_alt_hex(u64::from(d.qpn), 6),
        c_alt_hex(u64::from(d.psn), 6)
    );
    if test == Test::Read {
        l.push_str(&format!(" OUT {}", c_alt_hex(u64::from(d.out_reads), 4)));
    }
    if matches!(test, Test::Read | Test::Write) {
        l.push_str(&format!(
            " RKey {} VAddr {}",
            c_alt_hex(u64::from(d.rkey), 8),
            c_alt_hex(d.vaddr, 16)
        ));
    }
    let gid: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    [l, format!(" GID: {}", gid.join(":"))]
}

/// C's `%#0Nx`: `0x` and zero padding to N characters in all, except that
/// zero gets no `0x` (it prints as N zeros).
fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{v:#0width$x}")
    }
}

/// perftest's `ctx_set_out_reads`: what `-o` asked for, cut to the device's
/// limit (with its two lines on stderr), or the limit when not given or not positive.
fn out_reads(asked: Option<i64>, max: u8) -> (u8, bool) {
    match asked {
        Some(n) if n > i64::from(max) => (max, true),
        Some(n) if n > 0 => (n as u8, false),
        _ => (max, false),
    }
}

/// One result line; with `peer` (a bidirectional run), bandwidth and
/// message rate are the sum of both directions, as perftest prints them.
/// Returns them: bandwidth in the report's unit, message rate in Mpps.
fn print_result(
    a: &Args,
    r: &PerfResult,
    peer: Option<&BwReport>,
    check: &Check,
    peer_is_ferroce: bool,
) -> (f64, f64) {
    if a.lat && a.duration.is_some() {
        print_duration_lat(a, r, check, peer_is_ferroce);
        return (0.0, 0.0);
    }
    let g = a.report_gbits;
    let (peer_bw, peer_peak, peer_mpps) =
        peer.map_or((0.0, 0.0, 0.0), |p| (p.bw_avg, p.bw_peak, p.msg_rate_avg));
    // The peer's report is in perftest's unit; JSON gives 10^6 bytes per second.
    let peer_mb = perf::bytes_per_sec_of(peer_bw, g) / 1e6;
    let mb = r.mb_per_sec() + peer_mb;
    let mpps = r.mpps() + peer_mpps;
    let gbits = mb * 8.0 / 1000.0;
    // perftest's columns: MB/sec there is MiB/s.
    let bw = r.perftest_bw(g) + peer_bw;
    let peak = r.perftest_peak(g) + peer_peak;
    if a.json {
        let mut v = result_json(a, r, check, peer_is_ferroce);
        if let Some((min, typ, avg, p99, max)) = r.lat_summary() {
            if a.histogram || a.unsorted {
                v["samples_us"] = samples(a, r).into();
            }
            v["t_min_us"] = min.into();
            v["t_typical_us"] = typ.into();
            v["t_avg_us"] = avg.into();
            v["t_p99_us"] = p99.into();
            v["t_max_us"] = max.into();
        } else {
            v["bw_mb_s"] = mb.into();
            v["bw_gbit_s"] = gbits.into();
            // perftest's figures: MiB/s (its "MB/sec") or Gbit/s with --report_gbits.
            v["bw_avg_perftest"] = bw.into();
            v["bw_peak_perftest"] = peak.into();
            v["msg_rate_mpps"] = mpps.into();
            if peer.is_some() {
                v["bidirectional"] = true.into();
                v["local_bw_mb_s"] = r.mb_per_sec().into();
                v["remote_bw_mb_s"] = peer_mb.into();
            }
        }
        println!("{v}");
        return (bw, mpps);
    }
    if a.unsorted && !r.lat_us.is_empty() {
        print_samples(&r.lat_us);
    }
    if (a.histogram || a.unsorted) && !r.lat_us.is_empty() {
        print_samples(&samples(a, r));
    }
    match (a.output, r.lat_summary()) {
        (Some(OutputLevel::Latency), Some((_, typ, ..))) => println!("{typ:.6}"),
        (Some(OutputLevel::Bandwidth), None) => println!("{bw:.6}"),
        (Some(OutputLevel::MessageRate), None) => println!("{mpps:.6}"),
        _ => print_row(r, peak, bw, mpps),
    }
    (bw, mpps)
}

/// The fields every `--json` result line has.
fn result_json(
    a: &Args,
    r: &PerfResult,
    check: &Check,
    peer_is_ferroce: bool,
) -> serde_json::Value {
    serde_json::json!({
        "test": a.title(),
        "bytes": r.size,
        "iterations": r.iters,
        "seconds": r.elapsed.as_secs_f64(),
        "data_verified": check.ok(),
        "data_check": check.describe(),
        "peer_is_ferroce": peer_is_ferroce,
    })
}

/// A `-D` latency run's line: the window's average and rate, as perftest's
/// print_report_lat_duration (its REPORT_FMT_LAT_DUR), or the JSON object.
fn print_duration_lat(a: &Args, r: &PerfResult, check: &Check, peer_is_ferroce: bool) {
    let (t_avg, tps) = r.duration_lat();
    if a.json {
        let mut v = result_json(a, r, check, peer_is_ferroce);
        v["t_avg_us"] = t_avg.into();
        v["tps_average"] = tps.into();
        println!("{v}");
    } else if a.output == Some(OutputLevel::Latency) {
        println!("{t_avg:.6}");
    } else {
        println!(
            " {:<7}       {}            {t_avg:<7.2}        {tps:<7.2}",
            r.size, r.iters
        );
    }
}

/// The latency samples `-H`/`-U` report: sorted, or with `-U` (and
/// `--json`) in the order measured.
fn samples(a: &Args, r: &PerfResult) -> Vec<f64> {
    let mut v = r.lat_us.clone();
    if !(a.unsorted && a.json) {
        v.sort_by(|x, y| x.total_cmp(y));
    }
    v
}

/// perftest's sample list: a `#, usec` line, then `i, sample` from 1.
fn print_samples(v: &[f64]) {
    println!("#, usec");
    for (i, x) in v.iter().enumerate() {
        println!("{}, {}", i + 1, c_g(*x));
    }
}

/// C's `%g`, as perftest prints samples: six significant digits, trailing
/// zeros dropped, an exponent below 1e-4 and from 1e6 on.
fn c_g(x: f64) -> String {
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    // The exponent after rounding to six digits (999999.7 prints as 1e+06).
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trim(format!("{x:.decimals$}"))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa.to_string()), exp.abs())
    }
}

/// A perftest table row: latency figures, or bandwidth and message rate.
fn print_row(r: &PerfResult, peak: f64, bw: f64, mpps: f64) {
    if let Some((min, typ, avg, p99, max)) = r.lat_summary() {
        let n = r.lat_us.len() as f64;
        let var = r.lat_us.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
        let mut v = r.lat_us.clone();
        v.sort_by(|x, y| x.total_cmp(y));
        let p999 = v[((n * 0.999) as usize).min(v.len() - 1)];
        // perftest 4.5's REPORT_FMT_LAT (tabs and all).
        println!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            r.size,
            r.iters,
            min,
            max,
            typ,
            avg,
            var.sqrt(),
            p99,
            p999
        );
    } else {
        println!("{}", bw_row(r.size, r.iters, peak, bw, mpps));
    }
}

/// A bandwidth result row in perftest 4.5's REPORT_FMT (tabs and all).
fn bw_row(
    size: impl std::fmt::Display,
    iters: impl std::fmt::Display,
    peak: f64,
    avg: f64,
    mpps: f64,
) -> String {
    format!(" {size:<7}    {iters:<10}       {peak:<7.2}            {avg:<7.2}\t\t   {mpps:<7.6}")
}

/// `--soak`: print what the soak did; exit 1 on any lost or wrong data, a
/// failed work request, a stuck QP, or resident memory that kept growing.
fn soak(d: Duration, netns_backend: Option<Backend>, json: bool) -> i32 {
    use ferroce_verbs::soak::{self, SoakConfig, KINDS};
    // More than this growth after warm-up counts as a leak.
    const RSS_BOUND_KIB: u64 = 8 * 1024;
    let cfg = SoakConfig {
        netns_backend,
        ..SoakConfig::new(d)
    };
    let r = match soak::run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ferroce bench --soak: {e}");
            return 1;
        }
    };
    let flat = r.rss_end_kib <= r.rss_start_kib + RSS_BOUND_KIB;
    let ops: serde_json::Map<String, serde_json::Value> = KINDS
        .iter()
        .zip(r.ops)
        .map(|(k, n)| (k.to_string(), n.into()))
        .collect();
    let v = serde_json::json!({
        "seconds": r.elapsed.as_secs_f64(), "ops": r.total_ops(), "per_kind": ops,
        "bytes": r.bytes, "rss_start_kib": r.rss_start_kib, "rss_end_kib": r.rss_end_kib,
        "rss_samples_kib": r.rss_samples_kib, "rss_flat": flat, "retries": r.counter(0, "completer_retry_err"),
        "duplicates_seen": r.counter(1, "duplicate_request"),
    });
    if json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    i32::from(!flat)
}

#[cfg(test)]
mod tests {
    use super::{c_alt_hex, c_g, out_reads, path_mtu};

    #[test]
    fn addresses_print_as_c_alternate_hex() {
        // What perftest 4.5 printed on rxe: `LID 0000 QPN 0x0011 ... OUT 0x04 RKey 0x00027b`.
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0x11, 6), "0x0011");
        assert_eq!(c_alt_hex(0xe980cb, 6), "0xe980cb");
        assert_eq!(c_alt_hex(4, 4), "0x04");
        assert_eq!(c_alt_hex(0x27b, 8), "0x00027b");
        assert_eq!(c_alt_hex(0x7fb8c2eab000, 16), "0x007fb8c2eab000");
    }

    #[test]
    fn outstanding_reads_follow_perftest() {
        assert_eq!(out_reads(None, 16), (16, false));
        assert_eq!(out_reads(Some(4), 16), (4, false));
        assert_eq!(out_reads(Some(0), 16), (16, false));
        assert_eq!(out_reads(Some(-3), 16), (16, false));
        assert_eq!(out_reads(Some(999), 16), (16, true));
    }

    #[test]
    fn samples_print_as_c_percent_g() {
        for (x, want) in [
            (5.18, "5.18"),
            (123.456789, "123.457"),
            (0.0001234, "0.0001234"),
            (0.00001234, "1.234e-05"),
            (999999.7, "1e+06"),
            (1234567.0, "1.23457e+06"),
            (7.0, "7"),
            (0.0, "0"),
        ] {
            assert_eq!(c_g(x), want, "{x}");
        }
    }

    #[test]
    fn path_mtu_follows_perftest() {
        assert_eq!(path_mtu(None, 4096), (4096, vec![]));
        assert_eq!(path_mtu(Some(1024), 4096), (1024, vec![]));
        let (m, lines) = path_mtu(Some(4096), 1024);
        assert_eq!(m, 1024);
        assert_eq!(
            lines,
            vec![
                (
                    false,
                    "Requested mtu is higher than active mtu ".to_string()
                ),
                (false, "Changing to active mtu - 3".to_string()),
            ]
        );
        let (m, lines) = path_mtu(Some(1000), 4096);
        assert_eq!(m, 4096);
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|(stderr, _)| *stderr));
        assert_eq!(lines[0].1, " Invalid MTU - 1000 ");
        assert_eq!(lines[2].1, " Will run with the port active mtu - 5");
    }
}
