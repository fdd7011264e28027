//! A simulated network on a virtual clock, for testing the transport core
//! the way smoltcp and quinn-proto test themselves.
//!
//! N [`Core`]s hang off one switch; node `i` has MAC `02:00:00:00:00:i` and
//! IP `10.0.0.(i+1)` (or `fd00::(i+1)`). Every frame may be lost,
//! duplicated, delayed past up to `reorder_depth` later frames, or have one
//! bit flipped (which the receiver's ICRC check must catch), all drawn from a
//! seeded RNG so a failing seed replays exactly. Each sender's port
//! serialises its frames, so the clock moves like a real link.

use core::net::{Ipv4Addr, Ipv6Addr};
use core::time::Duration;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::transport::{
    AccessFlags, Config, Core, Instant, Path, QpAttr, QpAttrMask, QpState, QpType, MAX_FRAME_LEN,
};
use crate::wire::{PacketRepr, ParsedPacket};

/// Fault and timing model of every link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    pub latency: Duration,
    /// Nanoseconds to put one byte on the wire (0.125 = 64 Gb/s).
    pub ns_per_byte: f64,
    pub loss: f64,
    pub duplicate: f64,
    /// Probability a frame is held back behind later ones.
    pub reorder: f64,
    /// How many later frames (at most) overtake a held-back frame.
    pub reorder_depth: u32,
    /// Probability one bit of the frame (past the Ethernet header) is flipped.
    pub corrupt: f64,
}

impl LinkConfig {
    /// A perfect 64 Gb/s link with 2 µs latency.
    pub fn perfect() -> LinkConfig {
        LinkConfig {
            latency: Duration::from_micros(2),
            ns_per_byte: 0.125,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_depth: 0,
            corrupt: 0.0,
        }
    }
    /// The soak faults: 10% loss, 5% duplication, reorder depth 8, 1% corruption.
    pub fn lossy() -> LinkConfig {
        LinkConfig {
            loss: 0.10,
            duplicate: 0.05,
            reorder: 0.10,
            reorder_depth: 8,
            corrupt: 0.01,
            ..LinkConfig::perfect()
        }
    }
}

/// What the network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub delivered: u64,
    pub dropped_by_script: u64,
}

/// Scripted fault: return `true` to drop this frame (src node, dst node, parsed headers).
pub type DropFn = Box<dyn FnMut(usize, usize, &PacketRepr) -> bool>;

struct InFlight {
    at: Instant,
    seq: u64,
    dst: usize,
    frame: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// N cores joined by a faulty switch.
pub struct Network {
    pub now: Instant,
    pub cores: Vec<Core>,
    pub link: LinkConfig,
    pub stats: SimStats,
    /// Build IPv6 paths instead of IPv4-mapped ones.
    pub ipv6: bool,
    /// Scripted drops, consulted before the random faults.
    pub drop_if: Option<DropFn>,
    rng: Xoshiro256PlusPlus,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    port_free: Vec<Instant>,
    seq: u64,
    buf: Vec<u8>,
}

impl core::fmt::Debug for Network {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Network")
            .field("now", &self.now)
            .field("cores", &self.cores.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Network {
    /// `n` cores with default limits; core `i` is seeded from `seed` and `i`.
    pub fn new(n: usize, link: LinkConfig, seed: u64) -> Network {
        Network::with_config(n, link, seed, Config::default())
    }

    /// `n` cores with the limits in `cfg`.
    pub fn with_config(n: usize, link: LinkConfig, seed: u64, cfg: Config) -> Network {
        let cores = (0..n)
            .map(|i| {
                Core::new(
                    cfg,
                    seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1)),
                )
            })
            .collect();
        Network {
            now: Instant::ZERO,
            cores,
            link,
            stats: SimStats::default(),
            ipv6: false,
            drop_if: None,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            in_flight: BinaryHeap::new(),
            port_free: vec![Instant::ZERO; n],
            seq: 0,
            buf: vec![0; MAX_FRAME_LEN],
        }
    }

    pub fn mac(i: usize) -> [u8; 6] {
        [2, 0, 0, 0, 0, i as u8]
    }

    pub fn gid(&self, i: usize) -> Ipv6Addr {
        if self.ipv6 {
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i as u16 + 1)
        } else {
            Ipv4Addr::new(10, 0, 0, i as u8 + 1).to_ipv6_mapped()
        }
    }

    /// The path from node `src` to node `dst`.
    pub fn path(&self, src: usize, dst: usize) -> Path {
        Path {
            src_mac: Self::mac(src),
            dst_mac: Self::mac(dst),
            sgid: self.gid(src),
            dgid: self.gid(dst),
            ..Path::default()
        }
    }

    /// Move every frame every core has ready onto the wire. Cores with an
    /// odd index write theirs with `poll_transmit_split` (payloads left in
    /// their regions, joined here as a gathering backend would), the others
    /// with `poll_transmit`, so every simulated exchange runs both paths.
    pub fn transmit(&mut self) {
        let mut buf = core::mem::take(&mut self.buf);
        let mut joined = Vec::new();
        for i in 0..self.cores.len() {
            if i % 2 == 0 {
                while let Some(n) = self.cores[i].poll_transmit(self.now, &mut buf) {
                    self.send(i, &buf[..n]);
                }
                continue;
            }
            while let Some(s) = self.cores[i].poll_transmit_split(self.now, &mut buf) {
                joined.clear();
                joined.extend_from_slice(&buf[..s.head]);
                if let Some(p) = s.payload {
                    match self.cores[i].tx_payload(&p) {
                        Some(bytes) => joined.extend_from_slice(bytes),
                        None => continue,
                    }
                    joined.extend_from_slice(&buf[s.head..s.head + s.tail]);
                }
                self.send(i, &joined);
            }
        }
        self.buf = buf;
    }

    fn send(&mut self, src: usize, frame: &[u8]) {
        self.stats.sent += 1;
        let dst = frame.get(5).map_or(usize::MAX, |b| usize::from(*b));
        if dst >= self.cores.len() {
            self.stats.lost += 1;
            return;
        }
        if let Some(f) = self.drop_if.as_mut() {
            if let Ok(p) = ParsedPacket::parse(frame) {
                if f(src, dst, &p.repr) {
                    self.stats.dropped_by_script += 1;
                    return;
                }
            }
        }
        let l = self.link;
        if self.rng.random_bool(l.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.random_bool(l.duplicate) {
            2
        } else {
            1
        };
        self.stats.duplicated += copies - 1;
        let ser = Duration::from_nanos((frame.len() as f64 * l.ns_per_byte) as u64 + 20);
        for _ in 0..copies {
            let mut bytes = frame.to_vec();
            if bytes.len() > 14 && self.rng.random_bool(l.corrupt) {
                let at = self.rng.random_range(14..bytes.len());
                bytes[at] ^= 1 << self.rng.random_range(0..8);
                self.stats.corrupted += 1;
            }
            let depart = self.now.max(self.port_free[src]);
            self.port_free[src] = depart + ser;
            let mut at = depart + ser + l.latency;
            if l.reorder_depth > 0 && self.rng.random_bool(l.reorder) {
                let k = self.rng.random_range(1..=l.reorder_depth);
                at = at + ser * k;
                self.stats.reordered += 1;
            }
            self.seq += 1;
            self.in_flight.push(Reverse(InFlight {
                at,
                seq: self.seq,
                dst,
                frame: bytes,
            }));
        }
    }

    /// The next time something happens (a delivery or a core's timer).
    pub fn next_event(&mut self) -> Option<Instant> {
        let mut next = self.in_flight.peek().map(|Reverse(f)| f.at);
        for c in &mut self.cores {
            if let Some(t) = c.poll_timeout() {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        }
        next
    }

    /// Transmit, then advance the clock to the next event and handle it.
    /// Returns `false` when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.transmit();
        let Some(t) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(t);
        while let Some(Reverse(f)) = self.in_flight.peek() {
            if f.at > self.now {
                break;
            }
            if let Some(Reverse(f)) = self.in_flight.pop() {
                self.stats.delivered += 1;
                self.cores[f.dst].handle_frame(self.now, &f.frame);
            }
        }
        for c in &mut self.cores {
            if c.poll_timeout().is_some_and(|t| t <= self.now) {
                c.handle_timeout(self.now);
            }
        }
        true
    }

    /// Step until nothing is left to do or `limit` of virtual time has passed.
    pub fn run_idle(&mut self, limit: Duration) {
        let end = self.now + limit;
        while self.now <= end && self.step() {}
    }
}

/// Attributes for bringing up a connected pair with [`connect`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectCfg {
    pub path_mtu: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub access: AccessFlags,
}

impl Default for ConnectCfg {
    fn default() -> ConnectCfg {
        ConnectCfg {
            path_mtu: 1024,
            // 4.096 µs × 2^10 ≈ 4.2 ms: many round trips of the simulated link.
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            access: AccessFlags::ALL,
        }
    }
}

/// Bring QP `qa` on node `a` and QP `qb` on node `b` to RTS, connected
/// (`psn_a` is what `a` sends first, `psn_b` what `b` sends first).
#[allow(clippy::too_many_arguments)]
pub fn connect(
    net: &mut Network,
    a: usize,
    qa: u32,
    b: usize,
    qb: u32,
    qp_type: QpType,
    cfg: &ConnectCfg,
    psn_a: u32,
    psn_b: u32,
) -> Result<(), crate::transport::VerbsError> {
    for (me, qp, peer, rqp, sq_psn, rq_psn) in
        [(a, qa, b, qb, psn_a, psn_b), (b, qb, a, qa, psn_b, psn_a)]
    {
        let path = net.path(me, peer);
        let core = &mut net.cores[me];
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: cfg.access,
            port_num: 1,
            qkey: 0x1111_1111,
            ..QpAttr::default()
        };
        let init_mask = match qp_type {
            QpType::Ud => {
                QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY
            }
            _ => {
                QpAttrMask::STATE
                    | QpAttrMask::PKEY_INDEX
                    | QpAttrMask::PORT
                    | QpAttrMask::ACCESS_FLAGS
            }
        };
        core.modify_qp(qp, &attr, init_mask)?;
        attr.qp_state = QpState::Rtr;
        attr.ah_attr = path;
        attr.path_mtu = cfg.path_mtu;
        attr.dest_qp_num = rqp;
        attr.rq_psn = rq_psn;
        attr.max_dest_rd_atomic = cfg.max_rd_atomic;
        attr.min_rnr_timer = cfg.min_rnr_timer;
        let rtr_mask = match qp_type {
            QpType::Rc => {
                QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER
            }
            QpType::Uc => {
                QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
            }
            QpType::Ud => QpAttrMask::STATE,
        };
        core.modify_qp(qp, &attr, rtr_mask)?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = sq_psn;
        attr.timeout = cfg.timeout;
        attr.retry_cnt = cfg.retry_cnt;
        attr.rnr_retry = cfg.rnr_retry;
        attr.max_rd_atomic = cfg.max_rd_atomic;
        let rts_mask = match qp_type {
            QpType::Rc => {
                QpAttrMask::STATE
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC
            }
            _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        };
        core.modify_qp(qp, &attr, rts_mask)?;
    }
    Ok(())
}
