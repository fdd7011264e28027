//! Pieces of the slot/credit exchange loop that both RDMA backends
//! (`rdma`, `ibverbs`) run identically: when a credit-only message is due,
//! and which ranks a timed-out exchange was still waiting on.

use std::time::Duration;

use super::{RecvSpec, SendSpec};
use crate::error::Error;

/// A credit-only SEND is due once half the ring (at least one slot) has been
/// consumed without a credit riding back on data, and no more than a ring's
/// worth of credit messages is still outstanding.
pub(crate) fn credit_due(unreported: u32, slots: usize, posted: u64, done: u64) -> bool {
    unreported as usize >= (slots / 2).max(1) && posted - done < slots as u64
}

/// The time-out error, naming (sorted, once each) the ranks whose send or
/// receive had not completed.
pub(crate) fn timeout(
    timeout: Duration,
    sends: &[SendSpec<'_>],
    send_off: &[usize],
    recvs: &[RecvSpec<'_>],
    recv_off: &[usize],
) -> Error {
    let mut waiting_on: Vec<usize> = sends
        .iter()
        .zip(send_off)
        .filter(|(s, off)| **off < s.1.len())
        .map(|(s, _)| s.0)
        .chain(
            recvs
                .iter()
                .zip(recv_off)
                .filter(|(r, off)| **off < r.1.len())
                .map(|(r, _)| r.0),
        )
        .collect();
    waiting_on.sort_unstable();
    waiting_on.dedup();
    Error::Timeout {
        timeout,
        waiting_on,
    }
}
