//! Rabenseifner's allreduce for mid-size and large vectors: a reduce-scatter
//! by recursive halving, then an allgather by recursive doubling, over the
//! largest power of two p ≤ n ranks (the n − p extra ranks first fold their
//! vector into a neighbour and get the result back at the end).
//!
//! Each of the log2(p) halving steps swaps half of the range still owned
//! with the partner at distance p/2, p/4, …, 1, so a rank sends
//! (p−1)/p of the vector in all, like the ring, but in log2(p) steps
//! instead of p−1: fewer round trips for the same bytes.

use std::ops::Range;

use super::fold::Fold;
use crate::communicator::{block, split_pair, Communicator};
use crate::dtype::{finish, Element, ReduceOp};
use crate::error::Result;

impl Communicator<'_> {
    /// Allreduce into `buf`, in place, or of `src` (as long as `buf`) on a
    /// power-of-two rank count (no fold-in step, which would need the
    /// vector in `buf`): the first halving step reads this rank's operand
    /// from `src` and every later one works in `buf`.
    pub(crate) fn allreduce_rabenseifner<T: Element>(
        &self,
        buf: &mut [T],
        src: Option<&[T]>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.size();
        let fold = Fold::new(n, self.rank());
        if src.is_some() && fold.p != n {
            return Err(crate::error::Error::Invalid(format!(
                "out-of-place Rabenseifner on {n} ranks (not a power of two)"
            )));
        }
        let Some(vr) = fold.fold_in(self, buf, op)? else {
            return Ok(());
        };
        let (p, real) = (fold.p, |v: usize| fold.real(v));
        // Blocks of the p virtual ranks; [lo, hi) is the block range still owned.
        let blocks: Vec<Range<usize>> = (0..p).map(|i| block(buf.len(), p, i)).collect();
        let span = |lo: usize, hi: usize| blocks[lo].start..blocks[hi - 1].end;
        let (mut lo, mut hi) = (0, p);
        let mut mask = p / 2;
        while mask > 0 {
            let vp = vr ^ mask;
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if vr & mask == 0 {
                (span(lo, mid), span(mid, hi))
            } else {
                (span(mid, hi), span(lo, mid))
            };
            // Folded in as it arrives; the lower virtual rank's partial
            // always goes on the left.
            match src {
                // First step: both halves still only in `src`.
                Some(src) if mask == p / 2 => {
                    let (snd, acc) = (&src[give], &mut buf[keep.clone()]);
                    let local = Some(&src[keep]);
                    self.sendrecv_fold((real(vp), snd), (real(vp), acc), local, op, vp < vr)?;
                }
                _ => {
                    let (snd, acc) = split_pair(buf, give, keep);
                    self.sendrecv_fold((real(vp), snd), (real(vp), acc), None, op, vp < vr)?;
                }
            }
            if vr & mask == 0 {
                hi = mid;
            } else {
                lo = mid;
            }
            mask >>= 1;
        }
        finish(op, &mut buf[span(lo, hi)], n);
        // Allgather: the owned range doubles each step.
        let mut mask = 1;
        while mask < p {
            let vp = vr ^ mask;
            // [lo, hi) is `mask` blocks aligned to `mask`: the partner's is the twin.
            let (plo, phi) = (lo ^ mask, (lo ^ mask) + (hi - lo));
            let (mine, theirs) = (span(lo, hi), span(plo, phi));
            let (snd, rcv) = split_pair(buf, mine, theirs);
            self.sendrecv(Some((real(vp), snd)), Some((real(vp), rcv)))?;
            lo = lo.min(plo);
            hi = hi.max(phi);
            mask <<= 1;
        }
        fold.fold_out(self, buf)
    }
}
