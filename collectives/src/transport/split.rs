//! Two transports between the same ranks: messages of at most `max_small`
//! bytes go over one, larger ones over the other. On veth a raw AF_XDP
//! device answers small exchanges fastest (its receive ring is polled
//! without a system call) while the UDP backend moves bulk data fastest
//! (GSO/GRO), so a rank may hold a device of each.
//!
//! Both ends of a message see its length, so both put it on the same
//! transport, and each transport keeps its own per-pair order. An exchange
//! with messages of both kinds runs its small ones first, then its large
//! ones: a rank's small part waits only on other ranks' small parts, which
//! wait on nothing large, so the split adds no deadlock the single
//! transport did not have.

use super::{Fold, RecvSpec, SendSpec, Transport};
use crate::error::{Error, Result};

/// `small` for messages of at most `max_small` bytes, `large` for the rest.
#[derive(Debug)]
pub struct SplitTransport<S, L> {
    small: S,
    large: L,
    max_small: usize,
}

impl<S: Transport, L: Transport> SplitTransport<S, L> {
    /// Both transports must join the same ranks, as the same rank.
    pub fn new(small: S, large: L, max_small: usize) -> Result<Self> {
        if (small.rank(), small.size()) != (large.rank(), large.size()) {
            return Err(Error::Invalid(format!(
                "split transport: rank {} of {} for small messages, {} of {} for large",
                small.rank(),
                small.size(),
                large.rank(),
                large.size()
            )));
        }
        Ok(SplitTransport {
            small,
            large,
            max_small,
        })
    }

    /// The transports and the threshold.
    pub fn parts(&self) -> (&S, &L, usize) {
        (&self.small, &self.large, self.max_small)
    }

    /// Runs `run` with each transport's share of one exchange, the small
    /// messages' transport first; a transport with none is left out.
    fn in_turn(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        mut run: impl FnMut(&mut dyn Transport, &[SendSpec<'_>], &mut [RecvSpec<'_>]) -> Result<()>,
    ) -> Result<()> {
        let [(ss, mut sr), (ls, mut lr)] = split(sends, recvs, self.max_small);
        if !ss.is_empty() || !sr.is_empty() {
            run(&mut self.small, &ss, &mut sr)?;
        }
        if !ls.is_empty() || !lr.is_empty() {
            run(&mut self.large, &ls, &mut lr)?;
        }
        Ok(())
    }
}

type Parts<'s, 'r> = [(Vec<SendSpec<'s>>, Vec<RecvSpec<'r>>); 2];

/// Sends and receives by transport: `[small, large]`.
fn split<'s, 'r>(
    sends: &[SendSpec<'s>],
    recvs: &'r mut [RecvSpec<'_>],
    max_small: usize,
) -> Parts<'s, 'r> {
    let mut parts: Parts<'s, 'r> = Default::default();
    for &(j, data) in sends {
        parts[usize::from(data.len() > max_small)].0.push((j, data));
    }
    for (j, buf) in recvs.iter_mut() {
        let k = usize::from(buf.len() > max_small);
        parts[k].1.push((*j, &mut **buf));
    }
    parts
}

impl<S: Transport, L: Transport> Transport for SplitTransport<S, L> {
    fn rank(&self) -> usize {
        self.large.rank()
    }
    fn size(&self) -> usize {
        self.large.size()
    }

    fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()> {
        self.in_turn(sends, recvs, |t, s, r| t.exchange(s, r))
    }

    fn exchange_fold(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        align: usize,
        fold: Fold<'_>,
    ) -> Result<()> {
        self.in_turn(sends, recvs, |t, s, r| {
            t.exchange_fold(s, r, align, &mut *fold)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;
    use crate::transport::local::{local_world, LocalTransport};
    use crate::{Communicator, ReduceOp};

    /// A local transport that counts the bytes it was asked to send.
    struct Counted(LocalTransport, Rc<Cell<usize>>);

    impl Transport for Counted {
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn size(&self) -> usize {
            self.0.size()
        }
        fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()> {
            self.1
                .set(self.1.get() + sends.iter().map(|s| s.1.len()).sum::<usize>());
            self.0.exchange(sends, recvs)
        }
    }

    #[test]
    fn messages_take_the_transport_of_their_size() {
        let n = 4;
        let t = Duration::from_secs(10);
        let (smalls, larges) = (local_world(n, t), local_world(n, t));
        let max_small = 1024;
        std::thread::scope(|s| {
            for (small, large) in smalls.into_iter().zip(larges) {
                s.spawn(move || {
                    let (sc, lc) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
                    let split = SplitTransport::new(
                        Counted(small, Rc::clone(&sc)),
                        Counted(large, Rc::clone(&lc)),
                        max_small,
                    )
                    .unwrap();
                    let comm = Communicator::new(split).unwrap();
                    let r = comm.rank() as i32;
                    // 8 B: every message small. 1 MiB: every message large.
                    for (len, small_only) in [(2usize, true), (1 << 18, false)] {
                        let (s0, l0) = (sc.get(), lc.get());
                        let mut v = vec![0; len];
                        comm.allreduce(&vec![r + 1; len], &mut v, ReduceOp::Sum)
                            .unwrap();
                        assert!(v.iter().all(|&x| x == 10), "allreduce of {len}");
                        let (ds, dl) = (sc.get() - s0, lc.get() - l0);
                        if small_only {
                            assert!(ds > 0 && dl == 0, "{len}: small {ds} B, large {dl} B");
                        } else {
                            assert!(dl > 0 && ds == 0, "{len}: small {ds} B, large {dl} B");
                        }
                    }
                    // Sizes around the threshold and not divisible by the
                    // rank count: blocks of both kinds in one exchange.
                    for len in [255usize, 256, 257, 1023, 1025, 4099] {
                        let mut v = vec![0; len];
                        comm.allreduce(&vec![r + 1; len], &mut v, ReduceOp::Sum)
                            .unwrap();
                        assert!(v.iter().all(|&x| x == 10), "allreduce of {len}");
                        let mut g = vec![0i32; len * n];
                        comm.allgather(&vec![r; len], &mut g).unwrap();
                        for (k, chunk) in g.chunks(len).enumerate() {
                            assert!(chunk.iter().all(|&x| x == k as i32), "allgather of {len}");
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn both_parts_must_be_the_same_rank() {
        let t = Duration::from_secs(1);
        let mut a = local_world(2, t);
        let mut b = local_world(2, t);
        let (a1, b0) = (a.pop().unwrap(), b.swap_remove(0));
        assert!(SplitTransport::new(a1, b0, 8).is_err());
    }
}
