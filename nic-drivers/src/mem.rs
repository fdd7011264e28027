//! In-process backend: an N-port learning switch (a pair is a 2-port switch)
//! with optional seeded fault injection, for tests and for the demo when no
//! network access is allowed.
//!
//! Forwarding: the switch learns source MACs per port; a frame to a known
//! unicast MAC goes to that port, anything else (broadcast, multicast,
//! unknown) floods to every other port. Each port has a bounded queue; a full
//! queue drops the frame and counts it in the receiver's `rx_dropped`.
//! Each port's `poll_fd` is a timerfd armed for the earliest due frame, so
//! delayed frames wake a sleeping engine exactly when they become due.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::middleware::fault::{DelayQueue, FaultConfig, Faults};
use crate::sys::TimerFd;
use crate::{NicError, PacketIo, RxSink, Stats, TxFill};

/// Switch settings.
#[derive(Debug, Clone, Copy)]
pub struct SwitchConfig {
    /// Number of ports.
    pub ports: usize,
    /// Frames each port's receive queue holds before dropping.
    pub queue_frames: usize,
    /// Largest frame carried (9000-byte MTU + Ethernet + one VLAN tag).
    pub max_frame_len: usize,
    /// Faults applied on every delivery, or none.
    pub faults: Option<FaultConfig>,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            ports: 2,
            queue_frames: 8192,
            max_frame_len: 9018,
            faults: None,
        }
    }
}

#[derive(Debug)]
struct PortState {
    queue: DelayQueue,
    timer: Arc<TimerFd>,
    stats: Stats,
    taken: bool,
}

#[derive(Debug)]
struct Shared {
    cfg: SwitchConfig,
    ports: Vec<PortState>,
    macs: HashMap<[u8; 6], usize>,
    faults: Option<Faults>,
}

/// An in-memory Ethernet switch. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct Switch {
    shared: Arc<Mutex<Shared>>,
}

fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic in another port's holder must not take the whole switch down.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The MAC the switch assigns port `i` (locally administered).
pub fn port_mac(i: usize) -> [u8; 6] {
    let b = (i as u32).to_be_bytes();
    [0x02, 0x00, b[0], b[1], b[2], b[3].wrapping_add(1)]
}

impl Switch {
    /// A switch with `cfg.ports` ports.
    pub fn new(cfg: SwitchConfig) -> Result<Self, NicError> {
        if cfg.ports == 0 || cfg.queue_frames == 0 || cfg.max_frame_len < 60 {
            return Err(NicError::Config(format!("switch {cfg:?}")));
        }
        let mut ports = Vec::with_capacity(cfg.ports);
        for _ in 0..cfg.ports {
            ports.push(PortState {
                queue: DelayQueue::default(),
                timer: Arc::new(TimerFd::new()?),
                stats: Stats::default(),
                taken: false,
            });
        }
        Ok(Switch {
            shared: Arc::new(Mutex::new(Shared {
                cfg,
                ports,
                macs: HashMap::new(),
                faults: cfg.faults.map(Faults::new),
            })),
        })
    }

    /// Takes port `i` (each port can be taken once at a time).
    pub fn port(&self, i: usize) -> Result<MemPort, NicError> {
        let mut s = lock(&self.shared);
        let max_frame_len = s.cfg.max_frame_len;
        let p = s
            .ports
            .get_mut(i)
            .ok_or_else(|| NicError::Config(format!("switch has no port {i}")))?;
        if p.taken {
            return Err(NicError::Config(format!("switch port {i} already taken")));
        }
        p.taken = true;
        Ok(MemPort {
            shared: Arc::clone(&self.shared),
            idx: i,
            mac: port_mac(i),
            timer: Arc::clone(&p.timer),
            max_frame_len,
            rx: Vec::new(),
            tx: Vec::new(),
            pool: Vec::new(),
        })
    }

    /// Fault counts so far (zero without faults).
    pub fn fault_stats(&self) -> crate::middleware::fault::FaultStats {
        lock(&self.shared)
            .faults
            .as_ref()
            .map(Faults::stats)
            .unwrap_or_default()
    }
}

/// Two connected ports, without faults.
pub fn pair() -> Result<(MemPort, MemPort), NicError> {
    pair_with(SwitchConfig::default())
}

/// Two connected ports with the given settings (`ports` is forced to 2).
pub fn pair_with(cfg: SwitchConfig) -> Result<(MemPort, MemPort), NicError> {
    let sw = Switch::new(SwitchConfig { ports: 2, ..cfg })?;
    Ok((sw.port(0)?, sw.port(1)?))
}

/// One port of a [`Switch`].
#[derive(Debug)]
pub struct MemPort {
    shared: Arc<Mutex<Shared>>,
    idx: usize,
    mac: [u8; 6],
    timer: Arc<TimerFd>,
    max_frame_len: usize,
    // Reused batch buffers: frames move between these and the queues' pools.
    rx: Vec<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    pool: Vec<Vec<u8>>,
}

fn rearm(p: &PortState, now: Instant) {
    p.timer.clear();
    p.timer
        .arm(p.queue.next_at().map(|t| t.saturating_duration_since(now)));
}

impl Shared {
    fn deliver(&mut self, from: usize, frame: &[u8], now: Instant) {
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        if let (Some(d), Some(s)) = (frame.get(0..6), frame.get(6..12)) {
            dst.copy_from_slice(d);
            src.copy_from_slice(s);
        } else {
            return;
        }
        if src[0] & 1 == 0 {
            self.macs.insert(src, from);
        }
        let target = if dst[0] & 1 == 0 {
            self.macs.get(&dst).copied()
        } else {
            None
        };
        let cap = self.cfg.queue_frames;
        let faults = &mut self.faults;
        let mut one = |i: usize, p: &mut PortState| {
            if i == from || !p.taken {
                return;
            }
            if p.queue.len() >= cap {
                p.stats.rx_dropped += 1;
                return;
            }
            let before = p.queue.next_at();
            match faults {
                Some(f) => f.apply(frame, now, &mut p.queue),
                None => p.queue.push(now, frame),
            }
            // Timer syscalls only when the earliest due time moved earlier.
            if p.queue.next_at() != before
                && before.is_none_or(|b| p.queue.next_at().is_some_and(|n| n < b))
            {
                rearm(p, now);
            }
        };
        match target {
            Some(i) => {
                if let Some(p) = self.ports.get_mut(i) {
                    one(i, p);
                }
            }
            None => {
                for (i, p) in self.ports.iter_mut().enumerate() {
                    one(i, p);
                }
            }
        }
    }
}

impl MemPort {
    /// This port's index on its switch.
    pub fn index(&self) -> usize {
        self.idx
    }

    /// Frames waiting (due or not) in this port's queue.
    pub fn queued(&self) -> usize {
        lock(&self.shared)
            .ports
            .get(self.idx)
            .map_or(0, |p| p.queue.len())
    }
}

impl PacketIo for MemPort {
    fn kind(&self) -> &'static str {
        "mem"
    }

    fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        {
            let mut s = lock(&self.shared);
            let Some(p) = s.ports.get_mut(self.idx) else {
                return Ok(0);
            };
            let now = Instant::now();
            while self.rx.len() < max {
                match p.queue.pop_ready(now) {
                    Some(f) => self.rx.push(f),
                    None => break,
                }
            }
            rearm(p, now);
            p.stats.rx_frames += self.rx.len() as u64;
            p.stats.rx_bytes += self.rx.iter().map(|f| f.len() as u64).sum::<u64>();
        }
        // The sink runs without the switch lock so senders are not blocked.
        let n = self.rx.len();
        for f in &self.rx {
            sink(f);
        }
        let mut s = lock(&self.shared);
        if let Some(p) = s.ports.get_mut(self.idx) {
            for f in self.rx.drain(..) {
                p.queue.recycle(f);
            }
        }
        self.rx.clear();
        Ok(n)
    }

    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        // Fill outside the lock (the core may be slow), deliver under it once.
        let mut n = 0;
        let mut dropped = 0u64;
        while n < max {
            let mut buf = self.pool.pop().unwrap_or_default();
            buf.resize(self.max_frame_len, 0);
            match fill(&mut buf) {
                Some(len) if len <= self.max_frame_len && len >= 14 => {
                    buf.truncate(len);
                    self.tx.push(buf);
                }
                Some(_) => {
                    dropped += 1;
                    self.pool.push(buf);
                }
                None => {
                    self.pool.push(buf);
                    break;
                }
            }
            n += 1;
        }
        let now = Instant::now();
        let mut s = lock(&self.shared);
        for f in &self.tx {
            s.deliver(self.idx, f, now);
        }
        if let Some(p) = s.ports.get_mut(self.idx) {
            p.stats.tx_frames += self.tx.len() as u64;
            p.stats.tx_bytes += self.tx.iter().map(|f| f.len() as u64).sum::<u64>();
            p.stats.tx_dropped += dropped;
        }
        drop(s);
        self.pool.append(&mut self.tx);
        Ok(n)
    }

    fn poll_fd(&self) -> RawFd {
        self.timer.raw()
    }

    /// The switch floods multicast MACs to every port: nothing to join.
    fn join_multicast(&mut self, _group: std::net::IpAddr) -> Result<(), NicError> {
        Ok(())
    }

    fn leave_multicast(&mut self, _group: std::net::IpAddr) -> Result<(), NicError> {
        Ok(())
    }

    fn stats(&self) -> Stats {
        lock(&self.shared)
            .ports
            .get(self.idx)
            .map(|p| p.stats)
            .unwrap_or_default()
    }
}

impl Drop for MemPort {
    fn drop(&mut self) {
        let mut s = lock(&self.shared);
        let idx = self.idx;
        s.macs.retain(|_, p| *p != idx);
        if let Some(p) = s.ports.get_mut(idx) {
            p.taken = false;
            while p
                .queue
                .pop_ready(Instant::now() + std::time::Duration::from_secs(3600))
                .is_some()
            {}
            p.timer.arm(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{build_udp_frame, HeaderSpec};
    use std::time::Duration;

    fn frame(src: [u8; 6], dst: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
        let spec = HeaderSpec {
            dst_mac: dst,
            src_mac: src,
            src: "198.18.0.1:49152".parse().unwrap(),
            dst: "198.18.0.2:4791".parse().unwrap(),
            tos: 0,
            ttl: 64,
        };
        let mut payload = vec![0u8; len - 42];
        payload[..4].copy_from_slice(&seq.to_be_bytes());
        build_udp_frame(&spec, &payload).unwrap()
    }

    #[test]
    fn pair_moves_batches_in_order() {
        let (mut a, mut b) = pair().unwrap();
        let frames: Vec<Vec<u8>> = (0..64)
            .map(|i| frame(a.mac(), b.mac(), i, 60 + i as usize * 100))
            .collect();
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
        assert_eq!(a.send_frames(&refs).unwrap(), 64);
        assert!(b.wait(Some(Duration::from_secs(1))).unwrap());
        let mut got = Vec::new();
        while b.recv_owned(16, &mut got).unwrap() > 0 {}
        assert_eq!(got, frames);
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!((sa.tx_frames, sb.rx_frames), (64, 64));
        assert_eq!(sa.tx_bytes, sb.rx_bytes);
        assert!(
            !b.wait(Some(Duration::from_millis(1))).unwrap(),
            "fd idle when drained"
        );
    }

    #[test]
    fn switch_learns_and_floods() {
        let sw = Switch::new(SwitchConfig {
            ports: 3,
            ..SwitchConfig::default()
        })
        .unwrap();
        let mut p: Vec<MemPort> = (0..3).map(|i| sw.port(i).unwrap()).collect();
        let bcast = [0xFF; 6];
        // Port 0 broadcasts: both others see it, and the switch learns p0's MAC.
        let m0 = p[0].mac();
        p[0].send_frames(&[&frame(m0, bcast, 1, 60)]).unwrap();
        let mut got = Vec::new();
        assert_eq!(p[1].recv_owned(8, &mut got).unwrap(), 1);
        assert_eq!(p[2].recv_owned(8, &mut got).unwrap(), 1);
        // Port 2 answers p0 by unicast: only p0 gets it.
        let m2 = p[2].mac();
        p[2].send_frames(&[&frame(m2, m0, 2, 60)]).unwrap();
        assert_eq!(p[0].recv_owned(8, &mut got).unwrap(), 1);
        assert_eq!(p[1].recv_owned(8, &mut got).unwrap(), 0);
        assert!(sw.port(1).is_err(), "a port is taken once");
    }

    #[test]
    fn full_queue_drops_and_counts() {
        let (mut a, mut b) = pair_with(SwitchConfig {
            queue_frames: 10,
            ..SwitchConfig::default()
        })
        .unwrap();
        let f = frame(a.mac(), b.mac(), 0, 100);
        for _ in 0..15 {
            a.send_frames(&[&f]).unwrap();
        }
        let mut got = Vec::new();
        b.recv_owned(64, &mut got).unwrap();
        assert_eq!(got.len(), 10);
        assert_eq!(b.stats().rx_dropped, 5);
    }

    #[test]
    fn faults_are_seeded_and_delay_wakes_fd() {
        let cfg = SwitchConfig {
            faults: Some(FaultConfig {
                loss: 0.1,
                dup: 0.05,
                corrupt: 0.05,
                reorder: 0.05,
                delay: Duration::from_millis(5),
                ..FaultConfig::default()
            }),
            ..SwitchConfig::default()
        };
        let run = || {
            let (mut a, mut b) = pair_with(cfg).unwrap();
            let t0 = Instant::now();
            for i in 0..500 {
                a.send_frames(&[&frame(a.mac(), b.mac(), i, 80)]).unwrap();
            }
            let mut got = Vec::new();
            // Nothing is due before the 5 ms delay...
            b.recv_owned(1000, &mut got).unwrap();
            assert!(got.is_empty() || t0.elapsed() >= Duration::from_millis(5));
            // ...and the fd wakes once it is.
            while b.wait(Some(Duration::from_millis(100))).unwrap() {
                b.recv_owned(1000, &mut got).unwrap();
            }
            assert!(t0.elapsed() >= Duration::from_millis(5));
            got
        };
        let g1 = run();
        let g2 = run();
        assert_eq!(g1.len(), g2.len(), "same seed, same survivors");
        assert!(g1.len() > 400 && g1.len() < 500, "{}", g1.len());
    }
}
