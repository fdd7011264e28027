//! ferroce-collectives: MPI/NCCL-shaped communicators over RDMA.
//!
//! Bootstraps ranks from the environment conventions of torchrun, Open MPI,
//! PMI and Slurm, rendezvous over TCP, and runs point-to-point and collective
//! operations (allreduce, broadcast, reduce, allgather, reduce-scatter,
//! alltoall, barrier) with algorithms chosen by message size and rank count,
//! over `ferroce-verbs` or, with the `rdma-core` feature, rdma-core's
//! libibverbs (real RNICs, rxe); ranks of both kinds can share a job. The
//! reduction order of each algorithm is in [`algo`].
// unsafe only in the rdma-core FFI backend (transport::ibverbs).
#![deny(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod algo;
pub mod bind;
pub mod bootstrap;
pub mod communicator;
pub mod dtype;
pub mod error;
pub mod transport;
pub mod world;

pub use bootstrap::{Bootstrap, Rendezvous};
pub use communicator::{Algorithms, AllreduceAlgo, Communicator, TreeAlgo};
pub use dtype::{DType, Element, ReduceOp};
pub use error::{Error, Result};
pub use half;
#[cfg(feature = "rdma-core")]
pub use transport::ibverbs::{IbvEndpoint, IbvTransport};
pub use transport::local::{local_world, LocalTransport};
pub use transport::rdma::{RdmaConfig, RdmaEndpoint, RdmaTransport};
pub use transport::split::SplitTransport;
pub use transport::Transport;
