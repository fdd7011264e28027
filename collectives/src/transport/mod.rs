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

use crate::error::Result;

#[cfg(feature = "rdma-core")]
#[allow(unsafe_code)] // FFI: buffers registered with the device
pub mod ibverbs;
pub mod local;
pub mod rdma;
pub(crate) mod wire;

/// One send: (world rank, bytes).
pub type SendSpec<'a> = (usize, &'a [u8]);
/// One receive: (world rank, buffer of exactly the expected length).
pub type RecvSpec<'a> = (usize, &'a mut [u8]);

/// An ordered, reliable byte-message transport between the ranks of a world.
pub trait Transport {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Run every send and receive to completion (or fail within the
    /// transport's time-out when nothing moves).
    fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()>;
}
