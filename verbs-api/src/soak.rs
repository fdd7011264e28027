//! A bounded soak (issue 8): random work requests of every kind — SEND,
//! SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, both atomics, sizes from 0
//! bytes to many MTUs — between two devices whose links lose, duplicate,
//! reorder and corrupt frames (`ferroce_nic::FaultIo`; this kernel has no
//! sch_netem). Every byte is checked, every SEND must arrive, no QP may
//! stall, and resident memory is sampled after warm-up and at the end.
//! Run by `ferroce bench --soak DURATION` and by the verbs tests.

use std::collections::VecDeque;
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use ferroce_nic::{FaultConfig, FaultIo};

use crate::error::{Error, Result};
use crate::{
    AccessFlags, Backend, ConnectOptions, Context, DeviceConfig, MemoryRegion, OpenOptions,
    QpState, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

/// Kinds of work request, in report order.
pub const KINDS: [&str; 7] = [
    "SEND",
    "SEND_WITH_IMM",
    "RDMA_WRITE",
    "RDMA_WRITE_WITH_IMM",
    "RDMA_READ",
    "FETCH_ADD",
    "CMP_SWAP",
];

#[derive(Debug, Clone, Copy)]
pub struct SoakConfig {
    pub duration: Duration,
    /// RSS is first sampled after this long.
    pub warmup: Duration,
    pub seed: u64,
    /// Faults on the frames each side receives.
    pub faults: FaultConfig,
    /// Largest message (bytes); sizes are spread from 0 to this.
    pub max_size: u32,
    /// Work requests kept outstanding.
    pub depth: usize,
    pub path_mtu: u32,
    /// Give up when nothing completes for this long (a stuck QP).
    pub stall: Duration,
    /// `None`: two in-process devices on the in-memory switch. `Some(b)`:
    /// two network-namespace hosts on a veth pair, each opened with backend
    /// `b` (needs root), so the kernel's path and the packet engine are in
    /// the loop too. The faults are injected in both cases (no sch_netem here).
    pub netns_backend: Option<Backend>,
}

impl SoakConfig {
    pub fn new(duration: Duration) -> SoakConfig {
        SoakConfig {
            duration,
            warmup: (duration / 6).min(Duration::from_secs(10)),
            seed: 0x50a4,
            // Per frame, each direction.
            faults: FaultConfig {
                seed: 0x50a4,
                loss: 0.02,
                dup: 0.02,
                reorder: 0.05,
                corrupt: 0.005,
                ..FaultConfig::default()
            },
            max_size: 16 * 1024,
            depth: 16,
            path_mtu: 1024,
            stall: Duration::from_secs(30),
            netns_backend: None,
        }
    }
}

/// What a soak did.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub elapsed: Duration,
    /// Completed and checked, per kind (see [`KINDS`]).
    pub ops: [u64; 7],
    pub bytes: u64,
    /// Receives completed and checked (SEND, SEND_WITH_IMM, WRITE_WITH_IMM).
    pub recvs: u64,
    /// VmRSS in KiB after warm-up and at the end.
    pub rss_start_kib: u64,
    pub rss_end_kib: u64,
    /// VmRSS in KiB every tenth of the run after warm-up (to tell a leak,
    /// which climbs steadily, from buffers reaching their high-water mark).
    pub rss_samples_kib: Vec<u64>,
    /// Both devices' counters at the end (a, b).
    pub counters: [Vec<(&'static str, u64)>; 2],
}

impl SoakReport {
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().sum()
    }
    pub fn counter(&self, side: usize, name: &str) -> u64 {
        self.counters[side]
            .iter()
            .find(|(k, _)| *k == name)
            .map_or(0, |(_, v)| *v)
    }
}

/// VmRSS of this process in KiB (0 if /proc is not there).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// `90`, `90s`, `10m`, `1h`.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let (num, mul) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| Duration::from_secs(n * mul))
        .map_err(|_| format!("not a duration: {s} (say 90, 90s, 10m or 1h)"))
}

/// SplitMix64 (the seeded choices and the data patterns).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

#[derive(Debug, Clone, Copy)]
struct Op {
    kind: usize,
    len: u32,
    seed: u64,
    /// Atomics: the value the word held before, and after.
    before: u64,
    after: u64,
}

/// What B's next receive completion must be.
#[derive(Debug, Clone, Copy)]
struct Expect {
    kind: usize,
    len: u32,
    seed: u64,
    imm: Option<u32>,
}

fn err(msg: String) -> Error {
    Error::Soak(msg)
}

/// The soak's two ends, and the namespaces they live in when there are any
/// (dropped after the contexts: the topology goes last).
struct Pair {
    a: Context,
    b: Context,
    _topo: Option<ferroce_nic::netns::Topology>,
}

fn open_pair(cfg: &SoakConfig) -> Result<Pair> {
    let Some(backend) = cfg.netns_backend else {
        let (a, b) = open_mem_pair(cfg)?;
        return Ok(Pair { a, b, _topo: None });
    };
    if !ferroce_nic::is_root() {
        return Err(err("a soak across network namespaces needs root".into()));
    }
    let topo = ferroce_nic::netns::Topology::up(&ferroce_nic::netns::TopologyConfig::default())?;
    let mut ends = Vec::with_capacity(2);
    for i in 0..2 {
        let host = topo.host(i);
        let mut dc = DeviceConfig::new(&host.ifname, backend);
        dc.netns = Some(host.ns.clone());
        dc.seed = cfg.seed ^ i as u64;
        dc.faults = Some(FaultConfig {
            seed: cfg.faults.seed ^ (0xb * i as u64),
            ..cfg.faults
        });
        ends.push(topo.run_in(i, move || Context::open(&dc, OpenOptions::default()))??);
    }
    let b = ends.pop().ok_or_else(|| err("no second host".into()))?;
    let a = ends.pop().ok_or_else(|| err("no first host".into()))?;
    Ok(Pair {
        a,
        b,
        _topo: Some(topo),
    })
}

fn open_mem_pair(cfg: &SoakConfig) -> Result<(Context, Context)> {
    // A short switch queue (the default holds 8192 frames a port): what a
    // burst leaves behind in it shows as resident memory, and the soak
    // measures ferroce's, not the test switch's high-water mark.
    let (pa, pb) = ferroce_nic::mem::pair_with(ferroce_nic::SwitchConfig {
        queue_frames: 1024,
        ..ferroce_nic::SwitchConfig::default()
    })?;
    let fa = FaultConfig {
        seed: cfg.faults.seed,
        ..cfg.faults
    };
    let fb = FaultConfig {
        seed: cfg.faults.seed ^ 0xb,
        ..cfg.faults
    };
    let ga: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0xc612, 0x0001);
    let gb: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0xc612, 0x0002);
    let a = Context::with_io(
        Box::new(FaultIo::new(pa, fa)?),
        "soak_a",
        vec![ga],
        cfg.seed,
        OpenOptions::default(),
    )?;
    let fio = FaultIo::new(pb, fb)?;
    // FERROCE_SOAK_PCAP=<file>: record what B's engine receives and sends.
    let bio: Box<dyn ferroce_nic::PacketIo> = match std::env::var_os("FERROCE_SOAK_PCAP") {
        Some(path) => {
            let f = std::fs::File::create(&path).map_err(|e| Error::Io("creating the pcap", e))?;
            Box::new(ferroce_nic::PcapIo::new(
                fio,
                std::io::BufWriter::new(f),
                ferroce_nic::middleware::pcap::PcapMode::Both,
            )?)
        }
        None => Box::new(fio),
    };
    let b = Context::with_io(
        bio,
        "soak_b",
        vec![gb],
        cfg.seed ^ 1,
        OpenOptions::default(),
    )?;
    Ok((a, b))
}

fn connect(
    me: &QueuePair<'_>,
    ctx: &Context,
    peer: &QueuePair<'_>,
    pctx: &Context,
    psns: (u32, u32),
    opts: &ConnectOptions,
) -> Result<()> {
    // The IPv4-mapped GIDs (on a real interface index 0 is the link-local
    // IPv6 one, which needs neighbour discovery the soak does not want).
    let v4 = |c: &Context| c.gids().iter().position(|g| g.to_ipv4_mapped().is_some());
    let (Some(mine), Some(theirs)) = (v4(ctx), v4(pctx)) else {
        return Err(err("no IPv4 GID on a soak device".into()));
    };
    let o = ConnectOptions {
        local_psn: psns.0,
        sgid_index: mine,
        ..*opts
    };
    me.to_init(&o)?;
    me.connect(
        ctx,
        &RemoteQp {
            qpn: peer.qpn(),
            psn: psns.1,
            gid: pctx.query_gid(theirs)?,
        },
        &o,
    )
}

/// Run a soak between two in-memory devices with faulty links.
pub fn run(cfg: &SoakConfig) -> Result<SoakReport> {
    let pair = open_pair(cfg)?;
    let (ca, cb) = (&pair.a, &pair.b);
    run_on(cfg, ca, cb).map_err(|e| match e {
        // Say what both engines counted.
        Error::Soak(m) => {
            let nz = |c: &Context| -> Vec<(&'static str, u64)> {
                c.hw_counters()
                    .into_iter()
                    .filter(|(_, v)| *v > 0)
                    .collect()
            };
            err(format!("{m}\n  a: {:?}\n  b: {:?}", nz(ca), nz(cb)))
        }
        e => e,
    })
}

fn run_on(cfg: &SoakConfig, ca: &Context, cb: &Context) -> Result<SoakReport> {
    let (pda, pdb) = (ca.alloc_pd(), cb.alloc_pd());
    let d = cfg.depth;
    let slot = u64::from(cfg.max_size).div_ceil(64) * 64 + 64;
    let area = slot * d as u64;
    let access = ConnectOptions::default().access;
    // A: sources [0, area), READ/atomic results [area, 2 area).
    // B: WRITE/READ targets [0, area), receives [area, 2 area), atomic words after.
    let ma = pda.reg_mr((2 * area) as usize, access)?;
    let mb = pdb.reg_mr((2 * area + 8 * d as u64) as usize, access)?;
    let atom = 2 * area;
    let cqa = ca.create_cq(4 * d as u32)?;
    let cqb = cb.create_cq(4 * d as u32)?;
    let qa = pda
        .create_qp()
        .max_send_wr(2 * d as u32)
        .max_recv_wr(2 * d as u32)
        .build(&cqa, &cqa)?;
    let qb = pdb
        .create_qp()
        .max_send_wr(2 * d as u32)
        .max_recv_wr(2 * d as u32)
        .build(&cqb, &cqb)?;
    let opts = ConnectOptions {
        path_mtu: cfg.path_mtu,
        access: AccessFlags::ALL,
        // 4.096 µs × 2^12 ≈ 17 ms: many in-memory round trips, short stalls on loss.
        timeout: 12,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: ferroce_stack::transport::qp::MAX_RD_ATOMIC,
        max_dest_rd_atomic: ferroce_stack::transport::qp::MAX_RD_ATOMIC,
        ..ConnectOptions::default()
    };
    connect(&qa, ca, &qb, cb, (0xff_fff0, 77), &opts)?;
    connect(&qb, cb, &qa, ca, (77, 0xff_fff0), &opts)?;

    let post_recv = |r: u64| -> Result<()> {
        let sge = [mb.sge(area + r * slot, slot as u32)];
        qb.post_recv(&[RecvWr {
            wr_id: r,
            sg_list: &sge,
        }])
    };
    for r in 0..d as u64 {
        post_recv(r)?;
    }
    let mut words = vec![0u64; d];
    for (i, w) in words.iter_mut().enumerate() {
        *w = i as u64 * 1000;
        mb.write(atom + 8 * i as u64, &w.to_ne_bytes())?;
    }

    let mut rng = Rng(cfg.seed);
    let mut slots: Vec<Option<Op>> = vec![None; d];
    let mut expect: VecDeque<Expect> = VecDeque::new();
    let mut rep = SoakReport::default();
    let start = Instant::now();
    let end = start + cfg.duration;
    let mut warm = false;
    let mut next_sample = end;
    let mut last_progress = Instant::now();
    let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(4 * d);
    let mut scratch = vec![0u8; slot as usize];
    loop {
        let now = Instant::now();
        if !warm && now >= start + cfg.warmup {
            warm = true;
            rep.rss_start_kib = rss_kib();
            next_sample = now;
        }
        if warm && now >= next_sample && now < end {
            rep.rss_samples_kib.push(rss_kib());
            next_sample = now + cfg.duration / 10;
        }
        let running = now < end;
        let busy = slots.iter().any(Option::is_some) || !expect.is_empty();
        if !running && !busy {
            break;
        }
        if running {
            for (i, s) in slots.iter_mut().enumerate() {
                if s.is_some() {
                    continue;
                }
                let op = new_op(&mut rng, cfg, words[i]);
                post_op(&qa, &ma, &mb, i, slot, area, atom, &op)?;
                if let Some(imm) = imm_of(&op) {
                    expect.push_back(Expect {
                        kind: op.kind,
                        len: op.len,
                        seed: op.seed,
                        imm,
                    });
                }
                *s = Some(op);
            }
        }
        wcs.clear();
        cqa.poll(4 * d, &mut wcs)?;
        let mut progressed = !wcs.is_empty();
        for wc in &wcs {
            let i = wc.wr_id as usize;
            let op = slots
                .get_mut(i)
                .and_then(Option::take)
                .ok_or_else(|| err(format!("completion for no work request: {wc:?}")))?;
            if wc.status != WcStatus::Success {
                return Err(err(format!(
                    "{} of {} bytes: {wc:?}",
                    KINDS[op.kind], op.len
                )));
            }
            check_send_side(&ma, &mb, i, slot, area, atom, &op, &mut scratch)?;
            if op.kind >= 5 {
                words[i] = op.after;
            }
            rep.ops[op.kind] += 1;
            rep.bytes += u64::from(op.len);
        }
        wcs.clear();
        cqb.poll(4 * d, &mut wcs)?;
        progressed |= !wcs.is_empty();
        for wc in &wcs {
            let e = expect.pop_front().ok_or_else(|| {
                err(format!(
                    "a receive completed that no SEND asked for: {wc:?}"
                ))
            })?;
            if let Err(x) = check_recv(&mb, wc, &e, area, slot, &mut scratch) {
                return Err(err(format!(
                    "{x} (receive {} of this run; next expected: {:?}; ops so far {:?})",
                    rep.recvs,
                    expect.iter().take(4).collect::<Vec<_>>(),
                    rep.ops
                )));
            }
            rep.recvs += 1;
            post_recv(wc.wr_id)?;
        }
        if progressed {
            last_progress = Instant::now();
        } else {
            if last_progress.elapsed() > cfg.stall {
                return Err(err(format!(
                    "stalled for {:?}: QP states {:?}/{:?}, {} WRs and {} receives outstanding",
                    cfg.stall,
                    qa.state(),
                    qb.state(),
                    slots.iter().flatten().count(),
                    expect.len(),
                )));
            }
            match cqa.wait(Duration::from_millis(2)) {
                Ok(()) | Err(Error::Timeout(..)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    rep.elapsed = start.elapsed();
    if !warm {
        rep.rss_start_kib = rss_kib();
    }
    rep.rss_end_kib = rss_kib();
    for (q, name) in [(&qa, "a"), (&qb, "b")] {
        let s = q.state()?;
        if s != QpState::Rts {
            return Err(err(format!("QP {name} ended in {s:?}")));
        }
    }
    rep.counters = [ca.hw_counters(), cb.hw_counters()];
    Ok(rep)
}

fn new_op(rng: &mut Rng, cfg: &SoakConfig, word: u64) -> Op {
    let kind = rng.below(7) as usize;
    let max = u64::from(cfg.max_size);
    // A third small, a third around the MTU, a third up to max_size.
    let len = match rng.below(3) {
        0 => rng.below(65),
        1 => rng.below(2 * u64::from(cfg.path_mtu) + 1),
        _ => rng.below(max + 1),
    }
    .min(max) as u32;
    let (len, before, after) = match kind {
        5 => (8, word, word.wrapping_add(rng.below(1 << 20) + 1)),
        // Three times in four the compare matches and the swap happens.
        6 => {
            let swap = rng.next();
            (8, word, if rng.below(4) > 0 { swap } else { word })
        }
        _ => (len, 0, 0),
    };
    Op {
        kind,
        len,
        seed: rng.next(),
        before,
        after,
    }
}

/// For ops that consume a receive at B: the immediate it carries.
fn imm_of(op: &Op) -> Option<Option<u32>> {
    match op.kind {
        0 => Some(None),
        1 | 3 => Some(Some(op.seed as u32)),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn post_op(
    qa: &QueuePair<'_>,
    ma: &MemoryRegion<'_>,
    mb: &MemoryRegion<'_>,
    i: usize,
    slot: u64,
    area: u64,
    atom: u64,
    op: &Op,
) -> Result<()> {
    let off = i as u64 * slot;
    let data = pattern(op.seed, op.len as usize);
    let remote = mb.addr() + off;
    let rkey = mb.rkey();
    let word = mb.addr() + atom + 8 * i as u64;
    let send_op = match op.kind {
        0 => SendOp::Send,
        1 => SendOp::SendWithImm {
            imm: op.seed as u32,
        },
        2 => SendOp::RdmaWrite {
            remote_addr: remote,
            rkey,
        },
        3 => SendOp::RdmaWriteWithImm {
            remote_addr: remote,
            rkey,
            imm: op.seed as u32,
        },
        4 => SendOp::RdmaRead {
            remote_addr: remote,
            rkey,
        },
        5 => SendOp::AtomicFetchAdd {
            remote_addr: word,
            rkey,
            add: op.after.wrapping_sub(op.before),
        },
        _ => SendOp::AtomicCmpSwp {
            remote_addr: word,
            rkey,
            // A mismatch (after == before) uses a compare that cannot match.
            compare: if op.after == op.before {
                !op.before
            } else {
                op.before
            },
            swap: op.after,
        },
    };
    let sge = match op.kind {
        // The peer's memory is what a READ fetches: B writes it locally first.
        4 => {
            mb.write(off, &data)?;
            ma.write(area + off, &vec![0xa5; op.len as usize])?;
            [ma.sge(area + off, op.len)]
        }
        5 | 6 => {
            ma.write(area + off, &[0xa5; 8])?;
            [ma.sge(area + off, 8)]
        }
        _ => {
            ma.write(off, &data)?;
            [ma.sge(off, op.len)]
        }
    };
    let mut wr = SendWr::new(i as u64, send_op, &sge);
    wr.flags.signaled = true;
    qa.post_send(&[wr])
}

#[allow(clippy::too_many_arguments)]
fn check_send_side(
    ma: &MemoryRegion<'_>,
    mb: &MemoryRegion<'_>,
    i: usize,
    slot: u64,
    area: u64,
    atom: u64,
    op: &Op,
    scratch: &mut [u8],
) -> Result<()> {
    let off = i as u64 * slot;
    let n = op.len as usize;
    let bad = |what: &str| {
        err(format!(
            "{} of {n} bytes (slot {i}): {what}",
            KINDS[op.kind]
        ))
    };
    match op.kind {
        2 | 3 => {
            mb.read(off, &mut scratch[..n])?;
            if scratch[..n] != pattern(op.seed, n)[..] {
                return Err(bad("the peer's memory differs from what was written"));
            }
        }
        4 => {
            ma.read(area + off, &mut scratch[..n])?;
            if scratch[..n] != pattern(op.seed, n)[..] {
                return Err(bad("the data read differs from the peer's memory"));
            }
        }
        5 | 6 => {
            let mut b = [0u8; 8];
            ma.read(area + off, &mut b)?;
            if u64::from_ne_bytes(b) != op.before {
                return Err(bad(&format!(
                    "returned {:#x}, the word held {:#x}",
                    u64::from_ne_bytes(b),
                    op.before
                )));
            }
            mb.read(atom + 8 * i as u64, &mut b)?;
            if u64::from_ne_bytes(b) != op.after {
                return Err(bad(&format!(
                    "the word is {:#x}, expected {:#x} (executed twice or not at all?)",
                    u64::from_ne_bytes(b),
                    op.after
                )));
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_recv(
    mb: &MemoryRegion<'_>,
    wc: &WorkCompletion,
    e: &Expect,
    area: u64,
    slot: u64,
    scratch: &mut [u8],
) -> Result<()> {
    let bad = |what: &str| {
        err(format!(
            "receive for {} of {} bytes: {what}: {wc:?}",
            KINDS[e.kind], e.len
        ))
    };
    if wc.status != WcStatus::Success {
        return Err(bad("failed"));
    }
    let want_op = if e.kind == 3 {
        WcOpcode::RecvRdmaWithImm
    } else {
        WcOpcode::Recv
    };
    if wc.opcode != want_op || wc.imm_data != e.imm || wc.byte_len != e.len {
        return Err(bad(
            "wrong opcode, immediate or length (lost or reordered message?)",
        ));
    }
    if e.kind != 3 {
        let n = e.len as usize;
        mb.read(area + wc.wr_id * slot, &mut scratch[..n])?;
        if scratch[..n] != pattern(e.seed, n)[..] {
            return Err(bad("data differs"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("m").is_err());
    }
}
