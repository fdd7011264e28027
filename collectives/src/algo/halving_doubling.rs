//! Recursive doubling allreduce for small messages: log2(p) rounds in which
//! partners swap whole vectors, plus a fold step for non-powers of two.
//! (Rabenseifner's halving-doubling for larger vectors is in `rabenseifner`.)

use super::fold::Fold;
use crate::communicator::Communicator;
use crate::dtype::{finish, reduce_lower, reduce_upper, Element, ReduceOp};
use crate::error::Result;

impl Communicator<'_> {
    pub(crate) fn allreduce_recursive_doubling<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.size();
        let fold = Fold::new(n, self.rank());
        let Some(vr) = fold.fold_in(self, buf, op)? else {
            return Ok(());
        };
        let p = fold.p;
        self.with_scratch::<T, _>(buf.len(), |tmp| {
            let mut mask = 1;
            while mask < p {
                let vp = vr ^ mask;
                let peer = fold.real(vp);
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
        fold.fold_out(self, buf)
    }
}
