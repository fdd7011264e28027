//! Point-to-point transports under a communicator.
//!
//! A transport moves ordered byte messages between world ranks. The one
//! primitive is [`Transport::exchange`]: post a set of sends and receives and
//! progress them all together until every one is done, so algorithms that
//! send to one neighbour while receiving from another never deadlock on
//! flow control. Messages between a pair of ranks are matched in order (no
//! tags): both sides must issue their operations in the same order, which
//! collectives called in the same order on every rank guarantee. A
//! zero-length message moves nothing and matches a zero-length receive.
//! [`Transport::exchange_fold`] is the same with receives reduced into
//! their buffers on arrival (the reduce-scatter steps).

use crate::error::Result;

mod exchange;
#[cfg(feature = "rdma-core")]
#[allow(unsafe_code)] // FFI: buffers registered with the device
pub mod ibverbs;
pub mod local;
pub mod rdma;
mod region;
pub mod split;
pub(crate) mod wire;

/// One send: (world rank, bytes).
pub type SendSpec<'a> = (usize, &'a [u8]);
/// One receive: (world rank, buffer of exactly the expected length).
pub type RecvSpec<'a> = (usize, &'a mut [u8]);
/// Combines incoming bytes into a receive buffer: `fold(at, dst, incoming)`,
/// where `dst` is bytes `at..` of the receive buffer.
pub type Fold<'a> = &'a mut dyn FnMut(usize, &mut [u8], &[u8]);

/// An ordered, reliable byte-message transport between the ranks of a world.
pub trait Transport {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Run every send and receive to completion (or fail within the
    /// transport's time-out when nothing moves).
    fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()>;

    /// [`exchange`](Transport::exchange), but each incoming message is
    /// combined into its receive buffer by `fold(at, dst, incoming)` (equal
    /// lengths) instead of overwriting it. A transport may call `fold` piece
    /// by piece as data arrives, each piece starting at a multiple of
    /// `align` bytes into the message; folds are element-wise, so the
    /// result is the same. No send may alias a receive buffer. This
    /// default receives whole messages into temporaries first.
    fn exchange_fold(
        &mut self,
        sends: &[SendSpec<'_>],
        recvs: &mut [RecvSpec<'_>],
        align: usize,
        fold: Fold<'_>,
    ) -> Result<()> {
        let _ = align;
        exchange_fold_whole(self, sends, recvs, fold)
    }
}

/// [`Transport::exchange_fold`] by whole messages: receive into
/// temporaries, then fold each.
pub(crate) fn exchange_fold_whole<T: Transport + ?Sized>(
    t: &mut T,
    sends: &[SendSpec<'_>],
    recvs: &mut [RecvSpec<'_>],
    fold: Fold<'_>,
) -> Result<()> {
    let mut tmps: Vec<Vec<u8>> = recvs.iter().map(|(_, b)| vec![0; b.len()]).collect();
    let mut specs: Vec<RecvSpec<'_>> = recvs
        .iter()
        .zip(tmps.iter_mut())
        .map(|((j, _), t)| (*j, t.as_mut_slice()))
        .collect();
    t.exchange(sends, &mut specs)?;
    for ((_, b), t) in recvs.iter_mut().zip(&tmps) {
        fold(0, b, t);
    }
    Ok(())
}
