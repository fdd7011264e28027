//! The slot/credit exchange both RDMA backends run (`rdma` over
//! ferroce-verbs, `ibverbs` over rdma-core's libibverbs), once, over a
//! [`Link`]: the few verbs calls a backend makes for it.
//!
//! Per peer pair and direction the receiver has a ring of `slots` receive
//! slots of `chunk` bytes. Chunk `s` of a direction (counted over the life of
//! the pair) goes from send slot `s % slots` by RDMA WRITE WITH IMMEDIATE into
//! receive slot `s % slots`; the immediate is `wire::data_imm(len,
//! credits)`. The receiver learns of it from a receive completion, copies (or
//! folds) it out of the slot, and owes the sender a credit for it: credits
//! ride on the next chunk back, or go alone in a zero-length SEND WITH
//! IMMEDIATE once [`credit_due`]. A sender never has
//! more than `slots` chunks the receiver has not handed back, nor reuses a
//! send slot before its WRITE completed. RC delivers and completes in order,
//! so both sides agree on slot numbers without further bookkeeping.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ferroce_stack::transport::copy_bytes;

use super::rdma::RdmaConfig;
use super::{wire, Fold, RecvSpec, SendSpec};
use crate::error::{Error, Result};

/// Completions polled per round (one poll call's worth).
const POLL_BATCH: usize = 64;

/// A work completion, as the exchange sees it. `usize` is the peer rank
/// (every work request's `wr_id`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Completion<Op> {
    /// A data WRITE WITH IMMEDIATE completed.
    DataSent(usize),
    /// A lone credit SEND completed.
    CreditsSent(usize),
    /// A chunk arrived in the next receive slot: its immediate.
    DataArrived(usize, u32),
    /// A lone credit SEND arrived: its immediate (the count).
    CreditsArrived(usize, u32),
    /// A work request failed, with the status's name.
    Failed(usize, &'static str),
    /// An opcode the protocol never causes.
    Unexpected(usize, Op),
}

/// What a backend does for the exchange. Peer ranks are the ones the
/// exchange was built with; slot `s` is bytes `s * chunk ..` of a ring.
pub(crate) trait Link {
    /// A completion's opcode, shown in the error for an unexpected one.
    type Opcode: Copy + std::fmt::Debug;
    /// Copy `data` (at most a chunk) into send slot `slot` towards `peer`
    /// and post a signaled RDMA WRITE WITH IMMEDIATE `imm` of it into the
    /// peer's receive slot `slot`. The slot's previous WRITE has completed.
    fn post_data(&mut self, peer: usize, slot: usize, data: &[u8], imm: u32) -> Result<()>;
    /// Post a signaled zero-length SEND WITH IMMEDIATE `n` (credits).
    fn post_credits(&mut self, peer: usize, n: u32) -> Result<()>;
    /// Post one receive (no scatter list: only immediates arrive) from `peer`.
    fn post_recv(&mut self, peer: usize) -> Result<()>;
    /// Append up to `max` waiting completions to `out`, oldest first.
    fn poll(&mut self, max: usize, out: &mut Vec<Completion<Self::Opcode>>) -> Result<()>;
    /// Run `f` on the first `len` bytes of receive slot `slot` from `peer`.
    /// Its chunk has arrived, and the peer does not write the slot again
    /// before its credit goes back.
    fn with_slot<R>(
        &mut self,
        peer: usize,
        slot: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R>;
    /// Ask to be woken by the next completion before sleeping; true when a
    /// completion that came before the request would not wake us, so the CQ
    /// must be polled once more first.
    fn arm(&mut self) -> Result<bool>;
    /// Sleep until a completion may be waiting, or `d` passed.
    fn sleep(&mut self, d: Duration) -> Result<()>;
}

/// One direction pair's bookkeeping.
#[derive(Debug)]
struct Peer {
    /// Receive slots free at the peer.
    credits: usize,
    data_posted: u64,
    data_done: u64,
    credit_posted: u64,
    credit_done: u64,
    /// Lengths of chunks arrived and not yet consumed, in order.
    arrived: VecDeque<u32>,
    consumed: u64,
    /// Chunks consumed whose credits the peer has not been sent yet.
    unreported: u32,
}

/// The exchange state of one rank over its link to every other rank.
#[derive(Debug)]
pub(crate) struct Exchange<L: Link> {
    pub(crate) link: L,
    rank: usize,
    size: usize,
    chunk: usize,
    slots: usize,
    timeout: Duration,
    spin: Duration,
    peers: Vec<Option<Peer>>,
    wcs: Vec<Completion<L::Opcode>>,
    /// Per peer, whether an earlier send (or receive) is still active this
    /// round; kept to spare the loop an allocation per round.
    busy: Vec<bool>,
}

/// A credit-only SEND is due once half the ring (at least one slot) has been
/// consumed without a credit riding back on data, and no more than a ring's
/// worth of credit messages is still outstanding.
fn credit_due(unreported: u32, slots: usize, posted: u64, done: u64) -> bool {
    unreported as usize >= (slots / 2).max(1) && posted - done < slots as u64
}

/// The time-out error, naming (sorted, once each) the ranks whose send or
/// receive had not completed.
fn timeout_error(
    timeout: Duration,
    sends: &[SendSpec<'_>],
    send_off: &[usize],
    recvs: &[RecvSpec<'_>],
    recv_off: &[usize],
) -> Error {
    let mut waiting_on: Vec<usize> = sends
        .iter()
        .zip(send_off)
        .filter(|(s, off)| **off < s.1.len())
        .map(|(s, _)| s.0)
        .chain(
            recvs
                .iter()
                .zip(recv_off)
                .filter(|(r, off)| **off < r.1.len())
                .map(|(r, _)| r.0),
        )
        .collect();
    waiting_on.sort_unstable();
    waiting_on.dedup();
    Error::Timeout {
        timeout,
        waiting_on,
    }
}

fn peer_of(peers: &mut [Option<Peer>], j: usize, rank: usize) -> Result<&mut Peer> {
    peers
        .get_mut(j)
        .and_then(Option::as_mut)
        .ok_or_else(|| Error::Invalid(format!("rank {j} is not a peer of rank {rank}")))
}

fn protocol(peer: usize, what: String) -> Error {
    Error::Protocol { peer, what }
}

impl<L: Link> Exchange<L> {
    /// `link` reaches every rank of `0..size` but `rank`, each with a full
    /// ring of free receive slots and receives posted.
    pub(crate) fn new(link: L, rank: usize, size: usize, cfg: &RdmaConfig) -> Exchange<L> {
        let peers = (0..size)
            .map(|j| {
                (j != rank).then(|| Peer {
                    credits: cfg.slots,
                    data_posted: 0,
                    data_done: 0,
                    credit_posted: 0,
                    credit_done: 0,
                    arrived: VecDeque::new(),
                    consumed: 0,
                    unreported: 0,
                })
            })
            .collect();
        Exchange {
            link,
            rank,
            size,
            chunk: cfg.chunk,
            slots: cfg.slots,
            timeout: cfg.timeout,
            spin: cfg.spin,
            peers,
            wcs: Vec::with_capacity(POLL_BATCH),
            busy: vec![false; size],
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Handle the completions waiting; returns how many.
    fn drain(&mut self) -> Result<usize> {
        self.wcs.clear();
        self.link.poll(POLL_BATCH, &mut self.wcs)?;
        let slots = self.slots;
        let chunk = self.chunk;
        for &wc in &self.wcs {
            let j = match wc {
                Completion::Failed(peer, status) => return Err(Error::Completion { peer, status }),
                Completion::DataSent(j)
                | Completion::CreditsSent(j)
                | Completion::DataArrived(j, _)
                | Completion::CreditsArrived(j, _)
                | Completion::Unexpected(j, _) => j,
            };
            let p = peer_of(&mut self.peers, j, self.rank)?;
            match wc {
                Completion::DataSent(_) => p.data_done += 1,
                Completion::CreditsSent(_) => p.credit_done += 1,
                Completion::DataArrived(_, imm) => {
                    let (len, back) = wire::split_imm(imm);
                    if back > 0 {
                        if p.credits + back > slots {
                            return Err(protocol(
                                j,
                                format!(
                                    "returned {back} credits with {} held of {slots}",
                                    p.credits
                                ),
                            ));
                        }
                        p.credits += back;
                    }
                    if len as usize > chunk || len == 0 {
                        return Err(protocol(
                            j,
                            format!("chunk of {len} bytes (chunk size {chunk})"),
                        ));
                    }
                    if p.arrived.len() >= slots {
                        return Err(protocol(j, format!("more than {slots} chunks outstanding")));
                    }
                    p.arrived.push_back(len);
                    self.link.post_recv(j)?;
                }
                Completion::CreditsArrived(_, imm) => {
                    let n = imm as usize;
                    if n == 0 || p.credits + n > slots {
                        return Err(protocol(
                            j,
                            format!("returned {n} credits with {} held of {slots}", p.credits),
                        ));
                    }
                    p.credits += n;
                    self.link.post_recv(j)?;
                }
                Completion::Unexpected(_, op) => {
                    return Err(protocol(j, format!("unexpected completion {op:?}")))
                }
                Completion::Failed(..) => {}
            }
        }
        Ok(self.wcs.len())
    }

    /// Run every send and receive to completion; with `fold`, receives are
    /// combined into their buffers chunk by chunk instead of copied.
    pub(crate) fn run(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        mut fold: Option<Fold<'_>>,
    ) -> Result<()> {
        let (chunk, slots, rank) = (self.chunk, self.slots, self.rank);
        for &(j, _) in sends.iter() {
            peer_of(&mut self.peers, j, rank)?;
        }
        for (j, _) in recvs.iter() {
            peer_of(&mut self.peers, *j, rank)?;
        }
        // Progress offsets; per peer only the first unfinished op is active.
        let mut send_off = vec![0usize; sends.len()];
        let mut recv_off = vec![0usize; recvs.len()];
        let mut last_progress = Instant::now();
        loop {
            let mut progressed = self.drain()? > 0;
            let mut all_done = true;
            // Sends.
            let busy = &mut self.busy;
            busy.fill(false);
            for (k, &(j, data)) in sends.iter().enumerate() {
                if send_off[k] >= data.len() {
                    continue;
                }
                all_done = false;
                if std::mem::replace(&mut busy[j], true) {
                    continue;
                }
                let p = peer_of(&mut self.peers, j, rank)?;
                while send_off[k] < data.len()
                    && p.credits > 0
                    && p.data_posted - p.data_done < slots as u64
                {
                    let len = (data.len() - send_off[k]).min(chunk);
                    let slot = (p.data_posted % slots as u64) as usize;
                    let imm = wire::data_imm(len, p.unreported);
                    self.link
                        .post_data(j, slot, &data[send_off[k]..send_off[k] + len], imm)?;
                    p.credits -= 1;
                    p.unreported = 0;
                    p.data_posted += 1;
                    send_off[k] += len;
                    progressed = true;
                }
                if send_off[k] >= data.len() {
                    busy[j] = false;
                }
            }
            // Receives.
            let busy = &mut self.busy;
            busy.fill(false);
            for (k, (j, buf)) in recvs.iter_mut().enumerate() {
                let j = *j;
                if recv_off[k] >= buf.len() {
                    continue;
                }
                all_done = false;
                if std::mem::replace(&mut busy[j], true) {
                    continue;
                }
                let p = peer_of(&mut self.peers, j, rank)?;
                while recv_off[k] < buf.len() {
                    let Some(&len) = p.arrived.front() else { break };
                    let want = (buf.len() - recv_off[k]).min(chunk);
                    if len as usize != want {
                        return Err(protocol(
                            j,
                            format!(
                                "chunk of {len} bytes where {want} were expected \
                                 (mismatched message sizes?)"
                            ),
                        ));
                    }
                    p.arrived.pop_front();
                    let slot = (p.consumed % slots as u64) as usize;
                    let dst = &mut buf[recv_off[k]..recv_off[k] + want];
                    match fold.as_mut() {
                        None => self
                            .link
                            .with_slot(j, slot, want, |src| copy_bytes(dst, src)),
                        Some(f) => {
                            let at = recv_off[k];
                            self.link.with_slot(j, slot, want, |src| f(at, dst, src))
                        }
                    }?;
                    p.consumed += 1;
                    p.unreported += 1;
                    recv_off[k] += want;
                    progressed = true;
                }
                if recv_off[k] >= buf.len() {
                    busy[j] = false;
                }
            }
            // Credits back when none rode on data and half the ring is consumed.
            for (j, p) in self.peers.iter_mut().enumerate() {
                let Some(p) = p else { continue };
                if credit_due(p.unreported, slots, p.credit_posted, p.credit_done) {
                    self.link.post_credits(j, p.unreported)?;
                    p.credit_posted += 1;
                    p.unreported = 0;
                    progressed = true;
                }
            }
            if all_done {
                return Ok(());
            }
            if progressed {
                last_progress = Instant::now();
                continue;
            }
            let idle = last_progress.elapsed();
            if idle < self.spin {
                // Stay runnable (as MPI's progress loop does): with more
                // ranks than cores, a sleeping rank costs a wake-up on every
                // message, while a yielding one lets the peer run now.
                std::thread::yield_now();
                continue;
            }
            if idle >= self.timeout {
                return Err(timeout_error(
                    self.timeout,
                    sends,
                    &send_off,
                    recvs,
                    &recv_off,
                ));
            }
            if self.link.arm()? && self.drain()? > 0 {
                last_progress = Instant::now();
                continue;
            }
            self.link
                .sleep((self.timeout - idle).min(Duration::from_millis(20)))?;
        }
    }

    /// For a transport's drop: let the last WRITEs and credit SENDs complete
    /// (their ACKs came back) before the QPs go away, until `quiet` also
    /// holds, for at most the time-out (2 s at most). `nap` waits a little
    /// when nothing completed.
    pub(crate) fn settle(&mut self, quiet: impl Fn(&L) -> bool, mut nap: impl FnMut(&mut L)) {
        let deadline = Instant::now() + self.timeout.min(Duration::from_secs(2));
        while Instant::now() < deadline {
            let pending = self
                .peers
                .iter()
                .flatten()
                .any(|p| p.data_posted != p.data_done || p.credit_posted != p.credit_done);
            if !pending && quiet(&self.link) {
                break;
            }
            match self.drain() {
                Ok(0) => nap(&mut self.link),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
}
