//! `ferroce-coll-bench <op>`: nccl-tests' shape over ferroce. Ranks run as
//! threads, each with its own device (in-memory switch, UDP loopback or a
//! namespace host), and meet at a TCP rendezvous on loopback.

use std::time::Instant;

use clap::Parser;
use ferroce_collectives::world::{parse_mode, run_env, run_with, DeviceOptions, Fabric};
use ferroce_collectives::{
    communicator::parse_allreduce, with_dtype, Algorithms, Communicator, DType, Element, Error,
    RdmaConfig, ReduceOp, Result,
};

#[derive(Parser, Debug)]
#[command(
    name = "ferroce-coll-bench",
    about = "collective bandwidth in nccl-tests' format"
)]
struct Args {
    /// allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall, sendrecv
    op: String,
    /// Ranks.
    #[arg(short = 'n', long, default_value_t = 4)]
    ranks: usize,
    /// Smallest size (bytes; K/M/G suffixes).
    #[arg(short = 'b', long, default_value = "8")]
    minbytes: String,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "1M")]
    maxbytes: String,
    /// Size multiplication factor.
    #[arg(short = 'f', long, default_value_t = 2)]
    factor: usize,
    /// Data type (float, double, half, bfloat16, int8, uint8, int32, int64, uint64).
    #[arg(short = 'd', long, default_value = "float")]
    dtype: String,
    /// Reduction (sum, prod, min, max, avg).
    #[arg(short = 'o', long, default_value = "sum")]
    redop: String,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long, default_value_t = 2)]
    warmup: usize,
    /// Timed iterations per size.
    #[arg(short = 'i', long, default_value_t = 10)]
    iters: usize,
    /// mem (no root), udp (loopback, no root), netns (root), local (no
    /// network): ranks as threads of this process. env: this process is one
    /// rank of a job launched by mpirun/torchrun/srun (rank, size and
    /// MASTER_ADDR from the environment; device on FERROCE_IFACE or the
    /// first interface up with IPv4); only rank 0 prints. rdma-core: as env,
    /// over rdma-core's libibverbs (built with the `rdma-core` feature; device
    /// FERROCE_IBV_DEVICE or the first, GID FERROCE_IBV_GID or the RoCE v2
    /// IPv4-mapped one); env and rdma-core ranks can form one job.
    #[arg(long, default_value = "mem")]
    fabric: String,
    /// Allreduce algorithm: auto, ring, rd.
    #[arg(long, default_value = "auto")]
    algo: String,
    /// Packet backend on netns: udp, afxdp, afpacket, auto (default: FERROCE_BACKEND or udp).
    #[arg(long)]
    backend: Option<String>,
    /// Engine: poll (the rank's thread drives its device) or thread (default: FERROCE_ENGINE or poll).
    #[arg(long)]
    engine: Option<String>,
    /// Bytes per RDMA WRITE chunk of the transport (default: FERROCE_COLL_CHUNK or 64K).
    #[arg(long)]
    chunk: Option<String>,
    /// Receive slots (credit window) per peer (default: FERROCE_COLL_SLOTS or 8).
    #[arg(long)]
    slots: Option<usize>,
    /// Seconds without progress after which a collective fails (a dead rank; default 30).
    #[arg(long)]
    timeout: Option<f64>,
    /// Root of broadcast/reduce.
    #[arg(short = 'r', long, default_value_t = 0)]
    root: usize,
}

fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|v| v * mul)
        .map_err(|_| Error::Invalid(format!("size {s:?}")))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Allreduce,
    Broadcast,
    Reduce,
    Allgather,
    ReduceScatter,
    Alltoall,
    SendRecv,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "allreduce" | "all_reduce" => Op::Allreduce,
            "broadcast" | "bcast" => Op::Broadcast,
            "reduce" => Op::Reduce,
            "allgather" | "all_gather" => Op::Allgather,
            "reduce_scatter" | "reducescatter" => Op::ReduceScatter,
            "alltoall" => Op::Alltoall,
            "sendrecv" => Op::SendRecv,
            _ => return None,
        })
    }
    /// nccl-tests' busbw factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Allgather | Op::ReduceScatter | Op::Alltoall => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce | Op::SendRecv => 1.0,
        }
    }
    fn reduces(self) -> bool {
        matches!(self, Op::Allreduce | Op::Reduce | Op::ReduceScatter)
    }
}

fn val<T: Element>(rank: usize, i: usize) -> T {
    T::from_i64([1, 2, -1, -2][(rank * 7 + i * 3 + i / 5) % 4])
}

fn reference<T: Element>(n: usize, range: std::ops::Range<usize>, op: ReduceOp) -> Vec<T> {
    let mut acc: Vec<T> = range.clone().map(|i| val(0, i)).collect();
    for r in 1..n {
        for (a, i) in acc.iter_mut().zip(range.clone()) {
            *a = T::combine(op, *a, val(r, i));
        }
    }
    ferroce_collectives::dtype::finish(op, &mut acc, n);
    acc
}

struct Case {
    op: Op,
    redop: ReduceOp,
    root: usize,
}

/// The buffers of one size, filled before the timed loop (as nccl-tests
/// does) so the timing covers the collective only.
struct Bufs<T> {
    /// This rank's input: `val(rank, i)` (the root's, for broadcast).
    input: Vec<T>,
    out: Vec<T>,
}

impl<T: Element> Bufs<T> {
    fn new(c: &Communicator<'_>, case: &Case, count: usize) -> Bufs<T> {
        let (n, r) = (c.size(), c.rank());
        let pc = count / n;
        let (inp, out) = match case.op {
            Op::Allreduce | Op::Reduce | Op::Broadcast | Op::SendRecv => (count, count),
            Op::Allgather => (pc, pc * n),
            Op::ReduceScatter => (pc * n, pc),
            Op::Alltoall => (pc * n, pc * n),
        };
        let who = if case.op == Op::Broadcast {
            case.root
        } else {
            r
        };
        Bufs {
            input: (0..inp).map(|i| val(who, i)).collect(),
            out: vec![T::from_i64(0); out],
        }
    }
}

/// One run of the op, out of place (`input` → `out`).
fn once<T: Element>(c: &Communicator<'_>, case: &Case, b: &mut Bufs<T>) -> Result<()> {
    let (n, r) = (c.size(), c.rank());
    match case.op {
        Op::Allreduce => c.allreduce(&b.input, &mut b.out, case.redop),
        Op::Reduce => c.reduce(&b.input, &mut b.out, case.redop, case.root),
        Op::Broadcast => {
            if r == case.root {
                b.out.copy_from_slice(&b.input);
            }
            c.broadcast(&mut b.out, case.root)
        }
        Op::Allgather => c.allgather(&b.input, &mut b.out),
        Op::ReduceScatter => c.reduce_scatter(&b.input, &mut b.out, case.redop),
        Op::Alltoall => c.alltoall(&b.input, &mut b.out),
        Op::SendRecv => {
            if n == 1 {
                b.out.copy_from_slice(&b.input);
                return Ok(());
            }
            let (right, left) = ((r + 1) % n, (r + n - 1) % n);
            let sends = [(right, bytemuck::cast_slice::<T, u8>(&b.input))];
            let mut recvs = [(left, bytemuck::cast_slice_mut::<T, u8>(&mut b.out))];
            c.exchange_raw(&sends, &mut recvs)
        }
    }
}

/// Wrong elements in `b.out` after a run of the op.
fn wrong<T: Element>(c: &Communicator<'_>, case: &Case, b: &Bufs<T>) -> usize {
    let (n, r) = (c.size(), c.rank());
    let count_wrong = |want: Vec<T>| {
        b.out
            .iter()
            .zip(&want)
            .filter(|(a, b)| bytemuck::bytes_of(*a) != bytemuck::bytes_of(*b))
            .count()
    };
    let pc = b.out.len() / if case.op == Op::Allgather { n } else { 1 };
    match case.op {
        Op::Allreduce => count_wrong(reference::<T>(n, 0..b.out.len(), case.redop)),
        Op::Reduce if r == case.root => count_wrong(reference::<T>(n, 0..b.out.len(), case.redop)),
        Op::Reduce => 0,
        Op::Broadcast => count_wrong((0..b.out.len()).map(|i| val(case.root, i)).collect()),
        Op::Allgather => count_wrong(
            (0..n)
                .flat_map(|j| (0..pc).map(move |i| val(j, i)))
                .collect(),
        ),
        Op::ReduceScatter => count_wrong(reference::<T>(n, r * pc..(r + 1) * pc, case.redop)),
        Op::Alltoall => {
            let pc = b.out.len() / n;
            count_wrong(
                (0..n)
                    .flat_map(|j| (r * pc..(r + 1) * pc).map(move |i| val(j, i)))
                    .collect(),
            )
        }
        Op::SendRecv => {
            let left = (r + n - 1) % n;
            count_wrong((0..b.out.len()).map(|i| val(left, i)).collect())
        }
    }
}

fn bench<T: Element>(c: &Communicator<'_>, case: &Case, sizes: &[usize], a: &Args) -> Result<()> {
    let n = c.size();
    let es = std::mem::size_of::<T>();
    for &size in sizes {
        let count = size / es;
        if c.rank() == 0 {
            eprint!("\r# running {size} B ...");
        }
        let mut b = Bufs::<T>::new(c, case, count);
        for _ in 0..a.warmup {
            once::<T>(c, case, &mut b)?;
        }
        c.barrier()?;
        let t0 = Instant::now();
        for _ in 0..a.iters {
            once::<T>(c, case, &mut b)?;
        }
        let mut us = [t0.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64];
        c.allreduce_in_place(&mut us, ReduceOp::Max)?;
        b.out.fill(T::from_i64(0));
        once::<T>(c, case, &mut b)?;
        let mut wrong = [wrong::<T>(c, case, &b) as u64];
        c.allreduce_in_place(&mut wrong, ReduceOp::Sum)?;
        if c.rank() == 0 {
            let algbw = (count * es) as f64 / us[0] / 1e3;
            let busbw = algbw * case.op.bus_factor(n);
            let redop = if case.op.reduces() {
                case.redop.name()
            } else {
                "none"
            };
            eprint!("\r");
            println!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>9.1}  {:>7.3}  {:>7.3}  {:>6}",
                count * es,
                count,
                T::DTYPE.name(),
                redop,
                us[0],
                algbw,
                busbw,
                wrong[0]
            );
        }
    }
    Ok(())
}

fn header(
    a: &Args,
    ranks: usize,
    dev: DeviceOptions,
    cfg: &RdmaConfig,
    dt: DType,
    redop: ReduceOp,
) {
    println!(
        "# ferroce-coll-bench {}: {ranks} ranks on {}, dtype {}, redop {}, algo {}, {} warm-up + {} iterations",
        a.op, a.fabric, dt.name(), redop.name(), a.algo, a.warmup, a.iters
    );
    println!(
        "# backend {}, engine {:?}, chunk {} B, slots {}, spin {:?}, ACK coalescing {}{}",
        match (a.fabric.as_str(), dev.small_backend) {
            ("rdma-core", _) => "rdma-core libibverbs".to_string(),
            ("env", Some(small)) => format!(
                "{} (messages up to {} B on a second device, {})",
                dev.backend.name(),
                dev.small_max,
                small.name()
            ),
            _ => dev.backend.name().to_string(),
        },
        dev.mode,
        cfg.chunk,
        cfg.slots,
        cfg.spin,
        match dev.fit(cfg) {
            DeviceOptions {
                ack_delay: Some(d),
                ack_coalesce: k,
                ..
            } => format!("{k} per ACK or {d:?}"),
            _ => "off".into(),
        },
        if ferroce_collectives::bind::binding_from_env().unwrap_or(false) {
            ", each rank bound to a CPU (FERROCE_COLL_BIND=core)"
        } else {
            ""
        }
    );
    println!("#");
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}",
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"
    );
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}",
        "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
}

fn main() {
    let a = Args::parse();
    if let Err(e) = real_main(&a) {
        eprintln!("ferroce-coll-bench: {e}");
        std::process::exit(1);
    }
}

fn real_main(a: &Args) -> Result<()> {
    let op = Op::parse(&a.op).ok_or_else(|| Error::Invalid(format!("unknown op {:?}", a.op)))?;
    let dt = DType::parse(&a.dtype)
        .ok_or_else(|| Error::Invalid(format!("unknown dtype {:?}", a.dtype)))?;
    let redop = ReduceOp::parse(&a.redop)
        .ok_or_else(|| Error::Invalid(format!("unknown op {:?}", a.redop)))?;
    let fabric = match a.fabric.as_str() {
        "env" | "rdma-core" => Fabric::Local,
        f => Fabric::parse(f).ok_or_else(|| Error::Invalid(format!("unknown fabric {f:?}")))?,
    };
    let algo = parse_allreduce(&a.algo)?;
    let (lo, hi) = (parse_size(&a.minbytes)?, parse_size(&a.maxbytes)?);
    let mut sizes = Vec::new();
    let mut s = lo.max(1);
    while s <= hi {
        sizes.push(s);
        s = s.saturating_mul(a.factor.max(2));
    }
    let case = Case {
        op,
        redop,
        root: a.root % a.ranks.max(1),
    };
    let mut dev = DeviceOptions::from_env()?;
    if let Some(b) = &a.backend {
        dev.backend = b.parse().map_err(Error::Invalid)?;
    }
    if let Some(m) = &a.engine {
        dev.mode = parse_mode(m)?;
    }
    let mut rcfg = RdmaConfig::from_env()?;
    if let Some(c) = &a.chunk {
        rcfg.chunk = parse_size(c)?;
    }
    if let Some(n) = a.slots {
        rcfg.slots = n;
    }
    if let Some(t) = a.timeout {
        rcfg.timeout = std::time::Duration::try_from_secs_f64(t)
            .map_err(|_| Error::Invalid(format!("--timeout {t}")))?;
    }
    let body = |c: &Communicator<'_>| -> Result<()> {
        if c.rank() == 0 {
            header(a, c.size(), dev, &rcfg, dt, redop);
        }
        let mut c = c.split(0, 0)?;
        c.set_algorithms(Algorithms {
            allreduce: algo,
            ..Algorithms::from_env()?
        });
        with_dtype!(dt, T => bench::<T>(&c, &case, &sizes, a))
    };
    if a.fabric == "env" {
        return run_env(rcfg, dev, body);
    }
    if a.fabric == "rdma-core" {
        #[cfg(feature = "rdma-core")]
        return ferroce_collectives::world::run_env_ibverbs(rcfg, body);
        #[cfg(not(feature = "rdma-core"))]
        return Err(Error::Invalid(
            "--fabric rdma-core: this ferroce-coll-bench was built without the `rdma-core` \
             feature (cargo build -p ferroce-collectives --features rdma-core)"
                .into(),
        ));
    }
    let res = run_with(fabric, a.ranks, rcfg, dev, body)?;
    for (r, x) in res.into_iter().enumerate() {
        x.map_err(|e| Error::Invalid(format!("rank {r}: {e}")))?;
    }
    Ok(())
}
