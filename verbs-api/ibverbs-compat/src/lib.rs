//! A drop-in `libibverbs.so.1` backed by ferroce: rdma-core's libibverbs ABI
//! (Debian 12, rdma-core 44: its symbol versions and, through bindgen, its
//! struct layouts), so unmodified ibverbs programs — perftest, the
//! `ibv_*_pingpong` tools, your own — run over ferroce with
//! `LD_LIBRARY_PATH=<dir with libibverbs.so.1>`.
//!
//! Build the library with `cargo run --release -p ferroce-ibverbs-compat`
//! (see `src/bin/ferroce-libibverbs.rs`). Configuration is by environment:
//! `FERROCE_DEVICE` (one interface or several) and `FERROCE_BACKEND`
//! (afxdp | afpacket | udp | auto).
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]
#![allow(clippy::missing_safety_doc)]

pub mod channel;
pub mod datapath;
pub mod devices;
pub mod ffi;
pub mod handles;
pub mod misc;
pub mod qp;
pub mod rdmacm;
pub mod resources;
pub mod unsupported;
pub mod wr_api;

/// The version script the shared library is linked with: libibverbs's
/// symbol versions, then librdmacm's (the library is both).
pub const VERSION_SCRIPT: &str = concat!(
    include_str!("../libibverbs.map"),
    include_str!("../librdmacm.map")
);
