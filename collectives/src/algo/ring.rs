//! Ring reduce-scatter and allgather (together: ring allreduce).
//!
//! Each of the n−1 steps sends one block to the right neighbour while
//! receiving one from the left; the transport cuts each block into chunks
//! written with RDMA WRITE WITH IMMEDIATE into the neighbour's registered
//! slots, so a step's chunks stream back to back under credit flow control.

use std::ops::Range;

use crate::communicator::{block, split_pair, Communicator};
use crate::dtype::{finish, Element, ReduceOp};
use crate::error::Result;

impl Communicator<'_> {
    /// After this, `buf[blocks[rank]]` holds the reduction of every rank's block `rank`.
    /// This rank's vector is `src` if given (`buf` is then only written:
    /// each step folds a block this rank has not touched before), else `buf`.
    pub(crate) fn ring_reduce_scatter<T: Element>(
        &self,
        buf: &mut [T],
        src: Option<&[T]>,
        blocks: &[Range<usize>],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        for s in 0..n - 1 {
            let sb = blocks[(r + 2 * n - s - 1) % n].clone();
            let rb = blocks[(r + 2 * n - s - 2) % n].clone();
            if sb.is_empty() && rb.is_empty() {
                continue;
            }
            // The incoming partial covers the ranks before us in the fold;
            // it is folded in chunk by chunk as it arrives.
            let local = src.map(|src| &src[rb.clone()]);
            match src {
                // Step 0 sends this rank's own block; later steps the one
                // folded the step before (now in `buf`).
                Some(src) if s == 0 => {
                    let (snd, acc) = (&src[sb], &mut buf[rb]);
                    self.sendrecv_fold((right, snd), (left, acc), local, op, true)?;
                }
                _ => {
                    let (snd, acc) = split_pair(buf, sb, rb);
                    self.sendrecv_fold((right, snd), (left, acc), local, op, true)?;
                }
            }
        }
        Ok(())
    }

    /// Every rank starts with `buf[blocks[rank]]` and ends with all blocks.
    pub(crate) fn ring_allgather<T: Element>(
        &self,
        buf: &mut [T],
        blocks: &[Range<usize>],
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        for s in 0..n - 1 {
            let sb = blocks[(r + n - s) % n].clone();
            let rb = blocks[(r + 2 * n - s - 1) % n].clone();
            if sb.is_empty() && rb.is_empty() {
                continue;
            }
            let (snd, rcv) = split_pair(buf, sb, rb);
            self.sendrecv(Some((right, snd)), Some((left, rcv)))?;
        }
        Ok(())
    }

    /// Allreduce into `buf`, of `src` if given (as long as `buf`), else in place.
    pub(crate) fn allreduce_ring<T: Element>(
        &self,
        buf: &mut [T],
        src: Option<&[T]>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.size();
        let blocks: Vec<Range<usize>> = (0..n).map(|i| block(buf.len(), n, i)).collect();
        self.ring_reduce_scatter(buf, src, &blocks, op)?;
        finish(op, &mut buf[blocks[self.rank()].clone()], n);
        self.ring_allgather(buf, &blocks)
    }
}
