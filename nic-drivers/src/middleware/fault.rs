//! Seeded fault injection: loss, duplication, reordering, corruption, delay.
//!
//! [`Faults`] decides the fate of each frame from a seeded RNG, so a failing
//! test replays exactly; [`DelayQueue`] holds frames until they are due. The
//! in-memory switch uses both on delivery; [`FaultIo`] applies them to the
//! frames any backend receives.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::sys::{self, TimerFd};
use crate::{NicError, PacketIo, RxSink, Stats, TxFill};

/// What can go wrong with a frame, and how often (probabilities in 0..=1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// RNG seed: the same seed and traffic give the same faults.
    pub seed: u64,
    /// Probability a frame is dropped.
    pub loss: f64,
    /// Probability a frame is delivered twice.
    pub dup: f64,
    /// Probability a frame is held back by `reorder_delay`, so later frames
    /// overtake it.
    pub reorder: f64,
    /// Probability one bit of the frame (past the Ethernet header) is flipped.
    pub corrupt: f64,
    /// Fixed delay added to every frame.
    pub delay: Duration,
    /// Extra uniformly random delay in `0..jitter` (may reorder frames too).
    pub jitter: Duration,
    /// How long a reordered frame is held back.
    pub reorder_delay: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 0x5EED,
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            reorder_delay: Duration::from_micros(200),
        }
    }
}

/// SplitMix64: tiny, seedable, good enough to pick faults.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
}

/// Counts of the faults applied so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames dropped.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Frames held back.
    pub reordered: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
}

/// Applies a [`FaultConfig`] frame by frame.
#[derive(Debug, Clone)]
pub struct Faults {
    cfg: FaultConfig,
    rng: Rng,
    stats: FaultStats,
}

impl Faults {
    /// A fault injector seeded from `cfg.seed`.
    pub fn new(cfg: FaultConfig) -> Self {
        Faults {
            rng: Rng::new(cfg.seed),
            cfg,
            stats: FaultStats::default(),
        }
    }

    /// Counts so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Decides the fate of `frame` arriving at `now` and queues 0, 1 or 2
    /// (possibly corrupted) copies into `q` at their delivery times.
    pub fn apply(&mut self, frame: &[u8], now: Instant, q: &mut DelayQueue) {
        if self.rng.chance(self.cfg.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.cfg.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = now + self.cfg.delay;
            if !self.cfg.jitter.is_zero() {
                let j = self
                    .rng
                    .below(self.cfg.jitter.as_nanos().min(u128::from(u64::MAX)) as u64);
                at += Duration::from_nanos(j);
            }
            if self.rng.chance(self.cfg.reorder) {
                self.stats.reordered += 1;
                at += self.cfg.reorder_delay;
            }
            let mut data = q.take_buf();
            data.extend_from_slice(frame);
            if self.rng.chance(self.cfg.corrupt) && frame.len() > crate::frame::ETH_HLEN {
                self.stats.corrupted += 1;
                let span = (frame.len() - crate::frame::ETH_HLEN) as u64;
                let i = crate::frame::ETH_HLEN + self.rng.below(span) as usize;
                let bit = 1u8 << self.rng.below(8);
                if let Some(b) = data.get_mut(i) {
                    *b ^= bit;
                }
            }
            q.push_owned(at, data);
        }
    }
}

#[derive(Debug)]
struct Entry {
    at: Instant,
    seq: u64,
    data: Vec<u8>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    // Reversed: BinaryHeap is a max-heap and we want the earliest first;
    // `seq` keeps frames due at the same instant in arrival order.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

/// Frames waiting for their delivery time, earliest first, FIFO among equals.
/// Recycles its buffers.
#[derive(Debug, Default)]
pub struct DelayQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
    pool: Vec<Vec<u8>>,
}

impl DelayQueue {
    /// Copies `frame` in, due at `at`.
    pub fn push(&mut self, at: Instant, frame: &[u8]) {
        let mut data = self.pool.pop().unwrap_or_default();
        data.clear();
        data.extend_from_slice(frame);
        self.push_owned(at, data);
    }

    /// Queues an owned buffer, due at `at`.
    pub fn push_owned(&mut self, at: Instant, data: Vec<u8>) {
        self.seq += 1;
        self.heap.push(Entry {
            at,
            seq: self.seq,
            data,
        });
    }

    /// A recycled (or new) empty buffer.
    pub fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Number of frames held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no frame is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// When the earliest frame is due.
    pub fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|e| e.at)
    }

    /// Takes the earliest frame if it is due at `now`.
    pub fn pop_ready(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.heap.peek()?.at <= now {
            self.heap.pop().map(|e| e.data)
        } else {
            None
        }
    }

    /// Gives a buffer back for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < 4096 {
            self.pool.push(buf);
        }
    }
}

/// Applies [`Faults`] to every frame the wrapped backend receives. Transmit
/// passes straight through; wrap both ends to fault both directions.
#[derive(Debug)]
pub struct FaultIo<I> {
    inner: I,
    faults: Faults,
    queue: DelayQueue,
    timer: TimerFd,
    // epoll set of {inner fds, timer}: one fd that wakes for any.
    epoll: OwnedFd,
    dropped_by_faults: u64,
}

impl<I: PacketIo> FaultIo<I> {
    /// Wraps `inner`.
    pub fn new(inner: I, cfg: FaultConfig) -> Result<Self, NicError> {
        let timer = TimerFd::new()?;
        // Tests' middleware: the epoll set's cost on every wake-up is no matter here.
        let fds: Vec<RawFd> = [inner.poll_fd(), timer.raw()]
            .into_iter()
            .chain(inner.second_poll_fd())
            .collect();
        let epoll = sys::epoll_of(&fds)?;
        Ok(FaultIo {
            inner,
            faults: Faults::new(cfg),
            queue: DelayQueue::default(),
            timer,
            epoll,
            dropped_by_faults: 0,
        })
    }

    /// The faults applied so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.faults.stats()
    }

    /// The wrapped backend.
    pub fn inner(&mut self) -> &mut I {
        &mut self.inner
    }

    fn rearm(&self, now: Instant) {
        self.timer.clear();
        self.timer.arm(
            self.queue
                .next_at()
                .map(|t| t.saturating_duration_since(now)),
        );
    }
}

impl<I: PacketIo> PacketIo for FaultIo<I> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }
    fn mac(&self) -> [u8; 6] {
        self.inner.mac()
    }
    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        let now = Instant::now();
        let (faults, queue) = (&mut self.faults, &mut self.queue);
        self.inner
            .recv(max, &mut |f: &[u8]| faults.apply(f, now, queue))?;
        let mut n = 0;
        while n < max {
            let Some(f) = self.queue.pop_ready(Instant::now()) else {
                break;
            };
            sink(&f);
            self.queue.recycle(f);
            n += 1;
        }
        self.dropped_by_faults = self.faults.stats().lost;
        self.rearm(Instant::now());
        Ok(n)
    }
    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        self.inner.transmit(max, fill)
    }
    fn poll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        self.inner.set_busy_poll(on)
    }
    fn qpn_prefix(&self) -> Option<u8> {
        self.inner.qpn_prefix()
    }
    fn leave_shared(&mut self) {
        self.inner.leave_shared()
    }
    fn join_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.inner.join_multicast(group)
    }
    fn leave_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.inner.leave_multicast(group)
    }
    fn second_poll_fd(&self) -> Option<RawFd> {
        self.inner.second_poll_fd()
    }
    fn stats(&self) -> Stats {
        let mut s = self.inner.stats();
        s.rx_dropped += self.dropped_by_faults;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_fate() {
        let cfg = FaultConfig {
            loss: 0.2,
            dup: 0.1,
            corrupt: 0.1,
            reorder: 0.1,
            ..FaultConfig::default()
        };
        let run = || {
            let mut f = Faults::new(cfg);
            let mut q = DelayQueue::default();
            let t0 = Instant::now();
            for i in 0..1000u32 {
                let mut frame = vec![0u8; 64];
                frame[20..24].copy_from_slice(&i.to_be_bytes());
                f.apply(&frame, t0, &mut q);
            }
            let mut out = Vec::new();
            while let Some(x) = q.pop_ready(t0 + Duration::from_secs(1)) {
                out.push(x);
            }
            (f.stats(), out)
        };
        let (s1, o1) = run();
        let (s2, o2) = run();
        assert_eq!(s1, s2);
        assert_eq!(o1, o2);
        assert!(s1.lost > 150 && s1.lost < 250, "{s1:?}");
        assert!(
            s1.duplicated > 50 && s1.corrupted > 50 && s1.reordered > 50,
            "{s1:?}"
        );
        assert_eq!(o1.len() as u64, 1000 - s1.lost + s1.duplicated);
    }

    #[test]
    fn delay_queue_orders_by_time_then_arrival() {
        let mut q = DelayQueue::default();
        let t = Instant::now();
        q.push(t + Duration::from_millis(2), b"late");
        q.push(t, b"a");
        q.push(t, b"b");
        assert_eq!(q.pop_ready(t).as_deref(), Some(&b"a"[..]));
        assert_eq!(q.pop_ready(t).as_deref(), Some(&b"b"[..]));
        assert_eq!(q.pop_ready(t), None);
        assert_eq!(q.next_at(), Some(t + Duration::from_millis(2)));
    }
}
