//! The measuring loops behind `ferroce bench` and `ferroce demo`, in the
//! shape of perftest: bandwidth (a window of outstanding work requests kept
//! full) and latency (one operation at a time), with the data checked at the
//! end of every run.

use std::time::{Duration, Instant};

use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::mr::MemoryRegion;
use crate::qp::QueuePair;
use crate::{QpType, RecvWr, SendOp, SendWr, UdDest, WcStatus, WorkCompletion};

/// Bytes in front of each message a UD receive takes: the GRH's 40 (IBTA
/// 11.4.1.1; for RoCE v2 the IP header is written there), as ibverbs
/// UD receives have them.
pub const UD_GRH: u32 = 40;

/// The bytes a receive of `qp` needs in front of its message.
fn grh_of(qp: &QueuePair<'_>) -> u32 {
    if qp.qp_type() == QpType::Ud {
        UD_GRH
    } else {
        0
    }
}

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PerfOp {
    Write,
    Read,
    Send,
    /// ib_atomic_bw's default: fetch-and-add.
    FetchAdd,
    CompareSwap,
}

impl PerfOp {
    pub fn name(self) -> &'static str {
        match self {
            PerfOp::Write => "WRITE",
            PerfOp::Read => "READ",
            PerfOp::Send => "SEND",
            PerfOp::FetchAdd => "FETCH_ADD",
            PerfOp::CompareSwap => "CMP_SWAP",
        }
    }
    fn is_atomic(self) -> bool {
        matches!(self, PerfOp::FetchAdd | PerfOp::CompareSwap)
    }
}

/// Where the peer's buffer is (what the out-of-band exchange told us).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
    /// A UD QP's SENDs go here (address, QPN, Q_Key).
    pub ud: Option<UdDest>,
}

/// Run parameters (perftest's -s, -n, -t, -D).
#[derive(Debug, Clone, Copy)]
pub struct PerfParams {
    pub op: PerfOp,
    pub size: u32,
    pub iters: u64,
    /// Outstanding work requests in bandwidth runs (perftest -t, default 128).
    pub tx_depth: u32,
    /// Bandwidth runs: only every `cq_mod`-th request (and the last) asks
    /// for a completion (perftest -Q, CQ moderation; at most `tx_depth`).
    /// A `duration` run signals every one: its last is not known ahead.
    pub cq_mod: u32,
    /// Bandwidth runs: work requests per `post_send` call, at most (perftest -l).
    pub post_list: u32,
    /// Run for this long instead of `iters` (perftest -D); only what
    /// completes between `margin` after the start and `margin` before the
    /// end counts (see [`DurationClock`]).
    pub duration: Option<Duration>,
    /// perftest's -f: the warm-up and wind-down left out of a `duration`
    /// run's figure (perftest's default is a quarter of the duration).
    pub margin: Duration,
    /// Give up when no completion arrives for this long.
    pub timeout: Duration,
    /// Poll the CQ in a loop instead of waiting on it between polls, as
    /// perftest does without `-e`. With a polling-mode device every poll is
    /// an engine step, so the thread never sleeps: a single-CPU VM then takes
    /// an arriving frame without a halt and wake-up of its virtual CPU.
    pub spin: bool,
    /// Bandwidth runs: time every request to find the peak (perftest's BW
    /// peak; it does so up to [`PEAK_MAX_ITERS`] iterations, never for a
    /// duration run, and not with `-N`).
    pub peak: bool,
}

/// perftest measures the peak up to this many iterations ("default with
/// peak up to iters=20000"): the search is quadratic in them.
pub const PEAK_MAX_ITERS: u64 = 20_000;

impl PerfParams {
    pub fn new(op: PerfOp, size: u32, iters: u64) -> PerfParams {
        PerfParams {
            op,
            size,
            iters,
            tx_depth: 128,
            cq_mod: 1,
            post_list: 32,
            duration: None,
            margin: Duration::ZERO,
            timeout: Duration::from_secs(10),
            spin: false,
            peak: true,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfResult {
    pub op: PerfOp,
    pub size: u32,
    pub iters: u64,
    pub elapsed: Duration,
    /// Latency runs: microseconds (one way for ping-pong tests, as perftest
    /// reports them); a ping-pong has perftest's n − 1, from one send to the next.
    pub lat_us: Vec<f64>,
    /// Bandwidth runs that timed their requests ([`PerfParams::peak`]): the
    /// best rate over any run of consecutive requests, bytes per second.
    pub peak_bytes_per_sec: Option<f64>,
}

impl PerfResult {
    pub fn bytes(&self) -> u64 {
        self.iters * u64::from(self.size)
    }
    /// Average bandwidth in MB/s (10^6 bytes per second).
    pub fn mb_per_sec(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s == 0.0 {
            return 0.0;
        }
        self.bytes() as f64 / s / 1e6
    }
    /// Average bandwidth in Gbit/s (10^9 bits per second).
    pub fn gbits(&self) -> f64 {
        self.mb_per_sec() * 8.0 / 1000.0
    }
    /// Average bandwidth as perftest reports it: "MB/sec" there are MiB/s
    /// (2^20 bytes: its format factor 0x100000), "Gb/sec" 10^9 bits.
    pub fn perftest_bw(&self, gbits: bool) -> f64 {
        perftest_unit(self.mb_per_sec() * 1e6, gbits)
    }
    /// [`PerfResult::peak_bytes_per_sec`] in perftest's unit; 0 when not
    /// measured (perftest prints 0.00 then).
    pub fn perftest_peak(&self, gbits: bool) -> f64 {
        self.peak_bytes_per_sec
            .map_or(0.0, |b| perftest_unit(b, gbits))
    }
    /// Message rate in millions per second.
    pub fn mpps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s == 0.0 {
            return 0.0;
        }
        self.iters as f64 / s / 1e6
    }
    /// A duration latency run's figures, as perftest's report for one: the
    /// average time per operation in µs (half the round trip for SEND and
    /// WRITE, whose tests are ping-pongs) and operations per second.
    pub fn duration_lat(&self) -> (f64, f64) {
        let s = self.elapsed.as_secs_f64();
        if self.iters == 0 || s == 0.0 {
            return (0.0, 0.0);
        }
        let per_rtt = match self.op {
            PerfOp::Send | PerfOp::Write => 2.0,
            _ => 1.0,
        };
        let n = self.iters as f64;
        (s * 1e6 / per_rtt / n, n / s)
    }
    /// (min, typical = median, average, p99, max) of the latency samples.
    pub fn lat_summary(&self) -> Option<(f64, f64, f64, f64, f64)> {
        if self.lat_us.is_empty() {
            return None;
        }
        let mut v = self.lat_us.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let avg = v.iter().sum::<f64>() / n as f64;
        let p99 = v[((n as f64 * 0.99) as usize).min(n - 1)];
        // perftest's get_median: the mean of the middle two of an even count.
        let median = if n.is_multiple_of(2) {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        } else {
            v[n / 2]
        };
        Some((v[0], median, avg, p99, v[n - 1]))
    }
}

/// A deterministic pattern for offset `i` of run `seed`, so both ends can check data.
pub fn pattern_byte(seed: u64, i: u64) -> u8 {
    let x = (i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8
}

/// Fill `len` bytes of `mr` at `offset` with the pattern.
pub fn fill_pattern(mr: &MemoryRegion<'_>, offset: u64, len: u64, seed: u64) -> Result<()> {
    let data: Vec<u8> = (0..len).map(|i| pattern_byte(seed, i)).collect();
    mr.write(offset, &data)
}

/// Check `len` bytes of `mr` at `offset` hold the pattern from its start
/// (as [`fill_pattern`] put it there); returns the first bad offset.
pub fn check_pattern(
    mr: &MemoryRegion<'_>,
    offset: u64,
    len: u64,
    seed: u64,
) -> Result<Option<u64>> {
    check_pattern_from(mr, offset, len, seed, 0)
}

/// [`check_pattern`] for bytes that still hold the pattern bytes of their
/// own offsets, from a buffer filled whole at 0.
pub fn check_pattern_in_place(
    mr: &MemoryRegion<'_>,
    offset: u64,
    len: u64,
    seed: u64,
) -> Result<Option<u64>> {
    check_pattern_from(mr, offset, len, seed, offset)
}

/// `len` bytes of `mr` at `offset` against the pattern from byte `first` on.
fn check_pattern_from(
    mr: &MemoryRegion<'_>,
    offset: u64,
    len: u64,
    seed: u64,
    first: u64,
) -> Result<Option<u64>> {
    let mut data = vec![0u8; len as usize];
    mr.read(offset, &mut data)?;
    Ok((0u64..)
        .zip(&data)
        .find(|(i, b)| **b != pattern_byte(seed, first + i))
        .map(|(i, _)| i))
}

fn check_wc(wc: &WorkCompletion) -> Result<()> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(Error::EngineStopped(format!(
            "work request {} completed with {:?}",
            wc.wr_id, wc.status
        )))
    }
}

/// Between two empty polls: spin (`p.spin`) or sleep until a completion
/// (or `most`) — a time-out here only means poll again.
fn idle(cq: &CompletionQueue, p: &PerfParams, most: Duration) {
    if p.spin {
        std::hint::spin_loop();
    } else {
        cq.wait(most).ok();
    }
}

fn op_for(p: &PerfParams, remote: &RemoteBuf, i: u64) -> SendOp {
    // Spread successive operations over the remote buffer, perftest-style.
    let slots = (remote.len / u64::from(p.size.max(8))).max(1);
    let off = (i % slots) * u64::from(p.size.max(8));
    match p.op {
        PerfOp::Write => SendOp::RdmaWrite {
            remote_addr: remote.addr + off,
            rkey: remote.rkey,
        },
        PerfOp::Read => SendOp::RdmaRead {
            remote_addr: remote.addr + off,
            rkey: remote.rkey,
        },
        PerfOp::Send => SendOp::Send,
        PerfOp::FetchAdd => SendOp::AtomicFetchAdd {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            add: 1,
        },
        PerfOp::CompareSwap => SendOp::AtomicCmpSwp {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            compare: i,
            swap: i + 1,
        },
    }
}

/// perftest's `-D` clock (its START, SAMPLE, STOP_SAMPLE and END states): a
/// run lasts `duration`, and only what completes between `margin` after its
/// start and `margin` before its end counts, so ramp-up and wind-down stay
/// out of the figure.
#[derive(Debug, Clone, Copy)]
pub struct DurationClock {
    start: Instant,
    duration: Duration,
    margin: Duration,
    // (when, operations done) as the window opened and as it closed.
    opened: Option<(Instant, u64)>,
    closed: Option<(Instant, u64)>,
}

impl DurationClock {
    /// A `duration` run's clock, or none for a run of `iters`.
    pub fn of(p: &PerfParams) -> Option<DurationClock> {
        p.duration.map(|duration| DurationClock {
            start: Instant::now(),
            duration,
            margin: p.margin,
            opened: None,
            closed: None,
        })
    }

    /// Notes `done` (operations complete so far) against the clock; true
    /// once the run is over.
    pub fn tick(&mut self, done: u64) -> bool {
        let now = Instant::now();
        let t = now.duration_since(self.start);
        if self.opened.is_none() && t >= self.margin {
            self.opened = Some((now, done));
        }
        if self.closed.is_none() && t >= self.duration.saturating_sub(self.margin) {
            self.opened.get_or_insert((now, done));
            self.closed = Some((now, done));
        }
        self.over()
    }

    /// The run's time is up (no note taken).
    pub fn over(&self) -> bool {
        self.start.elapsed() >= self.duration
    }

    /// Operations completed inside the window, and its length; a run that
    /// stopped early (its peer's time ran out first) closes it at `done`.
    pub fn sampled(&mut self, done: u64) -> (u64, Duration) {
        self.tick(done);
        if self.closed.is_none() {
            let now = Instant::now();
            self.opened.get_or_insert((now, done));
            self.closed = Some((now, done));
        }
        match (self.opened, self.closed) {
            (Some((t0, n0)), Some((t1, n1))) => (n1.saturating_sub(n0), t1.duration_since(t0)),
            _ => (0, Duration::ZERO),
        }
    }
}

/// Room for a run's latency samples: none in a `duration` run (its figure
/// is the window's average), else one per iteration.
fn sample_room(p: &PerfParams) -> usize {
    if p.duration.is_some() {
        0
    } else {
        usize::try_from(p.iters).unwrap_or(0).min(1 << 24)
    }
}

/// A finished run's count and time: a `duration` run's window, else all of it.
fn measured(clock: Option<&mut DurationClock>, done: u64, start: Instant) -> (u64, Duration) {
    clock.map_or((done, start.elapsed()), |c| c.sampled(done))
}

/// Bytes per second in perftest's report unit: MiB/s, or Gbit/s.
pub fn perftest_unit(bytes_per_sec: f64, gbits: bool) -> f64 {
    if gbits {
        bytes_per_sec * 8.0 / 1e9
    } else {
        bytes_per_sec / f64::from(1u32 << 20)
    }
}

/// [`perftest_unit`] undone: a figure in perftest's unit as bytes per second.
pub fn bytes_per_sec_of(perftest: f64, gbits: bool) -> f64 {
    if gbits {
        perftest * 1e9 / 8.0
    } else {
        perftest * f64::from(1u32 << 20)
    }
}

/// perftest's peak: the shortest time per request over any run of
/// consecutive requests `i..=j`, from the post of `i` to the completion of
/// `j` (nanoseconds since the start); returns bytes per second.
fn peak_rate(posted: &[u64], completed: &[u64], size: u32) -> Option<f64> {
    let n = posted.len().min(completed.len());
    let mut best: Option<f64> = None;
    for i in 0..n {
        let from = posted[i];
        for (k, &to) in completed[i..n].iter().enumerate() {
            let per = to.saturating_sub(from) as f64 / (k + 1) as f64;
            if per > 0.0 && best.is_none_or(|b| per < b) {
                best = Some(per);
            }
        }
    }
    best.map(|ns| f64::from(size) * 1e9 / ns)
}

/// The slowest a run may move and still count as moving: a TCG VM under
/// netem loss moves a few MB/s (perftest itself waits without limit).
const SLOWEST_RATE: f64 = 1e6;

/// How long a run may go without a completion before it gives up: the
/// configured time-out, or longer when `bytes` pass between two completions
/// (one signaled request per `-Q` of 8 MiB each is 400 MiB between them with
/// `-n 50`, 11 s at 36 MB/s between two TCG VMs).
fn stall_limit(p: &PerfParams, bytes: u64) -> Duration {
    p.timeout
        .max(Duration::from_secs_f64(bytes as f64 / SLOWEST_RATE))
}

/// Bandwidth, requester side: keep `tx_depth` operations in flight until
/// `iters` (or `duration`) are complete. For SEND the peer must run
/// [`bw_receiver`].
pub fn bw_requester(
    qp: &QueuePair<'_>,
    cq: &CompletionQueue,
    mr: &MemoryRegion<'_>,
    remote: &RemoteBuf,
    p: &PerfParams,
) -> Result<PerfResult> {
    let size = if p.op.is_atomic() { 8 } else { p.size };
    // Local offsets follow the remote ones, so after a WRITE run the peer's
    // buffer mirrors ours (and after a READ run ours mirrors the peer's).
    // UD: the receiver's slots hold a GRH and then the message
    // (post_bw_recv); sending from where the message lands keeps the two
    // buffers alike too.
    let grh = u64::from(grh_of(qp));
    let slot = (u64::from(size) + grh).max(8);
    let local_slots = (mr.len().min(remote.len) / slot).max(1);
    let cq_mod = match p.duration {
        Some(_) => 1,
        None => u64::from(p.cq_mod.clamp(1, p.tx_depth.max(1))),
    };
    let signaled = |i: u64| (i + 1).is_multiple_of(cq_mod) || i + 1 == p.iters;
    let stall = stall_limit(p, cq_mod.saturating_mul(u64::from(size)));
    let mut posted = 0u64;
    // Requests known complete: a completion covers its request and the
    // unsignaled ones before it (a QP completes in order).
    let mut done = 0u64;
    let mut wcs = Vec::with_capacity(64);
    let timed = p.peak && p.duration.is_none() && p.iters <= PEAK_MAX_ITERS;
    let (mut t_posted, mut t_completed) = if timed {
        (
            Vec::with_capacity(p.iters as usize),
            Vec::with_capacity(p.iters as usize),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let start = Instant::now();
    let mut clock = DurationClock::of(p);
    let mut last_progress = Instant::now();
    loop {
        // Once over, a run's clock stays over.
        let ended = clock.as_mut().is_some_and(|c| c.tick(done));
        let stopping = ended || posted >= p.iters;
        if stopping && done == posted {
            break;
        }
        let mut batch = Vec::new();
        while !stopping
            && posted - done < u64::from(p.tx_depth)
            && posted < p.iters
            && batch.len() < p.post_list.max(1) as usize
        {
            let off = (posted % local_slots) * slot + grh;
            batch.push((posted, op_for(p, remote, posted), off));
            posted += 1;
        }
        if !batch.is_empty() {
            let sges: Vec<_> = batch
                .iter()
                .map(|(_, _, off)| [mr.sge(*off, size)])
                .collect();
            let wrs: Vec<SendWr<'_>> = batch
                .iter()
                .zip(&sges)
                .map(|((id, op, _), sge)| {
                    let mut wr = SendWr::new(*id, *op, sge);
                    wr.flags.signaled = signaled(*id);
                    wr.ud = remote.ud;
                    wr
                })
                .collect();
            if timed {
                // perftest takes the time just before posting.
                let at = start.elapsed().as_nanos() as u64;
                t_posted.resize(posted as usize, at);
            }
            qp.post_send(&wrs)?;
        }
        wcs.clear();
        let n = cq.poll(64, &mut wcs)?;
        for wc in &wcs {
            check_wc(wc)?;
            done = done.max(wc.wr_id + 1);
        }
        if timed && n > 0 {
            // A completion covers the unsignaled requests before it.
            let at = start.elapsed().as_nanos() as u64;
            t_completed.resize(done as usize, at);
        }
        if n > 0 {
            last_progress = Instant::now();
        } else if ended && last_progress.elapsed() > REQUESTER_DRAIN_QUIET {
            // perftest leaves what is still out when its time is up; a
            // receiver whose own time ran out first may leave a SEND
            // without a receive for good.
            break;
        } else if last_progress.elapsed() > stall {
            return Err(Error::Timeout(stall, "bandwidth completions"));
        } else if posted - done >= u64::from(p.tx_depth) || stopping {
            idle(cq, p, p.timeout.min(Duration::from_millis(5)));
        }
    }
    let (iters, elapsed) = measured(clock.as_mut(), done, start);
    Ok(PerfResult {
        op: p.op,
        size,
        iters,
        elapsed,
        lat_us: Vec::new(),
        peak_bytes_per_sec: if timed {
            peak_rate(&t_posted, &t_completed, size)
        } else {
            None
        },
    })
}

/// What a SEND bandwidth receiver counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Messages received (a `duration` run: inside its window).
    pub messages: u64,
    /// A `duration` run's window (else the caller times the run).
    pub window: Option<Duration>,
}

/// Bandwidth, SEND receiver side: keep receives posted and count `iters`
/// messages, or, in a `duration` run, those of its window.
pub fn bw_receiver(
    qp: &QueuePair<'_>,
    cq: &CompletionQueue,
    mr: &MemoryRegion<'_>,
    p: &PerfParams,
    rx_depth: u32,
) -> Result<Received> {
    let posted = bw_prepost(qp, mr, p, rx_depth)?;
    bw_receiver_from(qp, cq, mr, p, posted)
}

/// Receive `i` of a SEND bandwidth run: slot `i` of the buffer, cyclically,
/// where [`bw_requester`] sends message `i` from (slots of at least 8
/// bytes), so what lands matches the pattern the sender's buffer holds
/// there. (A bidirectional run sends from the buffer it receives into:
/// a message landing elsewhere would spoil the next size's data.)
/// A UD receive's slot holds the GRH and then the message.
fn post_bw_recv(qp: &QueuePair<'_>, mr: &MemoryRegion<'_>, p: &PerfParams, i: u64) -> Result<()> {
    let len = p.size + grh_of(qp);
    let slot = u64::from(len.max(8));
    let slots = (mr.len() / slot).max(1);
    let sge = [mr.sge((i % slots) * slot, len)];
    qp.post_recv(&[RecvWr {
        wr_id: i,
        sg_list: &sge,
    }])
}

/// The receives a SEND bandwidth receiver starts with (`rx_depth`, at most
/// one per message); returns how many. Posted before the peer is told to
/// start (as perftest's server does), a sender never finds the queue
/// empty: over RC that costs an RNR NAK and a retry, over UC the message.
pub fn bw_prepost(
    qp: &QueuePair<'_>,
    mr: &MemoryRegion<'_>,
    p: &PerfParams,
    rx_depth: u32,
) -> Result<u64> {
    let n = u64::from(rx_depth).min(p.iters);
    for i in 0..n {
        post_bw_recv(qp, mr, p, i)?;
    }
    Ok(n)
}

/// A duration run's requester, its time up, stops waiting for what is
/// still out once nothing has completed for this long.
const REQUESTER_DRAIN_QUIET: Duration = Duration::from_secs(1);

/// A duration run's receiver, its time up, stops once the sender has been
/// quiet this long: the sender runs on its own clock and may still be
/// sending, and its messages need receives (over RC an empty queue costs it
/// RNR NAKs it retries without end).
const RECEIVER_DRAIN_QUIET: Duration = Duration::from_millis(300);

/// [`bw_receiver`] after [`bw_prepost`] posted `posted` receives.
pub fn bw_receiver_from(
    qp: &QueuePair<'_>,
    cq: &CompletionQueue,
    mr: &MemoryRegion<'_>,
    p: &PerfParams,
    mut posted: u64,
) -> Result<Received> {
    let post = |i: u64| post_bw_recv(qp, mr, p, i);
    let start = Instant::now();
    let mut clock = DurationClock::of(p);
    let mut got = 0u64;
    let mut wcs = Vec::with_capacity(64);
    let mut last = Instant::now();
    while got < p.iters {
        let ended = clock.as_mut().is_some_and(|c| c.tick(got));
        wcs.clear();
        let n = cq.poll(64, &mut wcs)?;
        for wc in &wcs {
            check_wc(wc)?;
            got += 1;
            if posted < p.iters {
                post(posted)?;
                posted += 1;
            }
        }
        if n == 0 {
            if ended && last.elapsed() > RECEIVER_DRAIN_QUIET {
                break;
            }
            if last.elapsed() > p.timeout {
                // UC and UD do not resend a lost message: after a quiet
                // time-out the count so far is the result (perftest's server
                // gives up the same way). RC delivers all or fails.
                if matches!(qp.qp_type(), QpType::Uc | QpType::Ud) && got > 0 {
                    break;
                }
                return Err(Error::Timeout(p.timeout, "SEND messages"));
            }
            idle(cq, p, Duration::from_millis(5));
        } else {
            last = Instant::now();
        }
    }
    let window = clock.is_some();
    let (messages, elapsed) = measured(clock.as_mut(), got, start);
    Ok(Received {
        messages,
        window: window.then_some(elapsed),
    })
}

/// perftest's CQ moderation (`DEF_CQ_MOD`): only every 100th send is
/// signaled, for messages up to `MSG_SIZE_CQ_MOD_LIMIT` (8 KiB); above that
/// every one is.
const CQ_MOD: u64 = 100;
const CQ_MOD_SIZE_LIMIT: u32 = 8192;

/// SEND latency, one side of the ping-pong (perftest send_lat): the client
/// sends first, each side answers every message it receives. Samples are
/// half the round trip. As in perftest, small sends are signaled only every
/// 100th time (and the last), and a side waits for a signaled send's
/// completion right after posting it: the others complete with their ACKs,
/// off the ping-pong's path.
pub fn send_lat(
    qp: &QueuePair<'_>,
    cq: &CompletionQueue,
    mr: &MemoryRegion<'_>,
    p: &PerfParams,
    client: bool,
) -> Result<PerfResult> {
    send_lat_prepost(qp, mr, p)?;
    send_lat_from(qp, cq, mr, p, client, None)
}

/// A SEND ping-pong receives at 0 into this many bytes and sends from
/// this offset: half the buffer (at least the message), so a receive takes
/// any message the buffer can hold: two receives stay posted from one size
/// to the next of an `-a` run, and ones sized for the smaller message would
/// fail the larger one with a local length error. (A UD receive also takes
/// the GRH: the buffer's half must hold [`UD_GRH`] bytes more.)
fn lat_half(mr: &MemoryRegion<'_>, size: u32) -> u32 {
    u32::try_from(mr.len() / 2)
        .unwrap_or(u32::MAX)
        .max(size.max(1))
}

/// Where [`send_lat`] sends its `size`-byte messages from in `mr` (it
/// receives at 0): fill the pattern there to check what arrives.
pub fn send_lat_source(mr: &MemoryRegion<'_>, size: u32) -> u64 {
    u64::from(lat_half(mr, size))
}

/// One receive of a SEND ping-pong (the same buffer every time).
fn post_lat_recv(qp: &QueuePair<'_>, mr: &MemoryRegion<'_>, p: &PerfParams) -> Result<()> {
    let sge = [mr.sge(0, lat_half(mr, p.size))];
    qp.post_recv(&[RecvWr {
        wr_id: 0,
        sg_list: &sge,
    }])
}

/// The two receives a SEND ping-pong side keeps posted, so an early
/// message never meets an empty queue. Posted before the peer is told to
/// start, the first message cannot either (over UC it would be lost and
/// the ping-pong would stall).
pub fn send_lat_prepost(qp: &QueuePair<'_>, mr: &MemoryRegion<'_>, p: &PerfParams) -> Result<()> {
    post_lat_recv(qp, mr, p)?;
    post_lat_recv(qp, mr, p)
}

/// [`send_lat`] after [`send_lat_prepost`]; a UD QP sends to `to`.
pub fn send_lat_from(
    qp: &QueuePair<'_>,
    cq: &CompletionQueue,
    mr: &MemoryRegion<'_>,
    p: &PerfParams,
    client: bool,
    to: Option<UdDest>,
) -> Result<PerfResult> {
    let size = p.size;
    let send_sge = [mr.sge(send_lat_source(mr, size), size)];
    let post_recv = || post_lat_recv(qp, mr, p);
    // An unsignaled send's queue slot is free only once a later signaled
    // send completes (ibverbs): never more in a row than the queue holds.
    let cq_mod = if size <= CQ_MOD_SIZE_LIMIT {
        CQ_MOD.min(u64::from(p.tx_depth.max(1)))
    } else {
        1
    };
    let signaled = |i: u64| (i + 1).is_multiple_of(cq_mod) || i + 1 == p.iters;
    let send = |i: u64| {
        let mut wr = SendWr::new(i, SendOp::Send, &send_sge);
        wr.flags.signaled = signaled(i);
        wr.ud = to;
        qp.post_send(&[wr])
    };
    let start = Instant::now();
    let mut clock = DurationClock::of(p);
    let run = clock;
    // Completions are counted as they come: a receive may complete in the
    // same poll as a send (the answer overtaking the local completion).
    // False when a duration run's time ran out first (the peer's may have
    // run out a little earlier: it stops answering).
    let mut recvs = 0u64;
    let mut sends = 0u64;
    let mut wcs = Vec::with_capacity(4);
    let mut wait_for = |want_recvs: u64, want_sends: u64| -> Result<bool> {
        let deadline = Instant::now() + p.timeout;
        while recvs < want_recvs || sends < want_sends {
            wcs.clear();
            cq.poll(4, &mut wcs)?;
            for wc in &wcs {
                check_wc(wc)?;
                if wc.opcode == crate::WcOpcode::Recv {
                    recvs += 1;
                } else {
                    sends += 1;
                }
            }
            if wcs.is_empty() {
                if run.as_ref().is_some_and(DurationClock::over) {
                    return Ok(false);
                }
                if Instant::now() > deadline {
                    return Err(Error::Timeout(p.timeout, "a ping-pong message"));
                }
                idle(cq, p, Duration::from_millis(1));
            }
        }
        Ok(true)
    };
    let mut lat = Vec::with_capacity(sample_room(p));
    let mut want_sends = 0u64;
    let mut i = 0u64;
    while i < p.iters && !clock.as_mut().is_some_and(|c| c.tick(i)) {
        let t = Instant::now();
        let answered = if client {
            send(i)?;
            if signaled(i) {
                want_sends += 1;
            }
            wait_for(i + 1, want_sends)? && {
                post_recv()?;
                true
            }
        } else {
            wait_for(i + 1, want_sends)? && {
                post_recv()?;
                send(i)?;
                if signaled(i) {
                    want_sends += 1;
                }
                wait_for(i + 1, want_sends)?
            }
        };
        if !answered {
            break;
        }
        // perftest's samples run from one send to the next: n − 1 of them,
        // the client's round trips but the last, the server's from its first
        // answer on (its first iteration also waited for the client to
        // start, which a stock client does only after calibrating its clock).
        let sampled = if client { i + 1 < p.iters } else { i > 0 };
        if clock.is_none() && sampled {
            lat.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
        i += 1;
    }
    if clock.is_none() {
        wait_for(p.iters, want_sends)?;
    }
    let (iters, elapsed) = measured(clock.as_mut(), i, start);
    Ok(PerfResult {
        op: PerfOp::Send,
        size,
        iters,
        elapsed,
        lat_us: lat,
        peak_bytes_per_sec: None,
    })
}

/// READ / WRITE / atomic latency, requester side (one operation at a time;
/// samples are the full completion time, as perftest's read_lat reports).
pub fn op_lat(
    qp: &QueuePair<'_>,
    cq: &CompletionQueue,
    mr: &MemoryRegion<'_>,
    remote: &RemoteBuf,
    p: &PerfParams,
) -> Result<PerfResult> {
    let size = if p.op.is_atomic() { 8 } else { p.size };
    let sge = [mr.sge(0, size)];
    let mut lat = Vec::with_capacity(sample_room(p));
    let start = Instant::now();
    let mut clock = DurationClock::of(p);
    let mut wcs = Vec::with_capacity(1);
    let mut i = 0u64;
    while i < p.iters && !clock.as_mut().is_some_and(|c| c.tick(i)) {
        let t = Instant::now();
        let mut wr = SendWr::new(i, op_for(p, remote, 0), &sge);
        wr.flags.signaled = true;
        qp.post_send(&[wr])?;
        wcs.clear();
        let deadline = Instant::now() + p.timeout;
        while cq.poll(1, &mut wcs)? == 0 {
            if Instant::now() > deadline {
                return Err(Error::Timeout(p.timeout, "a completion"));
            }
            idle(cq, p, Duration::from_millis(1));
        }
        check_wc(&wcs[0])?;
        if clock.is_none() {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        i += 1;
    }
    let (iters, elapsed) = measured(clock.as_mut(), i, start);
    Ok(PerfResult {
        op: p.op,
        size,
        iters,
        elapsed,
        lat_us: lat,
        peak_bytes_per_sec: None,
    })
}

/// WRITE latency as perftest's `ib_write_lat` runs it: a ping-pong of RDMA
/// WRITEs. Each side writes `size` bytes into the peer's receive area whose
/// last byte carries the iteration number (1, 2, ... as a wrapping byte), and
/// waits until the peer's write has put that number into the last byte of its
/// own receive area (`recv_offset` in `mr`). The side with `starts` writes
/// first without waiting: in perftest 4.5 that is the server (run_iter_lat_write
/// skips the first poll when `machine == SERVER`; seen on the wire between two
/// rxe peers: the server's WRITE is the first RoCE packet). Samples are half
/// the round trip.
pub fn write_lat(
    qp: &QueuePair<'_>,
    cq: &CompletionQueue,
    mr: &MemoryRegion<'_>,
    remote: &RemoteBuf,
    p: &PerfParams,
    starts: bool,
    recv_offset: u64,
) -> Result<PerfResult> {
    let size = p.size.max(1);
    let post_at = u64::from(size) - 1;
    let poll_at = recv_offset + u64::from(size) - 1;
    let sge = [mr.sge(0, size)];
    let mut lat = Vec::with_capacity(sample_room(p));
    let mut wcs = Vec::with_capacity(4);
    let start = Instant::now();
    let mut clock = DurationClock::of(p);
    let run = clock;
    // False when a duration run's time ran out first (the peer stops
    // writing when its own runs out).
    let wait_for_peer = |n: u64| -> Result<bool> {
        let want = n as u8;
        let deadline = Instant::now() + p.timeout;
        let mut b = [0u8; 1];
        loop {
            mr.read(poll_at, &mut b)?;
            if b[0] == want {
                return Ok(true);
            }
            if run.as_ref().is_some_and(DurationClock::over) {
                return Ok(false);
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(p.timeout, "the peer's WRITE"));
            }
            // Take frames from this thread when the device is free (one step
            // in either engine mode: in thread mode the engine thread would
            // otherwise have to preempt this spinning one), and surface a
            // stopped engine.
            cq.try_progress();
            cq.shared.check_engine()?;
            std::hint::spin_loop();
        }
    };
    let mut sends_done = 0u64;
    // Iterations done (the starter's first only starts the ping-pong).
    let mut posted = 0u64;
    let mut rounds = 0u64;
    while posted < p.iters && !clock.as_mut().is_some_and(|c| c.tick(rounds)) {
        let i = posted + 1;
        let t = Instant::now();
        if (!starts || i > 1) && !wait_for_peer(if starts { i - 1 } else { i })? {
            break;
        }
        mr.write(post_at, &[i as u8])?;
        let mut wr = SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            &sge,
        );
        wr.flags.signaled = true;
        qp.post_send(&[wr])?;
        posted = i;
        // Reap send completions as they come; the CQ must not fill up.
        wcs.clear();
        cq.poll(4, &mut wcs)?;
        for wc in &wcs {
            check_wc(wc)?;
            sends_done += 1;
        }
        if !starts || i > 1 {
            rounds += 1;
            // The other side's first iteration waited for the ping-pong to
            // start, not a round trip: as perftest's samples (from one post
            // to the next) it has none.
            if clock.is_none() && (starts || i > 1) {
                lat.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
    }
    if starts && clock.is_none() {
        wait_for_peer(p.iters)?;
    }
    // A duration run's last WRITE may meet a peer whose time ran out first
    // and is gone: it counts for nothing, so nothing waits for it.
    while sends_done < posted && clock.is_none() {
        wcs.clear();
        let n = cq.poll(4, &mut wcs)?;
        for wc in &wcs {
            check_wc(wc)?;
        }
        sends_done += n as u64;
        if n == 0 {
            cq.wait(p.timeout)?;
        }
    }
    let (iters, elapsed) = if clock.is_some() {
        measured(clock.as_mut(), rounds, start)
    } else {
        (p.iters, start.elapsed())
    };
    Ok(PerfResult {
        op: PerfOp::Write,
        size,
        iters,
        elapsed,
        lat_us: lat,
        peak_bytes_per_sec: None,
    })
}

#[cfg(test)]
mod tests {
    use super::{
        bytes_per_sec_of, peak_rate, perftest_unit, stall_limit, PerfOp, PerfParams, PerfResult,
    };
    use std::time::Duration;

    #[test]
    fn latency_median_as_perftest_takes_it() {
        let r = |lat_us: Vec<f64>| PerfResult {
            op: PerfOp::Send,
            size: 8,
            iters: lat_us.len() as u64 + 1,
            elapsed: Duration::from_secs(1),
            lat_us,
            peak_bytes_per_sec: None,
        };
        // Odd count: the middle one; even: the mean of the middle two.
        let odd = r(vec![5.0, 1.0, 3.0]).lat_summary().unwrap();
        assert_eq!((odd.0, odd.1, odd.4), (1.0, 3.0, 5.0));
        let even = r(vec![4.0, 1.0, 2.0, 8.0]).lat_summary().unwrap();
        assert_eq!((even.1, even.2), (3.0, 3.75));
        assert!(r(Vec::new()).lat_summary().is_none());
    }

    #[test]
    fn a_run_waits_longer_when_completions_are_far_apart() {
        let p = PerfParams::new(PerfOp::Write, 8 << 20, 50);
        // Small gaps keep the configured time-out.
        assert_eq!(stall_limit(&p, 64 << 10), p.timeout);
        // 50 × 8 MiB between two completions: at least 419 s at 1 MB/s.
        assert_eq!(
            stall_limit(&p, 50 * (8 << 20)),
            Duration::from_secs_f64(419.4304)
        );
    }

    #[test]
    fn the_peak_is_the_best_run_of_consecutive_requests() {
        // Four 1000-byte requests: posted at 0, 0, 10, 10 µs, completed at
        // 20, 22, 24, 60 µs. Best: requests 0..=2 (posted 0, the third done
        // at 24: 8 µs each), better than any single one (at best 14 µs), 1..=2
        // (12 µs) or all four (15 µs).
        let posted = [0, 0, 10_000, 10_000];
        let completed = [20_000, 22_000, 24_000, 60_000];
        let bps = peak_rate(&posted, &completed, 1000).unwrap();
        assert!((bps - 1000.0 / 8e-6).abs() < 1e-3, "{bps}");
        // Nothing timed (or nothing completed): no peak.
        assert_eq!(peak_rate(&[], &[], 1000), None);
        assert_eq!(peak_rate(&[5], &[], 1000), None);
    }

    #[test]
    fn perftest_reports_mib_or_gbits() {
        assert_eq!(perftest_unit(1048576.0, false), 1.0);
        assert_eq!(perftest_unit(125_000_000.0, true), 1.0);
        assert_eq!(bytes_per_sec_of(1.0, false), 1048576.0);
        assert_eq!(bytes_per_sec_of(1.0, true), 125_000_000.0);
    }
}
