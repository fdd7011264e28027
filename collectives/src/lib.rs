//! ferroce-collectives: MPI/NCCL-shaped communicators over RDMA.
//!
//! Bootstraps ranks from the environment conventions of torchrun, Open MPI,
//! PMI and Slurm, rendezvous over TCP, and runs point-to-point and collective
//! operations (allreduce, broadcast, reduce, allgather, reduce-scatter,
//! alltoall, barrier) with algorithms chosen by message size and rank count,
//! over `ferroce-verbs` or over rdma-core's libibverbs.
#![forbid(unsafe_code)]
