//! ferroce-verbs: the user-facing, ibverbs-shaped API of ferroce.
//!
//! It joins one `ferroce-stack` transport core and one `ferroce-nic` packet
//! engine into a device that applications program the way they program
//! rdma-core (context, protection domain, memory region, completion queue,
//! queue pair, `post_send` / `post_recv` / `poll_cq`). It also holds the
//! out-of-band connection set-up compatible with `ibv_rc_pingpong` and
//! perftest, and the `ferroce` command-line tool.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod decode;
