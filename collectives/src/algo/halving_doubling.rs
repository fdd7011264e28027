//! Recursive doubling allreduce for small messages: log2(p) rounds in which
//! partners swap whole vectors, plus a fold step for non-powers of two.
//! (Rabenseifner's halving-doubling for larger vectors is in `rabenseifner`.)

use crate::communicator::Communicator;
use crate::dtype::{finish, reduce_lower, reduce_upper, Element, ReduceOp};
use crate::error::Result;

impl Communicator<'_> {
    pub(crate) fn allreduce_recursive_doubling<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let extra = n - p;
        if r < 2 * extra && r % 2 == 0 {
            // Fold: ranks 2i (i < extra) hand their vector to 2i+1 and wait.
            self.sendrecv::<T>(Some((r + 1, &*buf)), None)?;
            return self.sendrecv::<T>(None, Some((r + 1, &mut *buf)));
        }
        self.with_scratch::<T, _>(buf.len(), |tmp| {
            let vr = if r < 2 * extra {
                self.sendrecv::<T>(None, Some((r - 1, &mut *tmp)))?;
                reduce_upper(op, buf, tmp);
                r / 2
            } else {
                r - extra
            };
            let real = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };
            let mut mask = 1;
            while mask < p {
                let vp = vr ^ mask;
                let peer = real(vp);
                self.sendrecv(Some((peer, &*buf)), Some((peer, &mut *tmp)))?;
                if vp < vr {
                    reduce_upper(op, buf, tmp);
                } else {
                    reduce_lower(op, buf, tmp);
                }
                mask <<= 1;
            }
            Ok(())
        })?;
        finish(op, buf, n);
        if r < 2 * extra {
            self.sendrecv::<T>(Some((r - 1, &*buf)), None)?;
        }
        Ok(())
    }
}
