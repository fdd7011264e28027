//! The communicator: a group of ranks over a shared transport, with
//! point-to-point and collective operations.
//!
//! Operations are matched by order: every rank of a communicator must call
//! the same collectives in the same order (as in MPI and NCCL). Buffers are
//! typed slices of an [`Element`]; counts are element counts.

use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

use crate::dtype::{reduce_into, reduce_lower, reduce_upper, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::transport::Transport;

/// Allreduce algorithm choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllreduceAlgo {
    /// Recursive doubling up to `small_bytes` (or with fewer elements than
    /// ranks); above, Rabenseifner on a power-of-two rank count or below
    /// `ring_bytes`, else the ring.
    Auto,
    /// Reduce-scatter then allgather around the ring: bandwidth-optimal.
    Ring,
    /// Recursive doubling (pairs exchange whole vectors): latency-optimal.
    RecursiveDoubling,
    /// Recursive halving reduce-scatter + recursive doubling allgather:
    /// the ring's bytes in log2(n) steps.
    Rabenseifner,
}

/// Broadcast / reduce algorithm choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeAlgo {
    /// Binomial below `chain_bytes` or with ≤ 2 ranks, pipelined chain above.
    Auto,
    Binomial,
    Chain,
}

/// Algorithm selection and its thresholds (the override knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algorithms {
    pub allreduce: AllreduceAlgo,
    pub broadcast: TreeAlgo,
    pub reduce: TreeAlgo,
    /// Auto allreduce uses recursive doubling up to this many bytes.
    pub small_bytes: usize,
    /// Auto allreduce on a rank count that is not a power of two uses the
    /// ring from this many bytes (Rabenseifner's fold step moves whole
    /// vectors, which the ring avoids).
    pub ring_bytes: usize,
    /// Auto broadcast/reduce use the chain from this many bytes.
    pub chain_bytes: usize,
    /// Segment of the pipelined chain, bytes.
    pub segment_bytes: usize,
}

impl Default for Algorithms {
    fn default() -> Self {
        Algorithms {
            allreduce: AllreduceAlgo::Auto,
            broadcast: TreeAlgo::Auto,
            reduce: TreeAlgo::Auto,
            small_bytes: 16 << 10,
            ring_bytes: 1 << 20,
            chain_bytes: 512 << 10,
            segment_bytes: 128 << 10,
        }
    }
}

impl Algorithms {
    /// Defaults, overridden by `FERROCE_ALLREDUCE_ALGO` (`ring`, `rd`),
    /// `FERROCE_BCAST_ALGO` and `FERROCE_REDUCE_ALGO` (`binomial`, `chain`).
    pub fn from_env() -> Result<Algorithms> {
        let mut a = Algorithms::default();
        if let Ok(v) = std::env::var("FERROCE_ALLREDUCE_ALGO") {
            a.allreduce = parse_allreduce(&v)?;
        }
        if let Ok(v) = std::env::var("FERROCE_BCAST_ALGO") {
            a.broadcast = parse_tree(&v)?;
        }
        if let Ok(v) = std::env::var("FERROCE_REDUCE_ALGO") {
            a.reduce = parse_tree(&v)?;
        }
        Ok(a)
    }
}

pub fn parse_allreduce(s: &str) -> Result<AllreduceAlgo> {
    match s {
        "auto" => Ok(AllreduceAlgo::Auto),
        "ring" => Ok(AllreduceAlgo::Ring),
        "rd" | "recursive-doubling" => Ok(AllreduceAlgo::RecursiveDoubling),
        "rab" | "rabenseifner" | "halving-doubling" => Ok(AllreduceAlgo::Rabenseifner),
        o => Err(Error::Invalid(format!(
            "allreduce algorithm {o:?} (auto, ring, rd, rab)"
        ))),
    }
}

pub fn parse_tree(s: &str) -> Result<TreeAlgo> {
    match s {
        "auto" => Ok(TreeAlgo::Auto),
        "binomial" | "tree" => Ok(TreeAlgo::Binomial),
        "chain" | "pipeline" => Ok(TreeAlgo::Chain),
        o => Err(Error::Invalid(format!(
            "tree algorithm {o:?} (auto, binomial, chain)"
        ))),
    }
}

/// A group of ranks. Not `Send`: one communicator per rank thread; the
/// communicators made by [`Communicator::split`] share its transport.
pub struct Communicator<'t> {
    pub(crate) transport: Rc<RefCell<dyn Transport + 't>>,
    /// World rank of each member, by communicator rank.
    pub(crate) members: Vec<usize>,
    pub(crate) rank: usize,
    pub(crate) algos: Algorithms,
    /// Temporary space of the algorithms, kept between calls (a fresh
    /// multi-MiB vector per call costs page faults on every touch).
    scratch: Rc<RefCell<Vec<u64>>>,
}

impl std::fmt::Debug for Communicator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("members", &self.members)
            .field("algos", &self.algos)
            .finish()
    }
}

pub(crate) fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}
pub(crate) fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// Block `i` of `n` of a `count`-element vector: the first `count % n`
/// blocks have one element more.
pub(crate) fn block(count: usize, n: usize, i: usize) -> Range<usize> {
    let (q, r) = (count / n, count % n);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

/// Fold incoming bytes into `dst` bytes as `T`s (see
/// [`Communicator::sendrecv_fold`]); with `local`, `dst` is overwritten by
/// `local` folded with the incoming bytes (the out-of-place first step),
/// in one pass rather than a copy of `local` and a fold. `dst` comes from a
/// `[T]`, so it is aligned; bytes that are not (a receive slot is, at chunk
/// sizes that are multiples of 8) go through aligned copies rather than a
/// panic.
fn fold_bytes<T: Element>(
    op: ReduceOp,
    incoming_first: bool,
    dst: &mut [u8],
    local: Option<&[u8]>,
    src: &[u8],
) {
    let copied;
    let other: &[T] = match bytemuck::try_cast_slice(src) {
        Ok(o) => o,
        Err(_) => {
            copied = aligned_copy::<T>(src);
            &copied
        }
    };
    if let Some(local) = local {
        if let (Ok(acc), Ok(mine)) = (
            bytemuck::try_cast_slice_mut::<u8, T>(dst),
            bytemuck::try_cast_slice::<u8, T>(local),
        ) {
            if incoming_first {
                reduce_into(op, acc, other, mine)
            } else {
                reduce_into(op, acc, mine, other)
            }
            return;
        }
        dst.copy_from_slice(local);
    }
    let fold = |acc: &mut [T], other: &[T]| {
        if incoming_first {
            reduce_upper(op, acc, other)
        } else {
            reduce_lower(op, acc, other)
        }
    };
    match bytemuck::try_cast_slice_mut::<u8, T>(dst) {
        Ok(acc) => fold(acc, other),
        Err(_) => {
            let mut acc = aligned_copy::<T>(dst);
            fold(&mut acc, other);
            let n = dst.len();
            dst.copy_from_slice(&bytes(&acc)[..n]);
        }
    }
}

/// `b` as `T`s in fresh (aligned) storage, the tail zero-padded.
fn aligned_copy<T: Element>(b: &[u8]) -> Vec<T> {
    let mut v =
        vec![<T as bytemuck::Zeroable>::zeroed(); b.len().div_ceil(std::mem::size_of::<T>())];
    bytes_mut(&mut v)[..b.len()].copy_from_slice(b);
    v
}

/// `(&buf[a], &mut buf[b])` for disjoint ranges.
pub(crate) fn split_pair<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    if a.end <= b.start {
        let (x, y) = buf.split_at_mut(b.start);
        (&x[a], &mut y[..b.end - b.start])
    } else {
        let (x, y) = buf.split_at_mut(a.start);
        (&y[..a.end - a.start], &mut x[b])
    }
}

impl<'t> Communicator<'t> {
    /// The world communicator of a transport, with algorithms from the environment.
    pub fn new(transport: impl Transport + 't) -> Result<Communicator<'t>> {
        let algos = Algorithms::from_env()?;
        let rank = transport.rank();
        let members = (0..transport.size()).collect();
        Ok(Communicator {
            transport: Rc::new(RefCell::new(transport)),
            members,
            rank,
            algos,
            scratch: Rc::default(),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.members.len()
    }
    pub fn algorithms(&self) -> Algorithms {
        self.algos
    }
    /// Override algorithm choices for this communicator.
    pub fn set_algorithms(&mut self, a: Algorithms) {
        self.algos = a;
    }

    /// Run `f` on `len` elements of scratch space (contents unspecified).
    /// Not re-entrant: algorithms call it once at a time.
    pub(crate) fn with_scratch<T: Element, R>(
        &self,
        len: usize,
        f: impl FnOnce(&mut [T]) -> Result<R>,
    ) -> Result<R> {
        let mut s = self
            .scratch
            .try_borrow_mut()
            .map_err(|_| Error::Invalid("scratch space in use (nested collective)".into()))?;
        let words = (len * std::mem::size_of::<T>()).div_ceil(8);
        if s.len() < words {
            s.resize(words, 0);
        }
        let all: &mut [T] = bytemuck::cast_slice_mut(&mut s[..words]);
        f(&mut all[..len])
    }

    /// Run sends and receives (communicator ranks) together.
    pub(crate) fn xchg(
        &self,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> Result<()> {
        let n = self.size();
        let world = |r: usize| {
            self.members
                .get(r)
                .copied()
                .ok_or_else(|| Error::Invalid(format!("rank {r} is outside a communicator of {n}")))
        };
        let s: Vec<(usize, &[u8])> = sends
            .iter()
            .map(|&(r, b)| Ok((world(r)?, b)))
            .collect::<Result<_>>()?;
        let mut rv: Vec<(usize, &mut [u8])> = Vec::with_capacity(recvs.len());
        for (r, b) in recvs.iter_mut() {
            rv.push((world(*r)?, &mut **b));
        }
        self.transport.borrow_mut().exchange(&s, &mut rv)
    }

    /// Run raw byte sends and receives (communicator ranks) together: the
    /// transport primitive, for tools and custom patterns.
    pub fn exchange_raw(
        &self,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> Result<()> {
        self.xchg(sends, recvs)
    }

    pub(crate) fn sendrecv<T: Element>(
        &self,
        send: Option<(usize, &[T])>,
        recv: Option<(usize, &mut [T])>,
    ) -> Result<()> {
        let sends: Vec<(usize, &[u8])> = send.map(|(r, b)| (r, bytes(b))).into_iter().collect();
        let mut recvs: Vec<(usize, &mut [u8])> =
            recv.map(|(r, b)| (r, bytes_mut(b))).into_iter().collect();
        self.xchg(&sends, &mut recvs)
    }

    /// Send `send` while `recv` is combined with the partner's message:
    /// `recv[i] = incoming[i] op recv[i]` if `incoming_first` (the incoming
    /// partial covers lower ranks), else `recv[i] op incoming[i]`. The same
    /// element-wise order as receiving into a temporary and then calling
    /// `reduce_upper` / `reduce_lower`, but the transport may fold each
    /// chunk as it lands. `send` and `recv` must not overlap.
    ///
    /// With `local`, this rank's operand is `local` (as long as `recv`)
    /// instead of what `recv` holds: each arriving chunk is folded with its
    /// part of `local` and written to `recv`, which saves an out-of-place
    /// collective a pass over the whole vector to copy it in first.
    pub(crate) fn sendrecv_fold<T: Element>(
        &self,
        send: (usize, &[T]),
        recv: (usize, &mut [T]),
        local: Option<&[T]>,
        op: ReduceOp,
        incoming_first: bool,
    ) -> Result<()> {
        let n = self.size();
        if let Some(l) = local {
            Self::check_len("local operand", l.len(), recv.1.len())?;
        }
        let local = local.map(bytes);
        let world = |r: usize| {
            self.members
                .get(r)
                .copied()
                .ok_or_else(|| Error::Invalid(format!("rank {r} is outside a communicator of {n}")))
        };
        let sends = [(world(send.0)?, bytes(send.1))];
        let mut recvs = [(world(recv.0)?, bytes_mut(recv.1))];
        let mut fold = |at: usize, dst: &mut [u8], src: &[u8]| {
            let mine = local.and_then(|l| l.get(at..at + dst.len()));
            fold_bytes::<T>(op, incoming_first, dst, mine, src)
        };
        self.transport.borrow_mut().exchange_fold(
            &sends,
            &mut recvs,
            std::mem::size_of::<T>(),
            &mut fold,
        )
    }

    fn check_rank(&self, r: usize, what: &str) -> Result<()> {
        if r >= self.size() {
            return Err(Error::Invalid(format!(
                "{what} rank {r} in a communicator of {}",
                self.size()
            )));
        }
        Ok(())
    }

    fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(Error::Invalid(format!(
                "{what} has {got} elements, {want} expected"
            )));
        }
        Ok(())
    }

    /// Send `buf` to `dst` (matched by the `dst`'s `recv` of the same length).
    pub fn send<T: Element>(&self, buf: &[T], dst: usize) -> Result<()> {
        self.check_rank(dst, "destination")?;
        if dst == self.rank {
            return Err(Error::Invalid("send to self".into()));
        }
        self.sendrecv::<T>(Some((dst, buf)), None)
    }

    /// Receive exactly `buf.len()` elements from `src`.
    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()> {
        self.check_rank(src, "source")?;
        if src == self.rank {
            return Err(Error::Invalid("receive from self".into()));
        }
        self.sendrecv::<T>(None, Some((src, buf)))
    }

    /// Dissemination barrier: ⌈log2 n⌉ rounds of one-byte tokens.
    pub fn barrier(&self) -> Result<()> {
        let (n, r) = (self.size(), self.rank);
        let mut dist = 1;
        while dist < n {
            let mut token = [0u8; 1];
            self.sendrecv::<u8>(
                Some(((r + dist) % n, &[1u8])),
                Some(((r + n - dist) % n, &mut token)),
            )?;
            dist <<= 1;
        }
        Ok(())
    }

    /// Broadcast `buf` from `root` to every rank (in place).
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_rank(root, "root")?;
        if self.size() == 1 || buf.is_empty() {
            return Ok(());
        }
        let chain = match self.algos.broadcast {
            TreeAlgo::Binomial => false,
            TreeAlgo::Chain => true,
            TreeAlgo::Auto => {
                self.size() > 2 && std::mem::size_of_val(buf) >= self.algos.chain_bytes
            }
        };
        if chain {
            self.bcast_chain(buf, root)
        } else {
            self.bcast_binomial(buf, root)
        }
    }

    /// Reduce `send` from every rank into `recv` at `root` (`recv` is
    /// ignored elsewhere and may be empty there).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_rank(root, "root")?;
        if self.rank == root {
            Self::check_len("reduce receive buffer", recv.len(), send.len())?;
            recv.copy_from_slice(send);
            self.reduce_in_place(recv, op, root)
        } else {
            let mut acc = send.to_vec();
            self.reduce_in_place(&mut acc, op, root)
        }
    }

    /// Reduce into `buf` at `root`; other ranks' `buf` is left as it was.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_rank(root, "root")?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.size() == 1 {
            crate::dtype::finish(op, buf, 1);
            return Ok(());
        }
        let chain = match self.algos.reduce {
            TreeAlgo::Binomial => false,
            TreeAlgo::Chain => true,
            TreeAlgo::Auto => {
                self.size() > 2 && std::mem::size_of_val(buf) >= self.algos.chain_bytes
            }
        };
        if self.rank == root {
            if chain {
                self.reduce_chain(buf, op, root)
            } else {
                self.reduce_binomial(buf, op, root)
            }
        } else {
            let mut acc = buf.to_vec();
            if chain {
                self.reduce_chain(&mut acc, op, root)
            } else {
                self.reduce_binomial(&mut acc, op, root)
            }
        }
    }

    /// Allreduce out of place. The ring, and Rabenseifner's algorithm on a
    /// power-of-two rank count, read `send` where they first need this
    /// rank's operand; the others start from a copy of it in `recv`. Either
    /// way the result is the in-place one, bit for bit.
    pub fn allreduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        Self::check_len("allreduce receive buffer", recv.len(), send.len())?;
        if !send.is_empty() && self.size() > 1 {
            match self.allreduce_algo_for(std::mem::size_of_val(send), send.len()) {
                AllreduceAlgo::Ring => return self.allreduce_ring(recv, Some(send), op),
                AllreduceAlgo::Rabenseifner if self.size().is_power_of_two() => {
                    return self.allreduce_rabenseifner(recv, Some(send), op)
                }
                _ => {}
            }
        }
        recv.copy_from_slice(send);
        self.allreduce_in_place(recv, op)
    }

    /// The algorithm [`Communicator::allreduce`] would use for `bytes` bytes
    /// of `count` elements.
    pub fn allreduce_algo_for(&self, bytes: usize, count: usize) -> AllreduceAlgo {
        match self.algos.allreduce {
            AllreduceAlgo::Auto => {
                let n = self.size();
                if bytes <= self.algos.small_bytes || count < n {
                    AllreduceAlgo::RecursiveDoubling
                } else if n.is_power_of_two() || bytes < self.algos.ring_bytes {
                    AllreduceAlgo::Rabenseifner
                } else {
                    AllreduceAlgo::Ring
                }
            }
            a => a,
        }
    }

    /// Allreduce in place.
    pub fn allreduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if self.size() == 1 {
            crate::dtype::finish(op, buf, 1);
            return Ok(());
        }
        match self.allreduce_algo_for(std::mem::size_of_val(buf), buf.len()) {
            AllreduceAlgo::Ring => self.allreduce_ring(buf, None, op),
            AllreduceAlgo::Rabenseifner => self.allreduce_rabenseifner(buf, None, op),
            _ => self.allreduce_recursive_doubling(buf, op),
        }
    }

    /// Gather `send` (count elements) from every rank into `recv` (n × count), rank order.
    pub fn allgather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let c = send.len();
        Self::check_len("allgather receive buffer", recv.len(), c * self.size())?;
        recv[self.rank * c..(self.rank + 1) * c].copy_from_slice(send);
        self.allgather_in_place(recv)
    }

    /// Allgather where this rank's contribution already sits at `buf[rank*count..]`.
    pub fn allgather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.size();
        if !buf.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "allgather buffer of {} elements is not a multiple of {n} ranks",
                buf.len()
            )));
        }
        let c = buf.len() / n;
        let blocks: Vec<Range<usize>> = (0..n).map(|i| i * c..(i + 1) * c).collect();
        if c == 0 || n == 1 {
            return Ok(());
        }
        self.ring_allgather(buf, &blocks)
    }

    /// Reduce `send` (n × count) and scatter: rank r gets block r in `recv` (count).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, c) = (self.size(), recv.len());
        Self::check_len("reduce_scatter send buffer", send.len(), n * c)?;
        let mut tmp = send.to_vec();
        self.reduce_scatter_in_place(&mut tmp, op)?;
        recv.copy_from_slice(&tmp[self.rank * c..(self.rank + 1) * c]);
        Ok(())
    }

    /// Reduce-scatter in place: the result lands at `buf[rank*count..(rank+1)*count]`;
    /// the rest of `buf` holds partial sums afterwards.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.size();
        if !buf.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "reduce_scatter buffer of {} elements is not a multiple of {n} ranks",
                buf.len()
            )));
        }
        let c = buf.len() / n;
        if c == 0 {
            return Ok(());
        }
        let blocks: Vec<Range<usize>> = (0..n).map(|i| i * c..(i + 1) * c).collect();
        if n > 1 {
            self.ring_reduce_scatter(buf, None, &blocks, op)?;
        }
        crate::dtype::finish(op, &mut buf[blocks[self.rank].clone()], n);
        Ok(())
    }

    /// Block j of `send` (n × count) goes to rank j; block i of `recv` comes from rank i.
    pub fn alltoall<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        Self::check_len("alltoall receive buffer", recv.len(), send.len())?;
        if !send.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "alltoall buffer of {} elements is not a multiple of {n} ranks",
                send.len()
            )));
        }
        let c = send.len() / n;
        let r = self.rank;
        recv[r * c..(r + 1) * c].copy_from_slice(&send[r * c..(r + 1) * c]);
        if c == 0 || n == 1 {
            return Ok(());
        }
        // Everything at once, in the pairwise order (r+s, r−s) so no peer
        // is waited on by everyone first.
        let sends: Vec<(usize, &[u8])> = (1..n)
            .map(|s| {
                let j = (r + s) % n;
                (j, bytes(&send[j * c..(j + 1) * c]))
            })
            .collect();
        let mut order: Vec<usize> = (1..n).map(|s| (r + n - s) % n).collect();
        let mut chunks: Vec<(usize, &mut [u8])> = Vec::with_capacity(n - 1);
        let mut rest: Vec<Option<&mut [T]>> = recv.chunks_mut(c).map(Some).collect();
        for i in order.drain(..) {
            let b = rest[i]
                .take()
                .ok_or_else(|| Error::Invalid("alltoall block".into()))?;
            chunks.push((i, bytes_mut(b)));
        }
        self.xchg(&sends, &mut chunks)
    }

    /// Alltoall in place.
    pub fn alltoall_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let send = buf.to_vec();
        self.alltoall(&send, buf)
    }

    /// Split into sub-communicators: ranks with the same `color` form one,
    /// ordered by (`key`, old rank). The new communicators share this one's
    /// connections (operations on parent and children must still be issued
    /// in the same order on every rank involved).
    pub fn split(&self, color: u32, key: i32) -> Result<Communicator<'t>> {
        let n = self.size();
        let mine = [i64::from(color), i64::from(key)];
        let mut all = vec![0i64; 2 * n];
        self.allgather(&mine, &mut all)?;
        let mut group: Vec<(i64, usize)> = (0..n)
            .filter(|&i| all[2 * i] == i64::from(color))
            .map(|i| (all[2 * i + 1], i))
            .collect();
        group.sort_unstable();
        let rank = group
            .iter()
            .position(|&(_, i)| i == self.rank)
            .ok_or_else(|| Error::Invalid("split: this rank is not in its own group".into()))?;
        Ok(Communicator {
            transport: Rc::clone(&self.transport),
            members: group.iter().map(|&(_, i)| self.members[i]).collect(),
            rank,
            algos: self.algos,
            scratch: Rc::clone(&self.scratch),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_bytes_is_reduce_upper_or_lower_at_any_alignment() {
        let acc0: Vec<f32> = vec![1.5, -2.0, 3.25];
        let inc: Vec<f32> = vec![0.5, 4.0, -1.0];
        for first in [true, false] {
            let mut want = acc0.clone();
            if first {
                reduce_upper(ReduceOp::Sum, &mut want, &inc);
            } else {
                reduce_lower(ReduceOp::Sum, &mut want, &inc);
            }
            // Aligned, then both sides one byte off a 4-byte boundary.
            let mut acc = acc0.clone();
            fold_bytes::<f32>(ReduceOp::Sum, first, bytes_mut(&mut acc), None, bytes(&inc));
            assert_eq!(acc, want);
            // The local operand read from elsewhere: dst's old bytes do not count.
            let mut out = vec![f32::NAN; 3];
            fold_bytes::<f32>(
                ReduceOp::Sum,
                first,
                bytes_mut(&mut out),
                Some(bytes(&acc0)),
                bytes(&inc),
            );
            assert_eq!(out, want);
            let (mut dw, mut sw) = ([0i32; 4], [0i32; 4]);
            let d = &mut bytes_mut(&mut dw)[1..13];
            d.copy_from_slice(bytes(&acc0));
            let s = &mut bytes_mut(&mut sw)[1..13];
            s.copy_from_slice(bytes(&inc));
            fold_bytes::<f32>(ReduceOp::Sum, first, d, None, s);
            assert_eq!(&*d, bytes(&want));
            // Unaligned everywhere, with a local operand (also unaligned).
            let mut lw = [0i32; 4];
            let l = &mut bytes_mut(&mut lw)[1..13];
            l.copy_from_slice(bytes(&acc0));
            let mut ow = [-1i32; 4];
            let o = &mut bytes_mut(&mut ow)[1..13];
            fold_bytes::<f32>(ReduceOp::Sum, first, o, Some(&*l), s);
            assert_eq!(&*o, bytes(&want));
        }
    }
}
