//! Binomial-tree and pipelined-chain broadcast and reduce, rooted anywhere
//! (ranks are renumbered relative to the root: v = (rank − root) mod n).

use crate::communicator::Communicator;
use crate::dtype::{finish, reduce_lower, Element, ReduceOp};
use crate::error::Result;

impl Communicator<'_> {
    fn seg_elems<T: Element>(&self) -> usize {
        (self.algos.segment_bytes / std::mem::size_of::<T>()).max(1)
    }

    pub(crate) fn bcast_binomial<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let v = (r + n - root) % n;
        let real = |x: usize| (x + root) % n;
        let mut mask = 1;
        while mask < n {
            if v & mask != 0 {
                self.sendrecv::<T>(None, Some((real(v - mask), &mut *buf)))?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        let mut kids = Vec::new();
        while mask > 0 {
            if v + mask < n {
                kids.push((real(v + mask), crate::communicator::bytes(&*buf)));
            }
            mask >>= 1;
        }
        self.xchg(&kids, &mut [])
    }

    pub(crate) fn bcast_chain<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let v = (r + n - root) % n;
        let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
        let seg = self.seg_elems::<T>();
        let nseg = buf.len().div_ceil(seg);
        let len = buf.len();
        let range = |k: usize| k * seg..((k + 1) * seg).min(len);
        if v == 0 {
            let sends: Vec<(usize, &[u8])> = (0..nseg)
                .map(|k| (next, crate::communicator::bytes(&buf[range(k)])))
                .collect();
            return self.xchg(&sends, &mut []);
        }
        let last = v == n - 1;
        // Step k: receive segment k while forwarding segment k−1.
        for k in 0..=nseg {
            let send = (k > 0 && !last).then(|| range(k - 1));
            let recv = (k < nseg).then(|| range(k));
            match (send, recv) {
                (Some(s), Some(rr)) => {
                    let (a, b) = buf.split_at_mut(rr.start);
                    self.sendrecv(Some((next, &a[s])), Some((prev, &mut b[..rr.len()])))?;
                }
                (Some(s), None) => self.sendrecv::<T>(Some((next, &buf[s])), None)?,
                (None, Some(rr)) => self.sendrecv::<T>(None, Some((prev, &mut buf[rr])))?,
                (None, None) => {}
            }
        }
        Ok(())
    }

    /// `buf` is this rank's contribution and, at the root, the result.
    pub(crate) fn reduce_binomial<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let v = (r + n - root) % n;
        let real = |x: usize| (x + root) % n;
        let mut tmp = vec![T::from_i64(0); buf.len()];
        let mut mask = 1;
        while mask < n {
            if v & mask != 0 {
                return self.sendrecv::<T>(Some((real(v - mask), &*buf)), None);
            }
            if v + mask < n {
                self.sendrecv::<T>(None, Some((real(v + mask), &mut tmp)))?;
                reduce_lower(op, buf, &tmp);
            }
            mask <<= 1;
        }
        finish(op, buf, n);
        Ok(())
    }

    pub(crate) fn reduce_chain<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let v = (r + n - root) % n;
        // Data flows from relative rank n−1 down to 0 (the root).
        let (up, down) = ((r + 1) % n, (r + n - 1) % n);
        let seg = self.seg_elems::<T>();
        let nseg = buf.len().div_ceil(seg);
        let len = buf.len();
        let range = |k: usize| k * seg..((k + 1) * seg).min(len);
        let first = v == n - 1;
        let mut tmp = vec![T::from_i64(0); seg.min(buf.len())];
        if first {
            let sends: Vec<(usize, &[u8])> = (0..nseg)
                .map(|k| (down, crate::communicator::bytes(&buf[range(k)])))
                .collect();
            return self.xchg(&sends, &mut []);
        }
        // Step k: receive segment k from upstream, send reduced segment k−1 down.
        for k in 0..=nseg {
            let send = (k > 0 && v > 0).then(|| range(k - 1));
            let recv = (k < nseg).then(|| range(k));
            let t_len = recv.as_ref().map_or(0, |x| x.len());
            let t = &mut tmp[..t_len];
            match send {
                Some(s) => self.sendrecv(
                    Some((down, &buf[s])),
                    recv.is_some().then_some((up, &mut *t)),
                )?,
                None => self.sendrecv::<T>(None, recv.is_some().then_some((up, &mut *t)))?,
            }
            if let Some(rr) = recv {
                reduce_lower(op, &mut buf[rr], t);
            }
        }
        if v == 0 {
            finish(op, buf, n);
        }
        Ok(())
    }
}
