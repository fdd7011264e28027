//! Non-power-of-two rank counts for recursive doubling and Rabenseifner: the
//! n − p ranks beyond the largest power of two p ≤ n fold their vector into a
//! neighbour first and get the result back at the end, so the algorithm
//! proper runs over p virtual ranks.

use crate::communicator::Communicator;
use crate::dtype::{reduce_upper, Element, ReduceOp};
use crate::error::Result;

/// How n ranks map onto p virtual ones: ranks 2i and 2i+1 (i < extra)
/// become virtual rank i (2i+1 does the work), rank r ≥ 2·extra becomes
/// r − extra.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fold {
    /// The largest power of two ≤ n.
    pub p: usize,
    extra: usize,
    rank: usize,
}

impl Fold {
    pub fn new(n: usize, rank: usize) -> Fold {
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        Fold {
            p,
            extra: n - p,
            rank,
        }
    }

    /// The real rank behind virtual rank `v`.
    pub fn real(&self, v: usize) -> usize {
        if v < self.extra {
            2 * v + 1
        } else {
            v + self.extra
        }
    }

    fn paired(&self) -> bool {
        self.rank < 2 * self.extra
    }

    /// Folds in: an even paired rank hands its vector to its odd neighbour
    /// and waits for the result (then `None`: `buf` holds it); the odd one
    /// reduces the neighbour's vector into `buf` on its left. Returns this
    /// rank's virtual rank.
    pub fn fold_in<T: Element>(
        &self,
        comm: &Communicator<'_>,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<Option<usize>> {
        let r = self.rank;
        if !self.paired() {
            return Ok(Some(r - self.extra));
        }
        if r.is_multiple_of(2) {
            comm.sendrecv::<T>(Some((r + 1, &*buf)), None)?;
            comm.sendrecv::<T>(None, Some((r + 1, &mut *buf)))?;
            return Ok(None);
        }
        comm.with_scratch::<T, _>(buf.len(), |tmp| {
            comm.sendrecv::<T>(None, Some((r - 1, &mut *tmp)))?;
            reduce_upper(op, buf, tmp);
            Ok(())
        })?;
        Ok(Some(r / 2))
    }

    /// Folds out: the odd paired rank gives the result back to its neighbour.
    pub fn fold_out<T: Element>(&self, comm: &Communicator<'_>, buf: &[T]) -> Result<()> {
        if self.paired() {
            comm.sendrecv::<T>(Some((self.rank - 1, buf)), None)?;
        }
        Ok(())
    }
}
