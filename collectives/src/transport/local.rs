//! An in-process transport over channels: ranks are threads of one process.
//! It checks the algorithms without any network (fast, for the full test
//! matrix) and is the reference the RDMA transport is compared with.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::{RecvSpec, SendSpec, Transport};
use crate::error::{Error, Result};

/// One rank's end of a [`local_world`].
#[derive(Debug)]
pub struct LocalTransport {
    rank: usize,
    size: usize,
    tx: Vec<Option<Sender<Vec<u8>>>>,
    rx: Vec<Option<Receiver<Vec<u8>>>>,
    timeout: Duration,
}

/// `n` connected transports, one per rank (move each to its thread).
pub fn local_world(n: usize, timeout: Duration) -> Vec<LocalTransport> {
    let mut tx: Vec<Vec<Option<Sender<Vec<u8>>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut rx: Vec<Vec<Option<Receiver<Vec<u8>>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for (from, txs) in tx.iter_mut().enumerate() {
        for (to, slot) in txs.iter_mut().enumerate() {
            if from != to {
                let (s, r) = channel();
                *slot = Some(s);
                rx[to][from] = Some(r);
            }
        }
    }
    tx.into_iter()
        .zip(rx)
        .enumerate()
        .map(|(rank, (tx, rx))| LocalTransport {
            rank,
            size: n,
            tx,
            rx,
            timeout,
        })
        .collect()
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn exchange(&mut self, sends: &[SendSpec<'_>], recvs: &mut [RecvSpec<'_>]) -> Result<()> {
        for (peer, data) in sends {
            if data.is_empty() {
                continue;
            }
            let tx = self
                .tx
                .get(*peer)
                .and_then(Option::as_ref)
                .ok_or_else(|| Error::Invalid(format!("no channel to rank {peer}")))?;
            tx.send(data.to_vec()).map_err(|_| Error::PeerGone(*peer))?;
        }
        for (peer, buf) in recvs.iter_mut() {
            if buf.is_empty() {
                continue;
            }
            let rx = self
                .rx
                .get(*peer)
                .and_then(Option::as_ref)
                .ok_or_else(|| Error::Invalid(format!("no channel from rank {peer}")))?;
            let msg = rx.recv_timeout(self.timeout).map_err(|e| match e {
                RecvTimeoutError::Timeout => Error::Timeout {
                    timeout: self.timeout,
                    waiting_on: vec![*peer],
                },
                RecvTimeoutError::Disconnected => Error::PeerGone(*peer),
            })?;
            if msg.len() != buf.len() {
                return Err(Error::Protocol {
                    peer: *peer,
                    what: format!(
                        "message of {} bytes for a {}-byte receive",
                        msg.len(),
                        buf.len()
                    ),
                });
            }
            buf.copy_from_slice(&msg);
        }
        Ok(())
    }
}
